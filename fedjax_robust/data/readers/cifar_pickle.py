"""The CIFAR "python version" pickles (``cifar-10-batches-py``, ``cifar-100-python``).

These are the official, lossless CIFAR arrays, so they are preferred over image-folder
copies. Accepted layouts: the extracted folder, the batch files directly in the
folder, or the official ``.tar.gz`` archive (read without extracting). The pickles
are the official distribution format; only load archives you trust.
"""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import numpy as np

from fedjax_robust.data.errors import DatasetFormatError
from fedjax_robust.data.readers.base import ReadResult, Reader

_VARIANTS = {
    "cifar10": dict(folder="cifar-10-batches-py", archive="cifar-10-python.tar.gz",
                    train=tuple(f"data_batch_{i}" for i in range(1, 6)), test=("test_batch",),
                    label_key=b"labels", meta=("batches.meta", b"label_names")),
    "cifar100": dict(folder="cifar-100-python", archive="cifar-100-python.tar.gz",
                     train=("train",), test=("test",), label_key=b"fine_labels",
                     meta=("meta", b"fine_label_names")),
}


def _unpickle(data: bytes, where: str) -> dict:
  try:
    obj = pickle.loads(data, encoding="bytes")
  except Exception as e:  # noqa: BLE001 - any unpickling failure means a broken file.
    raise DatasetFormatError(f"{where}: not a readable CIFAR pickle ({e.__class__.__name__}: {e})") from e
  if not isinstance(obj, dict):
    raise DatasetFormatError(f"{where}: expected a dict, got {type(obj).__name__}")
  return obj


class CifarPickleReader(Reader):
  """Reads ``variant`` ('cifar10' or 'cifar100') from the official python pickles."""

  name = "cifar_pickle"

  def __init__(self, variant: str):
    if variant not in _VARIANTS:
      raise ValueError(f"unknown CIFAR variant {variant!r}; known: {sorted(_VARIANTS)}")
    self.variant = variant
    self.v = _VARIANTS[variant]

  def key(self):
    return f"cifar_pickle:{self.variant}"

  def _batch_names(self):
    return self.v["train"] + self.v["test"]

  def locate(self, directory):
    if directory is None:
      return None
    for folder in (directory / self.v["folder"], directory):
      paths = [folder / n for n in self._batch_names()]
      if all(p.is_file() for p in paths):
        return paths
    archive = directory / self.v["archive"]
    if archive.is_file():
      return [archive]
    return None

  def _read_blobs(self, paths: list[Path]) -> dict[str, bytes]:
    if len(paths) > 1:
      return {p.name: p.read_bytes() for p in paths}
    archive = paths[0]
    wanted = set(self._batch_names()) | {self.v["meta"][0]}
    blobs = {}
    try:
      with tarfile.open(archive, "r:*") as tf:
        for m in tf:
          base = m.name.rsplit("/", 1)[-1]
          if m.isfile() and base in wanted:
            blobs[base] = tf.extractfile(m).read()
    except (tarfile.TarError, OSError, EOFError) as e:
      raise DatasetFormatError(f"{archive}: corrupted or truncated archive ({e})") from e
    missing = [n for n in self._batch_names() if n not in blobs]
    if missing:
      raise DatasetFormatError(f"{archive}: archive lacks CIFAR batch files {missing}")
    return blobs

  def read(self, paths, spec, strict_checksums=False):
    blobs = self._read_blobs(paths)
    where = str(paths[0].parent if len(paths) > 1 else paths[0])
    out = []
    for names in (self.v["train"], self.v["test"]):
      xs, ys = [], []
      for n in names:
        d = _unpickle(blobs[n], f"{where}:{n}")
        if b"data" not in d or self.v["label_key"] not in d:
          raise DatasetFormatError(f"{where}:{n}: missing 'data' or {self.v['label_key']!r} entry")
        x = np.asarray(d[b"data"], np.uint8)
        y = np.asarray(d[self.v["label_key"]], np.int64)
        if x.ndim != 2 or x.shape[1] != 3072 or len(x) != len(y):
          raise DatasetFormatError(
              f"{where}:{n}: data has shape {x.shape} and {len(y)} labels; expected [N, 3072] and N")
        xs.append(x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(y)
      y = np.concatenate(ys)
      if len(y) and (y.min() < 0 or y.max() >= spec.num_classes):
        raise DatasetFormatError(f"{where}: labels outside [0, {spec.num_classes})")
      out += [np.ascontiguousarray(np.concatenate(xs)), y]
    class_names = None
    meta_name, meta_key = self.v["meta"]
    meta_blob = blobs.get(meta_name)
    if meta_blob is None and len(paths) > 1 and (paths[0].parent / meta_name).is_file():
      meta_blob = (paths[0].parent / meta_name).read_bytes()
    if meta_blob is not None:
      meta = _unpickle(meta_blob, f"{where}:{meta_name}")
      class_names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta.get(meta_key, [])] or None
    return ReadResult(*out, class_names=class_names)

  def instructions(self, folder):
    return (f"the official {self.v['archive']} (or its extracted {self.v['folder']}/ with "
            f"{', '.join(self._batch_names())}) in {folder}/")
