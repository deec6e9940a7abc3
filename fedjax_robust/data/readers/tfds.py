"""tensorflow-datasets as an optional source, without ever blocking on the network.

Why so guarded: offline, ``tfds.load`` spends ~200 s in download retries before it
fails, and preparing data needs TensorFlow. So by default only an *already prepared*
copy is read (``<tfds_dir>/<name>/<version>/dataset_info.json``) through
``builder_from_directory(...).as_data_source`` (works without TensorFlow); a download
is attempted only when the caller opts in with ``allow_download=True``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fedjax_robust.data.errors import DatasetFormatError
from fedjax_robust.data.readers.base import ReadResult, Reader


def import_tfds():
  """The tensorflow_datasets module, or None when it cannot be imported."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except Exception:  # noqa: BLE001 - any import failure means "not available".
    return None
  return tfds


def tfds_data_dirs(extra: list[Path | str | None] = ()) -> list[Path]:
  """Candidate tfds data folders: explicit ones, ``$TFDS_DATA_DIR``, ``~/tensorflow_datasets``."""
  dirs = [Path(d).expanduser() for d in extra if d]
  if os.environ.get("TFDS_DATA_DIR"):
    dirs.append(Path(os.environ["TFDS_DATA_DIR"]).expanduser())
  dirs.append(Path("~/tensorflow_datasets").expanduser())
  out = []
  for d in dirs:
    if d not in out:
      out.append(d)
  return out


def _version_key(p: Path):
  return tuple(int(t) if t.isdigit() else 0 for t in p.name.split("."))


def _records_to_arrays(source, where: str):
  n = len(source)
  records = [source[i] for i in range(n)]
  try:
    x = np.stack([np.asarray(r["image"]) for r in records])
    y = np.asarray([int(r["label"]) for r in records], np.int64)
  except (KeyError, TypeError, ValueError) as e:
    raise DatasetFormatError(f"{where}: records lack 'image'/'label' ({e})") from e
  return x, y


class TfdsReader(Reader):
  """Reads a prepared tfds dataset folder (no network, no TensorFlow)."""

  name = "tfds"

  def __init__(self, tfds_name: str):
    self.tfds_name = tfds_name

  def key(self):
    return f"tfds:{self.tfds_name}"

  def locate(self, directory):
    if directory is None:
      return None
    base = directory / self.tfds_name
    if not base.is_dir():
      return None
    versions = sorted((p for p in base.iterdir() if (p / "dataset_info.json").is_file()),
                      key=_version_key)
    return [versions[-1]] if versions else None

  def read(self, paths, spec, strict_checksums=False):
    tfds = import_tfds()
    if tfds is None:
      raise DatasetFormatError("tensorflow_datasets is not importable")
    try:
      builder = tfds.builder_from_directory(str(paths[0]))
      x_tr, y_tr = _records_to_arrays(builder.as_data_source(split="train"), str(paths[0]))
      x_te, y_te = _records_to_arrays(builder.as_data_source(split="test"), str(paths[0]))
    except DatasetFormatError:
      raise
    except Exception as e:  # noqa: BLE001 - tfds raises many types; report them uniformly.
      raise DatasetFormatError(f"tfds could not read {paths[0]}: {e.__class__.__name__}: {e}") from e
    return ReadResult(x_tr, y_tr, x_te, y_te)

  def instructions(self, folder):
    return f"a prepared tfds dataset {folder}/{self.tfds_name}/<version>/ (tfds data_dir layout)"


def download_with_tfds(tfds_name: str, data_dir: Path) -> ReadResult:
  """Downloads and prepares through ``tfds.load`` (needs network and TensorFlow)."""
  tfds = import_tfds()
  if tfds is None:
    raise RuntimeError("tensorflow_datasets is not importable (pip install 'fedjax_robust[tfds]')")
  splits = tfds.load(tfds_name, split=["train", "test"], batch_size=-1, as_supervised=True,
                     data_dir=str(data_dir), download=True)
  (x_tr, y_tr), (x_te, y_te) = tfds.as_numpy(splits)
  return ReadResult(np.asarray(x_tr), np.asarray(y_tr, np.int64), np.asarray(x_te),
                    np.asarray(y_te, np.int64))
