"""Shared types and helpers of the aggregation rules.

Every rule is an :class:`Aggregator`: a name plus a pure, jit-able function

    aggregate(updates, weights, mask, key, context) -> AggregateResult

over stacked client updates (any pytree whose leaves have a leading cohort axis
``C``). Shapes are static: clients that must not count are *masked*, never
removed, so ``n`` (the number of clients a rule reasons about) is a traced
scalar ``n = sum(valid)``.

Validity. A client is *valid* when ``mask`` is True, its weight is > 0 (the
engine gives weight 0 to clients that must not count) and every entry of its
update is finite. :func:`sanitize` zeroes every invalid client's rows, so a NaN
or Inf upload can never reach an arithmetic op (``0 * nan = nan``) and never
crashes a round; non-finite participating clients are reported in
``flagged`` and ``diagnostics["nonfinite"]``. This holds for *every* rule,
including the plain ``mean`` aggregator (which therefore differs from
:func:`weighted_mean` exactly when an upload is non-finite).

Vector maths (norms, Gram matrices, weighted sums) is done leaf by leaf and
summed, which equals working on ``ravel_pytree`` of each client's update without
materialising the concatenated vector (rules that need a real flat vector, such
as GAS, ravel per client with ``vmap``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

PyTree = Any

HIGHEST = jax.lax.Precision.HIGHEST
KEPT_MEAN = "kept_mean"  # Aggregator.averaging values (see Aggregator)
INPUT_WEIGHTS = "input_weights"


class AggregateResult(NamedTuple):
  update: PyTree  # the aggregate, same structure as one client's update
  weights: jax.Array  # [C] float: effective weight of each client (0 = excluded); sums to 1 when anything was aggregated
  flagged: jax.Array  # [C] bool: clients flagged/excluded as suspicious (always includes non-finite uploads)
  diagnostics: dict  # extra scalars / arrays; always has "nonfinite" [C] bool and "num_valid" int32


class Aggregator(NamedTuple):
  """``aggregate(updates [C, ...], weights [C], mask [C] bool, key, context dict) -> AggregateResult``.

  ``weights`` (sample counts), ``mask``, ``key`` and ``context`` may be ``None``
  (all ones / all True / no key / ``{}``). ``context`` is the round's
  :class:`~fedjax_robust.round_context.RoundContext` (or a plain dict in hand-written
  tests); rules read it with ``context.get(name)``. Rules that need a key (bucketing,
  GAS) raise when it is missing.
  """

  name: str
  aggregate: Callable[..., AggregateResult]
  # What the rule reads from the round context beyond the uploads, computed by the server step on device
  # (fedjax_robust/round_context.py): "reference_update" (FLTrust), "features" (FLARE), "penultimate_weights".
  needs: tuple[str, ...] = ()
  # How the rule averages the clients, for a client weighting that replaces its weights (server.weighting,
  # aggregators/weighting.py): KEPT_MEAN (its aggregate is a weighted mean of the raw updates of the clients it
  # keeps, effective weight > 0: mean, Krum, Multi-Krum, Zeno++, DnC), INPUT_WEIGHTS (its `weights` argument are
  # its averaging weights: weighted RFA's alphas), or "" (no client average to replace: coordinate-wise rules,
  # clipping, wrappers).
  averaging: str = ""

  def __call__(self, updates, weights=None, mask=None, key=None, context=None) -> AggregateResult:
    return self.aggregate(updates, weights, mask, key, context)


# ----------------------------------------------------------------------------------------- shapes


def num_clients_of(updates: PyTree) -> int:
  """The static leading (cohort) size ``C`` shared by every leaf."""
  leaves = jax.tree.leaves(updates)
  if not leaves:
    raise ValueError("updates has no leaves")
  sizes = {int(jnp.shape(leaf)[0]) if jnp.ndim(leaf) else -1 for leaf in leaves}
  if len(sizes) != 1 or -1 in sizes:
    raise ValueError(f"every leaf of updates needs the same leading client axis, got sizes {sorted(sizes)}")
  return sizes.pop()


def _col(v: jax.Array, leaf: jax.Array) -> jax.Array:
  """``v`` [C] reshaped to broadcast against ``leaf`` [C, ...]."""
  return v.reshape(v.shape + (1,) * (leaf.ndim - 1))


def _flat(leaf: jax.Array) -> jax.Array:
  return leaf.reshape(leaf.shape[0], -1).astype(jnp.promote_types(leaf.dtype, jnp.float32))


def num_coordinates(updates: PyTree) -> int:
  return sum(int(leaf[0].size) for leaf in jax.tree.leaves(updates))


# ----------------------------------------------------------------------------------------- validity


def sanitize(updates: PyTree, mask: Optional[jax.Array] = None):
  """``(updates, valid, nonfinite)``: drop non-finite uploads.

  ``nonfinite[i]`` is True when client ``i`` participates (``mask``) and any
  entry of its update is NaN/Inf; ``valid = mask & finite``. The returned
  updates have the rows of every invalid client (non-finite *or* masked out)
  set to exactly 0, so later arithmetic can never see NaN/Inf.
  """
  c = num_clients_of(updates)
  mask = jnp.ones((c,), bool) if mask is None else jnp.asarray(mask, bool).reshape(c)
  finite = finite_rows(updates, c)
  valid = mask & finite
  return zero_rows(updates, valid), valid, mask & ~finite


def finite_rows(stacked: PyTree, c: int) -> jax.Array:
  """``[C]`` bool: client ``i``'s rows of every leaf are all finite (True for a tree without leaves)."""
  finite = jnp.ones((c,), bool)
  for leaf in jax.tree.leaves(stacked):
    finite = finite & jnp.all(jnp.isfinite(leaf.reshape(c, -1)), axis=1)
  return finite


