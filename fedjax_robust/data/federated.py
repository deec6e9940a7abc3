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


def with_dataless_clients(data: FederatedData, count: int) -> FederatedData:
  """``data`` with ``count`` more clients that hold no rows, appended as ids ``K .. K + count - 1``.

  Why: in FedCC's code (specs/fedcc.md §2.6 [R]) the untargeted attackers own no partition; every round the
  server takes ``n - f`` benign clients from the ``K`` partitions and ``f`` crafted models besides, so no data is
  lost to the attackers, whereas attackers chosen among the partitions would take their clients' data out of
  training for good (not equivalent under non-IID). The new clients' train and test splits are empty (``n = 0``,
  zero padding of the existing shapes); the engine gives them a nominal aggregation weight
  (``Simulator(dataless_weight=...)``), since a weight of 0 means "must not count" to every rule.
  """
  count = int(count)
  if count < 0:
    raise ValueError(f"with_dataless_clients: count must be >= 0, got {count}")
  if count == 0:
    return data

  def grow(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, np.zeros((count,) + a.shape[1:], a.dtype)])

  empty = [np.zeros((0,), np.int64) for _ in range(count)]
  ids = list(range(data.num_clients, data.num_clients + count))
  schedule = data.train_schedule
  if schedule is not None:  # data dynamics: the new clients have no base rows either
    schedule = schedule._replace(n_base=grow(np.asarray(schedule.n_base)))
  return dataclasses.replace(
      data, x_train=grow(data.x_train), y_train=grow(data.y_train), n_train=grow(data.n_train),
      x_test=grow(data.x_test), y_test=grow(data.y_test), n_test=grow(data.n_test),
      client_train_indices=list(data.client_train_indices) + (empty if data.client_train_indices else []),
      client_test_indices=list(data.client_test_indices) + (empty if data.client_test_indices else []),
      info={**data.info, "dataless_clients": ids}, train_schedule=schedule)
