"""Data dynamics (FedVSA Table 5, specs/fedvsa.md §4.3(d)): "fresh" labels whose data arrive during training.

A fraction α of the labels is fresh: ``round(α C)`` labels drawn by seed. The other (base) labels are partitioned
over all clients with the run's partition (σ or Dirichlet, on the base-label data only). Each fresh label is cut
into ``2N/C`` equal shards given to random distinct clients; those rows start hidden, and from FL round
``start_round`` on every client reveals ``min(Δ, remaining)`` of its hidden fresh rows per round.

How it stays one compiled program: the builder orders each client's training rows base first, then its fresh
rows (in a seeded random order), so the rows a client may use at round t are a PREFIX of its padded rows, of length

    n_t = min(n_total, n_base + Δ · max(0, t − start_round + 1))        (t = 1, 2, ... the FL round)

and n_0 = n_base (before round 1: pre-training, the initial evaluation). The engine replaces the gathered cohort's
``n`` by ``n_t`` (:func:`revealed_counts`, a traced function of the round counter); rows past ``n`` are padding to
the local loop, so nothing else changes: the same program, padding no-ops, determinism and resumption (the
schedule depends on the state's round counter only).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

DEFAULTS = {"fresh_fraction": 0.0, "fresh_delta": 50, "fresh_start_round": 1}


class TrainSchedule(NamedTuple):
  """How many of each client's training rows exist at each round (a pytree: an argument of the compiled round).

  ``n_base``: ``[K]`` rows available from the start (base labels); the client's ``n`` (all rows) is the total.
  ``delta``: rows revealed per client per round; ``start_round``: the first FL round (1-indexed) that reveals.
  """

  n_base: Any  # [K] int32
  delta: Any  # int32 scalar
  start_round: Any  # int32 scalar


class DynamicsConfig(NamedTuple):
  fresh_fraction: float
  fresh_delta: int
  fresh_start_round: int


def revealed_counts(n_total, schedule: TrainSchedule, fl_round):
  """``n_t`` of every client at FL round ``fl_round`` (1-indexed; 0 = before round 1). Works on numpy and jax
  arrays (traced rounds included)."""
  if isinstance(fl_round, (int, np.integer)) and isinstance(n_total, np.ndarray):
    xp = np
  else:
    import jax.numpy as xp
  n_base = xp.minimum(schedule.n_base, n_total)
  fresh = n_total - n_base
  delta = xp.maximum(schedule.delta, 1)
  steps = xp.maximum(xp.asarray(fl_round) - schedule.start_round + 1, 0)
  need = (fresh + delta - 1) // delta  # rounds to reveal everything; bounds the product (no int32 overflow)
  return (n_base + xp.minimum(fresh, delta * xp.minimum(steps, need))).astype(xp.asarray(n_total).dtype)


def dynamics_from_config(cfg: Any) -> Optional[DynamicsConfig]:
  """The ``data.dynamics`` block (``fresh_fraction`` α, ``fresh_delta`` Δ, ``fresh_start_round``), or ``None``
  when α = 0 (off). Δ = 0 or ``None`` reveals every fresh row at ``fresh_start_round`` (the spec's simpler
  alternative: fresh labels absent only during pre-training)."""
  get = (lambda k: cfg.get(k, DEFAULTS[k])) if cfg is not None else DEFAULTS.get
  alpha = float(get("fresh_fraction") or 0.0)
  if not 0.0 <= alpha < 1.0:
    raise ValueError(f"data.dynamics.fresh_fraction must be in [0, 1) (the share of fresh labels), got {alpha}")
  if alpha == 0.0:
    return None
  delta = get("fresh_delta")
  delta = 0 if delta is None else int(delta)
  start = int(get("fresh_start_round"))
  if delta < 0:
    raise ValueError(f"data.dynamics.fresh_delta must be >= 0 (0 = reveal everything at once), got {delta}")
  if start < 1:
    raise ValueError(f"data.dynamics.fresh_start_round must be >= 1 (FL rounds are 1-indexed; pre-training and "
                     f"round 0 see the base labels only), got {start}")
  return DynamicsConfig(alpha, delta, start)


def choose_fresh_labels(classes: np.ndarray, fraction: float, seed: int) -> np.ndarray:
  """``round(fraction * C)`` of ``classes`` (sorted), drawn by ``seed``; at least one, and at least one base label
  left."""
  classes = np.asarray(classes, np.int64)
  count = int(round(fraction * len(classes)))
  if not 1 <= count < len(classes):
    raise ValueError(f"data.dynamics.fresh_fraction={fraction} makes round({fraction} x {len(classes)}) = {count} "
                     f"fresh labels; need between 1 and {len(classes) - 1}")
  return np.sort(np.random.default_rng(seed).choice(classes, count, replace=False))


def fresh_shards(labels: np.ndarray, fresh: np.ndarray, num_clients: int, num_classes: int,
                 seed: int) -> tuple[list[np.ndarray], int]:
  """Each fresh label's rows (shuffled) cut into ``round(2N/C)`` (clipped to [1, N]) near-equal shards, given to
  distinct random clients. Returns every client's fresh rows (positions in ``labels``; a client's shards in a seeded
  random order) and the shards per label."""
  labels = np.asarray(labels, np.int64)
  per_label = int(min(num_clients, max(1, round(2 * num_clients / num_classes))))
  rng = np.random.default_rng(seed)
  mine: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for c in fresh:
    rows = rng.permutation(np.flatnonzero(labels == c))
    owners = rng.choice(num_clients, per_label, replace=False)
    for k, shard in zip(owners, np.array_split(rows, per_label)):
      mine[k].append(shard)
  out = [rng.permutation(np.concatenate(m)) if m else np.zeros(0, np.int64) for m in mine]
  return out, per_label


def dynamics_summary(dyn: DynamicsConfig, fresh: np.ndarray, base: np.ndarray, per_label: int,
                     n_base: np.ndarray, n_fresh: np.ndarray) -> dict:
  """What ``info["dynamics"]`` records: the labels, the schedule and when every fresh row is out."""
  full = (0 if not n_fresh.size or n_fresh.max() == 0 else
          dyn.fresh_start_round + (0 if dyn.fresh_delta == 0 else -(-int(n_fresh.max()) // dyn.fresh_delta) - 1))
  return {"fresh_fraction": dyn.fresh_fraction, "fresh_delta": dyn.fresh_delta,
          "fresh_start_round": dyn.fresh_start_round, "fresh_labels": fresh.tolist(), "base_labels": base.tolist(),
          "shards_per_fresh_label": per_label, "n_train_base": n_base.tolist(), "n_train_fresh": n_fresh.tolist(),
          "all_revealed_by_round": full}


def make_schedule(n_base: np.ndarray, dyn: DynamicsConfig, n_total: np.ndarray) -> TrainSchedule:
  """The numpy :class:`TrainSchedule` (Δ = 0: everything at once, stored as the largest fresh count)."""
  n_base = np.asarray(n_base, np.int32)
  delta = dyn.fresh_delta or max(int((np.asarray(n_total) - n_base).max()), 1)
  return TrainSchedule(n_base, np.int32(delta), np.int32(dyn.fresh_start_round))
