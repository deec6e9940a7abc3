"""Robust evaluation's cost per attack (FedALC's ``eval.robust``), as the engine compiles it against the rolled loops.

Times ``robust_accuracy`` (the kernel every robust evaluation calls) on FedALC's MNIST CNN (``cnn_mnist``, random
weights: the cost does not depend on them) for each evaluation attack of ``eval.robust`` on ``--rows`` rows in
batches of ``--batch_size``, two ways in one process:

* ``engine``: what the simulator runs, :func:`fedjax_robust.compilation.map` over the batches (one batch is a plain
  call) and the attacks' step loops unrolled on the CPU for conv nets (``attack_unroll``);
* ``rolled``: ``jax.lax.map`` and rolled step loops (``FEDJAX_ROBUST_ATTACK_UNROLL=false``), where XLA:CPU leaves
  the gradient convolutions of the loop bodies off its Eigen kernels (jax#12868).

Prints compile and run seconds (median of ``--repeats`` calls) and the run-time ratio; ``--out`` stores them with
provenance.

  python benchmarks/robust_eval_cost.py --out benchmarks/results/robust_eval_cost_cpu2.json

``--simulator DATA_DIR`` times instead one whole evaluation (``eval.metrics=accuracy,robust``) of FedALC's MNIST
setting (``experiments/configs/fedalc_setting.py``, 600 training rows) as a simulator with the ``sequential``
strategy (the CPU default for conv nets) runs it, ``--repeats`` times each way:

* ``eager``: every registered evaluator called as it is, what the simulator did before commit 4c26717: the robust
  evaluator's loops are compiled again at every call;
* ``engine``: ``Simulator.evaluate``, where the robust evaluator is one program compiled at the first call.

  python benchmarks/robust_eval_cost.py --simulator ../shared/data --out benchmarks/results/eval_reuse_cpu2.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import grid  # noqa: E402


def time_robust_accuracy(attack, params, rows: int, batch_size: int, repeats: int) -> dict:
  import jax
  import jax.numpy as jnp
  from fedjax_robust.adversarial.evaluation import robust_accuracy
  from fedjax_robust.models import get_model, init_params
  model = get_model("cnn_mnist", 10)
  variables = init_params(model, jax.random.key(0), (28, 28, 1))
  logits = lambda v, x: model.apply({"params": v}, x)
  x = jax.random.uniform(jax.random.key(1), (rows, 28, 28, 1))
  y = jnp.arange(rows) % 10
  program = lambda v: robust_accuracy(logits, v, x, y, jax.random.key(2), attack, params, batch_size)[0]
  t = time.perf_counter()
  compiled = jax.jit(program).lower(variables).compile()
  compile_s = time.perf_counter() - t
  correct = int(compiled(variables).block_until_ready())  # warm-up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    compiled(variables).block_until_ready()
    times.append(time.perf_counter() - t)
  return {"compile_s": compile_s, "run_s": statistics.median(times), "run_s_all": times, "correct": correct}


def time_simulator_evaluation(data_dir: str, rows: int, batch_size: int, repeats: int) -> dict:
  from fedjax_robust.execution import to_host
  from fedjax_robust.experiment import build_experiment
  from fedjax_robust.metrics.evaluators import EVALUATORS
  from experiments.configs import fedalc_setting
  config = fedalc_setting.get_config("mnist", "fedalc")
  config.data.data_dir, config.data.pool_size, config.engine.strategy = data_dir, 600, "sequential"
  config.eval.robust.examples, config.eval.robust.batch_size = rows, batch_size
  exp = build_experiment(config)
  sim, state = exp.simulator, exp.init_state()
  global_model = sim.algorithm.global_params(state.server)
  eager = lambda: {name: EVALUATORS[name](sim, state, global_model, sim.inputs) for name in sim.evaluators}
  ways = {"eager": lambda: sim.evaluation_record(to_host(eager())), "engine": lambda: sim.evaluate(state)}
  out = {}
  for name, evaluate in ways.items():
    times, values = [], None
    for _ in range(repeats):
      t = time.perf_counter()
      values = evaluate()
      times.append(time.perf_counter() - t)
    out[name] = {"evaluation_s_all": times, "first_s": times[0], "later_s": statistics.median(times[1:] or times),
                 "robust_acc_pgd": values["robust_acc_pgd"], "global_test_acc": values["global_test_acc"]}
    print(f"{name}: first evaluation {times[0]:.1f} s, later ones {out[name]['later_s']:.1f} s (median)", flush=True)
  out["eager_over_engine_later_s"] = out["eager"]["later_s"] / out["engine"]["later_s"]
  print(f"later evaluations: eager / engine = {out['eager_over_engine_later_s']:.1f}x", flush=True)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--attacks", default="fgsm,bim,pgd,cw", help="names from eval.robust's attacks")
  parser.add_argument("--rows", type=int, default=500)
  parser.add_argument("--batch_size", type=int, default=500)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None)
  parser.add_argument("--simulator", metavar="DATA_DIR", default=None,
                      help="time whole evaluations of FedALC's MNIST setting under the sequential strategy instead")
  args = parser.parse_args()
  import jax
  if args.simulator:
    result = {"mode": "simulator", "rows": args.rows, "batch_size": args.batch_size, "repeats": args.repeats,
              "backend": jax.default_backend(), "cpu_count": os.cpu_count(), **grid.provenance(),
              **time_simulator_evaluation(args.simulator, args.rows, args.batch_size, args.repeats)}
    if args.out:
      grid.store_json(args.out, result)
    return
  from fedjax_robust import compilation
  from fedjax_robust.adversarial.evaluation import default_robust_eval_config, robust_eval_from_config

  cfg = default_robust_eval_config()
  cfg.attacks = args.attacks
  table = {name: (attack, params) for name, attack, params in robust_eval_from_config(cfg).attacks}
  result = {"rows": args.rows, "batch_size": args.batch_size, "repeats": args.repeats, "model": "cnn_mnist",
            "backend": jax.default_backend(), "cpu_count": os.cpu_count(), "attacks": {}, **grid.provenance()}
  engine_map = compilation.map
  user_unroll = os.environ.pop("FEDJAX_ROBUST_ATTACK_UNROLL", None)  # the engine side is the default
  for name, (attack, params) in table.items():
    row = {"engine": time_robust_accuracy(attack, params, args.rows, args.batch_size, args.repeats)}
    os.environ["FEDJAX_ROBUST_ATTACK_UNROLL"] = "false"
    compilation.map = jax.lax.map  # the kernel looks it up at trace time
    try:
      row["rolled"] = time_robust_accuracy(attack, params, args.rows, args.batch_size, args.repeats)
    finally:
      compilation.map = engine_map
      del os.environ["FEDJAX_ROBUST_ATTACK_UNROLL"]
    row["rolled_over_engine_run_s"] = row["rolled"]["run_s"] / row["engine"]["run_s"]
    result["attacks"][name] = row
    print(f"{name}: engine compile {row['engine']['compile_s']:.1f} s, run {row['engine']['run_s']:.3f} s | rolled "
          f"compile {row['rolled']['compile_s']:.1f} s, run {row['rolled']['run_s']:.3f} s | "
          f"{row['rolled_over_engine_run_s']:.2f}x", flush=True)
  if user_unroll is not None:
    os.environ["FEDJAX_ROBUST_ATTACK_UNROLL"] = user_unroll
  if args.out:
    grid.store_json(args.out, result)


if __name__ == "__main__":
  main()
