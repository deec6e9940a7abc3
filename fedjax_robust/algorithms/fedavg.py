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
  (``algorithm.local.trains_all``; ``False`` trains the sampled cohort only).

Model state (BatchNorm running statistics; ``fedjax_robust/models/interface.py``):
every client trains from the global model's statistics and uploads its new ones
beside ``delta``; the server takes their mean with the aggregation rule's
effective weights (the sample-weighted mean for ``mean``), so a client a robust
rule excludes does not move them either. Statistics are never attacked or
robust-aggregated: they are not gradients. ``keep_norm_local=True`` is FedBN
(Li et al., ICLR 2021): each client keeps its own BatchNorm scale/bias and
running statistics (the layers owning ``batch_stats`` entries), trains and is
scored with them, and only the other parameters follow the global model.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from fedjax_robust.adversarial.objectives import Objective, cross_entropy_loss
from fedjax_robust.aggregators import Aggregator, make_mean
from fedjax_robust.aggregators.base import combine, finite_rows, round_diagnostics, zero_rows
from fedjax_robust.hparams import check, may_be_nonzero
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.client import Batch, ClientData, LocalTrainSpec, local_train
from fedjax_robust.models.interface import Model, as_model, merge_variables, split_variables
from fedjax_robust.round_context import RoundContext, compute_needs

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]  # (params, x) -> logits


class ServerState(NamedTuple):
  params: PyTree
  opt_state: PyTree
  model_state: PyTree = {}  # non-trainable collections of the global model (BatchNorm statistics); {} if none


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
  return jax.tree.map(jnp.subtract, a, b)


def squared_distance(a: PyTree, b: PyTree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def classification_loss(model: Model | ApplyFn, anchor: PyTree | None = None, mu: float = 0.0,
                        objective: Optional[Objective] = None, data: Optional[ClientData] = None):
  """The local loss in training mode (dropout, masked batch statistics): masked cross-entropy, or the
  ``objective``'s loss on this client's ``data`` (adversarial training, :mod:`fedjax_robust.adversarial`), plus
  the proximal term ``μ/2 ||w - anchor||²`` when ``μ > 0``. A :data:`~fedjax_robust.client.LossFn`:
  ``(params, batch) -> (loss, model_state)``."""
  model = as_model(model)
  base = (cross_entropy_loss() if objective is None else objective.loss)(model, data)

  def loss_fn(params, batch: Batch):
    loss, model_state = base(params, batch)
    if may_be_nonzero(mu):
      loss = loss + 0.5 * mu * squared_distance(params, anchor)
    return loss, model_state

  return loss_fn


def objective_transform(objective: Optional[Objective], model: Model, data: ClientData):
  """The objective's batch transform for this client (``None``: train on the clean batches)."""
  if objective is None or objective.transform is None:
    return None
  return objective.transform(as_model(model), data)


def apply_server_update(server_opt: optax.GradientTransformation, state: ServerState,
                        mean_delta: PyTree) -> ServerState:
  """``w ← w - server_opt(-Δ)``: with SGD(lr=1) this is plain ``w + Δ``."""
  pseudo_grad = jax.tree.map(jnp.negative, mean_delta)
  updates, opt_state = server_opt.update(pseudo_grad, state.opt_state, state.params)
  return state._replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state)


def state_owned_params(params: PyTree, model_state: dict) -> frozenset:
  """Flat paths (``"bn1/scale"``) of the parameters of every layer that owns model state (BatchNorm layers)."""
  owners = {path[:-1] for coll in model_state.values() for path in traverse_util.flatten_dict(coll)}
  return frozenset("/".join(p) for p in traverse_util.flatten_dict(params) if p[:-1] in owners)


def take_paths(params: PyTree, paths: frozenset) -> dict:
  return {k: v for k, v in traverse_util.flatten_dict(params, sep="/").items() if k in paths}


def put_paths(params: PyTree, local: dict) -> PyTree:
  flat = traverse_util.flatten_dict(params, sep="/")
  flat.update(local)
  return traverse_util.unflatten_dict(flat, sep="/")


def mean_model_state(states: dict, coeffs: jax.Array, fallback: dict) -> dict:
  """``Σ_i c_i s_i`` of the uploaded model states with the rule's effective weights (non-finite ones excluded);
  the previous state when nothing was aggregated."""
  if not jax.tree.leaves(states):
    return fallback
  finite = finite_rows(states, coeffs.shape[0])
  w = jnp.where(finite, coeffs, 0.0)
  total = jnp.sum(w)
  mean = combine(w / jnp.where(total > 0, total, 1.0), zero_rows(states, finite))
  return jax.tree.map(lambda m, old: jnp.where(total > 0, m, old), mean, fallback)


