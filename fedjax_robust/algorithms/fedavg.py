"""FedAvg and its family: FedProx, FedAvg-FT, Local (separate) training.

* FedAvg (McMahan et al. 2017, Alg. 1): clients run E epochs of SGD from the
  global model and upload ``w_k - w``; the server takes the sample-weighted mean
  ``Δ = Σ n_k Δ_k / Σ n_k`` and applies it through a server optimizer
  (``w ← w + Δ`` for plain averaging; FedAvgM / FedAdam per Reddi et al. 2021).
* FedProx (Li et al. 2020, Eq. 2): the local objective adds
  ``μ/2 · ||w - w^t||²``; ``μ = 0`` is exactly FedAvg.
* FedAvg-FT: FedAvg, but each client is scored with a locally updated model.
  ``ft_mode="last_local"`` (FedCAP spec §3, the default): the model the client
  produced in the last round it took part in (E local epochs from that round's
  global model; clients never sampled keep the initial model).
  ``ft_mode="finetune"``: the current global model fine-tuned for
  ``finetune_epochs`` on the client's training data at evaluation time.
* Local / Separate: no communication; every client trains its own model from the
  common initialisation. FedCAP's spec (§3) trains all K clients every round, so
  the experiment builder gives Local a full cohort whatever the participation
  (``algorithm.local_trains_all``; ``False`` trains the sampled cohort only).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators import Aggregator, weighted_mean
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train, masked_cross_entropy

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]  # (params, x) -> logits


class ServerState(NamedTuple):
  params: PyTree
  opt_state: PyTree


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
  return jax.tree.map(jnp.subtract, a, b)


def squared_distance(a: PyTree, b: PyTree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def classification_loss(apply_fn: ApplyFn, anchor: PyTree | None = None, mu: float = 0.0):
  """Masked cross-entropy, plus the proximal term ``μ/2 ||w - anchor||²`` when ``μ > 0``."""

  def loss_fn(params, x, y, mask):
    loss = masked_cross_entropy(apply_fn(params, x), y, mask)
    if mu:
      loss = loss + 0.5 * mu * squared_distance(params, anchor)
    return loss

  return loss_fn


def apply_server_update(server_opt: optax.GradientTransformation, state: ServerState,
                        mean_delta: PyTree) -> ServerState:
  """``w ← w - server_opt(-Δ)``: with SGD(lr=1) this is plain ``w + Δ``."""
  pseudo_grad = jax.tree.map(jnp.negative, mean_delta)
  updates, opt_state = server_opt.update(pseudo_grad, state.opt_state, state.params)
  return ServerState(optax.apply_updates(state.params, updates), opt_state)


def make_fedavg(
    apply_fn: ApplyFn,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    server_opt: optax.GradientTransformation | None = None,
    mu: float = 0.0,
    finetune_epochs: int = 0,
    persist_client_opt_state: bool = False,
    name: str = "fedavg",
    ft_mode: str | None = None,
    aggregator: Aggregator | None = None,
    root_data: ClientData | None = None,
) -> FedAlgorithm:
  """FedAvg, FedProx (``mu > 0``) or FedAvg-FT (``ft_mode`` set).

  ``ft_mode``: None (score every client with the global model), ``"last_local"``
  or ``"finetune"`` (with ``finetune_epochs``), see the module docstring.

  ``aggregator``: a robust rule from :mod:`fedjax_robust.aggregators` replacing
  the sample-weighted mean; its flagged clients and effective weights are
  returned as round diagnostics. ``root_data``: the server's clean root dataset
  (FLTrust): each round the server trains on it from the global model with the
  clients' optimizer and local schedule, and passes the resulting update to the
  rule as ``context["reference_update"]``.

  ``persist_client_opt_state`` keeps each client's optimizer state (e.g.
  momentum) across the rounds it participates in, as PyTorch FL code that builds
  one optimizer per client does; by default it is reset every round.
  """
  if mu < 0:
    raise ValueError(f"FedProx mu must be >= 0, got {mu}")
  if ft_mode not in (None, "last_local", "finetune"):
    raise ValueError(f"ft_mode must be None, 'last_local' or 'finetune', got {ft_mode!r}")
  if ft_mode == "finetune" and finetune_epochs < 1:
    raise ValueError(f"ft_mode='finetune' needs finetune_epochs >= 1, got {finetune_epochs}")
  keep_local = ft_mode == "last_local"
  server_opt = server_opt or optax.sgd(1.0)
  finetune_spec = spec._replace(epochs=finetune_epochs)

  def init_server(params):
    return ServerState(params, server_opt.init(params))

  def init_client(params):
    state = {"opt_state": client_opt.init(params)} if persist_client_opt_state else {}
    return {**state, "params": params} if keep_local else state

  def broadcast(state: ServerState):
    return state.params

  def client_update(global_params, client_state, data: ClientData, key):
    opt_state = client_state["opt_state"] if persist_client_opt_state else client_opt.init(global_params)
    loss_fn = classification_loss(apply_fn, global_params, mu)
    params, opt_state, metrics = local_train(loss_fn, client_opt, global_params, opt_state, data, key, spec)
    new_state = {"opt_state": opt_state} if persist_client_opt_state else {}
    if keep_local:
      new_state["params"] = params
    return ClientOutput({"delta": tree_sub(params, global_params)}, new_state, metrics)

  def server_update(state: ServerState, uploads, weights, key):
    if aggregator is None:
      return apply_server_update(server_opt, state, weighted_mean(uploads["delta"], weights)), {}
    root_key, agg_key = jax.random.split(key)
    context = {"global_params": state.params}
    if root_data is not None:
      root_params, _, _ = local_train(classification_loss(apply_fn), client_opt, state.params,
                                      client_opt.init(state.params), root_data, root_key, spec)
      context["reference_update"] = tree_sub(root_params, state.params)
    mask = jnp.ones(weights.shape, bool)
    result = aggregator.aggregate(uploads["delta"], weights, mask, agg_key, context)
    diagnostics = {"flagged": result.flagged, "aggregation_weights": result.weights}
    return apply_server_update(server_opt, state, result.update), diagnostics

  def personal_params(global_params, client_state, data: ClientData, key):
    if keep_local:
      return client_state["params"]
    if ft_mode is None:
      return global_params
    loss_fn = classification_loss(apply_fn)
    params, _, _ = local_train(loss_fn, client_opt, global_params, client_opt.init(global_params), data, key,
                               finetune_spec)
    return params

  return FedAlgorithm(name, init_server, init_client, broadcast, client_update, server_update,
                      lambda state: state.params, personal_params)


def make_local(apply_fn: ApplyFn, client_opt: optax.GradientTransformation, spec: LocalTrainSpec) -> FedAlgorithm:
  """Local (a.k.a. Separate) training: each client trains only its own model, nothing is shared."""

  def init_client(params):
    return {"params": params, "opt_state": client_opt.init(params)}

  def client_update(payload, client_state, data: ClientData, key):
    del payload
    params, opt_state, metrics = local_train(classification_loss(apply_fn), client_opt, client_state["params"],
                                             client_state["opt_state"], data, key, spec)
    return ClientOutput({}, {"params": params, "opt_state": opt_state}, metrics)

  return FedAlgorithm(
      name="local",
      init_server=lambda params: (),
      init_client=init_client,
      broadcast=lambda state: (),
      client_update=client_update,
      server_update=lambda state, uploads, weights, key: (state, {}),
      global_params=lambda state: None,
      personal_params=lambda payload, client_state, data, key: client_state["params"],
  )
