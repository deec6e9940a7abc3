#!/usr/bin/env python
"""FedVSA's round cost (issue 33, paper Table 10): FedAvg vs FedVSA without detection vs FedVSA with a Shapley step
in every round, at cohort sizes m = 10 (exact enumeration, 2^10 = 1,024 coalition models) and m = 30 (truncated
Monte-Carlo, P permutations x 31 prefixes), in one process.

Each variant builds FedVSA's MNIST setting (``experiments/configs/fedvsa_mnist.py:sigma900``: LeNet-5, σ = 900,
E local epochs, B = 10) with the reductions given by ``--set``, then runs one warm-up round (compilation) and
``--rounds`` timed rounds (``time_rounds``). The Shapley step is forced every round with
``algorithm.fedvsa.detection=no_audit`` (normally it runs only in rounds whose loss audit fires: Table 10's
point); its utility scores every coalition model on ``server.root_dataset_size`` test rows. The baseline is FedAvg
under the same engine strategy; ``--strategies vmap,sequential`` also gives the vmap/sequential ratio.
``fedvsa_retrain_quiet`` is the two-phase round (``repaired_round=retrain``: the review phase's extra inference pass
before training) in rounds whose audit does not fire. Any other variant is a method of the setting
(``experiments/configs/fedvsa_setting.py``: ``feddc``, ``zeno``, ``dnc``, ``rfa``, ... with the setting's
hyperparameters): Table 10's baseline rows (``--variants fedavg,feddc,zeno,dnc,rfa,fedvsa_no_detection``);
``experiments/fedvsa_tables.py --mode table10`` tabulates the stored JSON beside the paper's numbers.

  python benchmarks/fedvsa_cost.py --set data.data_dir=../shared/data --set data.pool_size=6000 \\
      --set client.epochs=1 --set server.root_dataset_size=500 --out benchmarks/results/fedvsa_cost_cpu2.json
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

# variant -> (algorithm, FedVSA options)
VARIANTS = {
    "fedavg": ("fedavg", {}),
    "fedvsa_no_detection": ("fedvsa", {"detection": "off"}),
    "fedvsa_shapley_every_round": ("fedvsa", {"detection": "no_audit"}),
    # The two-phase round (repaired_round=retrain) in rounds whose audit stays quiet: the review phase's extra
    # inference pass and the audit, no Shapley step (an alarm would need every report above the largest loss ever
    # kept; the cell records whether one fired).
    "fedvsa_retrain_quiet": ("fedvsa", {"repaired_round": "retrain", "audit_reference": "running_max_all_history",
                                        "audit_quorum": 1.0}),
}


def variant_config(args, variant: str, cohort: int, strategy: str):
  """The variant's config: one of :data:`VARIANTS` on ``--config``, or the setting's method ``variant`` on
  ``--config``'s partition (``fedvsa_mnist.py:sigma900`` -> ``fedvsa_mnist.py:sigma900,<variant>``)."""
  if variant in VARIANTS:
    algorithm, options = VARIANTS[variant]
    config = load_config(args.config)
  else:
    path, _, arg = args.config.partition(":")
    config = load_config(f"{path}:{arg.split(',')[0] or 'sigma900'},{variant}")
    algorithm, options = config.algorithm.name, {}
  config.output.progress = False
  config.init.pretrain_rounds = 0
  config.eval.stop_at = 0.0
  grid.apply_overrides(config, args.set)
  config.data.num_clients = max(config.data.num_clients, cohort)
  config.server.cohort_size = cohort
  config.engine.strategy = strategy
  config.algorithm.name = algorithm
  for key, value in options.items():
    config.algorithm.fedvsa[key] = value
  config.algorithm.fedvsa.shapley_exact_max = args.exact_max
  config.algorithm.fedvsa.shapley_permutations = args.permutations
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="experiments/configs/fedvsa_mnist.py:sigma900")
  parser.add_argument("--cohorts", default="10,30", help="cohort sizes m")
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--strategies", default="vmap")
  parser.add_argument("--exact_max", type=int, default=10, help="exact Shapley up to this m, TMC beyond")
  parser.add_argument("--permutations", type=int, default=50, help="TMC permutations P")
  parser.add_argument("--rounds", type=int, default=2, help="timed rounds per variant (after one warm-up round)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  logging.basicConfig(level=logging.WARNING)
  import jax
  from fedjax_robust.experiment import build_experiment

  result = {"config": args.config, "set": args.set, "rounds": args.rounds, "exact_max": args.exact_max,
            "permutations": args.permutations, "machine": platform.processor() or platform.machine(),
            "cells": {}, **grid.provenance()}
  for cohort in (int(c) for c in args.cohorts.split(",")):
    for strategy in args.strategies.split(","):
      base = None
      for variant in args.variants.split(","):
        config = variant_config(args, variant, cohort, strategy)
        exp = build_experiment(config)
        first, per_round, _, metrics = time_rounds(exp, args.rounds)
        models = 2 ** cohort if cohort <= args.exact_max else args.permutations * (cohort + 1)
        cell = {"cohort": cohort, "strategy": strategy, "variant": variant, "first_round_s": first,
                "s_per_round": per_round, "rounds_per_s": 1.0 / per_round,
                "coalition_models_per_shapley_step": models if variant.endswith("every_round") else 0,
                "shapley_mode": ("exact" if cohort <= args.exact_max else "tmc") if variant.endswith("round") else "",
                "num_clients": int(config.data.num_clients), "server_rows": int(config.server.root_dataset_size),
                "backend": jax.default_backend()}
        if "audit_alarm" in metrics:
          cell["last_round_audit_alarm"] = bool(metrics["audit_alarm"])
        if variant == "fedavg":
          base = per_round
        if base is not None:
          cell["x_fedavg_time"] = per_round / base
        result["cells"][f"m{cohort}_{strategy}_{variant}"] = cell
        ratio = f"{cell['x_fedavg_time']:.2f}x FedAvg's time" if "x_fedavg_time" in cell else ""
        print(f"m={cohort:3d} {strategy:10s} {variant:28s} {per_round:8.2f} s/round "
              f"({1 / per_round:.3f} rounds/s) first {first:6.1f} s {ratio}", flush=True)
  if args.out:
    grid.store_json(args.out, result)


if __name__ == "__main__":
  main()
