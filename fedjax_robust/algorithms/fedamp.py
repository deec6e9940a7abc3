"""FedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021).

FedCAC baseline, spec ``specs/fedcac.md`` §2 ("attentive message passing"). Every client ``i`` keeps its own
personalized model ``w_i`` (persistent client state, initialised to ``w^0``); the server keeps the latest
uploaded model of every client (``models`` [K, D], flattened trainable parameters) and, each round, sends
client ``i`` its personalized cloud model

    u_i = Σ_j ξ_ij w_j,   ξ_ij = α · A'(‖w_i − w_j‖²)  (j ≠ i),   ξ_ii = 1 − Σ_{j≠i} ξ_ij,
    A(x) = 1 − exp(−x/σ)  ⇒  A'(x) = exp(−x/σ) / σ

(FedAMP's attention-inducing function; a pair of similar models gets a large weight). This is one gradient step
of size α on ``Σ_j A(‖w_i − w_j‖²)`` from ``w_i``, and it is computed in that form,
``u_i = w_i + Σ_{j≠i} ξ_ij (w_j − w_i)``, which equals the weighted sum exactly in real arithmetic but stays exact
in float32 when the models coincide (round 0: all ``w_j = w^0`` ⇒ ``u_i = w^0``) and when ``ξ_ii`` is large and
negative (the reference defaults give ``ξ_ij`` up to ``α/σ = 100``). The weights are not normalised: with a
large ``α`` the self weight ``ξ_ii`` may be negative, as in the paper and both reference codes. Distances
``‖w_i − w_j‖²`` are over every trainable parameter (BatchNorm γ/β included, running statistics not), summed
exactly per pair (one [K, D] difference per cohort client, no ``|a|² + |b|² − 2ab`` cancellation).

Client ``i`` then runs E local epochs on ``F_i(w) + λ/(2α)‖w − u_i‖²`` (the prox term of
:func:`~fedjax_robust.algorithms.fedavg.classification_loss` with ``μ = λ/α``) and uploads the trained ``w_i``.
``start="personal"`` (default) trains from the client's own ``w_i``, as the FedCAC authors' Fling code
(``fedamp_client``: ``client_u`` replaced, ``model`` kept) and PFLlib do; ``start="cloud"`` starts from ``u_i``.
The personalized model scored (``personal_params``) is ``w_i`` with its own BatchNorm statistics: aggregation does
not change it, so "after aggregation" (spec §3.6) is the model after the client's last training.

Step-size schedule (Fling's ``fedamp_group``, the configuration the FedCAC authors ran for Tables 1-2: λ = 1,
α = 1e4, σ = 100, α multiplied by 0.1 every 30 rounds): the value of α during round ``r`` (0-indexed) is
``α_r = α_0 · decay^{max(0, ⌊(r − 1)/every⌋)}`` (Fling decays after the aggregation of every round ``r > 0`` with
``r % every == 0``); round ``r``'s prox uses ``α_r`` and its cloud models were computed at the end of round
``r − 1`` with ``α_{r−1}``. ``alpha_decay_every = 0`` keeps α constant. Note that the decayed α makes the prox
curvature ``λ/α`` grow by 10x every 30 rounds; with SGD(0.1, momentum 0.9) the local step becomes unstable once
``λ/α`` exceeds ~38 (round ~181 with the defaults), so long runs end in diverged models after their best round,
as the reference schedule would. The metric is the best round (spec §3.6).

BatchNorm model state: running statistics belong to the personalized model and never leave the client (Fling's
server only reads ``model.parameters()``; the client's buffers are its own), so each client trains and is scored
with its own statistics. There is no global model (``global_params`` is ``None``).

Client x client weights (``client_weight_matrix``, :mod:`fedjax_robust.algorithms.base`): row ``i`` is ``ξ_i``, the
weights of the stored models in the cloud model ``u_i`` client ``i`` received this round (its own column ``ξ_ii``,
which may be negative); rows sum to 1. The client hands ``ξ_i`` back with its upload, so the server reports the
weights it sent without computing the distances a second time.

Partial participation (not in the paper's protocol): the cloud models are built from the latest stored model of
every client (those never sampled hold ``w^0``); non-participants keep their models.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from fedjax_robust.algorithms.base import CLIENT_WEIGHT_MATRIX, ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import classification_loss
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.hparams import check, scalar
from fedjax_robust.models.interface import Model, as_model, merge_variables

PyTree = Any
HIGHEST = jax.lax.Precision.HIGHEST
STARTS = ("personal", "cloud")


class FedAMPState(NamedTuple):
  models: jax.Array  # [K, D] latest uploaded (flattened trainable) model of every client; w^0 before its first
  round: jax.Array  # int32: server updates so far (the α schedule)


def alpha_at(alpha: Any, decay: Any, every: int, round_index: jax.Array) -> jax.Array:
  """``α_r = α_0 · decay^{max(0, ⌊(r − 1)/every⌋)}`` (module docstring); ``every = 0``: constant ``α_0``."""
  if not every:
    return jnp.asarray(alpha, jnp.float32)
  steps = jnp.maximum((jnp.asarray(round_index, jnp.int32) - 1) // every, 0)
  return alpha * jnp.power(jnp.asarray(decay, jnp.float32), steps.astype(jnp.float32))


def attention_row(models: jax.Array, i: jax.Array, alpha: Any, sigma: Any) -> tuple[jax.Array, jax.Array]:
  """Client ``i``'s FedAMP weights and cloud model: ``(ξ_i [K], u_i [D])`` from the stored ``models`` [K, D].

  ``ξ_ij = α exp(−‖w_i − w_j‖²/σ)/σ`` for ``j ≠ i`` and ``ξ_ii = 1 − Σ_{j≠i} ξ_ij``;
  ``u_i = w_i + Σ_{j≠i} ξ_ij (w_j − w_i)`` (= ``Σ_j ξ_ij w_j``)."""
  k = models.shape[0]
  diff = models - models[i][None]
  sq = jnp.sum(jnp.square(diff), axis=1)
  others = jnp.arange(k) != i
  xi = jnp.where(others, alpha * jnp.exp(-sq / sigma) / sigma, 0.0)
  cloud = models[i] + jnp.matmul(xi, diff, precision=HIGHEST)
  return xi.at[i].set(1.0 - jnp.sum(xi)), cloud


def attention(models: jax.Array, ids: jax.Array, alpha: Any, sigma: Any) -> tuple[jax.Array, jax.Array]:
  """:func:`attention_row` for clients ``ids``: ``(ξ [C, K], u [C, D])``. One row at a time (``lax.map``), so the
  memory is one ``[K, D]`` difference, not ``[C, K, D]``."""
  return jax.lax.map(lambda i: attention_row(models, i, alpha, sigma), ids)


def make_fedamp(
    model: Model,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    num_clients: int,
    alpha_k: float = 1e4,
    lamda: float = 1.0,
    sigma: float = 100.0,
    alpha_decay: float = 0.1,
    alpha_decay_every: int = 30,
    start: str = "personal",
    name: str = "fedamp",
) -> FedAlgorithm:
  """FedAMP (module docstring). ``num_clients`` = K (the server's store of models).

  ``alpha_k``: α, the attention step (and the prox denominator); ``lamda``: λ, the prox weight (the client's prox
  coefficient is ``λ/α``); ``sigma``: σ of the attention-inducing function; ``alpha_decay`` /
  ``alpha_decay_every``: α ← decay·α every that many rounds (0: never); ``start``: the local training's starting
  point, ``"personal"`` (the client's own ``w_i``, Fling/PFLlib) or ``"cloud"`` (``u_i``). Defaults: the FedCAC
  authors' FedAMP configuration (Fling ``cifar10_fedamp_resnet_config``).
  """
  if num_clients < 1:
    raise ValueError(f"{name}: num_clients must be >= 1, got {num_clients}")
  check(alpha_k, lambda v: v > 0, f"{name}: alpha_k must be > 0, got {alpha_k}")
  check(lamda, lambda v: v >= 0, f"{name}: lamda must be >= 0, got {lamda}")
  check(sigma, lambda v: v > 0, f"{name}: sigma must be > 0, got {sigma}")
  check(alpha_decay, lambda v: v > 0, f"{name}: alpha_decay must be > 0, got {alpha_decay}")
  if int(alpha_decay_every) < 0:
    raise ValueError(f"{name}: alpha_decay_every must be >= 0 (0 = no decay), got {alpha_decay_every}")
  if start not in STARTS:
    raise ValueError(f"{name}: start must be one of {STARTS}, got {start!r}")
  alpha_k, lamda, sigma, alpha_decay = scalar(alpha_k), scalar(lamda), scalar(sigma), scalar(alpha_decay)
  every = int(alpha_decay_every)
  model = as_model(model)

  def init_server(params, model_state=None):
    flat, _ = ravel_pytree(params)
    return FedAMPState(jnp.broadcast_to(flat, (num_clients,) + flat.shape), jnp.zeros((), jnp.int32))

  def init_client(params, model_state=None):
    return {"params": params, "model_state": dict(model_state or {})}

  def broadcast(state: FedAMPState, ids: jax.Array):
    """Shared: the round's prox coefficient ``λ/α_r``; per client: its cloud model ``u_i`` (flat) and ``ξ_i``."""
    r = state.round
    xi, cloud = attention(state.models, ids, alpha_at(alpha_k, alpha_decay, every, r - 1), sigma)
    return {"prox": lamda / alpha_at(alpha_k, alpha_decay, every, r)}, {"cloud": cloud, "weights": xi}

  def client_update(payload, client_state, data: ClientData, key):
    shared, own = payload
    _, unravel = ravel_pytree(client_state["params"])
    cloud = unravel(own["cloud"])
    params = client_state["params"] if start == "personal" else cloud
    loss_fn = classification_loss(model, anchor=cloud, mu=shared["prox"])
    params, _, metrics, model_state = local_train(loss_fn, client_opt, params, client_opt.init(params), data, key,
                                                  spec, client_state["model_state"])
    # ξ_i rides back with the model so the server can report it without recomputing the [C, K, D] distances
    upload = {"model": ravel_pytree(params)[0], "weights": own["weights"]}
    return ClientOutput(upload, {"params": params, "model_state": model_state}, metrics)

  def server_update(state: FedAMPState, uploads, weights, key, ids, context=None):
    del weights, key, context
    models = state.models.at[ids].set(uploads["model"])
    return FedAMPState(models, state.round + 1), {CLIENT_WEIGHT_MATRIX: uploads["weights"]}

  def personal_params(payload, client_state, data: ClientData, key):
    del payload, data, key
    if client_state["model_state"]:
      return merge_variables(client_state["params"], client_state["model_state"])
    return client_state["params"]

  return FedAlgorithm(name, init_server, init_client, broadcast, client_update, server_update, lambda state: None,
                      personal_params, uses_client_ids=True)
