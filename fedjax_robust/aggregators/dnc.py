"""Divide-and-Conquer (DnC; Shejwalkar & Houmansadr, NDSS 2021, Alg. 2).

For ``niters`` iterations, each on its own random subset of ``b`` coordinates
(``b = min(sub_dim, D)``, static; drawn from ``key``, the same subset for every
client, without replacement):

    r       = random subset of b coordinates
    x_i     = u_i[r]                       (valid clients only)
    mu      = mean_i x_i                   (plain mean over the valid clients)
    v       = top right singular vector of the centred matrix [x_i - mu]_i
    s_i     = <x_i - mu, v>^2              (outlier score)
    good_t  = the valid clients minus the floor(c * f) highest scores

The final good set is the intersection of the ``good_t``; the aggregate is the
mean of its updates (uniform, as in the paper; ``weighted=True`` uses the sample
weights). ``f = 0`` removes nobody: the rule is the (uniform) mean.

Implementation notes. ``v`` comes from the ``[C, C]`` Gram matrix of the centred
rows (``G = X X^T``, top eigenvector ``u``, ``v = X^T u / ||X^T u||``), which
equals the top right singular vector of ``X`` without forming the ``b x b``
matrix. The centred rows are scaled by their largest magnitude first (scores
only matter up to a common factor), so a huge finite upload cannot overflow the
Gram matrix. The removal count is clamped to ``n - 1`` (at least one client is
kept every iteration); masked and non-finite clients are never scored
(``base.prepare``). Ties in the scores are broken by client index (stable rank).
The coordinate subset depends only on ``key`` and ``D``, so the rule is
permutation invariant and a masked client changes nothing.

``flagged``: valid clients outside the final good set. ``diagnostics``:
``scores`` (last iteration, invalid = 0), ``selected`` [C], ``num_removed``
(per iteration, after clamping), ``sub_dim`` (the static ``b``).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import (HIGHEST, KEPT_MEAN, Aggregator, check_int, combine, finish,
                                            finite_scores, num_coordinates, prepare, rank_of)


def sampled_coordinates(updates, idx: jax.Array) -> jax.Array:
  """``[C, b]`` entries ``idx`` (indices into each client's flattened, leaf-concatenated update).

  Gathered leaf by leaf (no ``[C, D]`` concatenation is built): each index reads the leaf whose range holds it.
  """
  leaves = jax.tree.leaves(updates)
  c = leaves[0].shape[0]
  out = jnp.zeros((c, idx.shape[0]), jnp.float32)
  offset = 0
  for leaf in leaves:
    flat = leaf.reshape(c, -1)
    size = flat.shape[1]
    inside = (idx >= offset) & (idx < offset + size)
    vals = jnp.take(flat, jnp.clip(idx - offset, 0, size - 1), axis=1).astype(jnp.float32)
    out = jnp.where(inside[None, :], vals, out)
    offset += size
  return out


def dnc_scores(x: jax.Array, valid: jax.Array) -> jax.Array:
  """``[C]`` outlier scores ``<x_i - mu, v>^2`` of the valid rows of ``x`` [C, b] (invalid rows: 0)."""
  vf = valid.astype(jnp.float32)
  mu = jnp.sum(x * vf[:, None], axis=0) / jnp.maximum(jnp.sum(vf), 1.0)
  centred = jnp.where(valid[:, None], x - mu[None], 0.0)
  scale = jnp.max(jnp.abs(centred))
  centred = centred / jnp.where(scale > 0, scale, 1.0)
  g = jnp.dot(centred, centred.T, precision=HIGHEST)
  _, vecs = jnp.linalg.eigh(0.5 * (g + g.T))
  u = vecs[:, -1]  # eigenvector of the largest eigenvalue (eigh sorts ascending)
  v = jnp.dot(centred.T, u, precision=HIGHEST)
  v = v / jnp.maximum(jnp.linalg.norm(v), 1e-30)
  proj = jnp.dot(centred, v, precision=HIGHEST)
  return jnp.where(valid, jnp.nan_to_num(jnp.square(proj), nan=0.0), 0.0)


def make_dnc(num_byzantine: int, c: float = 1.0, niters: int = 1, sub_dim: int = 10000, weighted: bool = False,
             num_clients: Optional[int] = None) -> Aggregator:
  """DnC with ``f = num_byzantine``, filtering fraction ``c`` (removes ``floor(c f)`` per iteration), ``niters``
  iterations on ``sub_dim`` sampled coordinates each (capped at the update size ``D``). Needs a ``key``."""
  f = check_int("dnc: num_byzantine", num_byzantine)
  c = float(c)
  if not c >= 0:
    raise ValueError(f"dnc: c must be >= 0, got {c}")
  niters = check_int("dnc: niters", niters, 1)
  sub_dim = check_int("dnc: sub_dim", sub_dim, 1)
  remove = int(c * f + 1e-9)
  if num_clients is not None and remove >= int(num_clients):
    raise ValueError(f"dnc: removing floor(c * f) = {remove} of {num_clients} clients leaves nothing")

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del context
    if key is None:
      raise ValueError("dnc needs a PRNG key (it samples coordinates)")
    p = prepare(updates, weights, mask)
    d = num_coordinates(p.updates)
    b = min(sub_dim, d)
    k = jnp.clip(jnp.asarray(remove, jnp.int32), 0, jnp.maximum(p.n - 1, 0))

    def iteration(t, carry):
      good, _ = carry
      idx = jax.random.permutation(jax.random.fold_in(key, t), d)[:b]
      scores = dnc_scores(sampled_coordinates(p.updates, idx), p.valid)
      rank = rank_of(finite_scores(-scores, p.valid))  # 0 = highest score among the valid clients
      return good & p.valid & (rank >= k), scores

    good, scores = jax.lax.fori_loop(0, niters, iteration, (p.valid, jnp.zeros((p.num_clients,), jnp.float32)))
    coeffs = jnp.where(good, p.weights if weighted else 1.0, 0.0)
    coeffs = coeffs / jnp.maximum(jnp.sum(coeffs), 1e-30)
    diag = {"scores": scores, "selected": good, "num_removed": k, "sub_dim": jnp.asarray(b, jnp.int32)}
    return finish(p, combine(coeffs, p.updates), coeffs, p.valid & ~good, diag)

  return Aggregator("dnc", aggregate, averaging=KEPT_MEAN)
