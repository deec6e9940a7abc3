"""Distance-based selection: Krum, Multi-Krum (Blanchard et al. 2017) and Bulyan (El Mhamdi et al. 2018).

Textbook Krum: ``score_i = sum of the n-f-2 smallest squared Euclidean
distances from u_i to the OTHER valid updates``; Krum returns the update with
the smallest score; Multi-Krum averages the ``m`` lowest-score updates
uniformly (default ``m = n - f``; FedCAP spec §3 writes the same rule as "the
k+1 smallest distances including the 0 self-distance, k = Q-2, Q = N-M", i.e.
n-f-2 neighbours). Requires ``n > 2f + 2``.

Paper-code flags (fedcc.md §3 "Krum [Q]"):

* ``distance="fedcc"``: the FedCC code's ``d_ij = ||(w_i - w_j)^2||_2 = sqrt(sum
  delta^4)`` instead of the squared Euclidean distance (computed row by row,
  O(C^2 d), compat only);
* ``count_self=True``: sum the ``n-f-2`` smallest entries of the row
  *including* the self-distance 0, so only ``n-f-3`` neighbours count.

Bulyan: pick ``theta = n - 2f`` updates by repeatedly taking the Krum winner of
the remaining set (whose Krum uses ``|R|-f-2`` neighbours) and removing it; then
per coordinate average the ``beta = theta - 2f`` selected values closest to the
coordinate-wise median of the selected set. Requires ``n >= 4f + 3``.
``strict=False`` allows smaller ``n`` and clamps ``beta >= 1`` (the
recommended resolution of fedcc.md §3, where n=10, f=3 gives beta = -2);
``count_self=True`` is the FedCC code's Krum-with-self inside Bulyan.
``fedcc_code=True`` is the whole FedCC-code Bulyan (``aggregate.bulyan``), see
:func:`make_bulyan`.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import (KEPT_MEAN, Aggregator, check_int, combine, finish, finite_scores,
                                            num_coordinates, pairwise_sq_distances, prepare, rank_of)
from fedjax_robust.aggregators.coordinate import next_value
from fedjax_robust.aggregators.order import column_tiles, kth_smallest

_DISTANCES = ("squared", "fedcc")


def fedcc_distances(updates, valid) -> jax.Array:
  """``[C, C]`` ``sqrt(sum_k (u_i - u_j)_k^4)`` (FedCC code's Krum distance), one row at a time."""
  del valid
  leaves = [u.reshape(u.shape[0], -1).astype(jnp.float32) for u in jax.tree.leaves(updates)]
  c = leaves[0].shape[0]

  def row(i):
    return jnp.sqrt(sum(jnp.sum(jnp.square(jnp.square(x - x[i][None])), axis=1) for x in leaves))

  d = jax.lax.map(row, jnp.arange(c))
  d = jnp.where(jnp.eye(c, dtype=bool), 0.0, d)
  return jnp.where(jnp.isnan(d), jnp.inf, d)


def distance_matrix(updates, valid, distance: str) -> jax.Array:
  return pairwise_sq_distances(updates, valid) if distance == "squared" else fedcc_distances(updates, valid)


def krum_scores(dist: jax.Array, valid: jax.Array, f: int, count_self: bool = False, min_k: int = 1) -> jax.Array:
  """``[C]`` Krum scores over the clients in ``valid`` (invalid: +inf).

  Sums the ``k = n-f-2`` smallest distances to the other valid clients
  (``count_self``: ``k-1`` others, the self-distance 0 taking one slot). ``k`` is
  clamped to ``[min_k, n-1]`` so a too-small ``n`` at run time still gives finite,
  usable scores (``min_k=0``: the FedCC code, where only the self-distance is
  summed and every score is 0).
  """
  c = dist.shape[0]
  n = jnp.sum(valid).astype(jnp.int32)
  others = valid[None, :] & valid[:, None] & ~jnp.eye(c, dtype=bool)
  rows = jnp.sort(jnp.where(others, dist, jnp.inf), axis=1)
  k = n - f - 2 - (1 if count_self else 0)
  k = jnp.clip(k, min_k, jnp.maximum(n - 1, 1))
  take = jnp.arange(c)[None, :] < k
  scores = jnp.sum(jnp.where(take, rows, 0.0), axis=1)
  return finite_scores(scores, valid)


def _check_krum(who: str, f: int, c: int):
  if c <= 2 * f + 2:
    raise ValueError(f"{who} needs n > 2f + 2 clients: n={c}, f={f} (n must be >= {2 * f + 3})")


def _check_distance(who, distance):
  if distance not in _DISTANCES:
    raise ValueError(f"{who}: distance must be one of {_DISTANCES}, got {distance!r}")


def make_multi_krum(num_byzantine: int, m: Optional[int] = None, distance: str = "squared", count_self: bool = False,
                    weighted: bool = False, num_clients: Optional[int] = None, name: str = "multi_krum") -> Aggregator:
  """Multi-Krum: uniform mean of the ``m`` (default ``n - f``) lowest-score updates.

  ``weighted=True`` averages the selected updates by sample weight instead.
  Flags the valid clients that were not selected. ``m`` is clamped to ``[1, n]``.
  """
  f = check_int(f"{name}: num_byzantine", num_byzantine)
  if m is not None:
    m = check_int(f"{name}: m", m, 1)
  _check_distance(name, distance)
  if num_clients is not None:
    _check_krum(name, f, int(num_clients))
    if m is not None and m > int(num_clients):
      raise ValueError(f"{name}: m={m} > number of clients {num_clients}")

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    _check_krum(name, f, p.num_clients)
    dist = distance_matrix(p.updates, p.valid, distance)
    scores = krum_scores(dist, p.valid, f, count_self)
    m_eff = p.n - f if m is None else jnp.asarray(m, jnp.int32)
    m_eff = jnp.clip(m_eff, 1, jnp.maximum(p.n, 1))
    selected = p.valid & (rank_of(scores) < m_eff)
    coeffs = jnp.where(selected, p.weights if weighted else 1.0, 0.0)
    coeffs = coeffs / jnp.maximum(jnp.sum(coeffs), 1e-30)
    diag = {"scores": scores, "selected": selected, "condition_ok": p.n > 2 * f + 2}
    return finish(p, combine(coeffs, p.updates), coeffs, p.valid & ~selected, diag)

  return Aggregator(name, aggregate, averaging=KEPT_MEAN)


def make_krum(num_byzantine: int, distance: str = "squared", count_self: bool = False,
              num_clients: Optional[int] = None) -> Aggregator:
  """Krum: the single update with the lowest score (= Multi-Krum with ``m = 1``)."""
  return make_multi_krum(num_byzantine, 1, distance, count_self, num_clients=num_clients, name="krum")


def _check_bulyan(f: int, c: int):
  if c < 4 * f + 3:
    raise ValueError(f"bulyan needs n >= 4f + 3 clients: n={c}, f={f} (pass strict=False to clamp beta >= 1)")


def make_bulyan(num_byzantine: int, count_self: bool = False, strict: bool = True,
                num_clients: Optional[int] = None, fedcc_code: bool = False) -> Aggregator:
  """Bulyan (El Mhamdi et al. 2018) on top of recursive Krum (squared Euclidean distances).

  Flags the valid clients that the Krum selection stage did not pick.
  ``diagnostics``: ``selected`` [C] (the theta picks), ``selection_order`` [C]
  (pick index, -1 if not picked), ``theta``, ``beta``.

  ``fedcc_code=True`` (compat only, fedcc.md §3 "Bulyan [Q]") reproduces the
  FedCC code's ``aggregate.bulyan`` and implies ``count_self`` and no
  ``n >= 4f + 3`` check:

  * the recursive Krum sums the ``|R|-f-2`` smallest entries of a row INCLUDING
    the self-distance 0, and the loop stops as soon as ``|R| - f - 2 <= 0``, so
    ``theta = min(n - 2f, n - f - 2)`` (n=10: 8 picks at f=0, 7 at f=1, 4 at f=3);
    the last pick, with only the self-distance summed, is the first remaining index;
  * the median of the selected set is ``torch.median``, the LOWER middle value;
  * the mean is over ``sorted[:theta - 2f]`` with Python slicing: a negative
    ``beta`` keeps all but the last ``|beta|`` (n=10, f=3: 2 values); floored at 1.
  """
  f = check_int("bulyan: num_byzantine", num_byzantine)
  if fedcc_code:
    count_self, strict = True, False
  if strict and num_clients is not None:
    _check_bulyan(f, int(num_clients))

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    c = p.num_clients
    if strict:
      _check_bulyan(f, c)
    dist = distance_matrix(p.updates, p.valid, "squared")
    n = jnp.maximum(p.n, 1)
    if fedcc_code:
      theta = jnp.clip(jnp.minimum(p.n - 2 * f, p.n - f - 2), 1, n)
      beta = theta - 2 * f
      beta = jnp.clip(jnp.where(beta < 0, theta + beta, beta), 1, theta)
    else:
      theta = jnp.clip(p.n - 2 * f, 1, n)
      beta = jnp.clip(theta - 2 * f, 1, theta)

    def pick(t, carry):
      remaining, order = carry
      scores = krum_scores(dist, remaining, f, count_self, min_k=0 if fedcc_code else 1)
      i = jnp.argmin(scores)
      active = (t < theta) & remaining[i]
      remaining = remaining.at[i].set(remaining[i] & ~active)
      order = order.at[i].set(jnp.where(active, t, order[i]))
      return remaining, order

    steps = max(c - 2 * f, 1) if strict else c
    _, order = jax.lax.fori_loop(0, steps, pick, (p.valid, jnp.full((c,), -1, jnp.int32)))
    selected = p.valid & (order >= 0)

    agg, contrib = _closest_to_median(p.updates, selected, theta, beta, lower_median=fedcc_code)
    diag = {"selected": selected, "selection_order": order, "theta": theta, "beta": beta,
            "condition_ok": p.n >= 4 * f + 3}
    return finish(p, agg, contrib, p.valid & ~selected, diag)

  return Aggregator("bulyan", aggregate)


def _closest_to_median(updates, selected: jax.Array, theta, beta, lower_median: bool = False):
  """Per coordinate, the mean of the ``beta`` selected values closest to the selected values' median.

  The median of an even count is the mean of the two middle values, or the
  lower one with ``lower_median`` (``torch.median``). Values tied in distance at
  the cut (e.g. ``med - a`` and ``med + a``) share the remaining slots evenly, so
  the result is permutation invariant and equals the client-weight-weighted
  mean. Returns ``(aggregate, client weights [C])``.
  """
  betaf = beta.astype(jnp.float32)

  def block(x, col_ok):
    x = x.astype(jnp.float32)
    lo = kth_smallest(x, selected, (theta - 1) // 2)
    med = lo if lower_median else 0.5 * (lo + next_value(x, selected, lo, theta // 2))
    sb = selected[:, None]
    dist = jnp.where(sb, jnp.abs(x - med[None]), jnp.inf)
    cut = kth_smallest(dist, selected, beta - 1)[None]
    less = sb & (dist < cut)
    equal = sb & (dist == cut)
    n_less = jnp.sum(less, axis=0, keepdims=True).astype(jnp.float32)
    n_equal = jnp.maximum(jnp.sum(equal, axis=0, keepdims=True), 1).astype(jnp.float32)
    part = jnp.where(less, 1.0, jnp.where(equal, (betaf - n_less) / n_equal, 0.0)) * col_ok[None, :]
    agg = jnp.sum(part * jnp.where(sb, x, 0.0), axis=0) / betaf
    return agg, jnp.sum(part, axis=1) / betaf

  leaves, treedef = jax.tree.flatten(updates)
  outs, contrib = [], 0.0
  for u in leaves:
    agg, w = column_tiles(block, u.reshape(u.shape[0], -1))
    outs.append(agg.reshape(u.shape[1:]).astype(u.dtype))
    contrib = contrib + w
  return jax.tree.unflatten(treedef, outs), contrib / max(num_coordinates(updates), 1)
