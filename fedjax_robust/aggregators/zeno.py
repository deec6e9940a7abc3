"""Zeno++ in the synchronous form FedVSA's baselines use (Xie, Koyejo, Gupta: Zeno, ICML 2019; Zeno++, ICML 2020;
spec fedvsa.md §3).

Each upload ``Δ_k = w_k - w^t`` is scored on a server batch (the server-held data):

    score_k = L(w^t) - L(w^t + Δ_k) - rho * ||Δ_k||^2

(the loss decrease the update buys, minus a size penalty). The ``b`` lowest-scoring
valid clients are dropped, i.e. the top ``n - b`` are kept, and the aggregate is the
plain mean of the kept updates (``weighted=True``: by sample weight).

The losses are a declared need (``needs=("server_losses",)``): the server step
computes, on device, the mean cross-entropy of the global model
(``context["global_server_loss"]``) and of every client model
(``context["server_losses"]`` [C]) on at most ``max_server_rows`` real rows of the
server data (``round_context.compute_needs``). A run without server data is refused.

Conventions. ``rho = 5e-4`` and ``b = 1`` are the FedCavPlus library defaults
(spec §3). The penalty is the squared Euclidean norm of the whole update, as in
the Zeno papers (the FedCavPlus code's ``np.linalg.norm(.., ord==2)`` evaluates
``ord=False``, i.e. a count of non-zero entries; not reproduced). A non-finite
client loss scores worst (-inf) and is dropped first; masked and non-finite
uploads are never kept (``base.prepare``). The number kept is clamped to
``[1, n]``, so at least one valid client is always aggregated. Ties are broken by
client index.

``flagged``: valid clients that were dropped. ``diagnostics``: ``scores`` [C]
(invalid: -inf), ``selected`` [C], ``num_kept``.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp

from fedjax_robust.aggregators.base import (KEPT_MEAN, Aggregator, check_int, combine, finish, finite_scores, prepare,
                                            rank_of, sq_norms)


def zeno_scores(global_loss, client_losses, sq_norm, rho: float) -> jnp.ndarray:
  """``L(w^t) - L(w_k) - rho ||Δ_k||^2`` (NaN becomes -inf: a client whose loss cannot be measured is the worst)."""
  s = jnp.asarray(global_loss, jnp.float32) - jnp.asarray(client_losses, jnp.float32) - rho * sq_norm
  return jnp.where(jnp.isnan(s), -jnp.inf, s)


def make_zeno(rho: float = 5e-4, b: int = 1, weighted: bool = False,
              num_clients: Optional[int] = None) -> Aggregator:
  """Zeno++ (synchronous): keep the ``n - b`` highest-scoring valid uploads, average them."""
  rho = float(rho)
  if not rho >= 0:
    raise ValueError(f"zeno: rho must be >= 0, got {rho}")
  b = check_int("zeno: b", b)
  if num_clients is not None and b >= int(num_clients):
    raise ValueError(f"zeno: dropping b = {b} of {num_clients} clients leaves nothing")

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key
    context = context or {}
    losses, global_loss = context.get("server_losses"), context.get("global_server_loss")
    if losses is None or global_loss is None:
      raise ValueError("zeno needs context['server_losses'] and context['global_server_loss'] (each client "
                       "model's and the global model's loss on the server's data): give the run server-held "
                       "data (server.root_dataset_size > 0)")
    p = prepare(updates, weights, mask)
    losses = jnp.asarray(losses, jnp.float32).reshape(p.num_clients)
    scores = jnp.where(p.valid, zeno_scores(global_loss, losses, sq_norms(p.updates), rho), -jnp.inf)
    keep = jnp.clip(p.n - b, 1, jnp.maximum(p.n, 1))
    order = rank_of(finite_scores(-scores, p.valid))  # 0 = highest score; every valid client before any invalid
    selected = p.valid & (order < keep)
    coeffs = jnp.where(selected, p.weights if weighted else 1.0, 0.0)
    coeffs = coeffs / jnp.maximum(jnp.sum(coeffs), 1e-30)
    diag = {"scores": scores, "selected": selected, "num_kept": jnp.where(p.n > 0, keep, 0)}
    return finish(p, combine(coeffs, p.updates), coeffs, p.valid & ~selected, diag)

  return Aggregator("zeno", aggregate, needs=("server_losses",), averaging=KEPT_MEAN)
