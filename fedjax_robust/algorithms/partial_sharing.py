"""FedPer and FedRep: the body is shared and averaged, the personalization layers (the head) stay on each client.

FedCAC baselines, spec ``specs/fedcac.md`` §2 (issue 32 §3):

* **FedPer** (Arivazhagan et al. 2019): base layers averaged, the personalization layers (the final classifier,
  Fling's ``fc``; here ``head``, :func:`fedjax_robust.models.split_base_head`) kept local; all layers are trained
  jointly for the E local epochs.
* **FedRep** (Collins et al., ICML 2021): body averaged, head local; every round the client first trains its head
  for ``head_epochs`` epochs with the body frozen, then the body for ``body_epochs`` epochs (default: the run's
  E, ``client.epochs``) with the head frozen; only the body is aggregated. FedRep's paper trains the head for
  10 epochs and the representation for 1 (its official code: ``local_ep - local_rep_ep`` head epochs); FedCAC's
  protocol fixes E = 5 for the shared part, so the defaults are 10 head epochs and E body epochs (spec §5-A22:
  "each method's published defaults within the same N/E/B/T protocol"). Each phase starts a fresh optimizer
  (FedCAC's code builds a new SGD every round; PFLlib's FedRep keeps one optimizer per part), so the registry
  refuses ``client.persist_optimizer_state``.

One round ``t`` for client ``k`` (both methods):

1. Start model: the received global body ``w̄^t`` with the client's own local layers ``h_k``
   (:func:`~fedjax_robust.algorithms.fedavg.put_paths`).
2. Local training (joint for FedPer, head-then-body for FedRep), giving ``w_k``.
3. Upload ``Δ_k = w_k − w^t`` with the local layers' entries set to 0, so the server's aggregation rule
   (:func:`~fedjax_robust.algorithms.fedavg.make_fedavg`'s server half, reused verbatim: sample-weighted ``mean``
   by default) moves the body only; the server's copy of the local layers stays at ``w^0`` and is never used.
4. Keep ``h_k`` (and the local layers' model state) as client state.

Evaluation (spec §3.6, "after aggregation"): client ``k`` is scored with the new global body and its own head
(``personal_params``). There is no meaningful global model (the server's head is the initial one), so
``global_params`` is ``None`` and no ``global_*`` metrics are logged.

Which layers are local: ``local_layers``, top-level entries of the params (default ``("head",)``, the last layer
of every model of the zoo, = Fling's ``fc``). Every parameter under them is local.

BatchNorm model state (``batch_stats``; :mod:`fedjax_robust.models.interface`): running statistics follow the
parameters they belong to, as in :func:`~fedjax_robust.algorithms.fedavg.make_fedavg` (whose FedBN keeps a BN
layer's scale/bias and statistics together). Statistics of a local layer stay on the client; every other layer's
statistics are averaged by the server (sample-weighted, with the rule's effective weights) and clients train from
the averaged ones, as FedAvg does. With the default ``head`` (a Dense layer, no statistics) every running statistic
of a ResNet is averaged: Fling's FedPer configs aggregate every state-dict key that does not contain ``fc``
(its FedBN configs are the ones that exclude BN keys and buffers), and spec §2 lists only the classifier as local
for FedPer/FedRep (FedBN is the method that keeps BN local). In FedRep's head phase the
model runs in training mode, so the body's running statistics keep moving while its weights are frozen (PyTorch
``requires_grad=False`` with ``model.train()``, as FedRep's and PFLlib's code do).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from fedjax_robust.aggregators import Aggregator
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import classification_loss, make_fedavg, put_paths, take_paths, tree_sub
from fedjax_robust.client import Batch, ClientData, LocalTrainSpec, local_train
from fedjax_robust.models.interface import Model, as_model, merge_variables, split_variables

PyTree = Any


def local_param_paths(params: PyTree, local_layers: Sequence[str]) -> frozenset:
  """Flat paths (``"head/kernel"``) of every parameter under the top-level entries ``local_layers``."""
  missing = [name for name in local_layers if name not in params]
  if missing:
    raise ValueError(f"local_layers {tuple(missing)} are not layers of the model (its layers: {tuple(params)})")
  return frozenset(k for k in traverse_util.flatten_dict(params, sep="/") if k.split("/")[0] in local_layers)


def local_state_paths(model_state: dict, local_layers: Sequence[str]) -> frozenset:
  """Flat paths (``"batch_stats/bn1/mean"``) of the model state owned by the layers ``local_layers``."""
  return frozenset(k for k in traverse_util.flatten_dict(model_state, sep="/") if k.split("/")[1] in local_layers)


def zero_paths(tree: PyTree, paths: frozenset) -> PyTree:
  """``tree`` with the leaves at ``paths`` replaced by zeros (the local layers of an upload)."""
  return put_paths(tree, {k: jnp.zeros_like(v) for k, v in take_paths(tree, paths).items()})


def subset_loss(model: Model, frozen: PyTree):
  """The training loss as a function of a subset of the params (a flat ``{path: array}`` dict), the others
  fixed at ``frozen``: training that subset is training the model with the rest frozen (no gradient, no
  optimizer state, exactly unchanged)."""
  base = classification_loss(model)

  def loss_fn(subset, batch: Batch):
    return base(put_paths(frozen, subset), batch)

  return loss_fn


def _combine_metrics(a: dict, b: dict) -> dict:
  """Two local-training phases as one: steps summed, loss the step-weighted mean."""
  steps = a["steps"] + b["steps"]
  loss = (a["loss"] * a["steps"] + b["loss"] * b["steps"]) / jnp.maximum(steps, 1)
  return {"loss": loss, "steps": steps}


def _make_partial_sharing(
    name: str,
    model: Model,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    server_opt: Optional[optax.GradientTransformation],
    local_layers: Sequence[str],
    head_epochs: int,
    body_epochs: int,
    aggregator: Optional[Aggregator],
) -> FedAlgorithm:
  model = as_model(model)
  local_layers = tuple(str(n) for n in local_layers)
  if not local_layers:
    raise ValueError(f"{name}: local_layers must name at least one layer (none local is FedAvg)")
  server = make_fedavg(model, client_opt, spec, server_opt, aggregator=aggregator, name=name)
  alternating = head_epochs > 0
  head_spec = spec._replace(epochs=int(head_epochs))
  body_spec = spec._replace(epochs=int(body_epochs or spec.epochs))

  def local_part(params, model_state):
    return {"params": take_paths(params, local_param_paths(params, local_layers)),
            "state": take_paths(model_state, local_state_paths(model_state, local_layers))}

  def init_client(params, model_state=None):
    return {"local": local_part(params, dict(model_state or {}))}

  def start_model(payload, client_state):
    """The received global body (and its model state) with the client's own local layers."""
    params, model_state = split_variables(payload)
    local = client_state["local"]
    return put_paths(params, local["params"]), (put_paths(model_state, local["state"]) if model_state else {})

  def client_update(payload, client_state, data: ClientData, key):
    global_params, _ = split_variables(payload)
    params, model_state = start_model(payload, client_state)
    local_paths = local_param_paths(params, local_layers)
    if not alternating:  # FedPer: every layer trained jointly
      params, _, metrics, model_state = local_train(classification_loss(model), client_opt, params,
                                                    client_opt.init(params), data, key, spec, model_state)
    else:  # FedRep: the head with the body frozen, then the body with the head frozen
      head_key, body_key = jax.random.split(key)
      head = take_paths(params, local_paths)
      head, _, head_metrics, model_state = local_train(subset_loss(model, params), client_opt, head,
                                                       client_opt.init(head), data, head_key, head_spec, model_state)
      params = put_paths(params, head)
      body_paths = frozenset(traverse_util.flatten_dict(params, sep="/")) - local_paths
      body = take_paths(params, body_paths)
      body, _, body_metrics, model_state = local_train(subset_loss(model, params), client_opt, body,
                                                       client_opt.init(body), data, body_key, body_spec, model_state)
      params = put_paths(params, body)
      metrics = _combine_metrics(head_metrics, body_metrics)
    upload = {"delta": zero_paths(tree_sub(params, global_params), local_paths)}
    if model_state:
      upload["model_state"] = model_state
    return ClientOutput(upload, {"local": local_part(params, model_state)}, metrics)

  def personal_params(payload, client_state, data: ClientData, key):
    del data, key
    params, model_state = start_model(payload, client_state)
    return merge_variables(params, model_state) if model_state else params

  return FedAlgorithm(name, server.init_server, init_client, server.broadcast, client_update, server.server_update,
                      lambda state: None, personal_params, uses_context=True)


