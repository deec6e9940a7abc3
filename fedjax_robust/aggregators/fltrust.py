"""FLTrust (Cao, Fang, Liu, Gong, NDSS 2021).

The server's own update ``g0 = context["reference_update"]`` (trained on its
clean root dataset; the engine computes it, this rule only uses it):

    TS_i = ReLU(cos(u_i, g0))
    u^_i = u_i * ||g0|| / ||u_i||
    agg  = sum_i TS_i u^_i / sum_i TS_i

A zero-norm update (or a NaN cosine) gets trust 0 (FedCAP spec §6.20: a NaN
cosine becomes -1). When every trust score is 0 (or ``g0`` is zero or
non-finite) the aggregate is 0. FedCAP's artifact divides by ``sum TS + 1e-9``
(fedcap.md §3), which differs from the textbook only in the last float bits;
``eps`` sets that constant (default 0 = textbook).

``weights`` = ``TS / sum TS`` (the weight of each *rescaled* update);
``flagged`` = valid clients with trust 0; ``diagnostics``: ``trust``,
``cosine``, ``norms``, ``reference_norm``.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import Aggregator, combine, dots, finish, prepare, sanitize, sq_norms


def make_fltrust(eps: float = 0.0, num_clients: Optional[int] = None) -> Aggregator:
  del num_clients
  eps = float(eps)
  if eps < 0:
    raise ValueError(f"fltrust: eps must be >= 0, got {eps}")

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key
    context = context or {}
    if context.get("reference_update") is None:
      raise ValueError("fltrust needs context['reference_update'] (the server's update on its root dataset)")
    p = prepare(updates, weights, mask)
    ref = jax.tree.map(lambda r: r[None], context["reference_update"])
    if jax.tree.structure(ref) != jax.tree.structure(p.updates):
      raise ValueError("fltrust: context['reference_update'] must have the structure of one client's update")
    ref, ref_ok, _ = sanitize(ref)
    ref = jax.tree.map(lambda r: r[0], ref)
    ref_norm = jnp.sqrt(sq_norms(jax.tree.map(lambda r: r[None], ref))[0])
    norms = jnp.sqrt(sq_norms(p.updates))
    denom = norms * ref_norm
    ok = p.valid & (denom > 0) & jnp.isfinite(denom)
    cos = jnp.where(ok, dots(p.updates, ref) / jnp.where(ok, denom, 1.0), -1.0)
    cos = jnp.where(jnp.isnan(cos), -1.0, jnp.clip(cos, -1.0, 1.0))
    trust = jnp.where(ok, jax.nn.relu(cos), 0.0)
    total = jnp.sum(trust)
    scale = jnp.where(ok, ref_norm / jnp.where(ok, norms, 1.0), 0.0)
    coeffs = jnp.where(total > 0, trust * scale / (jnp.where(total > 0, total, 1.0) + eps), 0.0)
    diag = {"trust": trust, "cosine": cos, "norms": norms, "reference_norm": ref_norm,
            "reference_ok": ref_ok[0]}
    return finish(p, combine(coeffs, p.updates), trust, p.valid & (trust <= 0), diag)

  return Aggregator("fltrust", aggregate, needs=("reference_update",))
