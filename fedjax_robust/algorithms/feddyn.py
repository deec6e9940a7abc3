"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021), Algorithm 1.

Server state: the model ``θ^{t-1}`` and ``h`` (starts 0); client state: ``g_k = ∇L_k(θ_k^{t-1})``, the gradient of
its local loss at its last local model (starts 0). Round ``t`` with cohort ``P_t`` out of ``m`` clients:

1. Client ``k`` trains from ``θ^{t-1}`` on the dynamically regularized objective (Alg. 1 line 5)
   ``L_k(θ) − <g_k, θ> + (α/2) ||θ − θ^{t-1}||²`` (the linear term through
   :func:`~fedjax_robust.algorithms.hetero_common.linear_term`: exact gradient ``−g_k``, value 0, so the logged
   loss is the data loss plus the proximal term) with the run's local schedule, giving ``θ_k^t``.
2. ``g_k ← g_k − α (θ_k^t − θ^{t-1})`` (line 6, the first-order condition of line 5), kept on the client;
   upload ``Δ_k = θ_k^t − θ^{t-1}`` (field ``delta``).
3. Server (lines 9-10): ``h^t = h^{t-1} − α (1/m) Σ_{k∈P_t} Δ_k`` (1/m over ALL m clients, the paper's), and
   ``θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − (1/α) h^t``.

Averages through the aggregation rule: ``(1/|P|) Σ θ_k = θ^{t-1} + Δ̄`` with ``Δ̄`` the rule's aggregate of the
``delta`` uploads, and ``(1/m) Σ_{k∈P} Δ_k = (|P|/m) Δ̄`` with ``|P|`` the clients the rule kept. With the uniform
``mean`` rule (``aggregator.weighted=False``) both are the paper's sums exactly; the default ``mean`` rule weights
by samples like every algorithm of this package (identical for equal client sizes); a robust rule's exclusions
keep those clients out of ``h`` too. A round in which the rule keeps nobody leaves the server state unchanged.

Not reproduced from the official code: its per-client ``α / (n_k / mean n)`` scaling, gradient clipping and
weight decay inside the objective (the run's ``client.weight_decay`` still applies through the optimizer). The
client optimizer is any of the run's (re-created every round); the server's update is the paper's (the run's
server optimizer must stay plain averaging). Model state (BatchNorm statistics) as in
:func:`~fedjax_robust.algorithms.fedavg.make_fedavg`: averaged with the rule's effective weights; ``g_k`` and ``h``
cover the trainable parameters only.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators import Aggregator, make_mean
from fedjax_robust.aggregators.base import round_diagnostics
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import classification_loss, mean_model_state, tree_sub
from fedjax_robust.algorithms.hetero_common import aggregate_deltas, included_count, linear_term, zeros_like_tree
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.hparams import check
from fedjax_robust.models.interface import Model, as_model, merge_variables, split_variables
from fedjax_robust.round_context import RoundContext

PyTree = Any


class FedDynServerState(NamedTuple):
  params: PyTree  # θ^{t-1}, the broadcast (and evaluated) model
  h: PyTree  # the server's state h
  model_state: PyTree = {}


def make_feddyn(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec, num_clients: int,
                alpha=0.01, aggregator: Optional[Aggregator] = None) -> FedAlgorithm:
  """FedDyn with regularization ``alpha`` (α > 0) over ``num_clients`` (m) clients."""
  check(alpha, lambda v: v > 0, f"feddyn: alpha must be > 0, got {alpha}")
  if int(num_clients) < 1:
    raise ValueError(f"feddyn: num_clients must be >= 1, got {num_clients}")
  model = as_model(model)
  aggregator = aggregator or make_mean()
  m = float(num_clients)

  def init_server(params, model_state=None):
    return FedDynServerState(params, zeros_like_tree(params), dict(model_state or {}))

  def init_client(params, model_state=None):
    return {"grad": zeros_like_tree(params)}

  def broadcast(state: FedDynServerState):
    return merge_variables(state.params, state.model_state) if state.model_state else state.params

  def client_update(payload, client_state, data: ClientData, key):
    anchor, model_state = split_variables(payload)
    g = client_state["grad"]
    base = classification_loss(model, anchor, alpha)

    def loss_fn(params, batch):
      loss, new_state = base(params, batch)
      return loss - linear_term(g, params), new_state

    theta, _, metrics, model_state = local_train(loss_fn, client_opt, anchor, client_opt.init(anchor), data, key,
                                                 spec, model_state)
    delta = tree_sub(theta, anchor)
    upload = {"delta": delta}
    if model_state:
      upload["model_state"] = model_state
    return ClientOutput(upload, {"grad": jax.tree.map(lambda a, d: a - alpha * d, g, delta)}, metrics)

  def server_update(state: FedDynServerState, uploads, weights, key, context: Optional[RoundContext] = None):
    result = aggregate_deltas(aggregator, model, client_opt, spec, state.params, state.model_state,
                              uploads["delta"], weights, key, context)
    p = result.weights
    kept = included_count(p)
    h = jax.tree.map(lambda a, d: a - alpha * (kept / m) * d, state.h, result.update)
    params = jax.tree.map(lambda w, d, hh: w + d - hh / alpha, state.params, result.update, h)
    any_kept = kept > 0
    params = jax.tree.map(lambda new, old: jnp.where(any_kept, new, old), params, state.params)
    h = jax.tree.map(lambda new, old: jnp.where(any_kept, new, old), h, state.h)
    model_state = state.model_state
    if "model_state" in uploads:
      model_state = mean_model_state(uploads["model_state"], p, state.model_state)
    return FedDynServerState(params, h, model_state), round_diagnostics(result, p)

  def personal_params(payload, client_state, data, key):
    return payload

  return FedAlgorithm("feddyn", init_server, init_client, broadcast, client_update, server_update, broadcast,
                      personal_params, uses_context=True)
