"""FedFomo (Zhang et al., "Personalized Federated Learning with First Order Model Optimization", ICLR 2021).

FedCAP baseline, spec ``specs/fedcap.md`` §3 ("FedFomo") and ambiguity 16: the
FedCAP artifact's ``clientFomo.aggregate_parameters`` is never called, so its
FedFomo is Local training on 80% of the data. This module implements the
method of the paper (§3, Alg. 1); reported FedCAP numbers for FedFomo may come
from the degenerate version, so compare with care.

There is no global model. Every client ``k`` keeps its own model ``θ_k``
(persistent client state, initialised to ``θ^0``) and splits its real training
rows into a train part and a validation part (``val_fraction``, default 0.2):

    n_val = ⌊val_fraction · n_k⌋   (exact: val_fraction is taken as a fraction p/q, n_val = (n_k·p) // q)
    train rows  = 0 .. n_k − n_val − 1      (the first part, as PFLlib's ``train_data[:-n_val]``)
    val rows    = n_k − n_val .. n_k − 1    (the LAST n_val real rows; padding rows ≥ n_k are never used)

Local SGD runs on the train part only (``ClientData(x, y, n_k − n_val)``: the
padded-step no-ops of :func:`~fedjax_robust.client.local_train` make it exactly
E epochs over those rows). A client with ``n_val = 0`` has an empty validation
set, so all its weights are 0 and it keeps ``θ_old``.

One round ``t``:

1. **Download** (paper §3, model sending with the affinity matrix): the server keeps the latest uploaded model of
   every client (``models`` [K, D], flattened, with a ``seen`` mask) and the
   affinity matrix ``P`` [K, K], initialised to 0 off the diagonal as in the
   official code (``Client.init_client_weights``: other weights 0); the
   diagonal is never used because a client is never sent its own model. Client
   ``k`` is sent the ``O = num_models`` models with the highest ``P[k, ·]``
   among clients that have uploaded, itself excluded (ties broken at random).
   ε-greedy exploration (paper §3; official code ``get_federating_clients``, defaults ε = 0.3, decay 0.05):
   each of the O slots explores with probability ``ε_t = max(ε − decay·t, 0)``;
   with ``m`` exploring slots the client gets the top ``O − m`` by affinity plus
   ``m`` models drawn uniformly from the remaining candidates. (The official
   code decays ε per local *epoch* of its global epoch counter; here it decays
   per round.) With fixed shapes the per-client payload is the indices
   ``[C, O]`` and a validity mask (fewer than O candidates early on); the pool
   itself is the shared payload, read by every client without a copy.
2. **First-order weights** (paper §3, the FedFomo weight): on its validation rows the client
   evaluates ``L(θ_old)`` (its current model) and ``L(θ_n)`` for every received
   ``θ_n``, and sets

       w_n = max(0, (L(θ_old) − L(θ_n)) / ‖θ_n − θ_old‖₂),   w_n ← w_n / Σ_m w_m

   (a received model identical to ``θ_old`` gets 0; if every ``w_n`` is 0 the
   client keeps ``θ_old``).
3. **Federated update** (paper §3, the first-order federated update): ``θ ← θ_old + Σ_n w_n (θ_n − θ_old)``;
   with normalised weights this is the convex combination ``Σ_n w_n θ_n``.
4. **Local training**: E epochs of local SGD from ``θ`` on the train part
   (optimizer state reset each round), giving ``θ_k^{t}``.
5. **Upload**: ``delta = θ_k^t − θ_old`` (the field attacks poison), the
   client's ``θ_old`` (``base``) and the weights ``w_n``. The server stores
   ``models[k] ← base + delta``, marks ``k`` seen, and accumulates
   ``P[k, n] += w_n`` for the O indices it sent (paper Alg. 1, affinity update;
   the indices are recomputed from the state, as FedCAP does with ``ŵ_k``).
   Without an attack ``models[k]`` equals ``θ_k^t`` up to float rounding. An
   attacker's stored model is its own honest ``θ_old`` plus the poisoned delta,
   as the artifact builds it (``serverfomo.receive_models``: ``old_model`` +
   poisoned update), so a sign flip or a scaling does not compound over the
   server's earlier poisoned records.

Client x client weights (``client_weight_matrix``, :mod:`fedjax_robust.algorithms.base`;
:func:`round_weights`): row ``k`` holds the round's ``w_n`` of the models client ``k`` received and, on its own
column, the weight of its own ``θ_old`` (1 if it kept it, else 0); the off-diagonal entries are this round's
increment of ``P``, so their sum over every round is ``P`` itself.

Evaluation (``eval_models``): ``local`` = ``θ_k`` (primary: ``client_acc_*``)
and ``received`` = the federated model ``Σ_n w_n θ_n`` the client would build
from the current pool before training (``received_*``); the FedCAP artifact
reports the better of the two at the final round (spec §3 last paragraph).
``global_params`` = ``None`` (no ``global_*`` metrics). A client never sampled
keeps ``θ^0``.

Not modelled: the official code's signed affinity update (its ``P`` adds the
raw loss deltas divided by ``|Σ raw|``, negatives included); here ``P`` adds the
clamped, normalised weights actually used in the update, as the paper's
Alg. 1 writes it (``P_{i,n} ← P_{i,n} + w_{i,n}``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from fedjax_robust.models.interface import as_model, stateless_apply
from fedjax_robust.algorithms.base import CLIENT_WEIGHT_MATRIX, ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import classification_loss, tree_sub
from fedjax_robust.metrics.evaluation import score_models
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]
HIGHEST = jax.lax.Precision.HIGHEST


class FedFomoState(NamedTuple):
  models: jax.Array  # [K, D] latest uploaded model of every client (rows with seen=False are unused)
  seen: jax.Array  # [K] bool: the client has uploaded at least once
  affinity: jax.Array  # [K, K] P[k, n]: accumulated weights client k gave client n's model
  key: jax.Array  # exploration key of the next broadcast (the previous round's server key)
  round: jax.Array  # int32: server updates so far (ε decay)


def _as_fraction(val_fraction: float) -> Fraction:
  return Fraction(val_fraction).limit_denominator(10_000)


def _floor_fraction(n: int, val_fraction: float) -> int:
  frac = _as_fraction(val_fraction)
  return (n * frac.numerator) // frac.denominator


def validation_split(n: jax.Array, val_fraction: float) -> tuple[jax.Array, jax.Array]:
  """``(n_train, n_val)`` with ``n_val = ⌊val_fraction · n⌋`` computed exactly in integers (0.2 = 1/5)."""
  frac = _as_fraction(val_fraction)
  n = jnp.asarray(n, jnp.int32)
  n_val = (n * frac.numerator) // frac.denominator
  return n - n_val, n_val


def fomo_weights(loss_old: jax.Array, losses: jax.Array, distances: jax.Array, valid: jax.Array) -> jax.Array:
  """The FedFomo weight: ``w_n = max(0, (L(θ_old) − L(θ_n)) / ‖θ_n − θ_old‖)`` normalised to sum 1 (all 0 if none > 0).

  ``losses``, ``distances``, ``valid``: [O]. Invalid slots and zero distances get 0.
  """
  usable = valid & (distances > 0)
  raw = (loss_old - losses) / jnp.where(usable, distances, 1.0)
  pos = jnp.where(usable, jnp.maximum(raw, 0.0), 0.0)
  total = jnp.sum(pos)
  return jnp.where(total > 0, pos / jnp.where(total > 0, total, 1.0), 0.0)


def round_weights(weights: jax.Array, indices: jax.Array, ids: jax.Array, num_clients: int) -> jax.Array:
  """The round's ``[C, K]`` client x client weights (``client_weight_matrix``): each cohort member's ``w_n`` at the
  ids of the models it received, and at its own id the weight of its own ``θ_old`` in ``θ_old + Σ_n w_n (θ_n −
  θ_old)``: 1 when it kept its model (every ``w_n`` 0), else 0 (the normalised weights sum to 1 and the update is
  ``Σ_n w_n θ_n``), so every row sums to 1. The off-diagonal part is exactly what the round adds to ``P``."""
  rows = jnp.arange(ids.shape[0])
  matrix = jnp.zeros((ids.shape[0], num_clients), weights.dtype).at[rows[:, None], indices].add(weights)
  return matrix.at[rows, ids].add(jnp.where(jnp.sum(weights, axis=1) > 0, 0.0, 1.0).astype(weights.dtype))


def select_models(affinity_row: jax.Array, candidates: jax.Array, num_models: int, epsilon: jax.Array,
                  key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """ε-greedy top-O choice for one client: ``(indices [O], valid [O])``.

  ``affinity_row`` [K]: P[k, ·]; ``candidates`` [K]: clients whose model may be sent.
  ``m ~ Binomial(O, ε)`` slots explore: the client gets the ``O − m`` candidates
  with the highest affinity (random tie-break) and ``m`` uniformly random other
  candidates. Fewer than O candidates: all of them, the rest of the slots invalid.
  """
  k = affinity_row.shape[0]
  explore_key, tie_key, random_key = jax.random.split(key, 3)
  num_explore = jnp.sum(jax.random.uniform(explore_key, (num_models,)) < epsilon)
  tie = jax.random.uniform(tie_key, (k,))
  order = jnp.lexsort((tie, -jnp.where(candidates, affinity_row, -jnp.inf)))  # descending P, candidates first
  rank = jnp.zeros((k,), jnp.int32).at[order].set(jnp.arange(k, dtype=jnp.int32))
  exploit = candidates & (rank < num_models - num_explore)
  priority = jnp.where(exploit, rank.astype(jnp.float32),
                       jnp.where(candidates, num_models + jax.random.uniform(random_key, (k,)), jnp.inf))
  indices = jnp.argsort(priority)[:num_models].astype(jnp.int32)
  valid = jnp.arange(num_models) < jnp.minimum(num_models, jnp.sum(candidates))
  return jnp.where(valid, indices, 0), valid


def make_fedfomo(
    apply_fn: ApplyFn,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    num_clients: int,
    num_models: int | None = None,
    val_fraction: float = 0.2,
    epsilon: float = 0.3,
    epsilon_decay: float = 0.05,
    name: str = "fedfomo",
) -> FedAlgorithm:
  """FedFomo (module docstring). ``num_clients`` = K (size of the server's pool and of P).

  ``num_models``: O, models sent per client (FedCAP: half the participants, 10 of
  20); None = ``K // 2``; capped at ``K − 1``. ``val_fraction``: share of each
  client's real training rows held out (the last ones) for the weights.
  ``epsilon``, ``epsilon_decay``: ε-greedy exploration, ``ε_t = max(ε − decay·t, 0)``
  (official defaults 0.3 and 0.05; ``epsilon=0`` = pure top-O by affinity).
  """
  if num_clients < 1:
    raise ValueError(f"fedfomo: num_clients must be >= 1, got {num_clients}")
  if num_models is None:
    num_models = num_clients // 2
  if num_models < 1:
    raise ValueError(f"fedfomo: num_models must be >= 1, got {num_models}")
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"fedfomo: val_fraction must be in [0, 1), got {val_fraction}")
  if not 0.0 <= epsilon <= 1.0 or epsilon_decay < 0:
    raise ValueError(f"fedfomo: need 0 <= epsilon <= 1 and epsilon_decay >= 0, got {epsilon}, {epsilon_decay}")
  num_models = max(1, min(int(num_models), num_clients - 1))
  val_fraction, epsilon, epsilon_decay = float(val_fraction), float(epsilon), float(epsilon_decay)
  ce_loss = classification_loss(apply_fn)
  apply_fn = stateless_apply(as_model(apply_fn), name)  # eval mode, for the validation losses

  def init_server(params, model_state=None):
    flat, _ = ravel_pytree(params)
    return FedFomoState(jnp.zeros((num_clients, flat.shape[0]), flat.dtype), jnp.zeros((num_clients,), bool),
                        jnp.zeros((num_clients, num_clients), jnp.float32), jax.random.key(0),
                        jnp.zeros((), jnp.int32))

  def init_client(params):
    return {"params": params}

  def selection(state: FedFomoState, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(indices [C, O], valid [C, O])`` sent to clients ``ids`` (deterministic in the state)."""
    eps = jnp.maximum(epsilon - epsilon_decay * state.round.astype(jnp.float32), 0.0)

    def one(k):
      candidates = state.seen & (jnp.arange(num_clients) != k)
      return select_models(state.affinity[k], candidates, num_models, eps, jax.random.fold_in(state.key, k))

    return jax.vmap(one)(ids)

  def broadcast(state: FedFomoState, ids: jax.Array):
    indices, valid = selection(state, ids)
    return {"models": state.models}, {"indices": indices, "valid": valid}

  def federated_update(payload, client_state, data: ClientData):
    """Steps 2-3: ``(θ = Σ_n w_n θ_n flat, weights w [O], θ_old flat, unravel, n_train)`` for one client."""
    shared, own = payload
    pool, indices, valid = shared["models"], own["indices"], own["valid"]
    flat_old, unravel = ravel_pytree(client_state["params"])
    n_train, _ = validation_split(data.n, val_fraction)
    # The validation rows n_train .. n-1 lie in a window of static size (at most ⌊q·n_max⌋ rows).
    n_max = data.y.shape[0]
    window = max(_floor_fraction(n_max, val_fraction), 1)
    start = jnp.clip(n_train, 0, n_max - window)
    rows = start + jnp.arange(window)
    val_mask = (rows >= n_train) & (rows < data.n)
    x_val = jax.lax.dynamic_slice_in_dim(data.x, start, window)
    y_val = jax.lax.dynamic_slice_in_dim(data.y, start, window)
    # The O received models and the client's own, scored on the validation rows by the many-model kernel
    # (one model at a time: a vmapped chunk of conv nets would be a grouped convolution).
    candidates = jnp.concatenate([pool[indices], flat_old[None]])
    scores = score_models(apply_fn, jax.vmap(unravel)(candidates), x_val, y_val, mask=val_mask, model_chunk=1,
                          batch_size=window)
    losses, loss_old = scores.mean_loss[:-1], scores.mean_loss[-1]
    distances = jnp.linalg.norm(pool[indices] - flat_old[None], axis=1)
    weights = fomo_weights(loss_old, losses, distances, valid)
    # The federated update with Σ w_n = 1: θ_old + Σ w_n (θ_n − θ_old) = Σ w_n θ_n, as one [K] x [K, D] product.
    scattered = jnp.zeros((num_clients,), pool.dtype).at[indices].add(weights)
    federated = jnp.where(jnp.sum(weights) > 0, jnp.matmul(scattered, pool, precision=HIGHEST), flat_old)
    return federated, weights, flat_old, unravel, n_train

  def client_update(payload, client_state, data: ClientData, key):
    federated, weights, flat_old, unravel, n_train = federated_update(payload, client_state, data)
    start_params = unravel(federated)
    train = ClientData(data.x, data.y, n_train)
    trained, _, metrics, _ = local_train(ce_loss, client_opt, start_params, client_opt.init(start_params), train, key,
                                      spec)
    upload = {"delta": tree_sub(trained, client_state["params"]), "base": flat_old, "weights": weights}
    return ClientOutput(upload, {"params": trained}, metrics)

  def server_update(state: FedFomoState, uploads, weights, key, ids, context=None):
    del weights  # FedFomo has no sample-weighted aggregate
    deltas = jax.vmap(lambda d: ravel_pytree(d)[0])(uploads["delta"])
    models = state.models.at[ids].set(uploads["base"] + deltas)
    indices, valid = selection(state, ids)
    w = jnp.where(valid, uploads["weights"], 0.0)
    affinity = state.affinity.at[ids[:, None], indices].add(w)
    new_state = FedFomoState(models, state.seen.at[ids].set(True), affinity, key, state.round + 1)
    diagnostics = {"models_received": jnp.mean(jnp.sum(valid, axis=1).astype(jnp.float32)),
                   "kept_own_model": jnp.mean((jnp.sum(w, axis=1) == 0).astype(jnp.float32)),
                   CLIENT_WEIGHT_MATRIX: round_weights(w, indices, ids, num_clients)}
    return new_state, diagnostics

  def personal_params(payload, client_state, data: ClientData, key):
    del key
    federated, _, _, unravel, _ = federated_update(payload, client_state, data)
    return {"local": client_state["params"], "received": unravel(federated)}

  return FedAlgorithm(name, init_server, init_client, broadcast, client_update, server_update, lambda state: None,
                      personal_params, uses_client_ids=True, eval_models=("local", "received"))
