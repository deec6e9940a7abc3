"""Cost of federated adversarial training: a PGD-10 round against a clean round, vectorized vs sequential.

For each (objective, strategy) pair it builds the same experiment (``--config``, default FedALC on MNIST at
alpha = 0.1: 10 clients, 5,000 images, batch 32, E = 1, the CNN-MNIST), runs one warm-up round (compilation) and
then times ``--rounds`` rounds; it also times the robust evaluation of the global model (PGD-10 on
``--eval_examples`` test images, 11 forward/backward passes per image). Prints rounds/s, the adversarial/clean
cost ratio and the vmap/sequential speed ratio measured in this process; ``--out`` stores them with provenance,
each pair's local steps per client program and training-attack unroll, and the process's peak memory (run one
pair per process to read the peak as that pair's: the compile-cost table of benchmarks/README.md §5).

  python benchmarks/adversarial_round.py --set data.data_dir=../shared/data
  python benchmarks/adversarial_round.py --config experiments/configs/fedalc_fmnist.py:fedalc,0.1 --rounds 2 \\
      --set data.data_dir=../shared/data --out benchmarks/results/adversarial_round_cpu.json
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.seeds_vmap import load_config  # noqa: E402
from experiments import grid  # noqa: E402


def time_rounds(exp, rounds: int) -> tuple[float, float, object, dict]:
  """(warm-up round seconds incl. compilation, seconds per timed round, final state, last round's metrics)."""
  import jax
  sim = exp.simulator
  state = exp.init_state()
  t0 = time.perf_counter()
  state, _ = sim.run_round(state)
  jax.block_until_ready(state)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(rounds):
    state, metrics = sim.run_round(state)
  jax.block_until_ready((state, metrics))
  return first, (time.perf_counter() - t0) / rounds, state, metrics


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="experiments/configs/fedalc_mnist.py:fedalc,0.1")
  parser.add_argument("--objectives", default="ce,fedalc", help="adversarial.objective values to compare")
  parser.add_argument("--strategies", default="vmap,sequential")
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds per pair (after one warm-up round)")
  parser.add_argument("--eval_examples", type=int, default=1000, help="test images attacked by PGD-10 (0: skip)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  logging.basicConfig(level=logging.WARNING)
  import jax
  from fedjax_robust.experiment import build_experiment

  result = {"config": args.config, "rounds": args.rounds, "pairs": {}, **grid.provenance()}
  robust_done = False
  for objective in args.objectives.split(","):
    for strategy in args.strategies.split(","):
      config = load_config(args.config)
      config.output.progress = False
      config.adversarial.objective = objective
      config.engine.strategy = strategy
      config.eval.metrics = "accuracy"
      grid.apply_overrides(config, args.set)
      exp = build_experiment(config)
      first, per_round, state, _ = time_rounds(exp, args.rounds)
      result["pairs"][f"{objective}/{strategy}"] = {"first_round_s": first, "round_s": per_round,
                                                   "rounds_per_s": 1.0 / per_round, "local_steps": exp.local_steps,
                                                   "attack_unroll": exp.attack_unroll}
      print(f"{objective:>8s} {strategy:>10s}: first round {first:7.1f} s, then {per_round:7.2f} s/round "
            f"({1.0 / per_round:.3f} rounds/s)", flush=True)
      if args.eval_examples and not robust_done:
        from fedjax_robust.adversarial.evaluation import evaluate_robust, robust_eval_from_config
        cfg = config.eval.robust
        with cfg.unlocked():
          cfg.attacks, cfg.examples = "pgd", args.eval_examples
        spec = robust_eval_from_config(cfg)
        sim = exp.simulator
        model = exp.algorithm.global_params(state.server)
        fn = jax.jit(lambda m, k: evaluate_robust(sim.model, m, *sim.global_test, k, spec))
        jax.block_until_ready(fn(model, jax.random.key(0)))
        t0 = time.perf_counter()
        jax.block_until_ready(fn(model, jax.random.key(1)))
        seconds = time.perf_counter() - t0
        result["robust_eval"] = {"attack": "pgd", "steps": int(cfg.steps), "examples": args.eval_examples,
                                 "seconds": seconds, "images_per_s": args.eval_examples / seconds}
        print(f"robust evaluation: PGD-{int(cfg.steps)} on {args.eval_examples} test images in {seconds:.2f} s "
              f"({args.eval_examples / seconds:.0f} images/s, incl. the clean pass)", flush=True)
        robust_done = True
  pairs = result["pairs"]
  objectives, strategies = args.objectives.split(","), args.strategies.split(",")
  for strategy in strategies:
    if len(objectives) > 1:
      clean, adv = pairs[f"{objectives[0]}/{strategy}"], pairs[f"{objectives[-1]}/{strategy}"]
      ratio = adv["round_s"] / clean["round_s"]
      result[f"adversarial_over_clean_{strategy}"] = ratio
      print(f"{strategy}: a {objectives[-1]} round costs {ratio:.1f}x a {objectives[0]} round")
  if "vmap" in strategies and "sequential" in strategies:
    for objective in objectives:
      ratio = pairs[f"{objective}/sequential"]["round_s"] / pairs[f"{objective}/vmap"]["round_s"]
      result[f"vmap_over_sequential_{objective}"] = ratio
      print(f"{objective}: vmap is {ratio:.2f}x the sequential loop's rounds/s")
  import resource
  result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
  print(f"peak memory of this process: {result['peak_rss_gb']:.1f} GB")
  if args.out:
    grid.store_json(args.out, result)


if __name__ == "__main__":
  main()
