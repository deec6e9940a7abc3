"""Norm-based rules: norm clipping (Sun et al. 2019) and centered clipping (Karimireddy, He, Jaggi 2021).

* ``norm_clipping``: ``u_i <- u_i * min(1, max_norm / ||u_i||)``, then the
  (sample-weighted, by default) mean of the clipped updates.
* ``centered_clipping``: starting from a reference ``v`` (``context["reference"]``,
  e.g. the previous aggregate / server momentum; zero when absent), repeat
  ``iters`` times
      ``v <- v + (1/n) sum_i (u_i - v) * min(1, tau / ||u_i - v||)``
  over the valid clients (uniform ``1/n`` as in the paper; ``weighted=True``
  uses normalized sample weights instead).

Neither rule excludes anyone, so ``flagged`` only holds non-finite uploads.
Reported ``weights``: the normalized coefficients of the clients in the final
combination (clip factors times the averaging weights, renormalized to sum to
1: for centered clipping the aggregate is ``(1 - sum c_i/n) v + sum (c_i/n) u_i``,
an affine, not convex, combination). ``diagnostics``: ``norms`` and
``clip_factors`` (of the last iteration), ``clipped`` [C] bool.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import (Aggregator, check_int, check_positive, combine, finish, normalize, prepare,
                                            sanitize, sq_norms, tree_sub)


def _clip_factor(norms, bound):
  return jnp.where(norms > bound, bound / jnp.where(norms > 0, norms, 1.0), 1.0)


def make_norm_clipping(max_norm: float, weighted: bool = True, num_clients: Optional[int] = None) -> Aggregator:
  """Clip every update to L2 norm ``max_norm``, then average."""
  del num_clients
  bound = check_positive("norm_clipping: max_norm", max_norm)

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    norms = jnp.sqrt(sq_norms(p.updates))
    factor = jnp.where(jnp.isfinite(norms), _clip_factor(norms, bound), 0.0)
    avg = normalize(p.weights if weighted else p.valid.astype(jnp.float32))
    coeffs = avg * factor
    diag = {"norms": norms, "clip_factors": factor, "clipped": p.valid & (norms > bound)}
    return finish(p, combine(coeffs, p.updates), coeffs, diagnostics=diag)

  return Aggregator("norm_clipping", aggregate)


def make_centered_clipping(tau: float = 10.0, iters: int = 1, weighted: bool = False,
                           num_clients: Optional[int] = None) -> Aggregator:
  """Centered clipping with radius ``tau`` and ``iters`` fixed-point iterations around ``context["reference"]``."""
  del num_clients
  tau = check_positive("centered_clipping: tau", tau)
  iters = check_int("centered_clipping: iters", iters, 1)

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key
    context = context or {}
    p = prepare(updates, weights, mask)
    one = jax.tree.map(lambda u: jnp.zeros(u.shape[1:], u.dtype), p.updates)
    ref = context.get("reference")
    if ref is None:
      v = one
    else:  # a non-finite reference falls back to zero
      ref_clean, _, _ = sanitize(jax.tree.map(lambda r: r[None], ref))
      v = jax.tree.map(lambda r, z: r[0].astype(z.dtype), ref_clean, one)
    avg = normalize(p.weights if weighted else p.valid.astype(jnp.float32))

    def step(_, carry):
      v, _, _ = carry
      diff = tree_sub(p.updates, v)
      norms = jnp.sqrt(sq_norms(diff))
      factor = jnp.where(jnp.isfinite(norms), _clip_factor(norms, tau), 0.0)
      v = jax.tree.map(jnp.add, v, combine(avg * factor, diff))
      return v, norms, factor

    c = p.num_clients
    v, norms, factor = jax.lax.fori_loop(0, iters, step, (v, jnp.zeros((c,)), jnp.ones((c,))))
    diag = {"norms": norms, "clip_factors": factor, "clipped": p.valid & (norms > tau)}
    return finish(p, v, avg * factor, diagnostics=diag)

  return Aggregator("centered_clipping", aggregate)
