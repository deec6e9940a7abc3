"""``client_weights.npz``: the client x client mixing weights of a run's evaluated rounds.

Algorithms whose clients' models mix other clients' models report the round's weights as the ``[C, K]`` diagnostic
``client_weight_matrix`` (:mod:`fedjax_robust.algorithms.base`: row = receiving cohort member, column = contributing
client id, value = the contributor's weight in the receiver's model; FedCAP, FedFomo, FedCAC, FedAMP). A round record
(``metrics.jsonl``) keeps scalars and 1-D vectors only, and ``C x K`` numbers on every line would swamp it at
K = 100, so the run keeps the matrix of its evaluated rounds (every ``eval_every``-th, the last, ``eval.last_rounds``)
in one numpy archive in the run directory:

  ``round``   [R] int64: the rounds stored, increasing (1-indexed, as ``metrics.jsonl``'s ``round``)
  ``cohort``  [R, C] int64: each stored round's cohort, the rows' client ids (``metrics.jsonl``'s ``cohort``)
  ``matrix``  [R, C, K] float32: row ``i`` of round ``r`` is client ``cohort[r, i]``'s weights over ids 0..K-1

``np.load(path)`` reads it; :func:`square` turns a round into a ``[K, K]`` matrix by client id. The archive is
rewritten whole (through a temporary file, renamed, so a reader never sees half of one) after the 1st, 2nd, 4th,
8th, ... stored round, after each checkpoint and when the run ends: at most about twice the final file's bytes
written over the run (K = 100, 500 evaluated rounds: a 20 MB file), where rewriting it every round would write it
R/2 times over. A run that dies loses the rounds since the last write (its ``metrics.jsonl`` keeps their scalars), a
resumed run keeps those up to its checkpoint. Plain numpy, so plotting never imports JAX.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

FILE = "client_weights.npz"
KEY = "client_weight_matrix"  # the algorithms' diagnostic (fedjax_robust.algorithms.base.CLIENT_WEIGHT_MATRIX)


def save(path: str | Path, rounds: Sequence[int], cohorts: Sequence[np.ndarray], matrices: Sequence[np.ndarray]):
  """Writes the archive (module docstring) atomically: a reader never sees half a file."""
  if not len(rounds):
    raise ValueError("client_weights.save: no round to store")
  path = Path(path)
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a bare name
    np.savez(f, round=np.asarray(rounds, np.int64), cohort=np.stack(cohorts).astype(np.int64),
             matrix=np.stack(matrices).astype(np.float32))
  os.replace(tmp, path)


def load(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(round [R], cohort [R, C], matrix [R, C, K])`` of an archive :func:`save` wrote."""
  with np.load(Path(path)) as f:
    return f["round"], f["cohort"], f["matrix"]


def square(cohort: np.ndarray, matrix: np.ndarray, num_clients: int) -> np.ndarray:
  """One round's ``[C, K]`` rows placed at their receivers' ids: ``[K, K]`` (receiver x contributor), NaN rows for
  the clients that were not in the cohort (they received nothing that round)."""
  cohort = np.asarray(cohort, np.int64)
  matrix = np.asarray(matrix, np.float64)
  if matrix.shape != (len(cohort), num_clients):
    raise ValueError(f"a client weight matrix of shape {matrix.shape} for a cohort of {len(cohort)} and "
                     f"{num_clients} clients (expected {(len(cohort), num_clients)})")
  out = np.full((num_clients, num_clients), np.nan)
  out[cohort] = matrix
  return out


class Log:
  """The stored rounds of a run, kept in memory and written to ``path`` when their number doubles and on
  :meth:`flush` (``RunWriter``; module docstring).

  ``keep_through``: rounds of an existing archive to keep (a resumed run: those up to its checkpoint); an archive
  with no round to keep is deleted, so a fresh run never shows an earlier run's weights.
  """

  def __init__(self, path: str | Path, keep_through: int = 0):
    self.path = Path(path)
    self.rounds: list[int] = []
    self.cohorts: list[np.ndarray] = []
    self.matrices: list[np.ndarray] = []
    if self.path.exists():
      if keep_through > 0:
        rounds, cohorts, matrices = load(self.path)
        keep = rounds <= keep_through
        self.rounds, self.cohorts, self.matrices = rounds[keep].tolist(), list(cohorts[keep]), list(matrices[keep])
      if not self.rounds:
        self.path.unlink()
    self.written = len(self.rounds)  # rounds in the file on disk

  def add(self, round_index: int, cohort, matrix) -> None:
    self.rounds.append(int(round_index))
    self.cohorts.append(np.asarray(cohort, np.int64))
    self.matrices.append(np.asarray(matrix, np.float32))
    if len(self.rounds) >= 2 * self.written:
      self.flush()

  def flush(self) -> None:
    """Writes the rounds not on disk yet (rewriting the archive); nothing when there are none."""
    if len(self.rounds) > self.written:
      save(self.path, self.rounds, self.cohorts, self.matrices)
      self.written = len(self.rounds)
