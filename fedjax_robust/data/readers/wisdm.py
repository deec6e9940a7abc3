"""WISDM v1.1 raw accelerometer file (``WISDM_ar_v1.1_raw.txt``): FedCAP's WISDM dataset.

FedCAP (specs/fedcap.md §4.1, ambiguity 14) uses the FedCHAR generator, whose steps this
reader reproduces in numpy (the generator uses pandas/scipy/sklearn):

1. parse the lines ``user,activity,timestamp,x,y,z;``. A line that is not exactly six
   non-empty comma-separated fields with an integer user, one of the six activities and
   finite x/y/z (e.g. two records run together on one line) is skipped and counted; the
   count is logged (the generator's ``read_csv(on_bad_lines='skip')`` + ``dropna()``);
2. the users, sorted by id, are the natural clients (36 in the real file); each user's
   rows stay in file order;
3. per user, non-overlapping windows of 200 rows (step 200) start at 0, 200, ... while
   ``start < n - 200`` (the generator's ``range(0, n - 200, 200)``, so a last window
   ending exactly at the final row is not used); label = the most common activity of the
   window (ties: the alphabetically first name, as ``scipy.stats.mode`` on strings);
   values are raw (no normalisation). Labels index ``WISDM_ACTIVITIES`` (Walking,
   Jogging, Sitting, Standing, Upstairs, Downstairs);
4. one ``RandomState(seed)`` (seed 1): every user's windows are shuffled in user order
   (``np.random.choice(n, n, replace=False)``), then, in a second pass over the users,
   split 75/25 as sklearn's ``train_test_split(train_size=0.75, shuffle=True)`` does with
   the global numpy RNG (``perm = permutation(n)``, test = ``perm[:n - floor(0.75 n)]``,
   train = the rest, in that order).

A window is stored NHWC as ``[1, 200, 3]`` (H = 1, W = time, C = x/y/z), the input of
``HARCNN`` (the artifact's ``(3, 1, 200)`` NCHW). The per-sample user index (position in
the sorted user ids) is returned as ``train_groups``/``test_groups`` for the ``natural``
partition; ``data.client_split = "source"`` keeps this reader's per-user 75/25 split.
Accepted layouts: the text file (also inside ``WISDM_ar_v1.1/``) or the official
``WISDM_ar_latest.tar.gz`` archive (read as a stream), or the text file gzipped.
"""

from __future__ import annotations

import gzip
import io
import math
import tarfile
import zlib
from pathlib import Path

import numpy as np

from fedjax_robust.data.errors import DatasetFormatError
from fedjax_robust.data.readers.base import ReadResult, Reader, logger

WISDM_ACTIVITIES = ("Walking", "Jogging", "Sitting", "Standing", "Upstairs", "Downstairs")
WISDM_RAW_FILE = "WISDM_ar_v1.1_raw.txt"
WISDM_ARCHIVES = ("WISDM_ar_latest.tar.gz", "WISDM_ar_v1.1_raw.txt.gz")
_ACTIVITY_INDEX = {a: i for i, a in enumerate(WISDM_ACTIVITIES)}
# Tie-break order of scipy.stats.mode on strings: the alphabetically smallest name wins.
_ALPHABETICAL = np.array(sorted(range(len(WISDM_ACTIVITIES)), key=lambda i: WISDM_ACTIVITIES[i]))


def parse_wisdm_lines(lines) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """Parses raw WISDM lines (str or bytes) into rows; malformed lines are skipped.

  Returns:
    ``(users int64 [n], activities int64 [n] (index into WISDM_ACTIVITIES), xyz float64
    [n, 3], number of malformed lines skipped)``. Blank lines are ignored, not counted.
  """
  users, acts, xyz = [], [], []
  bad = 0
  for line in lines:
    if isinstance(line, bytes):
      line = line.decode("latin-1")
    line = line.strip()
    if not line:
      continue
    fields = line.split(",")
    if len(fields) != 6:
      bad += 1
      continue
    user, activity, stamp, x, y, z = (f.strip() for f in fields)
    z = z.replace(";", "").strip()
    try:
      if not stamp or activity not in _ACTIVITY_INDEX:
        raise ValueError
      u = int(user)
      v = (float(x), float(y), float(z))
      if not all(map(math.isfinite, v)):
        raise ValueError
    except ValueError:
      bad += 1
      continue
    users.append(u)
    acts.append(_ACTIVITY_INDEX[activity])
    xyz.append(v)
  return (np.asarray(users, np.int64), np.asarray(acts, np.int64),
          np.asarray(xyz, np.float64).reshape(-1, 3), bad)


def window_user(acts: np.ndarray, xyz: np.ndarray, window: int = 200,
                step: int = 200) -> tuple[np.ndarray, np.ndarray]:
  """One user's rows (file order) -> windows ``[n_w, 1, window, 3]`` float32 and mode labels.

  Starts are ``range(0, n - window, step)`` (the FedCHAR generator's loop).
  """
  starts = np.arange(0, max(len(acts) - window, 0), step)
  if len(starts) == 0:
    return np.zeros((0, 1, window, 3), np.float32), np.zeros(0, np.int64)
  rows = starts[:, None] + np.arange(window)[None, :]
  x = xyz[rows].astype(np.float32)[:, None, :, :]
  counts = np.zeros((len(starts), len(WISDM_ACTIVITIES)), np.int64)
  np.add.at(counts, (np.repeat(np.arange(len(starts)), window), acts[rows].ravel()), 1)
  labels = _ALPHABETICAL[np.argmax(counts[:, _ALPHABETICAL], axis=1)]
  return x, labels.astype(np.int64)


