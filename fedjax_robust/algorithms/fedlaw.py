"""FedLAW (Li, Lin, Shao, Chen, Yang, ICML 2023, "Revisiting Weighted Aggregation in Federated Learning with
Neural Networks"): learnable aggregation weights.

Clients train exactly as FedAvg's and upload ``Δ_k = w_k - w^t``. The server
learns a global shrink factor ``γ > 0`` and simplex weights ``λ`` on its proxy
set (the run's server-held data, ``context.server_data``):

    w^{t+1} = γ Σ_k λ_k w_k = γ (w^t + Σ_k λ_k Δ_k),   λ = softmax(θ),  γ = exp(g)

minimising the proxy set's cross-entropy with Adam over ``(θ, g)`` for
``server_epochs`` epochs of shuffled mini-batches of ``server_batch_size`` rows,
from ``θ_k = log(n_k / Σ n)`` (λ ∝ data size) and ``g = 0`` (γ = 1). The new model
is applied through the server optimizer as the pseudo-update ``w^{t+1} - w^t``
(exact with the default SGD(lr=1)).

Conventions of the official code (ZexiLee/ICML-2023-FedLAW, ``server_funct.py``
``fedlaw_optimization`` with ``server_funct='exp'``, ``whether_swa='none'``; read,
not copied): the exp/softmax parametrisation above; Adam with betas (0.5, 0.999);
lr 0.01 (the code's CIFAR-10 value; 0.005 for its other datasets), halved every
``lr_decay_every`` = 20 epochs (``StepLR``); ``server_epochs`` default 20 (its
``--server_epochs``); batch 128 (``--validate_batchsize``); the forward passes run
in training mode (dropout, BatchNorm batch statistics), so a BatchNorm model's
global running statistics are the ones those passes leave (the code loads only
the learned parameters into a central model whose buffers the passes updated);
``γ`` multiplies every trainable parameter. Not implemented: the code's ``quad``
parametrisation and its two-stage ``swa`` variant.

Clients whose upload is non-finite or whose weight is 0 get ``λ_k = 0`` (and are
flagged when non-finite); with no valid client the model is unchanged. A run
without server data is refused (``server.root_dataset_size > 0``). Round
diagnostics: ``aggregation_weights`` (λ), ``flagged``, ``fedlaw_gamma``,
``fedlaw_proxy_loss`` (mean proxy loss over the server steps).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators.base import combine, normalize, prepare
from fedjax_robust.algorithms.base import FedAlgorithm
from fedjax_robust.algorithms.fedavg import apply_server_update, make_fedavg, tree_sub
from fedjax_robust.client import (Batch, ClientData, LocalTrainSpec, local_train, masked_cross_entropy,
                                  steps_per_epoch)
from fedjax_robust.models.interface import Model, as_model, train_logits

PyTree = Any

NO_SERVER_DATA = ("fedlaw learns its aggregation weights on a server proxy set, and the run gives none: set "
                  "server.root_dataset_size > 0")


def fedlaw_model(global_params: PyTree, deltas: PyTree, valid: jax.Array, optimizees: dict):
  """``(γ (w + Σ λ_k Δ_k), λ, γ)`` for ``optimizees = {"theta": [C], "log_gamma": []}`` (invalid clients: λ = 0)."""
  lam = jax.nn.softmax(jnp.where(valid, optimizees["theta"], -1e30))
  lam = jnp.where(valid, lam, 0.0)
  gamma = jnp.exp(optimizees["log_gamma"])
  mixed = combine(lam, deltas)
  return jax.tree.map(lambda w, m: (gamma * (w + m)).astype(w.dtype), global_params, mixed), lam, gamma


def fedlaw_optimize(model: Model, global_params: PyTree, deltas: PyTree, sizes: jax.Array, valid: jax.Array,
                    data: ClientData, key: jax.Array, model_state: Optional[dict] = None, epochs: int = 20,
                    lr: float = 0.01, batch_size: int = 128, lr_decay_every: int = 20, unroll: bool | int = 1):
  """Learns ``(θ, g)`` on ``data``; returns ``(new params, λ [C], γ, model_state, mean proxy loss)``."""
  model = as_model(model)
  sizes = normalize(jnp.where(valid, jnp.asarray(sizes, jnp.float32), 0.0))
  init = {"theta": jnp.log(jnp.where(valid & (sizes > 0), sizes, 1.0)), "log_gamma": jnp.zeros((), jnp.float32)}

  def loss_fn(optimizees, batch: Batch):
    params, _, _ = fedlaw_model(global_params, deltas, valid, optimizees)
    logits, new_state = train_logits(model, params, batch.model_state, batch.x, batch.key, batch.mask)
    return masked_cross_entropy(logits, batch.y, batch.mask), new_state

  per_epoch = max(steps_per_epoch(int(data.y.shape[0]), batch_size, False), 1)
  schedule = lr
  if lr_decay_every > 0:  # StepLR(step_size=lr_decay_every epochs, gamma=0.5)
    schedule = optax.exponential_decay(lr, lr_decay_every * per_epoch, 0.5, staircase=True)
  opt = optax.adam(schedule, b1=0.5, b2=0.999)
  spec = LocalTrainSpec(epochs, batch_size, False, True, unroll)
  result = local_train(loss_fn, opt, init, opt.init(init), data, key, spec, model_state or {})
  params, lam, gamma = fedlaw_model(global_params, deltas, valid, result.params)
  return params, lam, gamma, result.model_state, result.metrics["loss"]


def make_fedlaw(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec,
                server_opt: Optional[optax.GradientTransformation] = None, server_epochs: int = 20,
                server_lr: float = 0.01, server_batch_size: int = 128, lr_decay_every: int = 20,
                root_data: Optional[ClientData] = None, **fedavg_kwargs) -> FedAlgorithm:
  """FedLAW on top of :func:`~fedjax_robust.algorithms.fedavg.make_fedavg` (same clients; the server step learns
  γ and λ on ``context.server_data``, or on ``root_data`` when the round brings none). ``fedavg_kwargs``: the
  FedAvg family's client options (``mu``, ``persist_client_opt_state``, ``client_attack``, ``objective``)."""
  if int(server_epochs) < 1 or int(server_batch_size) < 1:
    raise ValueError(f"fedlaw: server_epochs and server_batch_size must be >= 1, got {server_epochs}, "
                     f"{server_batch_size}")
  if not float(server_lr) > 0:
    raise ValueError(f"fedlaw: server_lr must be > 0, got {server_lr}")
  if int(lr_decay_every) < 0:
    raise ValueError(f"fedlaw: lr_decay_every must be >= 0 (0 = constant lr), got {lr_decay_every}")
  model = as_model(model)
  server_opt = server_opt or optax.sgd(1.0)
  base = make_fedavg(model, client_opt, spec, server_opt, name="fedlaw", **fedavg_kwargs)

  def server_update(state, uploads, weights, key, context=None):
    data = None if context is None else context.server_data
    data = root_data if data is None else data
    if data is None:
      raise ValueError(NO_SERVER_DATA)
    p = prepare(uploads["delta"], weights)
    params, lam, gamma, model_state, loss = fedlaw_optimize(
        model, state.params, p.updates, p.weights, p.valid, data, key, state.model_state,
        epochs=int(server_epochs), lr=float(server_lr), batch_size=int(server_batch_size),
        lr_decay_every=int(lr_decay_every), unroll=spec.unroll)
    some = p.n > 0
    delta = jax.tree.map(lambda d: jnp.where(some, d, jnp.zeros_like(d)), tree_sub(params, state.params))
    new_state = apply_server_update(server_opt, state, delta)
    if state.model_state:
      new_state = new_state._replace(model_state=jax.tree.map(lambda new, old: jnp.where(some, new, old),
                                                               model_state, state.model_state))
    diagnostics = {"flagged": p.nonfinite, "aggregation_weights": jnp.where(some, lam, 0.0),
                   "fedlaw_gamma": jnp.where(some, gamma, 1.0), "fedlaw_proxy_loss": loss}
    return new_state, diagnostics

  return base._replace(server_update=server_update)
