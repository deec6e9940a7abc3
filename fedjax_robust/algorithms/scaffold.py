"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020).

Algorithm 1 with the option II control-variate update (spec fedvsa.md §3). Server state: the model ``x`` and the
server control variate ``c``; client state: its control variate ``c_i`` (both start at 0). One round:

1. The server sends ``(x, c)`` to the cohort ``S``.
2. Client ``i`` starts from ``y_i = x`` and runs its local SGD steps with the corrected gradient
   ``y_i ← y_i − η (g_i(y_i) − c_i + c)`` (Alg. 1 line 10). Here the correction is the loss term
   ``<c − c_i, y>`` (:func:`~fedjax_robust.algorithms.hetero_common.linear_term`: value 0, gradient exactly
   ``c − c_i``), so every local-training feature (masked batches, padded no-op steps, BatchNorm) is unchanged.
3. Option II (line 12): ``c_i⁺ = c_i − c + (x − y_i) / (K η)``, with ``K`` the client's number of REAL local steps
   (``epochs · ceil(n_i / B)``, varying per client; padded steps are no-ops) and ``η`` the client learning rate.
   A client with no real step (``n_i = 0``) keeps ``c_i`` (``Δc_i = 0``).
4. Upload ``Δy_i = y_i − x`` (field ``delta``, what model attacks poison) and ``Δc_i = c_i⁺ − c_i`` (``dc``).
5. Server (line 16-17): ``x ← x + η_g · Δy``, ``c ← c + (|S|/N) · Δc``, with ``Δy`` the aggregation rule's result
   on the ``delta`` uploads and ``Δc = Σ_i p_i Δc_i`` with the rule's effective weights ``p_i`` (``|S|`` = clients
   the rule kept). The paper's plain means are the uniform ``mean`` rule (``aggregator.weighted=False``); the
   default ``mean`` rule weights by samples like every algorithm of this package (the same when clients hold equal
   amounts of data). A robust rule replaces the average of ``Δy`` and its exclusions also drop those clients'
   ``Δc`` (FedVSA spec Table 9 combines SCAFFOLD with other aggregation rules).

``η_g`` is ``server_lr`` (the registry's ``algorithm.scaffold.server_lr``; the run's server optimizer must stay
plain averaging). The client optimizer must be SGD with learning rate ``lr`` (``weight_decay`` and momentum are
applied by it as usual; with momentum, option II's ``(x − y_i)/(K η)`` is the mean applied step per unit of
learning rate, as PyTorch SCAFFOLD implementations compute it). It is re-created every round.

Model state (BatchNorm statistics): as :func:`~fedjax_robust.algorithms.fedavg.make_fedavg`, clients train from
the global statistics and upload theirs; the server averages them with the rule's effective weights. Control
variates cover the trainable parameters only.
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
from fedjax_robust.algorithms.hetero_common import (aggregate_deltas, included_count, linear_term, server_model,
                                                    weighted_rows,
                                                    zeros_like_tree)
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.hparams import check
from fedjax_robust.models.interface import Model, as_model, split_variables
from fedjax_robust.round_context import RoundContext

PyTree = Any


class ScaffoldServerState(NamedTuple):
  params: PyTree  # the global model x
  c: PyTree  # the server control variate
  model_state: PyTree = {}  # BatchNorm statistics of the global model; {} if none


def control_variate_update(c_i: PyTree, c: PyTree, x: PyTree, y: PyTree, steps: jax.Array, lr) -> PyTree:
  """Option II: ``c_i⁺ = c_i − c + (x − y) / (K η)``; ``c_i`` unchanged when ``K = 0``."""
  k = steps.astype(jnp.float32)
  scale = jnp.where(k > 0, 1.0 / (jnp.maximum(k, 1.0) * lr), 0.0)
  new = jax.tree.map(lambda ci, cc, a, b: ci - cc + (a - b) * scale, c_i, c, x, y)
  return jax.tree.map(lambda n, o: jnp.where(k > 0, n, o), new, c_i)


def make_scaffold(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec, num_clients: int,
                  lr, server_lr=1.0, aggregator: Optional[Aggregator] = None) -> FedAlgorithm:
  """SCAFFOLD (option II). ``client_opt``: SGD with learning rate ``lr`` (η of the ``c_i`` update);
  ``server_lr``: η_g; ``num_clients``: N; ``aggregator``: the rule for ``Δy`` (default sample-weighted ``mean``)."""
  check(lr, lambda v: v > 0, f"scaffold: the client learning rate must be > 0, got {lr}")
  check(server_lr, lambda v: v > 0, f"scaffold: server_lr must be > 0, got {server_lr}")
  if int(num_clients) < 1:
    raise ValueError(f"scaffold: num_clients must be >= 1, got {num_clients}")
  model = as_model(model)
  aggregator = aggregator or make_mean()
  n_total = float(num_clients)

  def init_server(params, model_state=None):
    return ScaffoldServerState(params, zeros_like_tree(params), dict(model_state or {}))

  def init_client(params, model_state=None):
    return {"c": zeros_like_tree(params)}

  def broadcast(state: ScaffoldServerState):
    return {"model": server_model(state), "c": state.c}

  def client_update(payload, client_state, data: ClientData, key):
    x, model_state = split_variables(payload["model"])
    c, c_i = payload["c"], client_state["c"]
    correction = jax.tree.map(jnp.subtract, c, c_i)
    base = classification_loss(model)

    def loss_fn(params, batch):
      loss, new_state = base(params, batch)
      return loss + linear_term(correction, params), new_state

    y, _, metrics, model_state = local_train(loss_fn, client_opt, x, client_opt.init(x), data, key, spec,
                                             model_state)
    c_new = control_variate_update(c_i, c, x, y, metrics["steps"], lr)
    upload = {"delta": tree_sub(y, x), "dc": tree_sub(c_new, c_i)}
    if model_state:
      upload["model_state"] = model_state
    return ClientOutput(upload, {"c": c_new}, metrics)

  def server_update(state: ScaffoldServerState, uploads, weights, key, context: Optional[RoundContext] = None):
    result = aggregate_deltas(aggregator, model, client_opt, spec, state.params, state.model_state,
                              uploads["delta"], weights, key, context)
    p = result.weights
    params = jax.tree.map(lambda w, d: w + server_lr * d, state.params, result.update)
    dc = weighted_rows(p, uploads["dc"])
    frac = included_count(p) / n_total
    c = jax.tree.map(lambda a, d: a + frac * d, state.c, dc)
    model_state = state.model_state
    if "model_state" in uploads:
      model_state = mean_model_state(uploads["model_state"], p, state.model_state)
    diagnostics = round_diagnostics(result, p)
    return ScaffoldServerState(params, c, model_state), diagnostics

  def personal_params(payload, client_state, data, key):
    return payload["model"]

  return FedAlgorithm("scaffold", init_server, init_client, broadcast, client_update, server_update, server_model,
                      personal_params, uses_context=True)