def build_wisdm_clients(users: np.ndarray, acts: np.ndarray, xyz: np.ndarray, window: int = 200,
                        step: int = 200, train_size: float = 0.75, seed: int = 1) -> ReadResult:
  """Windows, per-user shuffle and 75/25 split of parsed rows (steps 2-4 of the module docstring)."""
  ids = np.unique(users)
  order = np.argsort(users, kind="stable")
  bounds = np.searchsorted(users[order], ids)
  per_user = []
  for k, uid in enumerate(ids):
    rows = order[bounds[k]:bounds[k + 1] if k + 1 < len(ids) else len(order)]
    xw, yw = window_user(acts[rows], xyz[rows], window, step)
    if len(yw) < 2:  # the generator's train_test_split cannot split it (absent in the real file)
      logger.warning("wisdm: user %d has %d rows -> %d windows of %d; dropped", uid, len(rows), len(yw), window)
      continue
    per_user.append((str(uid), xw, yw))
  if not per_user:
    raise DatasetFormatError(f"no WISDM user has at least 2 windows of {window} rows")
  rs = np.random.RandomState(seed)
  shuffled = []
  for name, xw, yw in per_user:  # pass 1: np.random.choice(n, n, replace=False) per user
    perm = rs.permutation(len(yw))
    shuffled.append((name, xw[perm], yw[perm]))
  parts = {"train": ([], [], []), "test": ([], [], [])}
  for g, (name, xw, yw) in enumerate(shuffled):  # pass 2: train_test_split per user
    n = len(yw)
    n_train = int(math.floor(train_size * n))
    n_test = n - n_train
    perm = rs.permutation(n)
    for split, idx in (("train", perm[n_test:]), ("test", perm[:n_test])):
      xs, ys, gs = parts[split]
      xs.append(xw[idx])
      ys.append(yw[idx])
      gs.append(np.full(len(idx), g, np.int64))
  cat = {s: tuple(np.concatenate(a) for a in parts[s]) for s in parts}
  (xtr, ytr, gtr), (xte, yte, gte) = cat["train"], cat["test"]
  return ReadResult(xtr, ytr, xte, yte, class_names=WISDM_ACTIVITIES, train_groups=gtr,
                    test_groups=gte, group_names=[name for name, _, _ in per_user])


class WisdmRawReader(Reader):
  """``WISDM_ar_v1.1_raw.txt`` (plain, or inside ``WISDM_ar_latest.tar.gz``) -> windows per user.

  Args:
    window, step: window length and stride in rows (FedCAP / FedCHAR: 200, 200).
    train_size: per-user train fraction (0.75).
    seed: ``RandomState`` seed of the per-user shuffle and split (FedCHAR: 1).
  """

  name = "wisdm_raw"

  def __init__(self, window: int = 200, step: int = 200, train_size: float = 0.75, seed: int = 1):
    if window < 1 or step < 1:
      raise ValueError(f"window and step must be >= 1, got {window}, {step}")
    if not 0.0 < train_size < 1.0:
      raise ValueError(f"train_size must be in (0, 1), got {train_size}")
    self.window, self.step, self.train_size, self.seed = int(window), int(step), float(train_size), int(seed)

  def key(self) -> str:
    return f"wisdm_raw:v1:w{self.window}:s{self.step}:t{self.train_size}:seed{self.seed}"

  def locate(self, directory):
    if directory is None:
      return None
    for candidate in (directory / WISDM_RAW_FILE, directory / "WISDM_ar_v1.1" / WISDM_RAW_FILE):
      if candidate.is_file():
        return [candidate]
    for name in WISDM_ARCHIVES:
      if (directory / name).is_file():
        return [directory / name]
    return None

  @staticmethod
  def _raw_bytes(path: Path) -> bytes:
    if path.name.endswith(".txt"):
      return path.read_bytes()
    try:
      if path.name.endswith(".txt.gz"):
        return gzip.decompress(path.read_bytes())
      with tarfile.open(path, "r|*") as tf:
        for m in tf:
          if m.isfile() and Path(m.name).name == WISDM_RAW_FILE:
            return tf.extractfile(m).read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
      raise DatasetFormatError(f"{path}: corrupted or truncated archive ({e})") from e
    raise DatasetFormatError(f"{path}: the archive holds no {WISDM_RAW_FILE}")

  def read(self, paths, spec, strict_checksums=False):
    del strict_checksums  # no official checksum is published for the raw file
    path = Path(paths[0])
    data = self._raw_bytes(path)
    users, acts, xyz, bad = parse_wisdm_lines(io.BytesIO(data))
    total = len(users) + bad
    if len(users) == 0:
      raise DatasetFormatError(f"{path}: no valid 'user,activity,timestamp,x,y,z;' line ({bad} malformed)")
    if bad:
      logger.warning("wisdm: skipped %d malformed line(s) of %d in %s", bad, total, path)
    result = build_wisdm_clients(users, acts, xyz, self.window, self.step, self.train_size, self.seed)
    logger.info("wisdm: %d rows, %d users -> %d train / %d test windows of %d", len(users),
                len(result.group_names), len(result.y_train), len(result.y_test), self.window)
    if tuple(result.x_train.shape[1:]) != tuple(spec.image_shape):
      raise DatasetFormatError(f"{path}: windows are {result.x_train.shape[1:]}, expected {spec.image_shape}")
    return result

  def instructions(self, folder):
    return (f"the WISDM v1.1 raw file {WISDM_RAW_FILE} (from the official WISDM_ar_latest.tar.gz, "
            f"https://www.cis.fordham.edu/wisdm/dataset.php) in {folder}/, or the archive "
            f"{WISDM_ARCHIVES[0]} itself")
