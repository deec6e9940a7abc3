"""Coordinate-wise rules: median (Yin et al. 2018) and trimmed mean (Yin et al. 2018).

Both are "rank-window means": per coordinate, sort the ``n`` valid values and
average the order statistics with ranks ``lo..hi`` (inclusive):

* median, ``even="mean"`` (textbook / ``np.median`` / FedCAP): ``lo = (n-1)//2``,
  ``hi = n//2`` (the mean of the two middle values when ``n`` is even);
* median, ``even="lower"``: ``lo = hi = (n-1)//2`` = ``torch.median`` (FedCC
  code, spec fedcc.md §3 "Coomed [Q]"); ``even="upper"``: ``lo = hi = n//2``;
* trimmed mean: ``lo = Q``, ``hi = n-Q-1`` (drop the ``Q`` smallest and ``Q``
  largest values per coordinate). ``Q = floor(beta * n)`` or ``num_trimmed``.

Effective client weights: per coordinate, each client gets its share of the
window (ties split evenly inside a tie group), averaged over all coordinates.
The window's end values come from exact radix selection (``order.py``, no
sort); the rest is elementwise compares, and the aggregate is the
share-weighted sum of the inputs (no "total minus trimmed" subtraction, which
would lose the benign values next to a huge outlier).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import Aggregator, check_int, finish, num_coordinates, prepare
from fedjax_robust.aggregators.order import column_tiles, kth_smallest


def next_value(x: jax.Array, valid: jax.Array, v: jax.Array, r) -> jax.Array:
  """The ``(r)``-th smallest per column given ``v`` = the ``(r-1)``-th smallest (one pass instead of a select)."""
  xv = jnp.where(valid[:, None], x, jnp.nan)
  le = jnp.sum(xv <= v[None], axis=0)
  above = jnp.min(jnp.where(xv > v[None], x, jnp.inf), axis=0)
  return jnp.where(le > r, v, above)


def window_shares(x: jax.Array, valid: jax.Array, v_lo: jax.Array, v_hi: jax.Array, lo, hi) -> jax.Array:
  """``[C, T]`` share of each value in the rank window ``lo..hi`` whose end values are ``v_lo`` / ``v_hi``.

  Values strictly inside get 1; a tie group at an end of the window splits the
  window's overlap with its ranks evenly. Each column's shares sum to ``hi-lo+1``.
  """
  xv = jnp.where(valid[:, None], x, jnp.nan)  # invalid entries compare False with everything
  v_lo, v_hi = v_lo[None], v_hi[None]

  def share(v):
    a = jnp.sum(xv < v, axis=0, keepdims=True)
    b = jnp.sum(xv <= v, axis=0, keepdims=True)
    overlap = jnp.clip(jnp.minimum(b, hi + 1) - jnp.maximum(a, lo), 0, None)
    return overlap.astype(jnp.float32) / jnp.maximum(b - a, 1).astype(jnp.float32)

  inside = ((xv > v_lo) & (xv < v_hi)).astype(jnp.float32)
  return jnp.where(xv == v_lo, share(v_lo), jnp.where(xv == v_hi, share(v_hi), inside))


def window_mean(p, lo, hi, adjacent: bool):
  """``(aggregate, client weights [C])``: per coordinate, the mean of the order statistics ``lo..hi``.

  ``adjacent``: ``hi <= lo + 1`` (medians), so the upper end costs one pass instead of a second select.
  """
  valid = p.valid
  count = (hi - lo + 1).astype(jnp.float32)

  def block(x, col_ok):
    x = x.astype(jnp.float32)
    v_lo = kth_smallest(x, valid, lo)
    v_hi = next_value(x, valid, v_lo, hi) if adjacent else kth_smallest(x, valid, hi)
    part = window_shares(x, valid, v_lo, v_hi, lo, hi) * col_ok[None, :]
    agg = jnp.sum(part * jnp.where(valid[:, None], x, 0.0), axis=0) / count
    return agg, jnp.sum(part, axis=1) / count

  leaves, treedef = jax.tree.flatten(p.updates)
  outs, contrib = [], 0.0
  for u in leaves:
    agg, w = column_tiles(block, u.reshape(u.shape[0], -1))
    outs.append(agg.reshape(u.shape[1:]).astype(u.dtype))
    contrib = contrib + w
  return jax.tree.unflatten(treedef, outs), contrib / max(num_coordinates(p.updates), 1)


_EVEN = ("mean", "lower", "upper")


def make_median(even: str = "mean", num_clients: Optional[int] = None) -> Aggregator:
  """Coordinate-wise median of the valid uploads (unweighted).

  ``even``: what to return when ``n`` is even: ``"mean"`` of the two middle
  values (textbook, ``np.median``, FedCAP spec §3), ``"lower"`` (``torch.median``,
  the FedCC code, fedcc.md §3) or ``"upper"``.
  """
  del num_clients
  if even not in _EVEN:
    raise ValueError(f"median: even must be one of {_EVEN}, got {even!r}")

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    n = jnp.maximum(p.n, 1)
    lo = (n - 1) // 2 if even in ("mean", "lower") else n // 2
    hi = n // 2 if even in ("mean", "upper") else (n - 1) // 2
    agg, contrib = window_mean(p, lo, hi, adjacent=True)
    return finish(p, agg, contrib)

  return Aggregator("median", aggregate)


def _trim_check(q: int, c: int, who: str = "trimmed_mean"):
  if 2 * q >= c:
    raise ValueError(f"{who}: trimming {q} per side from {c} clients leaves nothing (need 2*num_trimmed < n)")


def make_trimmed_mean(beta: Optional[float] = None, num_trimmed: Optional[int] = None,
                      num_clients: Optional[int] = None) -> Aggregator:
  """Coordinate-wise trimmed mean (Yin et al. 2018): drop the ``Q`` largest and ``Q`` smallest, average the rest.

  Give exactly one of ``beta`` (fraction per side, ``Q = floor(beta * n)``,
  ``0 <= beta < 0.5``) or ``num_trimmed`` (``Q`` per side; FedCAP uses
  ``Q = floor(M/2)``, FedCC's later code ``Q = f``). ``2Q >= n`` is an error
  (at construction with ``num_clients``, and at trace time against ``C``); when
  masking leaves fewer valid clients at run time, ``Q`` is clamped to
  ``(n-1)//2`` and ``diagnostics["condition_ok"]`` is False.
  """
  if (beta is None) == (num_trimmed is None):
    raise ValueError("trimmed_mean: give exactly one of beta (fraction per side) or num_trimmed (count per side)")
  if beta is not None:
    beta = float(beta)
    if not 0.0 <= beta < 0.5:
      raise ValueError(f"trimmed_mean: beta must be in [0, 0.5), got {beta}")
  else:
    num_trimmed = check_int("trimmed_mean: num_trimmed", num_trimmed)
    if num_clients is not None:
      _trim_check(num_trimmed, int(num_clients))

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    if num_trimmed is not None:
      _trim_check(num_trimmed, p.num_clients)
      q_req = jnp.asarray(num_trimmed, jnp.int32)
    else:
      q_req = jnp.floor(beta * p.n.astype(jnp.float32) + 1e-6).astype(jnp.int32)
    n = jnp.maximum(p.n, 1)
    q = jnp.minimum(q_req, (n - 1) // 2)
    agg, contrib = window_mean(p, q, n - q - 1, adjacent=False)
    return finish(p, agg, contrib, diagnostics={"num_trimmed": q, "condition_ok": (2 * q_req < p.n)})

  return Aggregator("trimmed_mean", aggregate)