def zero_rows(stacked: PyTree, keep: jax.Array) -> PyTree:
  """``stacked`` with the rows of every client not in ``keep`` set to exactly 0 (so NaN/Inf there cannot spread)."""
  return jax.tree.map(lambda u: jnp.where(_col(keep, u), u, jnp.zeros((), u.dtype)), stacked)


class Prepared(NamedTuple):
  updates: PyTree  # sanitized (invalid rows are 0)
  weights: jax.Array  # [C] float32 sample weights, 0 for invalid clients
  valid: jax.Array  # [C] bool
  nonfinite: jax.Array  # [C] bool
  n: jax.Array  # int32 scalar: number of valid clients
  num_clients: int  # static C


def prepare(updates: PyTree, weights=None, mask=None) -> Prepared:
  """Sanitizes and folds ``weights > 0`` (finite) into the validity mask."""
  c = num_clients_of(updates)
  w = jnp.ones((c,), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32).reshape(c)
  mask = jnp.ones((c,), bool) if mask is None else jnp.asarray(mask, bool).reshape(c)
  mask = mask & jnp.isfinite(w) & (w > 0)
  clean, valid, nonfinite = sanitize(updates, mask)
  w = jnp.where(valid, w, 0.0)
  return Prepared(clean, w, valid, nonfinite, jnp.sum(valid).astype(jnp.int32), c)


def finish(p: Prepared, update: PyTree, coeffs: jax.Array, flagged: Optional[jax.Array] = None,
           diagnostics: Optional[dict] = None) -> AggregateResult:
  """Packs a result: normalizes ``coeffs`` to the simplex, ORs non-finite into ``flagged``."""
  coeffs = jnp.where(p.valid, coeffs, 0.0).astype(jnp.float32)
  total = jnp.sum(coeffs)
  coeffs = jnp.where(total > 0, coeffs / jnp.where(total > 0, total, 1.0), 0.0)
  flagged = jnp.zeros((p.num_clients,), bool) if flagged is None else (flagged & p.valid)
  diag = dict(diagnostics or {})
  diag["nonfinite"] = p.nonfinite
  diag["num_valid"] = p.n
  return AggregateResult(update, coeffs, flagged | p.nonfinite, diag)


def round_diagnostics(result: AggregateResult, weights: Optional[jax.Array] = None) -> dict:
  """What a round logs of a rule's result, the same for every algorithm that aggregates through one: whom it
  flagged, each client's aggregation weight (``weights`` when the algorithm re-weights the rule's), and, for a rule
  that scores each client to decide (FedCC's CKA similarity, Krum's, DnC's and Zeno++'s scores, GAS),
  ``detection_scores`` [C], so that how far apart benign clients and attackers were can be read from the log."""
  diagnostics = {"flagged": result.flagged, "aggregation_weights": result.weights if weights is None else weights}
  if "scores" in result.diagnostics:
    diagnostics["detection_scores"] = result.diagnostics["scores"]
  return diagnostics


def normalize(v: jax.Array) -> jax.Array:
  total = jnp.sum(v)
  return jnp.where(total > 0, v / jnp.where(total > 0, total, 1.0), 0.0)


