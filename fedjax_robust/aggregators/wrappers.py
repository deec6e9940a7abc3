"""Wrappers around an inner rule: Bucketing (Karimireddy, He, Jaggi 2022) and GAS (Liu et al. 2023).

Bucketing(s): randomly permute the valid clients (with ``key``), average
consecutive groups of ``s`` (the last bucket may be smaller), run the inner
rule on the ``ceil(n/s)`` bucket means (bucket weight = the sum of its members'
sample weights). A client's effective weight is its bucket's inner weight
divided by the bucket size; a client is flagged when its bucket is. ``s = 1``
returns the inner rule unchanged. The inner rule sees ``ceil(C/s)`` "clients",
so its ``num_byzantine`` should be set for buckets (FedCAP: ``int(#buckets *
p_atk)``, fedcap.md §3). ``fixed_seed``: FedCAP artifact quirk (fedcap.md §3
"Bucketing"): the same permutation, from ``PRNGKey(fixed_seed)``, every round.

GAS(p) (gradient splitting, fedcap.md §3 "GAS"): ravel every update, permute
the coordinates randomly (fresh ``key`` each round), split into ``p`` chunks;
run the inner rule on every chunk (``vmap``) and score each client by
``score_i = sum_chunks ||chunk_i - inner_agg(chunk)||_2``; keep the ``n - f``
lowest-score clients and average their FULL updates uniformly. With ``p = 1``
GAS is "the mean of the n - f updates closest to the inner aggregate".
``d`` that is not a multiple of ``p`` is zero-padded (zeros do not change any
distance); ``context["reference_update"]`` / ``context["reference"]`` are
permuted and split like the updates so FLTrust / centered clipping work inside.
``flagged`` = valid clients not kept; ``diagnostics``: ``scores``, ``selected``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_robust.aggregators.base import Aggregator, check_int, combine, finish, finite_scores, prepare, rank_of


def _build_inner(inner: Any, num_clients: Optional[int]) -> Aggregator:
  if isinstance(inner, Aggregator):
    return inner
  from fedjax_robust.aggregators.registry import aggregator_from_config, make_aggregator  # circular import
  if isinstance(inner, str):
    return make_aggregator(inner, num_clients=num_clients)
  return aggregator_from_config(inner, num_clients=num_clients)


def make_bucketing(inner: Any, s: int = 2, fixed_seed: Optional[int] = None,
                   num_clients: Optional[int] = None) -> Aggregator:
  """``inner``: an :class:`Aggregator`, a rule name or a config dict (``{"name": "krum", ...}``)."""
  s = check_int("bucketing: s", s, 1)
  num_buckets = None if num_clients is None else math.ceil(int(num_clients) / s)
  inner = _build_inner(inner, num_buckets)
  if s == 1:
    return Aggregator(f"bucketing({inner.name})", inner.aggregate, needs=inner.needs)

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    if fixed_seed is not None:
      key = jax.random.PRNGKey(fixed_seed)
    if key is None:
      raise ValueError("bucketing needs a PRNG key (or fixed_seed)")
    perm_key, inner_key = jax.random.split(key)
    p = prepare(updates, weights, mask)
    c = p.num_clients
    b = math.ceil(c / s)
    # valid clients first, in random order
    r = jnp.where(p.valid, jax.random.uniform(perm_key, (c,)), 2.0)
    order = jnp.argsort(r)
    pad = b * s - c
    idx = jnp.concatenate([order, jnp.zeros((pad,), order.dtype)]).reshape(b, s)
    member = jnp.concatenate([p.valid[order], jnp.zeros((pad,), bool)]).reshape(b, s)
    count = jnp.sum(member, axis=1)
    inv = jnp.maximum(count, 1).astype(jnp.float32)

    def bucket_mean(u):
      g = u[idx].astype(jnp.promote_types(u.dtype, jnp.float32))  # [b, s, ...]
      m = member.reshape(member.shape + (1,) * (u.ndim - 1))
      return (jnp.sum(jnp.where(m, g, 0.0), axis=1) / inv.reshape((b,) + (1,) * (u.ndim - 1))).astype(u.dtype)

    buckets = jax.tree.map(bucket_mean, p.updates)
    bucket_w = jnp.sum(jnp.where(member, p.weights[idx], 0.0), axis=1)
    res = inner.aggregate(buckets, bucket_w, count > 0, inner_key, context)
    # bucket of every client (valid ones; invalid ones are not in any bucket)
    pos = jnp.zeros((c,), jnp.int32).at[order].set(jnp.arange(c, dtype=jnp.int32))
    bucket_of = pos // s
    coeffs = jnp.where(p.valid, res.weights[bucket_of] / inv[bucket_of], 0.0)
    flagged = p.valid & res.flagged[bucket_of]
    diag = {"bucket": jnp.where(p.valid, bucket_of, -1)}
    diag.update({f"inner/{k}": v for k, v in res.diagnostics.items()})
    return finish(p, res.update, coeffs, flagged, diag)

  return Aggregator(f"bucketing({inner.name})", aggregate, needs=inner.needs)


def make_gas(inner: Any, p: int = 1000, num_byzantine: Optional[int] = None, permute: bool = True,
             num_clients: Optional[int] = None) -> Aggregator:
  """``num_byzantine`` (f): clients dropped after scoring; defaults to the inner config's ``num_byzantine``."""
  num_chunks = check_int("gas: p", p, 1)
  if num_byzantine is None and isinstance(inner, dict):
    num_byzantine = inner.get("num_byzantine")
  if num_byzantine is None and hasattr(inner, "get") and not isinstance(inner, (str, Aggregator)):
    num_byzantine = inner.get("num_byzantine", None)
  if num_byzantine is None:
    raise ValueError("gas: num_byzantine (clients to drop after scoring) is required")
  f = check_int("gas: num_byzantine", num_byzantine)
  if num_clients is not None and f >= int(num_clients):
    raise ValueError(f"gas: num_byzantine={f} must be < number of clients {num_clients}")
  inner = _build_inner(inner, num_clients)

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    context = dict(context or {})
    pr = prepare(updates, weights, mask)
    c = pr.num_clients
    if f >= c:
      raise ValueError(f"gas: num_byzantine={f} must be < number of clients {c}")
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])(pr.updates)  # [C, d]
    d = flat.shape[1]
    if permute and num_chunks > 1:
      if key is None:
        raise ValueError("gas needs a PRNG key to permute coordinates")
      key, perm_key = jax.random.split(key)
      perm = jax.random.permutation(perm_key, d)
    else:
      perm = None
    length = math.ceil(d / num_chunks)
    pad = length * num_chunks - d

    def split(v):  # [..., d] -> [..., p, L]
      if perm is not None:
        v = v[..., perm]
      v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, pad)])
      return v.reshape(v.shape[:-1] + (num_chunks, length))

    chunks = split(flat).transpose(1, 0, 2)  # [p, C, L]
    chunk_ctx = {}
    for name in ("reference_update", "reference"):
      if context.get(name) is not None:
        chunk_ctx[name] = split(ravel_pytree(context[name])[0].astype(flat.dtype))  # [p, L]
    rest = {k: v for k, v in context.items() if k not in chunk_ctx}
    keys = jax.random.split(key if key is not None else jax.random.PRNGKey(0), num_chunks)

    def one(args):  # the inner rule on one chunk -> that chunk's score contribution per client [C]
      chunk, k, cctx = args
      agg = inner.aggregate(chunk, pr.weights, pr.valid, k, {**rest, **cctx}).update
      return jnp.sqrt(jnp.sum(jnp.square(chunk - agg[None]), axis=-1))

    # CPU: one chunk at a time (a [C, L] chunk stays in cache; ~3x faster than vmap); accelerators: vmap
    batch = None if jax.default_backend() == "cpu" else num_chunks
    scores = jnp.sum(jax.lax.map(one, (chunks, keys, chunk_ctx), batch_size=batch), axis=0)
    scores = finite_scores(scores, pr.valid)
    keep = jnp.clip(pr.n - f, 1, jnp.maximum(pr.n, 1))
    selected = pr.valid & (rank_of(scores) < keep)
    coeffs = selected.astype(jnp.float32) / jnp.maximum(jnp.sum(selected), 1)
    return finish(pr, combine(coeffs, pr.updates), coeffs, pr.valid & ~selected,
                  {"scores": scores, "selected": selected})

  return Aggregator(f"gas({inner.name})", aggregate, needs=inner.needs)
