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
This is computed from the window's boundary values with elementwise compares
(no second sort).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import Aggregator, check_int, finish, num_coordinates, prepare


def window_mean_leaf(x: jax.Array, valid: jax.Array, lo, hi):
  """``(agg [...], contrib [C])`` for one leaf ``x`` [C, ...].

  ``agg`` is the mean of the per-coordinate order statistics ``lo..hi``
  (0 <= lo <= hi < n); ``contrib[i]`` is client ``i``'s summed weight over the
  leaf's coordinates (each coordinate distributes a total of 1).
  """
  c = x.shape[0]
  shape = x.shape[1:]
  acc = jnp.promote_types(x.dtype, jnp.float32)
  xf = x.reshape(c, -1).astype(acc)
  vb = valid[:, None]
  s = jnp.sort(jnp.where(vb, xf, jnp.inf), axis=0)
  ranks = jnp.arange(c)[:, None]
  window = (ranks >= lo) & (ranks <= hi)
  count = (hi - lo + 1).astype(acc)
  agg = jnp.sum(jnp.where(window, s, 0.0), axis=0) / count
  agg = jnp.where(jnp.any(valid), agg, 0.0)

  v_lo = jax.lax.dynamic_index_in_dim(s, lo, axis=0, keepdims=True)
  v_hi = jax.lax.dynamic_index_in_dim(s, hi, axis=0, keepdims=True)
  xv = jnp.where(vb, xf, jnp.nan)  # invalid entries compare False with everything

  def share(v):  # the window's share of each member of the tie group of value v
    a = jnp.sum(xv < v, axis=0, keepdims=True)
    b = jnp.sum(xv <= v, axis=0, keepdims=True)
    overlap = jnp.clip(jnp.minimum(b, hi + 1) - jnp.maximum(a, lo), 0, None)
    return overlap.astype(acc) / jnp.maximum(b - a, 1).astype(acc)

  inside = ((xv > v_lo) & (xv < v_hi)).astype(acc)
  part = jnp.where(xv == v_lo, share(v_lo), jnp.where(xv == v_hi, share(v_hi), inside))
  contrib = jnp.sum(part, axis=1) / count
  return agg.reshape(shape).astype(x.dtype), contrib


def window_mean(p, lo, hi):
  """Applies :func:`window_mean_leaf` to every leaf; returns ``(aggregate, client weights [C])``."""
  leaves, treedef = jax.tree.flatten(p.updates)
  outs = [window_mean_leaf(u, p.valid, lo, hi) for u in leaves]
  contrib = sum(o[1] for o in outs) / max(num_coordinates(p.updates), 1)
  return jax.tree.unflatten(treedef, [o[0] for o in outs]), contrib


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
    agg, contrib = window_mean(p, lo, hi)
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
    agg, contrib = window_mean(p, q, n - q - 1)
    return finish(p, agg, contrib, diagnostics={"num_trimmed": q, "condition_ok": (2 * q_req < p.n)})

  return Aggregator("trimmed_mean", aggregate)