def make_fedper(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec,
                server_opt: Optional[optax.GradientTransformation] = None, local_layers: Sequence[str] = ("head",),
                aggregator: Optional[Aggregator] = None, name: str = "fedper") -> FedAlgorithm:
  """FedPer (module docstring): ``local_layers`` kept on each client, the rest averaged; joint local training.

  ``server_opt``, ``aggregator``: the server half of :func:`~fedjax_robust.algorithms.fedavg.make_fedavg` (plain
  sample-weighted averaging by default), applied to the body."""
  return _make_partial_sharing(name, model, client_opt, spec, server_opt, local_layers, 0, 0, aggregator)


def make_fedrep(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec,
                server_opt: Optional[optax.GradientTransformation] = None, head_epochs: int = 10,
                body_epochs: int = 0, local_layers: Sequence[str] = ("head",),
                aggregator: Optional[Aggregator] = None, name: str = "fedrep") -> FedAlgorithm:
  """FedRep (module docstring): ``head_epochs`` epochs on ``local_layers`` with the body frozen, then
  ``body_epochs`` (0 = ``spec.epochs``) on the body with the head frozen; the body is averaged."""
  if int(head_epochs) < 1:
    raise ValueError(f"{name}: head_epochs must be >= 1, got {head_epochs} (0 head epochs is not FedRep)")
  if int(body_epochs) < 0:
    raise ValueError(f"{name}: body_epochs must be >= 0 (0 = client.epochs), got {body_epochs}")
  return _make_partial_sharing(name, model, client_opt, spec, server_opt, local_layers, int(head_epochs),
                               int(body_epochs), aggregator)
