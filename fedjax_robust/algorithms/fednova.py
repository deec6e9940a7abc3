"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization",
NeurIPS 2020): normalized averaging.

Client ``k`` runs its local SGD from the global model ``x`` and uploads ``Δ_k = x_k − x`` (field ``delta``) and
``a_k = ||a_k||_1``, the L1 norm of its aggregation vector (Eq. 6-7; field ``a``):

* plain SGD: ``a_k = τ_k``, the client's number of REAL local steps (``epochs · ceil(n_k / B)``; padded steps
  are no-ops, so τ varies per client);
* SGD with momentum ρ (the paper's momentum case, its official code's ``local_normalizing_vec``):
  ``a_k = [τ_k − ρ (1 − ρ^{τ_k}) / (1 − ρ)] / (1 − ρ)``, which is τ_k for ρ = 0.

The server (Eq. 7) normalizes ``d_k = Δ_k / a_k``, takes ``τ_eff = Σ_k p_k a_k`` and applies
``Δ = τ_eff Σ_k p_k d_k`` with ``p_k = n_k / Σ n`` (the sample weights the engine passes; uniform with
``aggregator.weighted=False``) through the run's
server optimizer (``sgd(1)``: ``x ← x + Δ``; momentum: FedNova's server momentum). The weights come from the
sample-weighted ``mean`` rule, so a non-finite upload is excluded and flagged (``p`` renormalized over the rest) and
a client without samples (``a_k = 0``) counts for nothing. When every ``a_k`` is equal this is FedAvg.

FedNova IS the aggregation rule, so the registry refuses another ``aggregator`` (FedVSA spec Table 9: FedNova does
not combine with other rules). The client optimizer must be SGD without Nesterov (``a_k`` is defined for plain and
heavy-ball momentum; weight decay is part of the step, as in the official code) and is re-created every round
(the momentum buffer starts at 0, as ``a_k`` assumes). Model state (BatchNorm statistics) is averaged with the
same ``p_k``.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators import make_mean
from fedjax_robust.aggregators.base import round_diagnostics
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import (ServerState, apply_server_update, classification_loss,
                                             mean_model_state, tree_sub)
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.models.interface import Model, as_model, merge_variables, split_variables

PyTree = Any


def normalizing_constant(steps: jax.Array, momentum: float = 0.0) -> jax.Array:
  """``a = ||a||_1`` after ``steps`` local steps of SGD with heavy-ball ``momentum`` ρ (τ for ρ = 0)."""
  tau = jnp.asarray(steps, jnp.float32)
  rho = float(momentum)
  if rho == 0.0:
    return tau
  return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)


def make_fednova(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec,
                 server_opt: optax.GradientTransformation | None = None, momentum: float = 0.0,
                 weighted: bool = True) -> FedAlgorithm:
  """FedNova. ``client_opt``: SGD with heavy-ball ``momentum`` ρ in ``[0, 1)`` (0 = plain SGD, ``a_k = τ_k``);
  ``weighted``: ``p_k = n_k / Σ n`` (the paper's), else uniform over the clients with samples."""
  if not 0.0 <= float(momentum) < 1.0:
    raise ValueError(f"fednova: the client momentum must be in [0, 1), got {momentum}")
  model = as_model(model)
  server_opt = server_opt or optax.sgd(1.0)
  mean = make_mean(weighted=bool(weighted))

  def init_server(params, model_state=None):
    return ServerState(params, server_opt.init(params), dict(model_state or {}))

  def broadcast(state: ServerState):
    return merge_variables(state.params, state.model_state) if state.model_state else state.params

  def client_update(payload, client_state, data: ClientData, key):
    x, model_state = split_variables(payload)
    y, _, metrics, model_state = local_train(classification_loss(model), client_opt, x, client_opt.init(x), data,
                                             key, spec, model_state)
    upload = {"delta": tree_sub(y, x), "a": normalizing_constant(metrics["steps"], momentum)}
    if model_state:
      upload["model_state"] = model_state
    return ClientOutput(upload, {}, metrics)

  def server_update(state: ServerState, uploads, weights, key, context=None):
    del key, context
    a = uploads["a"]
    scale = jnp.where(a > 0, 1.0 / jnp.where(a > 0, a, 1.0), 0.0)
    c = a.shape[0]
    normalized = jax.tree.map(lambda d: d * scale.reshape((c,) + (1,) * (d.ndim - 1)), uploads["delta"])
    result = mean(normalized, jnp.where(a > 0, weights, 0.0))
    p = result.weights
    tau_eff = jnp.sum(p * jnp.where(p > 0, a, 0.0))
    update = jax.tree.map(lambda d: tau_eff * d, result.update)
    new_state = apply_server_update(server_opt, state, update)
    if "model_state" in uploads:
      new_state = new_state._replace(model_state=mean_model_state(uploads["model_state"], p, state.model_state))
    return new_state, {**round_diagnostics(result, p), "tau_eff": tau_eff}

  def personal_params(payload, client_state, data, key):
    return payload

  return FedAlgorithm("fednova", init_server, lambda params, model_state=None: {}, broadcast, client_update,
                      server_update, broadcast, personal_params, uses_context=True)
