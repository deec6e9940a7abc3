"""TensorBoard event files of a run's per-round scalars, written with tensorboardX (no TensorFlow needed).

``output.tensorboard=True`` makes the run directory's :class:`~fedjax_robust.experiment.RunWriter` log every scalar
of every round (the columns of ``metrics.csv``: booleans as 0/1, ``num_flagged`` for the flagged clients) into
``<run_dir>/tb/``, at step = the round. Tags are grouped for TensorBoard's sections by :func:`tag`:
``accuracy/global_test_acc``, ``loss/train_loss``, ``detection/detection_tpr``, ``attack/backdoor_asr``,
``time/elapsed_s``, ``other/local_steps``. Then::

  pip install tensorboard          # the viewer only; it needs no TensorFlow either
  tensorboard --logdir runs/       # every run under runs/, each its own line

A resumed run rewrites ``tb/`` from its whole history, as it does ``metrics.jsonl``, so the curves have no doubled
rounds. :func:`read_scalars` reads event files back without TensorBoard (the tests use it).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Optional

INSTALL_HINT = ("output.tensorboard=True writes TensorBoard event files with tensorboardX, which is not installed: "
                "pip install -e \".[tensorboard]\" (or pip install tensorboardX; TensorFlow is not needed)")


def _tensorboardx():
  try:
    import tensorboardX
  except ImportError as e:
    raise ImportError(INSTALL_HINT) from e
  return tensorboardX


def tag(key: str) -> str:
  """The TensorBoard tag of a metric: ``<section>/<metric name>``."""
  if key.startswith(("detection_", "shapley_", "num_shapley", "audit_")) or key in (
      "num_flagged", "num_removed", "pool_size"):
    section = "detection"
  elif key.startswith("backdoor_") or key.startswith("attack_"):
    section = "attack"
  elif "acc" in key:
    section = "accuracy"
  elif "loss" in key:
    section = "loss"
  elif key in ("elapsed_s",):
    section = "time"
  else:
    section = "other"
  return f"{section}/{key}"


def scalars(record: dict) -> dict[str, float]:
  """A round record's scalars as floats (the columns of ``metrics.csv`` but ``round`` and the flagged ids)."""
  from fedjax_robust.experiment import csv_row
  out = {}
  for key, value in csv_row(record).items():
    if key in ("round", "flagged_clients") or value is None:
      continue
    out[key] = float(value)
  return out


class ScalarWriter:
  """Writes each round's scalars to TensorBoard event files in ``logdir``.

  ``fresh``: remove earlier event files first (a rerun or a resumed run, which re-logs its history).
  """

  def __init__(self, logdir: str | Path, fresh: bool = True):
    tbx = _tensorboardx()
    self.logdir = Path(logdir)
    if fresh and self.logdir.exists():
      for old in self.logdir.glob("events.out.tfevents.*"):
        old.unlink()
    self.logdir.mkdir(parents=True, exist_ok=True)
    self._writer = tbx.SummaryWriter(logdir=str(self.logdir), flush_secs=10)

  def log(self, record: dict, walltime: Optional[float] = None) -> None:
    step = int(record["round"])
    for key, value in scalars(record).items():
      self._writer.add_scalar(tag(key), value, step, walltime=walltime)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def _records(path: Path):
  """The payloads of a TFRecord file (length, masked CRC of the length, data, masked CRC of the data)."""
  data = path.read_bytes()
  pos = 0
  while pos + 12 <= len(data):
    (length,) = struct.unpack("<Q", data[pos:pos + 8])
    start = pos + 12
    if start + length + 4 > len(data):
      break  # a file still being written ends with a partial record
    yield data[start:start + length]
    pos = start + length + 4


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
  """``{tag: [(step, value), ...]}`` of every scalar in ``logdir``'s event files, in file and write order."""
  from tensorboardX.proto import event_pb2
  out: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
    for payload in _records(path):
      event = event_pb2.Event.FromString(payload)
      if not event.HasField("summary"):
        continue
      for value in event.summary.value:
        if value.HasField("simple_value"):
          out.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
  return out


__all__ = ["ScalarWriter", "read_scalars", "tag", "scalars", "INSTALL_HINT"]
