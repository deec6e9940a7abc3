"""FedDC (Gao et al., "FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and Correction",
CVPR 2022), Algorithm 1.

Server state: the global model ``w`` and the global control variate ``c``; client state: its local drift ``h_i``
and control variate ``c_i`` (all start at 0). Round ``t`` with cohort ``S`` out of ``N`` clients:

1. Client ``i`` trains ``θ_i`` from ``w`` on the drift-penalized, gradient-corrected objective (Eq. 6-8)
   ``L_i(θ) + (α/2) ||θ + h_i − w||² + <θ, c − c_i>``.
   The paper states the gradient correction on local parameter UPDATES, scaled by ``1/(ηK)``; here, as in the
   official code (``state_gadient_diffs``, loss term ``loss_cg``), the control variates are kept in gradient units
   (an update divided by ``ηK``), so the term is ``<θ, c − c_i>`` with the exact gradient ``c − c_i``
   (:func:`~fedjax_robust.algorithms.hetero_common.linear_term`; value 0, so the logged loss is the data loss plus
   the drift penalty).
2. Drift update (Eq. 9): ``h_i ← h_i + (θ_i − w)``.
3. Control variates, SCAFFOLD's option II (the official code's ``state_g``):
   ``c_i⁺ = c_i − c + (w − θ_i) / (K η)``, ``K`` = the client's number of REAL local steps, ``η`` = the client
   learning rate; ``c_i`` unchanged when ``K = 0``. Upload ``Δc_i = c_i⁺ − c_i`` (field ``dc``).
4. Server: ``c ← c + (1/N) Σ_{i∈S} Δc_i`` and the model, by ``drift_mean``:

   * ``"cohort"`` (default; Alg. 1's aggregation of the drift-corrected local models):
     ``w ← (1/|S|) Σ_{i∈S} (θ_i + h_i)``; clients upload ``delta = θ_i + h_i − w``.
   * ``"all"`` (the official code, ``cld_mdl_param = mean_S θ_i + mean over ALL clients of h_i``): clients upload
     ``delta = θ_i − w``; the server keeps ``H = (1/N) Σ_{all i} h_i`` (``H ← H + (1/N) Σ_{i∈S} (θ_i − w)``) and
     sets ``w ← (1/|S|) Σ_{i∈S} θ_i + H``. The two agree under full participation.

Averages go through the aggregation rule (``delta`` is what model attacks poison and robust rules judge):
``(1/|S|) Σ_{i∈S}`` is the rule's aggregate, and ``(1/N) Σ_{i∈S} x_i = (|S|/N) Σ_i p_i x_i`` with the rule's effective
weights ``p_i`` and ``|S|`` = the clients it kept. The uniform ``mean`` rule (``aggregator.weighted=False``) is the
paper's exactly; the default ``mean`` rule weights by samples like every algorithm of this package.

Not reproduced from the official code: the per-client data-size rescaling of α and ``c`` (``weight_list``, the
identity for equal client sizes), gradient clipping (max norm 10) and learning-rate decay. ``K`` is each client's
own real step count (the code uses one global ``n_minibatch``). The client optimizer must be SGD with learning rate
``lr`` (weight decay as in the code; momentum allowed, see :mod:`~fedjax_robust.algorithms.scaffold`), re-created
every round; the server's update is the paper's (the run's server optimizer must stay plain averaging). Model state
(BatchNorm statistics) is averaged with the rule's effective weights like FedAvg's; ``h_i``, ``c_i`` and ``c``
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
from fedjax_robust.algorithms.hetero_common import (aggregate_deltas, included_count, linear_term, server_model,
                                                    weighted_rows,
                                                    zeros_like_tree)
from fedjax_robust.algorithms.scaffold import control_variate_update
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.hparams import check
from fedjax_robust.models.interface import Model, as_model, split_variables
from fedjax_robust.round_context import RoundContext

PyTree = Any
DRIFT_MEANS = ("cohort", "all")


class FedDCServerState(NamedTuple):
  params: PyTree  # w
  c: PyTree  # the global control variate
  drift: PyTree  # H = mean over all N clients of h_i (drift_mean="all"; stays 0 under "cohort")
  model_state: PyTree = {}


def make_feddc(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec, num_clients: int,
               lr, alpha=0.01, drift_mean: str = "cohort", aggregator: Optional[Aggregator] = None) -> FedAlgorithm:
  """FedDC with drift-penalty weight ``alpha`` (α > 0), ``client_opt`` SGD with learning rate ``lr``, over
  ``num_clients`` (N) clients; ``drift_mean``: ``"cohort"`` or ``"all"`` (module docstring)."""
  check(alpha, lambda v: v > 0, f"feddc: alpha must be > 0, got {alpha}")
  check(lr, lambda v: v > 0, f"feddc: the client learning rate must be > 0, got {lr}")
  if drift_mean not in DRIFT_MEANS:
    raise ValueError(f"feddc: drift_mean must be one of {DRIFT_MEANS}, got {drift_mean!r}")
  if int(num_clients) < 1:
    raise ValueError(f"feddc: num_clients must be >= 1, got {num_clients}")
  model = as_model(model)
  aggregator = aggregator or make_mean()
  n_total = float(num_clients)

  def init_server(params, model_state=None):
    return FedDCServerState(params, zeros_like_tree(params), zeros_like_tree(params), dict(model_state or {}))

  def init_client(params, model_state=None):
    return {"h": zeros_like_tree(params), "c": zeros_like_tree(params)}

  def broadcast(state: FedDCServerState):
    return {"model": server_model(state), "c": state.c}

  def client_update(payload, client_state, data: ClientData, key):
    w, model_state = split_variables(payload["model"])
    c, c_i, h = payload["c"], client_state["c"], client_state["h"]
    correction = jax.tree.map(jnp.subtract, c, c_i)
    base = classification_loss(model, tree_sub(w, h), alpha)  # (α/2)||θ − (w − h_i)||²

    def loss_fn(params, batch):
      loss, new_state = base(params, batch)
      return loss + linear_term(correction, params), new_state

    theta, _, metrics, model_state = local_train(loss_fn, client_opt, w, client_opt.init(w), data, key, spec,
                                                 model_state)
    delta = tree_sub(theta, w)
    h_new = jax.tree.map(jnp.add, h, delta)
    c_new = control_variate_update(c_i, c, w, theta, metrics["steps"], lr)
    upload = {"delta": jax.tree.map(jnp.add, delta, h_new) if drift_mean == "cohort" else delta,
              "dc": tree_sub(c_new, c_i)}
    if model_state:
      upload["model_state"] = model_state
    return ClientOutput(upload, {"h": h_new, "c": c_new}, metrics)

  def server_update(state: FedDCServerState, uploads, weights, key, context: Optional[RoundContext] = None):
    result = aggregate_deltas(aggregator, model, client_opt, spec, state.params, state.model_state,
                              uploads["delta"], weights, key, context)
    p = result.weights
    frac = included_count(p) / n_total
    c = jax.tree.map(lambda a, d: a + frac * d, state.c, weighted_rows(p, uploads["dc"]))
    if drift_mean == "cohort":
      drift = state.drift
      params = jax.tree.map(jnp.add, state.params, result.update)
    else:
      drift = jax.tree.map(lambda a, d: a + frac * d, state.drift, result.update)
      params = jax.tree.map(lambda w, d, hh: w + d + hh, state.params, result.update, drift)
    any_kept = frac > 0
    params = jax.tree.map(lambda new, old: jnp.where(any_kept, new, old), params, state.params)
    model_state = state.model_state
    if "model_state" in uploads:
      model_state = mean_model_state(uploads["model_state"], p, state.model_state)
    return (FedDCServerState(params, c, drift, model_state),
            round_diagnostics(result, p))

  def personal_params(payload, client_state, data, key):
    return payload["model"]

  return FedAlgorithm("feddc", init_server, init_client, broadcast, client_update, server_update, server_model,
                      personal_params, uses_context=True)
