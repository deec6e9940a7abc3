"""Partitioners: split a labelled pool among K clients.

Every partitioner takes ``(labels, num_clients, seed, **params)`` and returns a list
of K int64 index arrays into the pool, each **sorted ascending**: the partition is a
set of indices per client, and any ordering (shuffling before the train/test split,
batching) is the job of later steps, which are seeded separately. Partitions are
disjoint; ``iid``, ``shards``, ``pat``, ``dirichlet`` and ``dirichlet_client`` (with
default sizes) also cover the whole pool. All randomness comes from
``np.random.default_rng(seed)``, so a seed fully determines the result. The exceptions
are FedCAC's ``pathological_sampled`` / ``dirichlet_sampled`` (specs/fedcac.md §3.2):
they draw each client's rows independently (clients may share rows, a list may repeat
a row) from a legacy ``RandomState(seed)`` stream, exactly as the reference code does,
and FedVSA's ``sigma`` with ``sigma_mode`` ``icpp_offset`` / ``variance_offset`` (specs/fedvsa.md
§4.3(b)): once a label's pool is exhausted it reuses rows other clients hold, as the ICPP code does.

Why several Dirichlet forms: papers disagree on what "Dir(alpha)" means (see the
FedCAC spec, A14): the per-class form (FedCC / PFLlib ``dir``: for each class,
proportions over clients ~ Dir(alpha 1_K)) skews both labels and client sizes, while
the client forms (each client's class mix q_k ~ Dir(alpha p) or Dir(alpha 1_C)) keep
client sizes fixed and only skew labels.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

logger = logging.getLogger("fedjax_robust.data")

IndexList = list[np.ndarray]


# ----------------------------------------------------------------------------- checks


def _as_labels(labels, num_clients: int) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
  if labels.size and not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
  if labels.size and labels.min() < 0:
    raise ValueError("labels must be non-negative")
  if int(num_clients) != num_clients or num_clients < 1:
    raise ValueError(f"num_clients must be a positive integer, got {num_clients}")
  if num_clients > labels.size:
    raise ValueError(f"num_clients={num_clients} is more than the {labels.size} samples in the pool")
  return labels.astype(np.int64)


def _num_classes(labels: np.ndarray, num_classes: int | None) -> int:
  inferred = int(labels.max()) + 1 if labels.size else 0
  if num_classes is None:
    return inferred
  if num_classes < inferred:
    raise ValueError(f"num_classes={num_classes} but labels go up to {inferred - 1}")
  return int(num_classes)


def _check_alpha(alpha: float) -> None:
  if math.isinf(alpha) and alpha > 0:
    raise ValueError("alpha=inf is the IID limit of the Dirichlet partition, which cannot be sampled; "
                     "use data.partition.name=iid for it")
  if not (alpha > 0 and math.isfinite(alpha)):
    raise ValueError(f"alpha must be > 0 and finite (Dirichlet concentration), got {alpha}")


def _check_min_size(min_size: int, num_clients: int, n: int) -> None:
  if min_size < 0:
    raise ValueError(f"min_size must be >= 0, got {min_size}")
  if min_size * num_clients > n:
    raise ValueError(f"min_size={min_size} x num_clients={num_clients} = {min_size * num_clients} "
                     f"exceeds the {n} samples in the pool")


def _finish(buckets: Sequence[Sequence[int] | np.ndarray]) -> IndexList:
  return [np.sort(np.asarray(b, np.int64)) for b in buckets]


def _safe_dirichlet(rng: np.random.Generator, conc: np.ndarray) -> np.ndarray:
  """Dir(conc) that never returns NaN: at tiny concentrations all mass may underflow,
  in which case the limit distribution (all mass on one component) is returned."""
  p = rng.dirichlet(conc)
  s = p.sum()
  if not np.isfinite(s) or s <= 0:
    p = np.zeros_like(conc, dtype=np.float64)
    p[rng.choice(len(conc), p=conc / conc.sum())] = 1.0
    return p
  return p / s


# ----------------------------------------------------------------------------- IID / shards


def iid(labels, num_clients: int, seed: int) -> IndexList:
  """Random equal split: client sizes differ by at most one."""
  labels = _as_labels(labels, num_clients)
  perm = np.random.default_rng(seed).permutation(labels.size)
  return _finish(np.array_split(perm, num_clients))


def shards(labels, num_clients: int, seed: int, shards_per_client: int = 2) -> IndexList:
  """McMahan et al.'s pathological split.

  Sort by label (random order within a label), cut into ``K * shards_per_client``
  equal shards, give every client ``shards_per_client`` random shards. A client has
  at most ``shards_per_client`` classes when shard boundaries align with class
  boundaries (class sizes multiples of the shard size, as in MNIST 60k/200); a shard
  straddling two classes can add one more.
  """
  labels = _as_labels(labels, num_clients)
  if shards_per_client < 1:
    raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}")
  n_shards = num_clients * shards_per_client
  if n_shards > labels.size:
    raise ValueError(f"{n_shards} shards (num_clients x shards_per_client) exceed the "
                     f"{labels.size} samples in the pool")
  rng = np.random.default_rng(seed)
  order = rng.permutation(labels.size)
  order = order[np.argsort(labels[order], kind="stable")]
  pieces = np.array_split(order, n_shards)
  assign = rng.permutation(n_shards).reshape(num_clients, shards_per_client)
  return _finish([np.concatenate([pieces[s] for s in row]) for row in assign])


# ----------------------------------------------------------------------------- PFLlib pat


def pat(labels, num_clients: int, seed: int, classes_per_client: int = 2, balance: bool = True,
        min_size: int = 0, shuffle: bool = True, num_classes: int | None = None) -> IndexList:
  """PFLlib's ``pat`` (balanced pathological) partition, as reconstructed in FedCAP §4.1.

  Each client has ``classes_per_client`` class slots. Classes are handled in order;
  class ``c`` goes to the first ``ceil(K / C * classes_per_client)`` clients that still
  have a free slot, split evenly among them (``balance=True``; the last one takes the
  remainder) or with random sizes in ``[max(n/10, min_size/C), n)`` (``balance=False``,
  PFLlib's ``least_samples`` rule). The class-to-client grouping is deterministic:
  with K=20, C=10, 2 classes per client, clients 0-3 get classes {0,1}, 4-7 {2,3}, ...
  ``shuffle=True`` takes each class's samples in a seeded random order; ``shuffle=False``
  takes them in pool order, exactly like PFLlib.
  """
  labels = _as_labels(labels, num_clients)
  n_cls = _num_classes(labels, num_classes)
  if classes_per_client < 1:
    raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client}")
  if classes_per_client > n_cls:
    raise ValueError(f"classes_per_client={classes_per_client} exceeds num_classes={n_cls}")
  rng = np.random.default_rng(seed)
  slots = [classes_per_client] * num_clients
  group = int(np.ceil(num_clients / n_cls * classes_per_client))
  buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for c in range(n_cls):
    idx = np.flatnonzero(labels == c)
    if shuffle:
      idx = rng.permutation(idx)
    selected = [k for k in range(num_clients) if slots[k] > 0][:group]
    if not selected:
      raise ValueError(
          f"pat: no client has a free class slot left for class {c} (num_clients={num_clients}, "
          f"classes_per_client={classes_per_client}, num_classes={n_cls}); PFLlib's grouping "
          "needs more clients or more classes per client")
    s = len(selected)
    per = len(idx) / s
    if balance or s == 1:
      counts = [int(per)] * (s - 1)
    else:
      low, high = int(max(per / 10, min_size / n_cls)), int(per)
      counts = (rng.integers(low, high, s - 1).tolist() if high > low else [int(per)] * (s - 1))
    counts.append(len(idx) - sum(counts))
    start = 0
    for k, cnt in zip(selected, counts):
      buckets[k].append(idx[start:start + cnt])
      start += cnt
      slots[k] -= 1
  empty = [k for k in range(num_clients) if sum(len(b) for b in buckets[k]) == 0]
  if empty:
    raise ValueError(f"pat left clients {empty[:10]} without samples (num_clients={num_clients}, "
                     f"classes_per_client={classes_per_client}, num_classes={n_cls})")
  return _finish([np.concatenate(b) for b in buckets])


# ----------------------------------------------------------------------------- Dirichlet


def repair_min_size(buckets: list[np.ndarray], labels: np.ndarray, min_size: int) -> tuple[list[np.ndarray], int]:
  """Deterministically moves samples from the largest clients to those below ``min_size``.

  Why: at tiny alpha with many clients, redrawing may essentially never produce a
  partition with every client >= min_size, so the partitioner would hang. The repair
  takes samples of the donor's majority class (keeping the donor's skew) from the end
  of its list. Each move strictly lowers the total deficit, so it always terminates
  when ``K * min_size <= N``. Returns the new buckets and the number of moved samples.
  """
  buckets = [np.asarray(b, np.int64) for b in buckets]
  moved = 0
  while True:
    sizes = np.array([len(b) for b in buckets])
    low = int(np.argmin(sizes))
    need = min_size - sizes[low]
    if need <= 0:
      return buckets, moved
    donor = int(np.argmax(sizes))
    spare = sizes[donor] - min_size
    if spare <= 0:
      raise ValueError(f"cannot give every client {min_size} samples: pool too small")
    d = buckets[donor]
    major = np.bincount(labels[d]).argmax()
    pos = np.flatnonzero(labels[d] == major)[-min(need, spare):]
    keep = np.ones(len(d), bool)
    keep[pos] = False
    buckets[low] = np.concatenate([buckets[low], d[pos]])
    buckets[donor] = d[keep]
    moved += len(pos)


def dirichlet(labels, num_clients: int, seed: int, alpha: float = 0.5, min_size: int = 10,
              max_tries: int = 100, cap_at_mean: bool = False) -> IndexList:
  """Per-class Dirichlet (FedCC, PFLlib ``dir``, FedVSA's exact-split recommendation).

  For each class c: p_c ~ Dir(alpha * 1_K); class c's samples (random order) are cut
  at ``floor(cumsum(p_c)[:-1] * n_c)``. The whole draw is repeated (up to
  ``max_tries`` times) until every client has ``min_size`` samples; if no draw
  qualifies, :func:`repair_min_size` fixes the last one, so this always terminates,
  even at alpha = 0.001 with hundreds of clients.

  Args:
    cap_at_mean: PFLlib / IBM behaviour: a client already holding ``N / K`` samples
      gets no share of later classes (limits size imbalance).
  """
  labels = _as_labels(labels, num_clients)
  _check_alpha(alpha)
  _check_min_size(min_size, num_clients, labels.size)
  if max_tries < 1:
    raise ValueError(f"max_tries must be >= 1, got {max_tries}")
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  n, mean = labels.size, labels.size / num_clients
  conc = np.full(num_clients, float(alpha))
  for attempt in range(1, max_tries + 1):
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, np.int64)
    for c in classes:
      idx = rng.permutation(np.flatnonzero(labels == c))
      p = _safe_dirichlet(rng, conc)
      if cap_at_mean:
        p = p * (sizes < mean)
        p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
      cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
      for k, piece in enumerate(np.split(idx, cuts)):
        parts[k].append(piece)
        sizes[k] += len(piece)
    if sizes.min() >= min_size:
      if attempt > 1:
        logger.info("dirichlet(alpha=%g): min_size=%d met on draw %d", alpha, min_size, attempt)
      return _finish([np.concatenate(p) for p in parts])
  buckets, moved = repair_min_size([np.concatenate(p) for p in parts], labels, min_size)
  logger.warning("dirichlet(alpha=%g, K=%d): no draw in %d met min_size=%d; repaired by moving "
                 "%d of %d samples from the largest clients", alpha, num_clients, max_tries,
                 min_size, moved, n)
  return _finish(buckets)


def balanced_sizes(n: int, num_clients: int) -> np.ndarray:
  """``n`` split into K sizes differing by at most one (the first ones larger)."""
  return np.array([n // num_clients + (k < n % num_clients) for k in range(num_clients)], np.int64)


def dirichlet_client(labels, num_clients: int, seed: int, alpha: float = 0.5,
                     form: str = "prior", client_sizes: Sequence[int] | None = None,
                     min_size: int = 1, num_classes: int | None = None) -> IndexList:
  """Client-side Dirichlet: each client's class mix q_k is drawn, sizes are fixed.

  ``form='prior'`` (FedCAC paper): q_k ~ Dir(alpha * p) with p the pool's class
  frequencies (for balanced data alpha*p = (alpha/C) 1). ``form='symmetric'`` (FedCAC
  code, "alpha per class"): q_k ~ Dir(alpha * 1_C). Client k then draws
  ``client_sizes[k]`` samples (default: the pool split evenly, so the union is the
  pool) without replacement: counts ~ Multinomial(q_k restricted to classes with
  samples left); when a class runs out its share is redrawn over the remaining
  classes, so later clients partly absorb leftovers (unlike FedCAC's code, which
  samples clients independently with overlaps; this keeps the partition disjoint).
  """
  labels = _as_labels(labels, num_clients)
  _check_alpha(alpha)
  if form not in ("prior", "symmetric"):
    raise ValueError(f"dirichlet_client form must be 'prior' or 'symmetric', got {form!r}")
  n_cls = _num_classes(labels, num_classes)
  sizes = (balanced_sizes(labels.size, num_clients) if client_sizes is None
           else np.asarray(client_sizes, np.int64))
  if len(sizes) != num_clients or sizes.min() < 0:
    raise ValueError(f"client_sizes must be {num_clients} non-negative ints")
  if sizes.sum() > labels.size:
    raise ValueError(f"client_sizes sum to {sizes.sum()} > {labels.size} samples in the pool")
  if sizes.min() < min_size:
    raise ValueError(f"client size {sizes.min()} is below min_size={min_size} "
                     f"({labels.size} samples for {num_clients} clients)")
  rng = np.random.default_rng(seed)
  counts = np.bincount(labels, minlength=n_cls)
  prior = counts / counts.sum()
  conc = alpha * prior if form == "prior" else np.full(n_cls, float(alpha))
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(n_cls)]
  left = counts.copy()
  buckets = []
  for k in range(num_clients):
    q = np.zeros(n_cls)
    present = conc > 0
    q[present] = _safe_dirichlet(rng, conc[present])
    need, mine = int(sizes[k]), []
    while need > 0:
      w = q * (left > 0)
      if w.sum() <= 0:  # q's classes are exhausted: fall back to what is left.
        w = left.astype(np.float64)
      draw = np.minimum(rng.multinomial(need, w / w.sum()), left)
      for c in np.flatnonzero(draw):
        take = int(draw[c])
        mine.append(pools[c][left[c] - take:left[c]])
        left[c] -= take
      need -= int(draw.sum())
    buckets.append(np.concatenate(mine) if mine else np.zeros(0, np.int64))
  return _finish(buckets)


# ----------------------------------------------------------------------------- FedCAC's sampled partitions
#
# FedCAC's reference code (Fling's sampling functions, specs/fedcac.md §3.2): every client's samples are DRAWN
# from the pool independently of the other clients (two clients may share an image, a small class is sampled with
# replacement), so the result is not a disjoint partition and need not cover the pool. Each client gets exactly
# ``samples_per_client`` rows. The randomness is a legacy ``np.random.RandomState(seed)`` stream, consumed exactly
# as the spec describes, and the per-client class mix is drawn FIRST in that stream: running the same procedure
# with the same seed on the test split (``samples_per_client`` = 100 instead of 500) gives every client the same
# classes / the same q_i for its test rows (``data.client_split='per_split'``, builder.py).

SAMPLED_PARTITIONS = ("pathological_sampled", "dirichlet_sampled")


def _sampled_setup(labels, num_clients: int, samples_per_client: int | None,
                   num_classes: int | None) -> tuple[np.ndarray, int, int, list[np.ndarray]]:
  labels = _as_labels(labels, num_clients)
  n_cls = _num_classes(labels, num_classes)
  m = labels.size // num_clients if samples_per_client is None else samples_per_client
  if int(m) != m or m < 1:
    raise ValueError(f"samples_per_client must be a positive integer, got {samples_per_client}")
  pools = [np.flatnonzero(labels == c) for c in range(n_cls)]  # ascending pool order, as the reference lists them
  return labels, n_cls, int(m), pools


def _draw_class(rs: np.random.RandomState, pool: np.ndarray, count: int, cls: int) -> np.ndarray:
  """``count`` rows of one class: without replacement unless the class has fewer rows (spec §3.2, A15). Called
  even for ``count = 0``, which still consumes the stream (bit-exact with the reference)."""
  if count > 0 and pool.size == 0:
    raise ValueError(f"class {cls} has no sample in the pool but a client needs {count} of it")
  return rs.choice(pool, count, replace=bool(count > pool.size))


def pathological_sampled(labels, num_clients: int, seed: int, classes_per_client: int = 2,
                         samples_per_client: int | None = None, num_classes: int | None = None) -> IndexList:
  """FedCAC's pathological split (spec §3.2 "Pathological", A16): ``classes_per_client`` random classes per client.

  1. ``rs = RandomState(seed)``; 2. for every client, ALL clients first: ``rs.choice(C, classes_per_client,
  replace=False)`` (pairs may repeat across clients); 3. for every client, for each of its classes in the drawn
  order: ``int(m / classes_per_client)`` rows of that class with ``rs.choice`` (250 train / 50 test for m = 500 /
  100). ``samples_per_client`` = m (default: pool size // K). Rows are drawn per client independently: clients may
  share rows.
  """
  labels, n_cls, m, pools = _sampled_setup(labels, num_clients, samples_per_client, num_classes)
  if not 1 <= classes_per_client <= n_cls:
    raise ValueError(f"classes_per_client={classes_per_client} must be in [1, num_classes={n_cls}]")
  rs = np.random.RandomState(seed)
  chosen = [rs.choice(n_cls, classes_per_client, replace=False) for _ in range(num_clients)]
  per_class = m // classes_per_client
  return _finish([np.concatenate([_draw_class(rs, pools[c], per_class, int(c)) for c in row]) for row in chosen])


def dirichlet_counts(q: Sequence[float], m: int) -> np.ndarray:
  """A client's class counts from its class mix ``q`` (spec §3.2 "Dirichlet", step 2): for ``j < C-1``
  ``c_j = int(m q_j + 0.5)``, the last class takes ``m - s``; each count is clipped to ``[0, m - s]`` (``s`` = the
  running total), so the counts sum to exactly ``m``."""
  q = np.asarray(q, np.float64)
  counts, s = np.zeros(len(q), np.int64), 0
  for j in range(len(q)):
    c = int(m * q[j] + 0.5) if j < len(q) - 1 else m - s
    c = min(max(c, 0), m - s)
    counts[j] = c
    s += c
  return counts


def dirichlet_sampled(labels, num_clients: int, seed: int, alpha: float = 0.5,
                      samples_per_client: int | None = None, num_classes: int | None = None) -> IndexList:
  """FedCAC's Dirichlet split (spec §3.2 "Dirichlet", A14, A15): symmetric ``q_i ~ Dir(alpha 1_C)``, fixed sizes.

  1. ``rs = RandomState(seed)``; ``q = rs.dirichlet([alpha] * C, size=K)`` (K x C, drawn before any row);
  2. for every client i, for classes j = 0..C-1 in order: ``c_ij`` by :func:`dirichlet_counts` (the
  ``int(m q + 0.5)`` rounding, the last class takes the rest), then ``c_ij`` rows of class j with ``rs.choice``
  (without replacement unless the class has fewer rows; also called for ``c_ij = 0``). Every client ends with
  exactly m = ``samples_per_client`` rows (default: pool size // K); clients may share rows.
  """
  labels, n_cls, m, pools = _sampled_setup(labels, num_clients, samples_per_client, num_classes)
  _check_alpha(alpha)
  rs = np.random.RandomState(seed)
  q = rs.dirichlet([float(alpha)] * n_cls, size=num_clients)
  if not np.isfinite(q).all():
    raise ValueError(f"Dir(alpha={alpha}) underflowed to NaN for some client (alpha too small for float64)")
  buckets = []
  for i in range(num_clients):
    counts = dirichlet_counts(q[i], m)
    buckets.append(np.concatenate([_draw_class(rs, pools[j], int(counts[j]), j) for j in range(n_cls)]))
  return _finish(buckets)


# ----------------------------------------------------------------------------- quantity skew


def quantity_skew(labels, num_clients: int, seed: int, alpha: float = 0.5, dist: str = "dirichlet",
                  sigma: float = 1.0, min_size: int = 1) -> IndexList:
  """Skewed client sizes with IID labels.

  Size weights w ~ Dir(alpha 1_K) (``dist='dirichlet'``) or w_k = exp(N(0, sigma^2))
  (``dist='lognormal'``); client k gets ``min_size`` plus its largest-remainder share
  of the other ``N - K min_size`` samples, drawn from a random permutation of the pool.
  """
  labels = _as_labels(labels, num_clients)
  _check_min_size(min_size, num_clients, labels.size)
  rng = np.random.default_rng(seed)
  if dist == "dirichlet":
    _check_alpha(alpha)
    w = _safe_dirichlet(rng, np.full(num_clients, float(alpha)))
  elif dist == "lognormal":
    if not sigma >= 0:
      raise ValueError(f"sigma must be >= 0, got {sigma}")
    w = np.exp(rng.normal(0.0, sigma, num_clients))
    w = w / w.sum()
  else:
    raise ValueError(f"quantity_skew dist must be 'dirichlet' or 'lognormal', got {dist!r}")
  free = labels.size - num_clients * min_size
  raw = w * free
  extra = np.floor(raw).astype(np.int64)
  rest = free - extra.sum()
  extra[np.argsort(-(raw - extra), kind="stable")[:rest]] += 1
  sizes = min_size + extra
  perm = rng.permutation(labels.size)
  return _finish(np.split(perm, np.cumsum(sizes)[:-1]))


# ----------------------------------------------------------------------------- FedVSA sigma


SIGMA_MODES = ("gaussian_std", "icpp_offset", "variance_offset")


def sigma_label_skew(labels, num_clients: int, seed: int, sigma: float = 300.0,
                     classes_per_client: int = 2, min_size: int = 10,
                     num_classes: int | None = None, sigma_mode: str = "gaussian_std") -> IndexList:
  """FedVSA's σ partition (specs/fedvsa.md §4.3(b)); ``sigma_mode`` picks the reading of σ.

  ``"gaussian_std"`` (default, spec [R]): ``classes_per_client * K`` slots; each class
  fills an equal number of slots (``2K/C``; shuffled, no class twice in a client). Slot
  sizes r ~ max(min_size, round(Normal(mu, sigma^2))) with ``mu = N // slots``; a class
  whose slots ask for more than it has is scaled down proportionally (``max(min_size,
  floor(r * pool / sum r))``). Disjoint, but it need not cover the pool. σ is the
  standard deviation of the slot sizes, in samples. The realised std of slot sizes and
  of client sizes is logged (:func:`sigma_partition_stats`).

  ``"icpp_offset"`` (the ICPP code's ``noniid_equal_label_sigma_alpha``) and
  ``"variance_offset"`` (σ read literally as a variance): see :func:`_sigma_offset`.
  They are NOT disjoint once a label's pool runs out (samples are then reused).

  The classes are those present in ``labels`` (``num_classes``: ``0..num_classes-1``).
  """
  labels = _as_labels(labels, num_clients)
  if sigma_mode not in SIGMA_MODES:
    raise ValueError(f"unknown sigma_mode {sigma_mode!r}; use one of {list(SIGMA_MODES)}")
  if not (sigma >= 0 and math.isfinite(sigma)):
    raise ValueError(f"sigma must be >= 0 and finite, got {sigma}")
  if num_classes is None:
    classes = np.unique(labels)
  else:
    classes = np.arange(_num_classes(labels, num_classes))
  n_cls = len(classes)
  if sigma_mode != "gaussian_std":
    return _sigma_offset(labels, num_clients, seed, float(sigma), sigma_mode, classes_per_client, classes)
  if classes_per_client < 1 or classes_per_client > n_cls:
    raise ValueError(f"classes_per_client={classes_per_client} must be in [1, num_classes={n_cls}]")
  rng = np.random.default_rng(seed)
  n_slots = classes_per_client * num_clients
  slot_cls = np.resize(classes, n_slots)
  grid = None
  for _ in range(1000):
    cand = rng.permutation(slot_cls).reshape(num_clients, classes_per_client)
    if all(len(set(row)) == classes_per_client for row in cand):
      grid = cand
      break
  if grid is None:
    grid = _dedupe_rows(rng.permutation(slot_cls).reshape(num_clients, classes_per_client))
  mu = labels.size // n_slots
  r = np.maximum(min_size, np.rint(rng.normal(mu, sigma, grid.shape))).astype(np.int64)
  pools = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
  scaled = []
  for c in classes:
    mask = grid == c
    total, avail = r[mask].sum(), len(pools[c])
    if total > avail:
      if mask.sum() * min_size > avail:
        raise ValueError(f"class {c} has {avail} samples, fewer than {mask.sum()} slots x "
                         f"min_size={min_size}")
      scaled.append(int(c))
      r[mask] = np.maximum(min_size, np.floor(r[mask] * avail / total)).astype(np.int64)
      while r[mask].sum() > avail:  # min_size clamping can still overshoot; trim the largest.
        pos = np.argwhere(mask)[np.argmax(r[mask])]
        r[tuple(pos)] -= 1
  used = {c: 0 for c in classes}
  buckets = []
  for k in range(num_clients):
    mine = []
    for j, c in enumerate(grid[k]):
      mine.append(pools[c][used[c]:used[c] + r[k, j]])
      used[c] += r[k, j]
    buckets.append(np.concatenate(mine))
  logger.info("sigma partition (gaussian_std, sigma=%g, mu=%d, K=%d): realised std of slot sizes %.1f, of client "
              "sizes %.1f; classes scaled down to their pool: %s", sigma, mu, num_clients, r.std(),
              r.sum(1).std(), scaled or "none")
  return _finish(buckets)


def _sigma_offset(labels: np.ndarray, num_clients: int, seed: int, sigma: float, mode: str,
                  classes_per_client: int, classes: np.ndarray) -> IndexList:
  """The ICPP code's σ rule (``icpp_offset``) and its literal-variance reading (``variance_offset``).

  The classes are permuted; the first ``C // 2`` are "major", the rest "minor" (5 / 5 for
  C = 10). Client i gets the pair ``product(major, minor)[i mod len]`` (25 pairs for C = 10):
  ``n̄/2 + s`` samples of its major and ``n̄/2 − s`` of its minor label, with n̄ = ⌊N/K⌋ and
  s = σ (``icpp_offset``) or √σ (``variance_offset``). The minor count is rounded
  (``round(n̄/2 − s)``) and the major one is ``n̄ − minor``, so every client holds exactly n̄
  rows. σ with s ≥ n̄/2 leaves no minor sample and is refused (spec §4.3(b): the journal's
  σ ∈ {300, 600, 900} is infeasible under this rule at n̄ = 600).

  Sampling follows the code: without replacement from the label's pool while it lasts;
  once it is exhausted the shortfall is drawn from the label's other samples (rows other
  clients already hold), so the partition is then NOT disjoint (logged with the number of
  reused rows). A client never holds a row twice unless one slot asks for more rows than
  its label has.
  """
  if classes_per_client != 2:
    raise ValueError(f"sigma_mode={mode!r} gives every client one major and one minor label: classes_per_client "
                     f"must be 2, got {classes_per_client}")
  if len(classes) < 2:
    raise ValueError(f"sigma_mode={mode!r} needs at least 2 classes, got {len(classes)}")
  n_bar = labels.size // num_clients
  offset = sigma if mode == "icpp_offset" else math.sqrt(sigma)
  minor = int(round(n_bar / 2 - offset))
  if offset >= n_bar / 2 or minor < 1:
    what = "sigma" if mode == "icpp_offset" else "sqrt(sigma)"
    raise ValueError(
        f"sigma_mode={mode!r}: {what} = {offset:g} must be below n̄/2 = {n_bar / 2:g} (n̄ = ⌊{labels.size}/"
        f"{num_clients}⌋ = {n_bar}), else the minor label gets n̄/2 − {what} <= 0 samples (spec §4.3(b)); "
        "sigma on the sample-count scale (300/600/900) needs sigma_mode='gaussian_std'")
  major = n_bar - minor
  rng = np.random.default_rng(seed)
  perm = rng.permutation(classes)
  half = len(classes) // 2
  pairs = [(a, b) for a in perm[:half] for b in perm[half:]]
  pools = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
  used = {c: 0 for c in classes}
  reused = 0

  def take(c, count):
    nonlocal reused
    pool = pools[c]
    got = pool[used[c]:used[c] + count]
    used[c] += len(got)
    short = count - len(got)
    if short == 0:
      return got
    reused += short
    others = np.setdiff1d(pool, got)
    return np.concatenate([got, rng.choice(others, short, replace=short > len(others))])

  buckets = []
  for k in range(num_clients):
    a, b = pairs[k % len(pairs)]
    buckets.append(np.concatenate([take(a, major), take(b, minor)]))
  logger.info("sigma partition (%s, sigma=%g, n̄=%d): %d major / %d minor rows per client, %d label pairs", mode,
              sigma, n_bar, major, minor, len(pairs))
  if reused:
    logger.warning("sigma partition (%s): label pools ran out, %d rows were drawn again from samples other clients "
                   "hold: the partition is not disjoint", mode, reused)
  return _finish(buckets)


def sigma_partition_stats(labels, parts: Sequence[np.ndarray]) -> dict:
  """Realised statistics of a σ partition (spec §4.3(b): "log the realised std of slot sizes and of client
  sizes"): a slot is one (client, label) pair the client holds."""
  labels = np.asarray(labels, np.int64)
  n_cls = int(labels.max()) + 1 if labels.size else 0
  hist = label_histograms(labels, parts, n_cls)
  slots = hist[hist > 0]
  sizes = np.asarray([len(p) for p in parts])
  all_rows = np.concatenate(parts) if len(parts) else np.zeros(0, np.int64)
  return {"slot_size_std": float(slots.std()) if slots.size else 0.0,
          "slot_size_mean": float(slots.mean()) if slots.size else 0.0,
          "slot_size_min": int(slots.min()) if slots.size else 0,
          "slot_size_max": int(slots.max()) if slots.size else 0,
          "client_size_std": float(sizes.std()), "client_size_mean": float(sizes.mean()),
          "rows_shared": int(len(all_rows) - len(np.unique(all_rows)))}


def _dedupe_rows(grid: np.ndarray) -> np.ndarray:
  """Swaps entries until no row repeats a class (greedy; used when shuffling fails)."""
  grid = grid.copy()
  k, m = grid.shape
  for _ in range(k * m * k):
    bad = [(i, j) for i in range(k) for j in range(m) if list(grid[i]).count(grid[i, j]) > 1]
    if not bad:
      return grid
    i, j = bad[0]
    for i2 in range(k):
      for j2 in range(m):
        if i2 != i and grid[i2, j2] not in grid[i] and grid[i, j] not in grid[i2]:
          grid[i, j], grid[i2, j2] = grid[i2, j2], grid[i, j]
          break
      else:
        continue
      break
  raise ValueError("could not arrange the class slots without repeating a class in a client")


# ----------------------------------------------------------------------------- natural


def natural(labels, num_clients: int | None, seed: int, groups=None, min_size: int = 1) -> IndexList:
  """One client per natural group (e.g. FEMNIST writer) with at least ``min_size`` samples.

  ``num_clients=None`` keeps every such group (in group-id order); a smaller number
  keeps a seeded random subset of groups (in group-id order). ``labels`` only fixes
  the pool size.
  """
  if groups is None:
    raise ValueError("the natural partition needs per-sample group ids (dataset has none)")
  groups = np.asarray(groups, np.int64)
  if groups.shape != np.shape(labels):
    raise ValueError(f"groups shape {groups.shape} != labels shape {np.shape(labels)}")
  ids, counts = np.unique(groups, return_counts=True)
  ids = ids[counts >= min_size]
  if num_clients is not None:
    _as_labels(labels, num_clients)
    if num_clients > len(ids):
      raise ValueError(f"num_clients={num_clients} but only {len(ids)} natural groups have "
                       f">= {min_size} samples")
    ids = np.sort(np.random.default_rng(seed).choice(ids, num_clients, replace=False))
  return _finish([np.flatnonzero(groups == g) for g in ids])


def default_class_groups(num_classes: int) -> list[list[int]]:
  """EMNIST ByClass (62 classes): digits 0-9, uppercase 10-35, lowercase 36-61; otherwise 3 near-equal blocks."""
  if num_classes == 62:
    return [list(range(10)), list(range(10, 36)), list(range(36, 62))]
  return [b.tolist() for b in np.array_split(np.arange(num_classes), 3) if len(b)]


def group(labels, num_clients: int, seed: int, class_groups=None, dominant_fraction: float = 0.8,
          num_classes: int | None = None) -> IndexList:
  """FedCAP's EMNIST "group" partition (spec §4.1, after SCAFFOLD's "20% IID + 80% sorted").

  Classes are split into groups (:func:`default_class_groups`), clients into as many
  contiguous near-equal blocks (100 clients, 3 groups -> 34/33/33). For every class, a
  seeded random ``dominant_fraction`` of its samples goes to the clients of the block
  that owns the class, split evenly in index order; the remaining samples of all classes
  are shuffled together and split evenly over all clients (the IID part).
  """
  labels = _as_labels(labels, num_clients)
  c = _num_classes(labels, num_classes)
  groups = default_class_groups(c) if class_groups is None else [list(map(int, g)) for g in class_groups]
  flat = sorted(k for g in groups for k in g)
  if flat != list(range(c)):
    raise ValueError(f"class_groups must cover the classes 0..{c - 1} exactly once, got {groups}")
  if not 0.0 <= dominant_fraction <= 1.0:
    raise ValueError(f"dominant_fraction must be in [0, 1], got {dominant_fraction}")
  if num_clients < len(groups):
    raise ValueError(f"the group partition needs at least one client per group: {num_clients} clients, "
                     f"{len(groups)} groups")
  rng = np.random.default_rng(seed)
  blocks = np.array_split(np.arange(num_clients), len(groups))
  buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  rest = []
  for block, classes in zip(blocks, groups):
    for k in classes:
      idx = rng.permutation(np.flatnonzero(labels == k))
      n_dom = int(round(dominant_fraction * len(idx)))
      for client, part in zip(block, np.array_split(np.sort(idx[:n_dom]), len(block))):
        buckets[client].append(part)
      rest.append(idx[n_dom:])
  iid_part = rng.permutation(np.concatenate(rest)) if rest else np.zeros(0, np.int64)
  for client, part in enumerate(np.array_split(iid_part, num_clients)):
    buckets[client].append(part)
  return _finish([np.sort(np.concatenate(b)) for b in buckets])


# ----------------------------------------------------------------------------- dispatch

PARTITIONERS: dict[str, Callable[..., IndexList]] = {
    "iid": iid,
    "shards": shards,
    "pat": pat,
    "dirichlet": dirichlet,
    "dirichlet_client": dirichlet_client,
    "quantity_skew": quantity_skew,
    "sigma": sigma_label_skew,
    "natural": natural,
    "group": group,
    "pathological_sampled": pathological_sampled,
    "dirichlet_sampled": dirichlet_sampled,
}


def partition_by_name(name: str, labels, num_clients: int, seed: int, **params) -> IndexList:
  """Calls the partitioner registered as ``name`` (ValueError listing the known ones)."""
  if name not in PARTITIONERS:
    raise ValueError(f"unknown partition {name!r}; known partitions: {sorted(PARTITIONERS)}")
  return PARTITIONERS[name](labels, num_clients, seed, **params)


# ----------------------------------------------------------------------------- helpers


def _check_ratio(train_ratio: float) -> None:
  if not 0.0 < train_ratio < 1.0:
    raise ValueError(f"train_ratio must be in (0, 1), got {train_ratio}")


def train_test_split_per_client(indices: Sequence[np.ndarray], train_ratio: float,
                                seed: int) -> tuple[IndexList, IndexList]:
  """Shuffles each client's indices and splits them into train / test.

  Client k keeps ``max(1, floor(train_ratio * n_k))`` (at most n_k) samples for
  training, like sklearn's ``train_test_split(train_size=ratio, shuffle=True)`` but
  with at least one training sample. Both outputs keep the **shuffled** order.
  """
  _check_ratio(train_ratio)
  rng = np.random.default_rng(seed)
  train, test = [], []
  for idx in indices:
    idx = rng.permutation(np.asarray(idx, np.int64))
    n_tr = min(len(idx), max(1, int(math.floor(train_ratio * len(idx) + 1e-9))))
    train.append(idx[:n_tr])
    test.append(idx[n_tr:])
  return train, test


def cap_samples_per_client(indices: Sequence[np.ndarray], max_samples: int, seed: int) -> IndexList:
  """Keeps a seeded random subset of at most ``max_samples`` per client (order preserved)."""
  if int(max_samples) != max_samples or max_samples < 1:
    raise ValueError(f"max_samples must be a positive integer, got {max_samples}")
  rng = np.random.default_rng(seed)
  out = []
  for idx in indices:
    idx = np.asarray(idx, np.int64)
    if len(idx) > max_samples:
      idx = idx[np.sort(rng.choice(len(idx), max_samples, replace=False))]
    out.append(idx)
  return out


def subsample_per_class(labels, per_class: int, seed: int, strict: bool = False) -> np.ndarray:
  """Sorted indices of ``per_class`` random samples of every class.

  A class with fewer samples contributes all of them (with a warning), or raises
  ValueError when ``strict``.
  """
  labels = np.asarray(labels, np.int64)
  if int(per_class) != per_class or per_class < 1:
    raise ValueError(f"per_class must be a positive integer, got {per_class}")
  rng = np.random.default_rng(seed)
  out = []
  for c in np.unique(labels):
    idx = np.flatnonzero(labels == c)
    if len(idx) < per_class:
      msg = f"class {c} has only {len(idx)} samples, fewer than per_class={per_class}"
      if strict:
        raise ValueError(msg)
      logger.warning("%s; keeping all of them", msg)
      out.append(idx)
    else:
      out.append(rng.choice(idx, per_class, replace=False))
  return np.sort(np.concatenate(out))


def label_histograms(labels, indices: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
  """``[K, num_classes]`` label counts of each client's indices."""
  labels = np.asarray(labels, np.int64)
  return np.stack([np.bincount(labels[np.asarray(i, np.int64)], minlength=num_classes)
                   for i in indices]) if len(indices) else np.zeros((0, num_classes), np.int64)


# ----------------------------------------------------------------------------- save / load


def _jsonable(obj: Any) -> Any:
  if isinstance(obj, dict):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  if isinstance(obj, np.generic):
    return obj.item()
  if isinstance(obj, Path):
    return str(obj)
  if hasattr(obj, "to_dict"):  # ml_collections.ConfigDict
    return _jsonable(obj.to_dict())
  return obj


def save_partition(path, train_indices: Sequence[np.ndarray],
                   test_indices: Sequence[np.ndarray] | None = None, *,
                   label_histograms: np.ndarray | None = None,
                   test_label_histograms: np.ndarray | None = None,
                   meta: dict | None = None) -> Path:
  """Writes a partition as ``.json`` (readable) or ``.npz`` (compact), by suffix.

  Histograms and ``meta`` (partition parameters, dataset, source) are optional; they
  make a run directory self-describing. Round-trips through :func:`load_partition`.
  """
  path = Path(path)
  record = {
      "format": "fedjax_robust.partition/1",
      "num_clients": len(train_indices),
      "train_indices": [np.asarray(i, np.int64) for i in train_indices],
      "test_indices": None if test_indices is None else [np.asarray(i, np.int64) for i in test_indices],
      "label_histograms": None if label_histograms is None else np.asarray(label_histograms, np.int64),
      "test_label_histograms": (None if test_label_histograms is None
                                else np.asarray(test_label_histograms, np.int64)),
      "meta": _jsonable(meta or {}),
  }
  path.parent.mkdir(parents=True, exist_ok=True)
  if path.suffix == ".json":
    path.write_text(json.dumps(_jsonable(record)))
  elif path.suffix == ".npz":
    arrays = {"header": np.asarray(json.dumps({"format": record["format"], "meta": record["meta"],
                                               "num_clients": record["num_clients"]}))}
    for key in ("train_indices", "test_indices"):
      if record[key] is not None:
        arrays[key] = np.concatenate(record[key]) if record[key] else np.zeros(0, np.int64)
        arrays[key + "_sizes"] = np.asarray([len(i) for i in record[key]], np.int64)
    for key in ("label_histograms", "test_label_histograms"):
      if record[key] is not None:
        arrays[key] = record[key]
    with open(path, "wb") as f:
      np.savez(f, **arrays)
  else:
    raise ValueError(f"partition file must end in .json or .npz, got {path.name}")
  return path


def load_partition(path) -> dict[str, Any]:
  """Reads :func:`save_partition` output: a dict with ``train_indices``, ``test_indices``
  (lists of int64 arrays or None), ``label_histograms``, ``test_label_histograms``
  (arrays or None), ``num_clients`` and ``meta``."""
  path = Path(path)
  if path.suffix == ".json":
    rec = json.loads(path.read_text())
    out = {"num_clients": rec["num_clients"], "meta": rec.get("meta", {})}
    for key in ("train_indices", "test_indices"):
      out[key] = None if rec.get(key) is None else [np.asarray(i, np.int64) for i in rec[key]]
    for key in ("label_histograms", "test_label_histograms"):
      out[key] = None if rec.get(key) is None else np.asarray(rec[key], np.int64).reshape(
          rec["num_clients"], -1)
    return out
  if path.suffix == ".npz":
    with np.load(path, allow_pickle=False) as z:
      header = json.loads(str(z["header"]))
      out = {"num_clients": header["num_clients"], "meta": header.get("meta", {})}
      for key in ("train_indices", "test_indices"):
        out[key] = (None if key not in z.files else
                    [a.astype(np.int64) for a in np.split(z[key], np.cumsum(z[key + "_sizes"])[:-1])])
      for key in ("label_histograms", "test_label_histograms"):
        out[key] = z[key] if key in z.files else None
    return out
  raise ValueError(f"partition file must end in .json or .npz, got {path.name}")
