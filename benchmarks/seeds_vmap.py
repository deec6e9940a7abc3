"""N seeds as ONE vmapped program (``--config.seeds``) against N separate runs, in one process.

Both sides run the same N experiments (seed, data.seed and attack.seed = s) end to end, compilation
included, since that is what a user waits for: "one program" is ``run_seeds`` (build every seed's
partition on the host, one compile, one run); "separate" is ``run_experiment`` once per seed, each
with its own compile, as N processes would (without their interpreter and JAX start-up, which this
leaves out in their favour). Prints seed-rounds/s of both and the ratio; ``--out`` stores the result
with its provenance.

  python benchmarks/seeds_vmap.py --config experiments/configs/quickstart.py --seeds 4 --rounds 20
  python benchmarks/seeds_vmap.py --config experiments/configs/fedcap_cifar10.py:none --seeds 3 --rounds 10 \\
      --set data.data_dir=../shared/data
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import grid  # noqa: E402


def load_config(spec: str):
  """``path.py[:argument]`` -> the config its ``get_config`` returns."""
  from fedjax_robust.config_files import load_module
  path, _, arg = spec.partition(":")
  module = load_module(path)
  return module.get_config(arg) if arg else module.get_config()


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="config file[:argument]")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--epochs", type=int, default=0, help="client.epochs (0 = the config's)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--skip_separate", action="store_true", help="only the one-program side")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  logging.basicConfig(level=logging.WARNING)
  from fedjax_robust.experiment import run_experiment
  from fedjax_robust.run import seed_config

  base = load_config(args.config)
  base.rounds, base.eval_every, base.output.progress = args.rounds, args.rounds, False
  if args.epochs:
    base.client.epochs = args.epochs
  grid.apply_overrides(base, args.set)
  seeds = list(range(args.seeds))
  result = {"config": args.config, "seeds": args.seeds, "rounds": args.rounds, **grid.provenance()}
  with tempfile.TemporaryDirectory() as tmp:
    together = seed_config(base, 0)
    together.seeds = ",".join(map(str, seeds))
    t0 = time.perf_counter()
    summary = run_experiment(together, Path(tmp) / "together")
    one_s = time.perf_counter() - t0
    result["one_program"] = {"wall_s": one_s, "build_s": summary["build_s"], "compile_s": summary["compile_s"],
                             "run_s": summary["run_s"], "seed_rounds_per_s": args.seeds * args.rounds / one_s,
                             "seed_rounds_per_s_after_compile": args.seeds * args.rounds / summary["run_s"]}
    print(f"one program, {args.seeds} seeds x {args.rounds} rounds: {one_s:.1f} s end to end (build "
          f"{summary['build_s']:.1f}, compile {summary['compile_s']:.1f}, run {summary['run_s']:.1f}) = "
          f"{result['one_program']['seed_rounds_per_s']:.3f} seed-rounds/s", flush=True)
    if not args.skip_separate:
      walls = []
      for s in seeds:
        c = seed_config(base, s)
        c.engine.strategy = "vmap"  # the same client strategy as inside the seeds program
        t = time.perf_counter()
        run_experiment(c, Path(tmp) / f"seed_{s}")
        walls.append(time.perf_counter() - t)
      sep_s = sum(walls)
      result["separate"] = {"wall_s": sep_s, "per_run_s": walls, "seed_rounds_per_s": args.seeds * args.rounds / sep_s}
      result["speedup"] = sep_s / one_s
      print(f"separate runs: {sep_s:.1f} s ({', '.join(f'{w:.1f}' for w in walls)}) = "
            f"{result['separate']['seed_rounds_per_s']:.3f} seed-rounds/s; one program is {sep_s / one_s:.2f}x",
            flush=True)
  if args.out:
    grid.store_json(args.out, result)


if __name__ == "__main__":
  main()
