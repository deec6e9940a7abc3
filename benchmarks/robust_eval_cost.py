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


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--attacks", default="fgsm,bim,pgd,cw", help="names from eval.robust's attacks")
  parser.add_argument("--rows", type=int, default=500)
  parser.add_argument("--batch_size", type=int, default=500)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  import jax
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
