#!/usr/bin/env python
"""Seconds per round of whole experiment configs against the first one, in one process: a rule's or an
algorithm's round cost next to FedAvg's under the same data, model, cohort and engine strategy.

Each ``--configs`` entry is ``file.py[:argument]`` (the configs ``experiments/run.py`` takes); ``--set`` overrides
apply to every one (the same reduction for all). Each config is built, runs one warm-up round (compilation, timed
apart) and ``--rounds`` timed rounds (``benchmarks/adversarial_round.time_rounds``); the ratio is each config's time
per round over the first config's. FedCC (issue 29) next to FedAvg on its reduced CIFAR-10 setting:

  python benchmarks/config_rounds.py --set data.data_dir=../shared/data --set data.samples_per_class=500 \\
      --set client.epochs=2 --configs experiments/configs/fedcc_cifar10.py:fang_median,fedavg \\
      --configs experiments/configs/fedcc_cifar10.py:fang_median,fedcc --out benchmarks/results/fedcc_rounds_cpu2.json
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.adversarial_round import time_rounds  # noqa: E402
from benchmarks.seeds_vmap import load_config  # noqa: E402
from experiments import grid  # noqa: E402


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--configs", action="append", required=True, metavar="FILE[:ARG]",
                      help="a config (repeat the flag for each); the first is the baseline of the ratios")
  parser.add_argument("--rounds", type=int, default=2, help="timed rounds per config (after one warm-up round)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  if len(set(args.configs)) < len(args.configs):
    parser.error(f"--configs: each config once (got {args.configs})")
  logging.basicConfig(level=logging.WARNING)
  import jax
  from fedjax_robust.experiment import build_experiment

  result = {"set": args.set, "rounds": args.rounds, "machine": platform.processor() or platform.machine(),
            "cells": {}, **grid.provenance()}
  base = None
  for spec in args.configs:
    config = load_config(spec)
    config.output.progress = False
    grid.apply_overrides(config, args.set)
    exp = build_experiment(config)
    first, per_round, _, _ = time_rounds(exp, args.rounds)
    base = per_round if base is None else base
    cell = {"config": spec, "first_round_s": first, "s_per_round": per_round, "rounds_per_s": 1.0 / per_round,
            "x_first_time": per_round / base, "algorithm": config.algorithm.name,
            "aggregator": config.aggregator.to_dict(), "attack": config.attack.name,
            "num_clients": int(config.data.num_clients), "strategy": exp.strategy,
            "backend": jax.default_backend()}
    result["cells"][spec] = cell
    print(f"{spec:60s} {per_round:8.2f} s/round ({1 / per_round:.3f} rounds/s) first {first:6.1f} s "
          f"{cell['x_first_time']:.2f}x the first config's time", flush=True)
  if args.out:
    grid.store_json(args.out, result)
  return result


if __name__ == "__main__":
  main()
