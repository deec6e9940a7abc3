"""LEAF json shards (FEMNIST): ``{users, num_samples, user_data: {user: {x, y}}}``.

Why: LEAF datasets carry a *natural* client (the writer), which is the point of
FEMNIST. The reader returns, besides images and labels, a per-sample writer id
(``train_groups``/``test_groups``, indices into the sorted writer names) that the
``natural`` partition turns into clients. Pixels are stored by LEAF as floats k/255
(white background = 1.0); they are converted back to exact uint8.
Accepted layouts: ``train/*.json`` + ``test/*.json`` (also under ``data/``), or a
``.tar.gz`` holding them (read as a stream).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import PurePosixPath

import numpy as np

from fedjax_robust.data.errors import DatasetFormatError
from fedjax_robust.data.readers.base import ReadResult, Reader


class LeafJsonReader(Reader):
  name = "leaf_json"

  def __init__(self, archives: tuple[str, ...] = ()):
    self.archives = tuple(archives)

  def locate(self, directory):
    if directory is None:
      return None
    for base in (directory, directory / "data"):
      tr, te = base / "train", base / "test"
      if tr.is_dir() and te.is_dir() and any(tr.glob("*.json")) and any(te.glob("*.json")):
        return sorted(tr.glob("*.json")) + sorted(te.glob("*.json"))
    for pattern in self.archives:
      matches = sorted(p for p in directory.glob(pattern) if p.is_file())
      if matches:
        return [matches[0]]
    return None

  @staticmethod
  def _split_of(name: str) -> str | None:
    parts = PurePosixPath(name).parts
    return parts[-2] if len(parts) >= 2 and parts[-2] in ("train", "test") else None

  def _shards(self, paths):
    if len(paths) == 1 and not paths[0].name.endswith(".json"):
      try:
        with tarfile.open(paths[0], "r|*") as tf:
          for m in tf:
            split = self._split_of(m.name)
            if m.isfile() and m.name.endswith(".json") and split:
              yield split, f"{paths[0]}:{m.name}", tf.extractfile(m).read()
      except (tarfile.TarError, OSError, EOFError) as e:
        raise DatasetFormatError(f"{paths[0]}: corrupted or truncated archive ({e})") from e
    else:
      for p in paths:
        yield p.parent.name, str(p), p.read_bytes()

  def read(self, paths, spec, strict_checksums=False):
    per_split = {"train": {}, "test": {}}
    for split, where, blob in self._shards(paths):
      try:
        d = json.loads(blob)
        for user in d["users"]:
          u = d["user_data"][user]
          per_split[split].setdefault(user, []).append((u["x"], u["y"]))
      except (ValueError, KeyError, TypeError) as e:
        raise DatasetFormatError(f"{where}: not a LEAF json shard ({e.__class__.__name__}: {e})") from e
    if not per_split["train"] or not per_split["test"]:
      raise DatasetFormatError(f"{paths[0]}: LEAF data needs both train/ and test/ json shards")
    users = sorted(set(per_split["train"]) | set(per_split["test"]))
    uid = {u: i for i, u in enumerate(users)}
    h, w, _ = spec.image_shape
    out = []
    for split in ("train", "test"):
      xs, ys, gs = [], [], []
      for user in sorted(per_split[split]):
        for x, y in per_split[split][user]:
          x = np.asarray(x, np.float32)
          if x.ndim != 2 or x.shape[1] != h * w or len(x) != len(y):
            raise DatasetFormatError(f"user {user}: x has shape {x.shape}, expected [n, {h * w}]")
          xs.append(np.rint(x * 255.0).clip(0, 255).astype(np.uint8).reshape(-1, h, w, 1))
          ys.append(np.asarray(y, np.int64))
          gs.append(np.full(len(y), uid[user], np.int64))
      y = np.concatenate(ys)
      if y.min() < 0 or y.max() >= spec.num_classes:
        raise DatasetFormatError(f"{paths[0]}: labels outside [0, {spec.num_classes})")
      out.append((np.concatenate(xs), y, np.concatenate(gs)))
    (xtr, ytr, gtr), (xte, yte, gte) = out
    return ReadResult(xtr, ytr, xte, yte, train_groups=gtr, test_groups=gte, group_names=users)

  def instructions(self, folder):
    arch = " or ".join(self.archives) or "a .tar.gz"
    return f"LEAF json shards {folder}/train/*.json and {folder}/test/*.json, or {arch} in {folder}/"
