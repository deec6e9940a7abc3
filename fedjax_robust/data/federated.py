"""The federated dataset: per-client arrays stacked and padded along a client axis.

Why padded stacks: the round engine maps one client kernel over a leading client
axis (`vmap`/`shard_map`), so every client's data must share one static shape.
Client ``k`` owns rows ``[:n_train[k]]`` of ``x_train[k]``; the rest is zero
padding that the engine masks out (padded local steps are exact no-ops).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class FederatedData:
  """Per-client train/test arrays padded to ``[clients, n_max, *feature_shape]``.

  Attributes:
    name: dataset name (e.g. ``"digits"``).
    num_classes: number of label classes.
    x_train: float32 ``[K, n_max, *feature_shape]`` normalised features, NHWC for images.
    y_train: int32 ``[K, n_max]`` labels (padding rows are 0).
    n_train: int32 ``[K]`` true number of training samples of each client.
    x_test, y_test, n_test: the same for each client's own test split.
    x_global_test: float32 ``[N, *feature_shape]`` the global (server-side) test set.
    y_global_test: int32 ``[N]``.
    client_train_indices: list of K int64 arrays, indices into the source pool
      (recorded so a partition can be saved, reloaded and inspected).
    client_test_indices: same for the per-client test splits.
    info: free-form provenance (source that served the data, partition params, ...).
    train_schedule: optional :class:`~fedjax_robust.data.dynamics.TrainSchedule` (data dynamics, FedVSA
      Table 5): client ``k``'s rows are base rows first, then fresh rows revealed over the rounds, and the engine
      trains round ``t`` on the first ``revealed_counts(n_train, schedule, t)[k]`` rows; ``None`` = all rows
      from the start.
  """

  name: str
  num_classes: int
  x_train: np.ndarray
  y_train: np.ndarray
  n_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  n_test: np.ndarray
  x_global_test: np.ndarray
  y_global_test: np.ndarray
  client_train_indices: list = dataclasses.field(default_factory=list)
  client_test_indices: list = dataclasses.field(default_factory=list)
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  train_schedule: Any = None

  @property
  def num_clients(self) -> int:
    return int(self.x_train.shape[0])

  @property
  def feature_shape(self) -> tuple[int, ...]:
    return tuple(self.x_train.shape[2:])

  def label_histograms(self, split: str = "train") -> np.ndarray:
    """``[K, num_classes]`` label counts of each client's train or test split."""
    y, n = (self.y_train, self.n_train) if split == "train" else (self.y_test, self.n_test)
    hist = np.zeros((self.num_clients, self.num_classes), np.int64)
    for k in range(self.num_clients):
      hist[k] = np.bincount(y[k, : n[k]], minlength=self.num_classes)
    return hist


def stack_padded(arrays: list[np.ndarray], dtype=None) -> tuple[np.ndarray, np.ndarray]:
  """Stacks ragged per-client arrays into ``[K, n_max, ...]`` zero padding plus counts."""
  counts = np.asarray([len(a) for a in arrays], np.int32)
  n_max = max(int(counts.max()), 1)
  first = arrays[0]
  out = np.zeros((len(arrays), n_max) + first.shape[1:], dtype or first.dtype)
  for k, a in enumerate(arrays):
    out[k, : len(a)] = a
  return out, counts
