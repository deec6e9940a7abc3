"""FedCAP: customized aggregation, calibration/detection and personalization (Li et al., ACSAC 2024).

Spec: ``specs/fedcap.md`` §1 (paper: ``papers/fedcap.txt``, Alg. 1, Eqs. 3-7). One round ``t``:

1. **Customize** (Eqs. 3-5, spec §1.4). For every client ``k`` the server builds
   ``ŵ_k = Σ_i p_{k,i} w̃_i`` over the valid pool ``V`` of the previous round, with
   ``p_{k,·} = (1-φ)·softmax(α·cos(r_k, d̃_i))`` over ``i ≠ k`` and ``p_{k,k} = φ``
   when ``k ∈ V`` (``r_k = d̃_k``, its own calibrated update); a client outside
   the pool sends a request update ``r_k`` (E epochs of plain SGD from the previous
   global model ``w^{t-1}``, the reference the pool's ``d̃`` were calibrated against)
   and gets the softmax over the whole pool, no self term. An empty pool
   (round 0) gives everyone the global model ``w^0``.
2. **Client update** (Eq. 7 and the artifact's alternating scheme, spec §1.5): on
   each mini-batch, one prox step on the personalized model ``v_k`` toward the
   frozen ``ŵ_k`` (λ), then one plain SGD step on the local copy ``w`` of ``ŵ_k``.
   The two steps use the same batch and do not interact, so they are one optimizer
   step on the pair ``{v, w}`` with loss ``CE(v) + λ/2‖v-ŵ‖² + CE(w)``. Upload
   ``d_k = w - ŵ_k`` (attacks poison this).
3. **Recover / calibrate / detect** (spec §1.3 lines 13-16): ``w̃_k = ŵ_k + d_k``
   with the server's own record of ``ŵ_k``; ``d̃_k = w̃_k - w^t``; a client whose
   ``‖d̃_k‖₂ > T_norm`` (strictly) or is NaN is removed for good. The valid pool
   becomes this round's unflagged participants, and the global model is their
   sample-weighted recovered models (Eq. 6).

Client x client weights (``client_weight_matrix``, :mod:`fedjax_robust.algorithms.base`): row ``k`` of a round
holds ``p_{k,·}``, the weights of the pool's recovered models ``w̃_i`` (the previous round's) in the ``ŵ_k`` cohort
member ``k`` trained from; rows sum to 1. A client outside the pool without request updates is sent the global
model, which is the pool's Eq. 6 mix (its sample weights); a row of zeros means the pool was empty (round 1, or
every participant flagged) and ``ŵ_k`` was the global model ``w^0`` or an older one.

Evaluation scores two models per client (``eval_models``): the customized model
built from the latest pool and the personalized ``v_k``; FedCAP reports the
better of their benign accuracies (spec §4.4).

Table IV ablations (spec §1.7): ``personalize=False`` trains only ``w`` (variants
①, ③); ``calibrate=False`` uses the raw uploads ``d_k`` for similarities and
turns detection off (①, ④). Ditto (②) is :mod:`fedjax_robust.algorithms.ditto`.

Partial participation (spec §1.6): with ``request_updates=True`` clients outside
the pool compute their request update inside the client kernel and upload it
with ``d_k``, so the server recomputes exactly the ``ŵ_k`` it would have sent.
With a ``request_poisoner`` (the artifact's behaviour, spec §2.3) a malicious client
poisons its request with the round's model attack before asking: sign flip /
scaling / Gaussian act on its own ``r_k``; LIE, IPM, Min-Max and Min-Sum send the
vector crafted from the server's valid calibrated pool, the pool's malicious
members counted as the attackers (:mod:`fedjax_robust.attacks.requests`, built by
the run from its attack). The attacker mask reaches ``broadcast`` as an argument
of the round (``uses_malicious``), so seeds with different attackers share one
program. Requests
enter only through cosine similarities, so positive scale factors (MR's N, IPM's
ε) do not change the customized model; the artifact's N = participants is not
reproduced there. Requests are never norm-checked.

Removed clients (spec §1.6): never in a pool, never in the global model, and
their uploads are discarded; they can still be sampled, as in the artifact. One
difference: a removed participant here is handed a freshly customized model (by
request, or the global model without requests) where the artifact leaves it its
stale one (it keeps training its own last model, so its honest update drifts
further from that stale model each time it is sampled). This reaches the numbers
in two places: the removed client's personalized model (benign accuracy, only if a
benign client was removed by mistake, FPR > 0), and the cohort statistics that
LIE, Min-Max and Min-Sum craft from, which include removed attackers' honest
uploads as in the artifact. Neither arises on CIFAR-10 (no false positives; LIE is
never detected and the other crafted attacks lose all attackers in one round).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from fedjax_robust.hparams import check, scalar
from fedjax_robust.algorithms.base import CLIENT_WEIGHT_MATRIX, ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.ditto import check_pair_forward, ditto_pair_loss
from fedjax_robust.algorithms.fedavg import classification_loss, tree_sub
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.models.interface import Model, as_model, require_stateless

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]
HIGHEST = jax.lax.Precision.HIGHEST


class FedCAPState(NamedTuple):
  global_params: PyTree  # w^t (Eq. 6): the pool's sample-weighted recovered models; calibrates the next uploads
  request_reference: PyTree  # w^{t-1}: the model the pool's d̃ were calibrated against, so the start point and
  # reference of request updates (spec §1.4, §6 item 3: r_k and d̃^{t-1} share one reference); w^0 before round 1
  pool_models: jax.Array  # [K, D] recovered models w̃_i of the valid pool (rows outside the pool are stale)
  pool_updates: jax.Array  # [K, D] calibrated updates d̃_i (raw uploads when calibrate=False)
  pool_valid: jax.Array  # [K] bool: V, the previous round's unflagged participants
  pool_n: jax.Array  # [K] float: training-set sizes n_i (Eq. 6 weights)
  removed: jax.Array  # [K] bool: permanently flagged clients
  removed_round: jax.Array  # [K] int32: round (1-based) in which the client was removed, 0 if never
  round: jax.Array  # int32: server updates so far


def cosine_rows(a: jax.Array, b: jax.Array) -> jax.Array:
  """``cos(a_i, b_j)`` for rows of ``a`` [m, D] and ``b`` [P, D]; NaN (zero vectors) -> -1 as the artifact does."""
  dots = jnp.matmul(a, b.T, precision=HIGHEST)
  norms = jnp.linalg.norm(a, axis=1)[:, None] * jnp.linalg.norm(b, axis=1)[None, :]
  cos = dots / norms
  return jnp.where(jnp.isfinite(cos), cos, -1.0)


def customization_weights(requests: jax.Array, self_ids: jax.Array, has_self: jax.Array, pool_updates: jax.Array,
                          pool_valid: jax.Array, alpha: float, phi: float) -> jax.Array:
  """``p_{k,·}`` of Eqs. 4-5 for a batch of target clients: ``[m, K]`` rows that sum to 1 over the pool.

  ``requests`` [m, D]: r_k; ``self_ids`` [m]: the targets' ids; ``has_self`` [m]: whether
  the target is in the pool (then its own entry is excluded from the softmax and
  gets the self-weight φ). A target whose pool holds nobody else keeps weight 1 on
  itself; an empty pool gives all-zero rows (the caller falls back to the global model).
  """
  k = pool_updates.shape[0]
  sims = cosine_rows(requests, pool_updates)
  own = jax.nn.one_hot(self_ids, k, dtype=bool) & has_self[:, None]
  candidates = pool_valid[None, :] & ~own
  logits = jnp.where(candidates, alpha * sims, -jnp.inf)
  any_other = jnp.any(candidates, axis=1, keepdims=True)
  soft = jnp.where(any_other, jax.nn.softmax(jnp.where(any_other, logits, 0.0), axis=1), 0.0)
  soft = jnp.where(candidates, soft, 0.0)
  self_weight = jnp.where(any_other, phi, 1.0)
  return jnp.where(has_self[:, None], (1.0 - phi) * soft * any_other + own * self_weight, soft)


def aggregate_rows(weights: jax.Array, rows: jax.Array) -> jax.Array:
  return jnp.matmul(weights, rows, precision=HIGHEST)


def make_fedcap(
    apply_fn: Model | ApplyFn,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    num_clients: int,
    alpha: float = 10.0,
    phi: float = 0.1,
    lamda: float = 0.1,
    norm_threshold: float = 10.0,
    calibrate: bool = True,
    personalize: bool = True,
    request_updates: bool = False,
    request_poisoner: Optional[Any] = None,
    malicious: Optional[Any] = None,
    pair_forward: str = "separate",
    sample_removed: bool = True,
    eval_customized: str = "fresh",
    name: str = "fedcap",
) -> FedAlgorithm:
  """FedCAP (module docstring). ``num_clients`` = K, the size of the server's pools.

  Defaults are the spec's choice off its per-cell table (§6 item 12: α = 10 for label skew, φ = 0.1, λ = 0.1,
  T_norm = 10); the paper's experiments use the per-cell values of ``experiments/configs/fedcap_*.py``.

  ``request_updates``: let clients outside the pool build their customized model
  from a request update (spec §1.6); needed under partial participation, where
  the pool only holds the previous round's participants. With full participation
  every unflagged client is in the pool after round 0, so the default skips that
  extra local training (flagged clients then start from the global model; their
  uploads are discarded anyway).

  ``request_poisoner`` (:func:`fedjax_robust.attacks.request_poisoner` of the
  run's attack): malicious clients poison their request updates (spec §2.3,
  module docstring); only meaningful with ``request_updates``, since without
  requests there is nothing to poison. The engine passes the run's ``[K]``
  attacker mask to ``broadcast``; ``malicious`` is the mask used when a caller
  of ``broadcast(state, ids)`` gives none.

  ``sample_removed`` (spec §6 item 9): ``True`` keeps removed clients in the
  cohort draw, as the artifact does (they take a slot and their upload is
  discarded); ``False`` draws the cohort from the unremoved clients only (removed
  ones fill slots only when too few remain).

  ``eval_customized`` (spec §6 item 8): the customized model each client is scored
  with. ``"fresh"`` (default, the artifact's numbers): a customization from the
  latest pools for every client, a request update for each client outside the
  pool, with no state change (about K extra local trainings per evaluation under
  partial participation). ``"last_received"``: the ŵ_k the client was last sent
  (w^0 before its first round); free at evaluation, but it keeps a [K, D] copy on
  the client axis and scores clients on models up to many rounds old.

  ``pair_forward``: how the personalized and customized models' passes run
  (:func:`fedjax_robust.algorithms.ditto.pair_logits`); same numbers.
  """
  check(alpha, lambda v: v >= 0, f"fedcap: alpha must be >= 0, got {alpha}")
  check(phi, lambda v: 0.0 <= v <= 1.0, f"fedcap: phi must be in [0, 1], got {phi}")
  check(lamda, lambda v: v >= 0, f"fedcap: lamda must be >= 0, got {lamda}")
  check(norm_threshold, lambda v: v > 0, f"fedcap: norm_threshold must be > 0, got {norm_threshold}")
  if num_clients < 1:
    raise ValueError(f"fedcap: num_clients must be >= 1, got {num_clients}")
  if eval_customized not in ("fresh", "last_received"):
    raise ValueError(f"fedcap: eval_customized must be 'fresh' or 'last_received', got {eval_customized!r}")
  keep_customized = eval_customized == "last_received"
  check_pair_forward(pair_forward)
  alpha, phi, lamda, norm_threshold = scalar(alpha), scalar(phi), scalar(lamda), scalar(norm_threshold)
  poison_requests = request_updates and request_poisoner is not None
  if poison_requests and malicious is not None:
    malicious = jnp.asarray(malicious, bool).reshape(-1)
    if malicious.shape[0] != num_clients:
      raise ValueError(f"fedcap: malicious has {malicious.shape[0]} entries, expected num_clients={num_clients}")
  require_stateless(as_model(apply_fn), name)
  ce_loss = classification_loss(apply_fn)

  def pair_loss(anchor):
    """CE(w) + CE(v) + λ/2‖v - ŵ‖² with ŵ frozen (Ditto's pair loss, spec §1.5); CE(w) alone without personalization."""
    if personalize:
      return ditto_pair_loss(apply_fn, anchor, lamda, pair_forward)
    w_loss = classification_loss(apply_fn)
    return lambda params, batch: w_loss(params["w"], batch)

  def init_server(params, model_state=None):
    flat, _ = ravel_pytree(params)
    zeros = jnp.zeros((num_clients, flat.shape[0]), flat.dtype)
    flags = jnp.zeros((num_clients,), bool)
    return FedCAPState(params, params, zeros, zeros, flags, jnp.zeros((num_clients,), jnp.float32), flags,
                       jnp.zeros((num_clients,), jnp.int32), jnp.zeros((), jnp.int32))

  def init_client(params):
    state = {"v": params} if personalize else {}
    return {**state, "customized": params} if keep_customized else state

  def pool_weights(state: FedCAPState, ids: jax.Array) -> jax.Array:
    """``p_{k,·}`` [C, K] for clients ``ids`` that are in the pool (self branch); other rows are meaningless."""
    return customization_weights(state.pool_updates[ids], ids, jnp.ones(ids.shape, bool), state.pool_updates,
                                 state.pool_valid, alpha, phi)

  def pool_customized(state: FedCAPState, ids: jax.Array) -> jax.Array:
    """ŵ for clients ``ids`` that are in the pool (self branch); other rows are meaningless."""
    return aggregate_rows(pool_weights(state, ids), state.pool_models)

  def global_weights(state: FedCAPState) -> jax.Array:
    """[K]: the global model as a mix of the pool (Eq. 6's sample weights, which built it from this very pool);
    all zero when the pool is empty (the global model is then w^0 or an older one, not the pool's)."""
    gw = jnp.where(state.pool_valid, state.pool_n, 0.0)
    return gw / jnp.maximum(jnp.sum(gw), 1e-12)

  def request_customized(state_like, request: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(ŵ, p [K])`` for one client outside the pool from its request update (no self term); the global model
    and all-zero weights if the pool is empty."""
    pool_updates, pool_models, pool_valid, global_flat = state_like
    w = customization_weights(request[None], jnp.zeros((1,), jnp.int32), jnp.zeros((1,), bool), pool_updates,
                              pool_valid, alpha, phi)
    return jnp.where(jnp.any(pool_valid), aggregate_rows(w, pool_models)[0], global_flat), w[0]

  def broadcast(state: FedCAPState, ids: jax.Array, run_malicious: Optional[jax.Array] = None):
    global_flat, _ = ravel_pytree(state.global_params)
    in_pool = state.pool_valid[ids]
    customized = jnp.where(in_pool[:, None], pool_customized(state, ids), global_flat[None])
    shared = {"global": state.global_params}
    own = {"customized": customized, "in_pool": in_pool}
    if request_updates:
      shared.update(request_reference=state.request_reference, pool_updates=state.pool_updates,
                    pool_models=state.pool_models, pool_valid=state.pool_valid)
    if poison_requests:
      mal = malicious if run_malicious is None else jnp.asarray(run_malicious, bool)
      if mal is None:
        raise ValueError("fedcap: poisoned requests need the run's [K] malicious mask (broadcast's third argument)")
      own["malicious"] = mal[ids]
      if not request_poisoner.uses_own_request:
        # the vector a malicious requester sends under a pool-statistics attack (spec §2.3)
        shared["request_poison"] = request_poisoner.from_pool(state.pool_updates, state.pool_valid, mal,
                                                              state.request_reference)
    return shared, own

  def poisoned_request(shared, own, request: jax.Array, key) -> jax.Array:
    """``r_k`` as a malicious client sends it (spec §2.3); benign clients' requests pass unchanged."""
    if request_poisoner.uses_own_request:
      crafted = request_poisoner.own(request, shared["request_reference"], key)
    else:
      crafted = shared["request_poison"]
    return jnp.where(own["malicious"], crafted, request)

  def own_customized(shared, own, data: ClientData, key):
    """``(ŵ_k as params, request update r_k flat or None)`` for one client."""
    global_flat, unravel = ravel_pytree(shared["global"])
    if not request_updates:
      return unravel(own["customized"]), None
    # r_k = SGD_E(w^{t-1}) - w^{t-1}: the same reference as the pool's d̃^{t-1} (spec §1.4), not the newer w^t.
    reference = shared["request_reference"]
    trained = local_train(ce_loss, client_opt, reference, client_opt.init(reference), data, key, spec)
    request = ravel_pytree(trained.params)[0] - ravel_pytree(reference)[0]
    if poison_requests:
      request = poisoned_request(shared, own, request, jax.random.fold_in(key, 1))
    from_request, _ = request_customized((shared["pool_updates"], shared["pool_models"], shared["pool_valid"],
                                          global_flat), request)
    return unravel(jnp.where(own["in_pool"], own["customized"], from_request)), request

  def client_update(payload, client_state, data: ClientData, key):
    shared, own = payload
    request_key, train_key = jax.random.split(key)
    customized, request = own_customized(shared, own, data, request_key)
    params = {"w": customized, "v": client_state["v"]} if personalize else {"w": customized}
    trained, _, metrics, _ = local_train(pair_loss(customized), client_opt, params, client_opt.init(params), data,
                                      train_key, spec)
    upload = {"delta": tree_sub(trained["w"], customized)}
    if request_updates:
      upload["request"] = request
    new_state = {"v": trained["v"]} if personalize else {}
    if keep_customized:
      new_state["customized"] = customized
    return ClientOutput(upload, new_state, metrics)

  def server_update(state: FedCAPState, uploads, weights, key, ids, context=None):
    del key
    global_flat, unravel = ravel_pytree(state.global_params)
    deltas = jax.vmap(lambda d: ravel_pytree(d)[0])(uploads["delta"])
    in_pool = state.pool_valid[ids]
    mixing = pool_weights(state, ids)
    sent = jnp.where(in_pool[:, None], aggregate_rows(mixing, state.pool_models), global_flat[None])
    outside = jnp.broadcast_to(global_weights(state), mixing.shape)  # clients outside the pool got w^t
    if request_updates:
      from_request, outside = jax.vmap(lambda r: request_customized(
          (state.pool_updates, state.pool_models, state.pool_valid, global_flat), r))(uploads["request"])
      sent = jnp.where(in_pool[:, None], sent, from_request)
    recovered = sent + deltas  # w̃_k = ŵ_k + d_k
    if calibrate:
      calibrated = recovered - global_flat[None]  # d̃_k = w̃_k - w^t
      norms = jnp.linalg.norm(calibrated, axis=1)
      anomalous = ~(norms <= norm_threshold)  # strictly greater, and NaN counts as anomalous
    else:
      calibrated, anomalous = deltas, jnp.zeros(ids.shape, bool)
      norms = jnp.linalg.norm(deltas, axis=1)
    newly = anomalous & ~state.removed[ids]
    removed = state.removed.at[ids].max(anomalous)
    removed_round = state.removed_round.at[ids].max(jnp.where(newly, state.round + 1, 0))
    keep = ~removed[ids]
    pool_valid = jnp.zeros_like(state.pool_valid).at[ids].set(keep)
    pool_models = state.pool_models.at[ids].set(jnp.where(keep[:, None], recovered, 0.0))
    pool_updates = state.pool_updates.at[ids].set(jnp.where(keep[:, None], calibrated, 0.0))
    pool_n = state.pool_n.at[ids].set(weights)
    # Eq. 6: the next global model is the sample-weighted mean of the pool's recovered models.
    gw = jnp.where(pool_valid, pool_n, 0.0)
    new_global = jnp.where(jnp.sum(gw) > 0, aggregate_rows(gw / jnp.maximum(jnp.sum(gw), 1e-12), pool_models),
                           global_flat)
    # The pool just stored is calibrated against this round's w^t, so w^t is the next round's request reference.
    new_state = FedCAPState(unravel(new_global), state.global_params, pool_models, pool_updates, pool_valid, pool_n,
                            removed, removed_round, state.round + 1)
    diagnostics = {"flagged": removed[ids], "calibrated_norms": norms, "num_removed": jnp.sum(removed),
                   "pool_size": jnp.sum(pool_valid),
                   CLIENT_WEIGHT_MATRIX: jnp.where(in_pool[:, None], mixing, outside)}  # the p_{k,·} of ŵ_k
    return new_state, diagnostics

  def personal_params(payload, client_state, data: ClientData, key):
    shared, own = payload
    customized = client_state["customized"] if keep_customized else own_customized(shared, own, data, key)[0]
    return {"customized": customized, "personalized": client_state["v"] if personalize else customized}

  return FedAlgorithm(name, init_server, init_client, broadcast, client_update, server_update,
                      lambda state: state.global_params, personal_params, uses_client_ids=True,
                      uses_malicious=poison_requests,
                      eval_models=("customized", "personalized"),
                      sampling_mask=None if sample_removed else (lambda state: ~state.removed))
