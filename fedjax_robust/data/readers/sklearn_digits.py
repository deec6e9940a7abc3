"""scikit-learn's bundled ``digits`` (1,797 8x8 grey images, values 0..16).

Why it exists: it is the only real image-classification set that works offline with
no files, so CI can run every experiment path on real data. sklearn has no official
split, so a fixed, stratified 80/20 split is made here in pure numpy (independent of
the sklearn version's RNG conventions).
"""

from __future__ import annotations

import numpy as np

from fedjax_robust.data.readers.base import ReadResult, Reader

DIGITS_SPLIT_SEED = 20240601
DIGITS_TEST_FRACTION = 0.2


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
  """Sorted train/test index arrays with ``round(test_fraction * n_c)`` test rows per class."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == c))
    n_test = int(round(test_fraction * len(idx)))
    test.append(idx[:n_test])
    train.append(idx[n_test:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


class SklearnDigitsReader(Reader):
  name = "sklearn_digits"
  source = "sklearn.datasets.load_digits"
  builtin = True

  def key(self):
    return f"sklearn_digits:{DIGITS_SPLIT_SEED}:{DIGITS_TEST_FRACTION}"

  def locate(self, directory):
    return []  # Nothing on disk to locate: the data ships with scikit-learn.

  def read(self, paths, spec, strict_checksums=False):
    from sklearn.datasets import load_digits  # Imported lazily: sklearn import is slow.

    d = load_digits()
    x = d.images.astype(np.uint8)[..., None]  # Values are integers 0..16.
    y = d.target.astype(np.int64)
    tr, te = stratified_split(y, DIGITS_TEST_FRACTION, DIGITS_SPLIT_SEED)
    return ReadResult(x[tr], y[tr], x[te], y[te], class_names=[str(i) for i in range(10)])

  def instructions(self, folder):
    return "nothing: digits ships with scikit-learn (pip install scikit-learn)"
