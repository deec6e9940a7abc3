"""Runs one federated experiment from an ml_collections config.

  python experiments/run.py --config experiments/configs/quickstart.py
  python experiments/run.py --config experiments/configs/quickstart.py --config.rounds=5 \
      --config.data.partition.alpha=0.1 --config.engine.strategy=vmap

Writes a run directory (``--config.output.dir``, default ``runs/``) with the
resolved config, per-round metrics (JSONL + CSV), the partition, a summary and
the run's plots (``plots/``; ``experiments/plot.py`` redraws or compares runs).
A resume for which no checkpoint restores stops with one ``error:`` line.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an experiment config (a .py file).",
                                          lock_config=True)
_RUN_DIR = flags.DEFINE_string("run_dir", None, "Explicit run directory (default: output.dir/output.name).")


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config experiments/configs/quickstart.py")
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  from fedjax_robust.execution import configure_cpu_devices
  if config.engine.get("cpu_devices", 0):
    configure_cpu_devices(config.engine.cpu_devices)  # must precede the first JAX computation
  from fedjax_robust.experiment import apply_open_overrides, run_experiment
  apply_open_overrides(config, _OPEN_OVERRIDES)
  from fedjax_robust.checkpoint import CheckpointError
  try:
    summary = run_experiment(config, _RUN_DIR.value)
  except CheckpointError as e:  # resume=True and no checkpoint restores: one line, not orbax's traceback
    sys.exit(f"error: {e}")
  speed = summary["rounds_per_s"]  # None when a resumed run had no rounds left to run
  final = summary["final"]
  if "seeds" in summary:  # one program over seeds (and grid points): mean ± std per metric
    spread = lambda block: {k: f"{v['mean']:.4f} ± {v['std']:.4f}" for k, v in block.items()}
    final = spread(final) if not summary["grid"] else {p: spread(b) for p, b in final.items()}
  print(json.dumps({"final": final, "wall_time_s": round(summary["wall_time_s"], 2),
                    "rounds_per_s": None if speed is None else round(speed, 3), "strategy": summary["strategy"],
                    "resumed_from_round": summary.get("resumed_from_round"), "run_dir": summary["run_dir"]}, indent=2))


_OPEN_OVERRIDES: list = []

if __name__ == "__main__":
  # Rule / attack / model parameters (--config.aggregator.num_byzantine=3, --config.attack.params.sigma=inf) are not
  # fields of the default config, so they are taken out here and set after it loads (experiment.OPEN_GROUPS).
  from fedjax_robust.experiment import split_open_overrides
  sys.argv, _OPEN_OVERRIDES[:] = split_open_overrides(sys.argv)
  app.run(main)
