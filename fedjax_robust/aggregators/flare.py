"""FLARE (Wang et al., AsiaCCS 2022): trust from penultimate-layer representations (PLRs), fedcc.md §3.

FLARE's PLRs are each client model's penultimate activations on a small
server-held auxiliary set. The rule declares ``needs=("features",)``, so the
server step computes them on device (``round_context.compute_needs``: client
model = global + upload, activations on the run's server data, the first
``server.root_dataset_size`` clean training rows) and passes them as
``context["features"]``, ``[C, m, d]`` (m
PLR vectors per client) or ``[C, d]`` (one vector per client, m = 1). Then

1. ``MMD^2(i, j)`` between the clients' PLR sets with the RBF kernel
   ``k(x, y) = exp(-gamma ||x - y||^2)``; unbiased estimator by default (the
   original), ``unbiased=False`` = biased (forced when m = 1). ``gamma=None``:
   median heuristic ``gamma = 1 / median(||x - y||^2)`` over distinct pooled
   PLR pairs (at most 2048 pooled vectors, strided).
2. Each valid client names its ``k = floor(neighbor_frac * n)`` nearest other
   clients (``neighbor_frac = 0.5``); ``count[j]`` = times ``j`` is named.
   ``port_k_minus_one=True``: the third-party port's ``argsort[:, 1:k]``
   (k - 1 others, fedcc.md §3).
3. Trust ``tau = softmax(count / (T * mean(count)))`` over the valid clients
   (T = ``temperature`` = 1); aggregate ``sum_i tau_i u_i``.

The FedCC code's FLARE (PLR = the penultimate *weight* matrix, biased MMD with
gamma = 1, 5 neighbours incl. self, a softmax over client ids, no
renormalisation; fedcc.md §3 "[Q]") is NOT reproduced; its data-free PLR can be
approximated by passing the penultimate weight rows as ``features`` with
``gamma=1.0, unbiased=False``.

FLARE down-weights rather than excludes: ``flagged`` holds only non-finite
clients (non-finite features count as non-finite); ``diagnostics``:
``counts``, ``mmd`` ([C, C]).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import HIGHEST, Aggregator, check_positive, combine, finish, prepare
from fedjax_robust.aggregators.order import kth_smallest


def _sqdist(a, b):
  """``[..., p, q]`` squared distances between rows of a [p, d] and b [..., q, d]."""
  aa = jnp.sum(a * a, axis=-1)
  bb = jnp.sum(b * b, axis=-1)
  ab = jnp.einsum("pd,...qd->...pq", a, b, precision=HIGHEST)
  return jnp.maximum(aa[:, None] + bb[..., None, :] - 2.0 * ab, 0.0)


def mmd_matrix(feats: jax.Array, gamma, unbiased: bool) -> jax.Array:
  """``[C, C]`` MMD^2 between the per-client PLR sets ``feats`` [C, m, d]."""
  c, m, _ = feats.shape
  unbiased = unbiased and m > 1

  def row(x):
    return jnp.mean(jnp.exp(-gamma * _sqdist(x, feats)), axis=(-2, -1))  # mean k(X_i, X_j) over all pairs

  kbar = jax.lax.map(row, feats)  # [C, C]
  self_k = jnp.diag(kbar)
  if unbiased:  # drop the m diagonal terms k(x, x) = 1 from the within-set means
    self_k = (self_k * m * m - m) / (m * (m - 1))
  mmd = self_k[:, None] + self_k[None, :] - 2.0 * kbar
  return jnp.where(jnp.eye(c, dtype=bool), 0.0, mmd)


def median_heuristic_gamma(feats: jax.Array, valid: jax.Array) -> jax.Array:
  c, m, d = feats.shape
  pts = feats.reshape(c * m, d)
  ok = jnp.repeat(valid, m)
  stride = max(1, (c * m) // 2048)
  pts, ok = pts[::stride], ok[::stride]
  dist = _sqdist(pts, pts).reshape(-1, 1)
  pair = (ok[:, None] & ok[None, :]).reshape(-1, 1) & (dist > 0)
  count = jnp.sum(pair)
  lo = kth_smallest(dist, pair, jnp.maximum(count - 1, 0) // 2)[0]  # radix select: XLA:CPU sorts are slow
  hi = kth_smallest(dist, pair, jnp.maximum(count, 1) // 2)[0]
  med = 0.5 * (lo + hi)
  good = (count > 0) & jnp.isfinite(med) & (med > 0)
  return jnp.where(good, 1.0 / jnp.where(good, med, 1.0), 1.0)


def make_flare(neighbor_frac: float = 0.5, temperature: float = 1.0, gamma: Optional[float] = None,
               unbiased: bool = True, port_k_minus_one: bool = False, num_clients: Optional[int] = None) -> Aggregator:
  del num_clients
  if not 0 < float(neighbor_frac) <= 1:
    raise ValueError(f"flare: neighbor_frac must be in (0, 1], got {neighbor_frac}")
  temperature = check_positive("flare: temperature", temperature)
  if gamma is not None:
    gamma = check_positive("flare: gamma", gamma)

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key
    context = context or {}
    feats = context.get("features")
    if feats is None:
      raise ValueError("flare needs context['features']: the clients' penultimate-layer representations "
                       "[C, m, d] (or [C, d]) on the server's auxiliary set")
    feats = jnp.asarray(feats, jnp.float32)
    if feats.ndim == 2:
      feats = feats[:, None, :]
    c = jax.tree.leaves(updates)[0].shape[0]
    if feats.ndim != 3 or feats.shape[0] != c:
      raise ValueError(f"flare: context['features'] must be [C={c}, m, d] or [C, d], got {feats.shape}")
    feat_ok = jnp.all(jnp.isfinite(feats.reshape(c, -1)), axis=1)
    base_mask = jnp.ones((c,), bool) if mask is None else jnp.asarray(mask, bool)
    p = prepare(updates, weights, base_mask & feat_ok)
    p = p._replace(nonfinite=p.nonfinite | (base_mask & ~feat_ok))
    feats = jnp.where(p.valid[:, None, None], feats, 0.0)
    g = median_heuristic_gamma(feats, p.valid) if gamma is None else gamma
    mmd = mmd_matrix(feats, g, unbiased)
    others = p.valid[:, None] & p.valid[None, :] & ~jnp.eye(c, dtype=bool)
    ranks = jnp.argsort(jnp.argsort(jnp.where(others, mmd, jnp.inf), axis=1, stable=True), axis=1, stable=True)
    k = jnp.floor(neighbor_frac * p.n.astype(jnp.float32) + 1e-6).astype(jnp.int32)
    if port_k_minus_one:
      k = k - 1
    k = jnp.clip(k, 1, jnp.maximum(p.n - 1, 1))
    named = others & (ranks < k)
    counts = jnp.sum(named, axis=0).astype(jnp.float32)
    mean_count = jnp.sum(counts) / jnp.maximum(p.n, 1)
    logits = counts / (temperature * jnp.where(mean_count > 0, mean_count, 1.0))
    tau = jax.nn.softmax(jnp.where(p.valid, logits, -jnp.inf))
    tau = jnp.where(p.valid, tau, 0.0)
    return finish(p, combine(tau, p.updates), tau, diagnostics={"counts": counts, "mmd": mmd})

  return Aggregator("flare", aggregate, needs=("features",))