def make_fedavg(
    model: Model | ApplyFn,
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
    keep_norm_local: bool = False,
    client_attack: Any = None,
    objective: Optional[Objective] = None,
) -> FedAlgorithm:
  """FedAvg, FedProx (``mu > 0``), FedAvg-FT (``ft_mode`` set) or FedBN (``keep_norm_local``).

  ``model``: a :class:`~fedjax_robust.models.Model` (or a plain ``(params, x) -> logits`` function).
  ``ft_mode``: None (score every client with the global model), ``"last_local"``
  or ``"finetune"`` (with ``finetune_epochs``), see the module docstring.

  ``aggregator``: the server rule (default: the ``mean`` rule, sample-weighted, which
  excludes and flags non-finite uploads); its flagged clients and effective weights are
  returned as round diagnostics. What the rule declares in ``needs`` is computed from the
  round context (:mod:`fedjax_robust.round_context`): FLTrust's reference update is the
  server's training on the round's server data (``context.server_data``; ``root_data``
  is used when the round brings none) from the global model with the clients' optimizer
  and local schedule.

  ``client_attack`` (:mod:`fedjax_robust.attacks.client_attacks`): the malicious clients' local procedure,
  run by the engine for the cohort's attackers (``malicious_update``) instead of their honest training.

  ``objective`` (:mod:`fedjax_robust.adversarial.objectives`): the local training objective, e.g. PGD adversarial
  training (FedAvg-AT; FedProx-AT with ``mu``) or FedALC's calibrated loss; ``None`` is plain cross-entropy.
  The server's FLTrust reference update and FedAvg-FT's fine-tuning train with it too.

  ``persist_client_opt_state`` keeps each client's optimizer state (e.g.
  momentum) across the rounds it participates in, as PyTorch FL code that builds
  one optimizer per client does; by default it is reset every round.
  """
  check(mu, lambda v: v >= 0, f"FedProx mu must be >= 0, got {mu}")
  if ft_mode not in (None, "last_local", "finetune"):
    raise ValueError(f"ft_mode must be None, 'last_local' or 'finetune', got {ft_mode!r}")
  if ft_mode == "finetune" and finetune_epochs < 1:
    raise ValueError(f"ft_mode='finetune' needs finetune_epochs >= 1, got {finetune_epochs}")
  model = as_model(model)
  if keep_norm_local and not model.stateful:
    raise ValueError(f"{name}: keep_norm_local (FedBN) needs a model with BatchNorm state (e.g. model.name=bn_cnn)")
  keep_local = ft_mode == "last_local"
  server_opt = server_opt or optax.sgd(1.0)
  aggregator = aggregator or make_mean()
  finetune_spec = spec._replace(epochs=finetune_epochs)
  penultimate = getattr(model.module, "penultimate", None)

  def local_paths(params, model_state):
    return state_owned_params(params, model_state) if keep_norm_local else frozenset()

  def init_server(params, model_state=None):
    return ServerState(params, server_opt.init(params), dict(model_state or {}))

  def init_client(params, model_state=None):
    model_state = dict(model_state or {})
    state = {"opt_state": client_opt.init(params)} if persist_client_opt_state else {}
    if keep_norm_local:
      state["norm"] = {"params": take_paths(params, local_paths(params, model_state)), "state": model_state}
    if keep_local:
      state["params"] = merge_variables(params, model_state) if model_state else params
    return state

  def broadcast(state: ServerState):
    return merge_variables(state.params, state.model_state) if state.model_state else state.params

  def start_model(payload, client_state):
    """The model a client trains from: the global one, with its own BatchNorm layers under FedBN."""
    params, model_state = split_variables(payload)
    if keep_norm_local:
      params = put_paths(params, client_state["norm"]["params"])
      model_state = client_state["norm"]["state"]
    return params, model_state

  def client_update(payload, client_state, data: ClientData, key, attack_data: Optional[ClientData] = None):
    global_params, _ = split_variables(payload)
    params, model_state = start_model(payload, client_state)
    opt_state = client_state["opt_state"] if persist_client_opt_state else client_opt.init(params)
    loss_fn = classification_loss(model, global_params, mu, objective, data)
    if attack_data is None:
      params, opt_state, metrics, model_state = local_train(loss_fn, client_opt, params, opt_state, data, key, spec,
                                                            model_state, objective_transform(objective, model, data))
    else:  # a malicious client's own procedure (malicious_update)
      params, opt_state, metrics, model_state = client_attack.train(loss_fn, client_opt, params, data, attack_data,
                                                                    key, spec, model_state)
    new_state = {"opt_state": opt_state} if persist_client_opt_state else {}
    if keep_norm_local:
      new_state["norm"] = {"params": take_paths(params, local_paths(params, model_state)), "state": model_state}
    if keep_local:
      new_state["params"] = merge_variables(params, model_state) if model_state else params
    upload = {"delta": tree_sub(params, global_params)}
    if model_state:
      upload["model_state"] = model_state
    return ClientOutput(upload, new_state, metrics)

  def server_update(state: ServerState, uploads, weights, key, context: Optional[RoundContext] = None):
    root_key, agg_key = jax.random.split(key)

    def reference_update(global_params, server_data):
      trained = local_train(classification_loss(model, objective=objective, data=server_data), client_opt,
                            global_params, client_opt.init(global_params), server_data, root_key, spec,
                            state.model_state, objective_transform(objective, model, server_data))
      return tree_sub(trained.params, global_params)

    features_fn = None
    if model.features is not None:
      features_fn = lambda p, x: model.features(merge_variables(p, state.model_state), x)
    if context is None:  # called directly (tests): a context with the server's model and the closed-over root data
      c = weights.shape[0]
      context = RoundContext(jnp.zeros((), jnp.int32), jnp.arange(c), jnp.zeros((c,), bool), weights)
    context = context._replace(global_params=state.params)
    if context.server_data is None and root_data is not None:
      context = context._replace(server_data=root_data)
    context = compute_needs(aggregator.needs, context, uploads["delta"], features_fn=features_fn,
                            penultimate=penultimate, reference_update=reference_update,
                            logits_fn=lambda p, x: model.logits(merge_variables(p, state.model_state), x))
    mask = jnp.ones(weights.shape, bool)
    result = aggregator.aggregate(uploads["delta"], weights, mask, agg_key, context)
    diagnostics = round_diagnostics(result)
    new_state = apply_server_update(server_opt, state, result.update)
    if "model_state" in uploads:
      new_state = new_state._replace(model_state=mean_model_state(uploads["model_state"], result.weights,
                                                                  state.model_state))
    return new_state, diagnostics

  def global_params(state: ServerState):
    return broadcast(state)

  def personal_params(payload, client_state, data: ClientData, key):
    if keep_local:
      return client_state["params"]
    params, model_state = start_model(payload, client_state)
    if ft_mode is None:
      return merge_variables(params, model_state) if model_state else params
    trained = local_train(classification_loss(model, objective=objective, data=data), client_opt, params,
                          client_opt.init(params), data, key, finetune_spec, model_state,
                          objective_transform(objective, model, data))
    return merge_variables(trained.params, trained.model_state) if model_state else trained.params

  malicious_update = None
  if client_attack is not None:
    malicious_update = lambda payload, client_state, data, attack_data, key: client_update(
        payload, client_state, data, key, attack_data)
  return FedAlgorithm(name, init_server, init_client, broadcast, client_update, server_update, global_params,
                      personal_params, uses_context=True, malicious_update=malicious_update,
                      malicious_weight=None if client_attack is None else client_attack.weight)