# ----------------------------------------------------------------------------------------- tree maths


def combine(coeffs: jax.Array, updates: PyTree) -> PyTree:
  """``sum_i coeffs[i] * updates[i]`` leaf by leaf (elementwise, exact f32, no matmul precision issues)."""

  def one(u):
    acc = jnp.promote_types(u.dtype, jnp.float32)
    return jnp.sum(_col(coeffs.astype(acc), u) * u.astype(acc), axis=0).astype(u.dtype)

  return jax.tree.map(one, updates)


def sq_norms(updates: PyTree) -> jax.Array:
  """``[C]`` squared Euclidean norms of each client's (flattened) update."""
  return sum(jnp.sum(jnp.square(_flat(u)), axis=1) for u in jax.tree.leaves(updates)).astype(jnp.float32)


def dots(updates: PyTree, ref: PyTree) -> jax.Array:
  """``[C]`` inner products ``<updates[i], ref>``."""
  return sum(jnp.sum(_flat(u) * r.reshape(1, -1).astype(jnp.float32), axis=1)
             for u, r in zip(jax.tree.leaves(updates), jax.tree.leaves(ref))).astype(jnp.float32)


def gram(updates: PyTree) -> jax.Array:
  """``[C, C]`` matrix of inner products (f32, HIGHEST precision so GPUs do not use TF32)."""
  return sum(jnp.dot(_flat(u), _flat(u).T, precision=HIGHEST) for u in jax.tree.leaves(updates)).astype(jnp.float32)


def tree_sub(tree: PyTree, one: PyTree) -> PyTree:
  """``updates[i] - one`` for every client."""
  return jax.tree.map(lambda u, r: u - r[None].astype(u.dtype), tree, one)


def distances_to(updates: PyTree, point: PyTree) -> jax.Array:
  """``[C]`` Euclidean distances ``||updates[i] - point||`` (computed directly, no cancellation)."""
  return jnp.sqrt(sq_norms(tree_sub(updates, point)))


def pairwise_sq_distances(updates: PyTree, valid: jax.Array) -> jax.Array:
  """``[C, C]`` squared Euclidean distances via the Gram matrix of the *centered* updates.

  Centering at the valid clients' mean first removes most of the float
  cancellation of ``|a|^2 + |b|^2 - 2<a, b>``. The diagonal is exactly 0,
  entries are clamped to >= 0 and anything non-finite (overflow) becomes +inf.
  """
  center = combine(normalize(valid.astype(jnp.float32)), updates)
  g = gram(tree_sub(updates, center))
  d = jnp.diag(g)
  dist = jnp.maximum(d[:, None] + d[None, :] - 2.0 * g, 0.0)
  dist = 0.5 * (dist + dist.T)
  dist = jnp.where(jnp.eye(g.shape[0], dtype=bool), 0.0, dist)
  return jnp.where(jnp.isnan(dist), jnp.inf, dist)


def pairwise_cosine(updates: PyTree) -> jax.Array:
  """``[C, C]`` cosine similarities; a zero (or overflowing) vector gets -1 to everyone (FedCAP spec §6.20-21)."""
  g = gram(updates)
  nrm = jnp.sqrt(jnp.maximum(jnp.diag(g), 0.0))
  denom = nrm[:, None] * nrm[None, :]
  ok = (denom > 0) & jnp.isfinite(denom) & jnp.isfinite(g)
  return jnp.where(ok, jnp.clip(g / jnp.where(ok, denom, 1.0), -1.0, 1.0), -1.0)


def rank_of(scores: jax.Array) -> jax.Array:
  """0-based rank of each entry in ascending order (stable: ties broken by index)."""
  return jnp.argsort(jnp.argsort(scores, stable=True), stable=True)


def finite_scores(scores: jax.Array, valid: jax.Array) -> jax.Array:
  """Valid scores capped at float max (so an overflowing valid client still beats any invalid one); invalid = +inf."""
  big = jnp.finfo(jnp.float32).max
  return jnp.where(valid, jnp.minimum(jnp.nan_to_num(scores, nan=big), big), jnp.inf)


# ----------------------------------------------------------------------------------------- checks


def check_int(name: str, value, minimum: int = 0) -> int:
  if isinstance(value, bool) or int(value) != value or int(value) < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def check_positive(name: str, value) -> float:
  value = float(value)
  if not value > 0:
    raise ValueError(f"{name} must be > 0, got {value!r}")
  return value
