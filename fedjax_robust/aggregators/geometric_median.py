"""RFA: the geometric median by smoothed Weiszfeld iterations (Pillutla, Kakade, Harchaoui 2022, Alg. 3).

    v_0 = sum_i a_i u_i                      (a = normalized sample weights, or uniform)
    b_i = a_i / max(nu, ||v - u_i||)
    v  <- sum_i b_i u_i / sum_i b_i
    stop after max_iter iterations or when |g(v_old) - g(v)| <= tol * g(v),  g(v) = sum_i a_i ||v - u_i||

Textbook default: one geometric median over the whole (flattened) update.
``per_layer=True`` runs Weiszfeld separately on every leaf, as the FedCAP
artifact does (``hdmedians.geomedian`` per layer tensor; fedcap.md §3 "RFA" and
§6.17); the artifact's median is unweighted, i.e. ``weighted=False``.
FedVSA (fedvsa.md §3) uses nu = 1e-6 and at most 3 iterations.

``weights`` in the result are the last Weiszfeld weights ``b / sum b`` (the
geometric median is the fixed point of that weighted mean); with ``per_layer``
they are averaged over leaves. ``diagnostics["iterations"]`` is the number of
Weiszfeld steps taken (max over leaves).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import (INPUT_WEIGHTS, Aggregator, check_int, check_positive, combine,
                                            distances_to, finish, normalize, prepare)


def weiszfeld(updates, alphas: jax.Array, max_iter: int, tol: float, nu: float):
  """``(median, weights [C], iterations, objective)`` of the points ``updates`` with weights ``alphas`` (>= 0)."""
  alphas = normalize(alphas)
  v0 = combine(alphas, updates)
  d0 = distances_to(updates, v0)
  obj0 = jnp.sum(alphas * d0)

  def cond(state):
    it, _, _, _, _, done = state
    return (it < max_iter) & ~done

  def body(state):
    it, _, d, obj, _, _ = state
    b = normalize(alphas / jnp.maximum(nu, d))
    v = combine(b, updates)
    d_new = distances_to(updates, v)
    obj_new = jnp.sum(alphas * d_new)
    done = jnp.abs(obj - obj_new) <= tol * obj_new
    return it + 1, v, d_new, obj_new, b, done

  init = (jnp.zeros((), jnp.int32), v0, d0, obj0, alphas, jnp.zeros((), bool))
  it, v, _, obj, b, _ = jax.lax.while_loop(cond, body, init)
  return v, b, it, obj


def make_rfa(max_iter: int = 100, tol: float = 1e-6, smoothing: float = 1e-6, per_layer: bool = False,
             weighted: bool = True, num_clients: Optional[int] = None, name: str = "rfa") -> Aggregator:
  """RFA / geometric median. ``weighted``: Weiszfeld weights start from the sample weights (Pillutla et al.)."""
  del num_clients
  max_iter = check_int(f"{name}: max_iter", max_iter)
  tol = float(tol)
  if tol < 0:
    raise ValueError(f"{name}: tol must be >= 0, got {tol}")
  nu = check_positive(f"{name}: smoothing", smoothing)

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    alphas = p.weights if weighted else p.valid.astype(jnp.float32)
    if not per_layer:
      agg, b, it, obj = weiszfeld(p.updates, alphas, max_iter, tol, nu)
      return finish(p, agg, b, diagnostics={"iterations": it, "objective": obj})
    leaves, treedef = jax.tree.flatten(p.updates)
    outs = [weiszfeld(u, alphas, max_iter, tol, nu) for u in leaves]
    agg = jax.tree.unflatten(treedef, [o[0] for o in outs])
    b = sum(o[1] for o in outs) / len(outs)
    it = jnp.max(jnp.stack([o[2] for o in outs]))
    return finish(p, agg, b, diagnostics={"iterations": it, "objective": sum(o[3] for o in outs)})

  return Aggregator(name, aggregate, averaging=INPUT_WEIGHTS if weighted else "")
