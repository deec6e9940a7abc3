"""Runs one federated experiment from an ml_collections config.

  python experiments/run.py --config experiments/configs/quickstart.py
  python experiments/run.py --config experiments/configs/quickstart.py --config.rounds=5 \
      --config.data.partition.alpha=0.1 --config.engine.strategy=vmap

Writes a run directory (``--config.output.dir``, default ``runs/``) with the
resolved config, per-round metrics (JSONL + CSV), the partition, a summary and
the run's plots (``plots/``; ``experiments/plot.py`` redraws or compares runs).
A resume for which no checkpoint restores stops with one ``error:`` line.

Past one host (JAX's multi-controller runtime, ``jax.distributed.initialize``): start the same command once per
process with ``--distributed`` (the cluster's environment says who is who: SLURM, Open MPI, a Cloud TPU pod slice)
or with ``--coordinator_address=HOST:PORT --num_processes=N --process_id=I``. The client axis is then sharded
(``shard_map``) over every process's devices, every process computes the same metrics, and process 0 alone writes
the run directory (README, "More than one host").
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
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Join a multi-process run with jax.distributed.initialize(), which reads the cluster's "
    "environment (SLURM, Open MPI, Cloud TPU pod slice); implied by --coordinator_address, --num_processes "
    "or --process_id.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0's coordinator (multi-process runs), reachable by all.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes of a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's id, 0 .. num_processes-1 (0 writes the run).")
_LOCAL_DEVICES = flags.DEFINE_list(
    "local_device_ids", None, "GPUs this process drives, e.g. 0,1,2,3 (default: all it sees; under SLURM JAX's "
    "auto-detection gives each process the one GPU of its SLURM_LOCALID).")


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config experiments/configs/quickstart.py")
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  from fedjax_robust.execution import configure_cpu_devices
  if config.engine.get("cpu_devices", 0):
    configure_cpu_devices(config.engine.cpu_devices)  # must precede the first JAX computation
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if _DISTRIBUTED.value or any(v is not None for v in explicit):  # before the first JAX computation too
    from fedjax_robust.execution import initialize_distributed
    local = None if _LOCAL_DEVICES.value is None else [int(i) for i in _LOCAL_DEVICES.value]
    initialize_distributed(*explicit, local_device_ids=local)
  from fedjax_robust.experiment import apply_open_overrides, run_experiment
  apply_open_overrides(config, _OPEN_OVERRIDES)
  from fedjax_robust.checkpoint import CheckpointError
  try:
    summary = run_experiment(config, _RUN_DIR.value)
  except CheckpointError as e:  # resume=True and no checkpoint restores: one line, not orbax's traceback
    sys.exit(f"error: {e}")
  from fedjax_robust.execution import is_primary
  if not is_primary():  # every process has the same summary; process 0 prints it
    return
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