def make_local(model: Model | ApplyFn, client_opt: optax.GradientTransformation, spec: LocalTrainSpec,
               objective: Optional[Objective] = None, persist_client_opt_state: bool = False) -> FedAlgorithm:
  """Local (a.k.a. Separate) training: each client trains only its own model (and BatchNorm state), nothing is
  shared. ``objective``: as in :func:`make_fedavg`. The optimizer state (momentum) is rebuilt every round like
  every other algorithm's (FedCAC's Separate, spec §1.2), unless ``persist_client_opt_state``."""
  model = as_model(model)

  def init_client(params, model_state=None):
    return {"params": params, "opt_state": client_opt.init(params), "model_state": dict(model_state or {})}

  def client_update(payload, client_state, data: ClientData, key):
    del payload
    opt_state = client_state["opt_state"] if persist_client_opt_state else client_opt.init(client_state["params"])
    params, opt_state, metrics, model_state = local_train(classification_loss(model, objective=objective, data=data),
                                                          client_opt, client_state["params"], opt_state, data, key,
                                                          spec, client_state["model_state"],
                                                          objective_transform(objective, model, data))
    return ClientOutput({}, {"params": params, "opt_state": opt_state, "model_state": model_state}, metrics)

  def personal_params(payload, client_state, data, key):
    if client_state["model_state"]:
      return merge_variables(client_state["params"], client_state["model_state"])
    return client_state["params"]

  return FedAlgorithm(
      name="local",
      init_server=lambda params, model_state=None: (),
      init_client=init_client,
      broadcast=lambda state: (),
      client_update=client_update,
      server_update=lambda state, uploads, weights, key, context=None: (state, {}),
      global_params=lambda state: None,
      personal_params=personal_params,
  )
