"""FedVSA (Zeng et al., JPDC 2024): value-sensitive aggregation, a historic loss audit and Shapley-value recovery.

Spec: ``shared/specs/fedvsa.md`` (§1.3-1.8; [R] marks its recommended resolutions, which are the defaults here).

Client (Alg. 2). Before training, client ``k`` scores the model it downloaded on its own training set in eval
mode: the *inference loss* ``F_k^t = ℓ(w^t, D_k)`` (``inference_reduction``: ``mean`` [R], ``sum`` = Eq. 1,
``sum_batch_means`` = the ICPP code; ``inference_loss``: ``ce``, or ``mse`` / ``l1`` of the softmax against the
one-hot label, Table 8). Then it trains like FedAvg (plain SGD; ``mu > 0`` adds FedProx's proximal term, the
"plug-in" row of Table 9) and uploads ``{"delta": w_k^{t+1} − w^t, "loss": F_k^t}``. Table 9's other rows are
``server.weighting.name=value_sensitive`` on those methods: the same loss report (``algorithms/reported_loss.py``)
and the same weights (``aggregators/weighting.py``), without the detection.

Server (Alg. 1 line 7, Eq. 8). Weights are a softmax over the reported losses of the kept clients, after clipping
them from above at their mean (``clip_mode``: ``mean`` [C], ``median``, ``fixed`` at ``clip_value``, ``none`` =
Fig. 4's ablation) and dividing by a temperature (1 in the paper): ``p = softmax(min(F, c) / T)`` — a client whose
global model fits its data badly holds knowledge the model lacks and weighs more. Clients with a non-finite model
or loss are dropped (weight 0) and reported as flagged (spec §2, guard).

Detection (Alg. 3, corrected as spec §1.5-1.7 says). The server caches the previous round: its kept clients'
updates ``w_k^t − w^{t−1}``, losses, weights and the model ``w^{t−1}`` they started from.

1. Loss audit (Eq. 12): ``Dr = 1`` when at least ``audit_quorum`` (½) of this round's reporters exceed the
   reference (``audit_reference``: ``prev_round_max`` [R], the largest loss kept last round;
   ``running_max_all_history``; ``per_client_last``, each client's own last report). Losses should fall over
   time, so a majority of rising losses means last round's aggregate was poisoned. No audit without history.
2. When ``Dr = 1``: Shapley values of last round's kept clients, the utility of a coalition ``S`` being the
   accuracy on the server's evaluation data of ``recon(S) = w^{t−1} + Σ_{k∈S} p^S_k (w_k^t − w^{t−1})`` with
   ``p^S`` this module's weights renormalised (and re-clipped) over ``S`` (so ``recon(all) = w^t``,
   ``recon({k}) = w_k^t``, ``recon(∅) = w^{t−1}``, spec A6). Exact enumeration of the ``2^C`` coalitions when
   the cohort has at most ``shapley_exact_max`` slots, truncated Monte-Carlo (``shapley_permutations``,
   ``shapley_tol``) beyond; every coalition model is built and scored by one batched kernel in chunks of
   ``shapley_chunk`` models (:func:`fedjax_robust.metrics.evaluation.score_models`).
3. Clients with a negative value (``flag_rule``: ``lt0`` ``φ < −ε`` [P]; ``le0`` ``φ ≤ ε``) are flagged:
   their weighted share of the suspect aggregate is removed (``hotfix="subtract"``:
   ``w^{t+1} = Σ p^t_k w_k^{t+1} − τ Σ_{k flagged} p^{t−1}_k (w_k^t − w^{t−1})``) or the suspect aggregate is
   replaced by the kept clients' re-aggregation (``hotfix="reaggregate"``:
   ``+ τ (recon(kept \\ flagged) − w^t)``), and flagged clients sampled again this round are left out
   (``blacklist=True``: for the rest of the run).

   The round that repairs also aggregates its own updates (``repaired_round="aggregate"``, the paper's
   ``w^{t+1} = Σ p^t_k w_k^{t+1} − τH``), although they were trained from the model just found poisoned: when a
   boosted attack left that model far off (huge weights, losses in the hundreds), those updates are large
   corrections of the wrong model and carry the damage into the repaired one. ``repaired_round="skip"`` drops them:
   the round's model is the repaired previous one, at the cost of that round's training (and of the next audit,
   which then has no history). ``repaired_round="retrain"`` is the two-phase reading of the paper's "the hotfix
   will be integrated into [...] the local training-based model": the round opens with the engine's review phase
   (``client_report`` / ``server_review``, ``algorithms/base.py``), in which the cohort reports the downloaded
   model's loss, the server runs the audit and Shapley step on those reports and repairs the global model, and
   the cohort then trains from the repaired model (its training-phase loss, of the repaired model, sets the
   weights). It costs one more eval pass of the clients' data per round. Measured in
   ``experiments/results/fedvsa.md`` (Fig. 3).

Ablations (Fig. 5): ``detection="off"`` (aggregation only, Tables 3-9), ``"no_audit"`` (Shapley every round
once there is a history), ``"no_shapley"`` (the audit is logged, nothing is repaired, spec A14).

Cost. The cache holds ``C`` updates; a Shapley step scores ``2^C`` (exact) or ``P·(C+1)`` (TMC) models, and
runs under ``lax.cond`` only in rounds where ``Dr = 1`` (inside a seeds-vmapped program the condition becomes a
select, so it runs every round there).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators.base import HIGHEST, finite_rows, zero_rows
# The weights (§1.4) and the clients' loss report (§1.3) are shared with server.weighting=value_sensitive, the
# Table 9 plug-in for other algorithms (aggregators/weighting.py, algorithms/reported_loss.py).
from fedjax_robust.aggregators.weighting import CLIP_MODES, clip_value_of, value_weights  # noqa: F401
from fedjax_robust.algorithms.reported_loss import (INFERENCE_LOSSES, REDUCTIONS, inference_loss,  # noqa: F401
                                                    per_sample_loss, reporting_loss)
from fedjax_robust.algorithms.base import FedAlgorithm
from fedjax_robust.algorithms.fedavg import ServerState, apply_server_update, make_fedavg, mean_model_state
from fedjax_robust.client import ClientData, LocalTrainSpec
from fedjax_robust.metrics.evaluation import score_models
from fedjax_robust.metrics.shapley import all_coalitions, exact_shapley, permutation_prefixes, tmc_shapley
from fedjax_robust.models.interface import Model, as_model, merge_variables, split_variables
from fedjax_robust.round_context import RoundContext

PyTree = Any

DETECTION = ("full", "off", "no_audit", "no_shapley")
AUDIT_REFERENCES = ("prev_round_max", "running_max_all_history", "per_client_last")
FLAG_RULES = ("lt0", "le0")
HOTFIX = ("subtract", "reaggregate")
REPAIRED_ROUND = ("aggregate", "skip", "retrain")


def _choice(name: str, value: str, allowed) -> str:
  if value not in allowed:
    raise ValueError(f"fedvsa: {name} must be one of {allowed}, got {value!r}")
  return value


# ------------------------------------------------------------------------------------------ server side
def loss_audit(losses: jax.Array, reporting: jax.Array, reference: jax.Array, quorum: float = 0.5,
               has_reference: Optional[jax.Array] = None) -> tuple[jax.Array, jax.Array]:
  """Eq. 12 as spec §1.5 [R] reads it: ``(Dr, exceedances)`` with ``Dr = #{k: F_k > ref_k} ≥ quorum · m``.

  ``reference``: a scalar or ``[C]`` (per client); ``has_reference`` ([C] bool): reporters that have one (those
  without neither count nor vote; default all). Strict ``>``; no reporter with a reference: ``Dr = 0``."""
  voters = jnp.asarray(reporting, bool)
  if has_reference is not None:
    voters = voters & has_reference
  up = voters & (losses > reference)
  n_up = jnp.sum(up).astype(jnp.int32)
  m = jnp.sum(voters)
  return (m > 0) & (n_up >= quorum * m), n_up


def weighted_sum(p: jax.Array, stacked: PyTree) -> PyTree:
  """``Σ_k p_k x_k`` over the leading cohort axis as a full-precision contraction. Unlike
  :func:`~fedjax_robust.aggregators.base.combine` (broadcast product, then sum) it stays a matrix product when
  vmapped over a chunk of coalitions (``[chunk, C] x [C, P]``), so no ``chunk x C x P`` product is built; the
  aggregate and the Shapley reconstruction use this same function, so ``recon(all) == w^t``."""
  return jax.tree.map(lambda a: jnp.tensordot(p.astype(a.dtype), a, axes=1, precision=HIGHEST), stacked)


class Cache(NamedTuple):
  """The previous round, as the server kept it (spec §1.1)."""
  base: PyTree  # w^{t-1}: the model that round's cohort started from (params)
  base_state: PyTree  # its model state ({} without BatchNorm)
  deltas: PyTree  # [C, ...] w_k^t - w^{t-1} (zero for clients not kept)
  states: PyTree  # [C, ...] the clients' uploaded model states ({} without)
  losses: jax.Array  # [C] reported losses (0 where not kept)
  kept: jax.Array  # [C] bool: aggregated
  weights: jax.Array  # [C] p^{t-1}
  ids: jax.Array  # [C] client ids
  malicious: jax.Array  # [C] bool: attackers among them (for the detection counts only)
  has: jax.Array  # bool: a previous round exists


def recon(cache: Cache, p: jax.Array) -> PyTree:
  """``w^{t-1} + Σ_k p_k (w_k^t − w^{t-1})``: the model that coalition weights ``p`` ([C], zero outside the
  coalition) aggregate the cached round to (spec §1.6), with the same weights over the clients' BatchNorm
  statistics (variables then; bare params without model state). ``p = 0`` gives ``w^{t-1}``."""
  params = jax.tree.map(jnp.add, cache.base, weighted_sum(p, cache.deltas))
  if not cache.base_state:
    return params
  mixed = weighted_sum(p, cache.states)
  state = jax.tree.map(lambda m, b: jnp.where(jnp.sum(p) > 0, m, b), mixed, cache.base_state)
  return merge_variables(params, state)


class FedVSAState(NamedTuple):
  server: ServerState
  cache: Any  # Cache, or () with detection="off"
  loss_max: jax.Array  # the largest loss ever kept (audit_reference=running_max_all_history)
  last_loss: jax.Array  # [K] each client's last kept report, NaN before its first (per_client_last)
  blacklist: jax.Array  # [K] bool
  excluded: jax.Array  # [K] bool: flagged by this round's review, left out of its aggregation (retrain)


def make_fedvsa(
    model: Model,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    server_opt: Optional[optax.GradientTransformation] = None,
    *,
    num_clients: int,
    cohort_size: int,
    inference_loss_kind: str = "ce",
    inference_reduction: str = "mean",
    inference_batch_size: int = 256,
    clip_mode: str = "mean",
    clip_value: float = 0.0,
    temperature: float = 1.0,
    detection: str = "full",
    audit_reference: str = "prev_round_max",
    audit_quorum: float = 0.5,
    shapley_exact_max: int = 10,
    shapley_permutations: int = 50,
    shapley_tol: float = 0.0,
    shapley_chunk: int = 64,
    flag_rule: str = "lt0",
    flag_eps: float = 0.0,
    hotfix: str = "subtract",
    tau: float = 1.0,
    blacklist: bool = False,
    repaired_round: str = "aggregate",
    mu: float = 0.0,
    persist_client_opt_state: bool = False,
    client_attack: Any = None,
    eval_batch_size: int = 1024,
) -> FedAlgorithm:
  """FedVSA on ``model`` (module docstring). ``cohort_size``: the static number of cohort slots (the cache's
  size); ``num_clients``: K. Needs the round's server data (``context.server_data``) when the detection runs
  Shapley values (``detection`` ``full`` / ``no_audit``)."""
  _choice("inference_loss", inference_loss_kind, INFERENCE_LOSSES)
  _choice("inference_reduction", inference_reduction, REDUCTIONS)
  _choice("clip_mode", clip_mode, CLIP_MODES)
  _choice("detection", detection, DETECTION)
  _choice("audit_reference", audit_reference, AUDIT_REFERENCES)
  _choice("flag_rule", flag_rule, FLAG_RULES)
  _choice("hotfix", hotfix, HOTFIX)
  _choice("repaired_round", repaired_round, REPAIRED_ROUND)
  if not temperature > 0:
    raise ValueError(f"fedvsa: temperature must be > 0, got {temperature}")
  if not 0 < audit_quorum <= 1:
    raise ValueError(f"fedvsa: audit_quorum must be in (0, 1], got {audit_quorum}")
  if shapley_permutations < 1 or shapley_chunk < 1 or shapley_exact_max < 0:
    raise ValueError("fedvsa: shapley_permutations and shapley_chunk must be >= 1, shapley_exact_max >= 0")
  if shapley_tol < 0 or tau < 0:
    raise ValueError(f"fedvsa: shapley_tol and tau must be >= 0, got {shapley_tol}, {tau}")
  model = as_model(model)
  server_opt = server_opt or optax.sgd(1.0)
  k_total, c_slots = int(num_clients), int(cohort_size)
  cached = detection != "off"
  repairs = detection in ("full", "no_audit")
  reviews = repaired_round == "retrain"
  if reviews and not repairs:
    raise ValueError(f"fedvsa: repaired_round='retrain' repairs before training; detection={detection!r} "
                     "does not repair (use full or no_audit)")
  exact = c_slots <= int(shapley_exact_max)
  inner = make_fedavg(model, client_opt, spec, server_opt, mu=mu, persist_client_opt_state=persist_client_opt_state,
                      name="fedvsa", client_attack=client_attack)

  def weights_of(losses, members):
    return value_weights(losses, members, clip_mode, temperature, clip_value)

  def report(payload, data):
    return inference_loss(model.logits, payload, data, inference_loss_kind, inference_reduction,
                          inference_batch_size, spec.batch_size)

  # Clients upload {"delta", "loss"}; the attacker reports the downloaded model's loss on the data it trains on
  # (honest on poisoned, §2 [R]).
  reporting = reporting_loss(inner, report)
  client_update, malicious_update = reporting.client_update, reporting.malicious_update

  def init_server(params, model_state=None):
    server = inner.init_server(params, model_state)
    cache = ()
    if cached:
      stack = lambda t: jax.tree.map(lambda a: jnp.zeros((c_slots,) + a.shape, a.dtype), t)
      zeros_c = jnp.zeros((c_slots,), jnp.float32)
      no = jnp.zeros((c_slots,), bool)
      cache = Cache(params, server.model_state, stack(params), stack(server.model_state), zeros_c, no, zeros_c,
                    jnp.zeros((c_slots,), jnp.int32), no, jnp.zeros((), bool))
    return FedVSAState(server, cache, jnp.asarray(-jnp.inf, jnp.float32), jnp.full((k_total,), jnp.nan, jnp.float32),
                       jnp.zeros((k_total,), bool), jnp.zeros((k_total,), bool))

  def coalition_values(cache: Cache, masks: jax.Array, server_data: ClientData) -> jax.Array:
    """Accuracy on the server data of every coalition's model, ``[M]`` for ``masks`` ``[M, C]``."""

    def one(mask):
      return recon(cache, weights_of(cache.losses, mask & cache.kept))

    def score_chunk(chunk_masks):
      models = jax.vmap(one)(chunk_masks)
      return score_models(model.logits, models, server_data.x, server_data.y, server_data.n,
                          batch_size=eval_batch_size).accuracy

    m = masks.shape[0]
    chunk = min(int(shapley_chunk), m)
    num = -(-m // chunk)
    padded = jnp.pad(masks, ((0, num * chunk - m), (0, 0)))
    return jax.lax.map(score_chunk, padded.reshape(num, chunk, c_slots)).reshape(-1)[:m]

  def shapley_values(cache: Cache, server_data: ClientData, key) -> jax.Array:
    if exact:
      masks = jnp.asarray(all_coalitions(c_slots))
      return exact_shapley(coalition_values(cache, masks, server_data))
    orders, prefixes = permutation_prefixes(key, c_slots, int(shapley_permutations))
    values = coalition_values(cache, prefixes.reshape(-1, c_slots), server_data)
    return tmc_shapley(orders, values.reshape(prefixes.shape[:2]), shapley_tol)

  def audit(state: FedVSAState, losses, reporting, cohort):
    cache = state.cache
    if audit_reference == "prev_round_max":
      ref = jnp.max(jnp.where(cache.kept, cache.losses, -jnp.inf))
      return loss_audit(losses, reporting & cache.has & jnp.any(cache.kept), ref, audit_quorum)
    if audit_reference == "running_max_all_history":
      return loss_audit(losses, reporting & jnp.isfinite(state.loss_max), state.loss_max, audit_quorum)
    last = state.last_loss[cohort]
    return loss_audit(losses, reporting, last, audit_quorum, has_reference=jnp.isfinite(last))

  def detect(state: FedVSAState, losses, reporting, cohort, key, context: Optional[RoundContext]):
    """The audit of this round's reports and, when it fires, the Shapley values of last round's kept clients and
    the hotfix: ``(state, correction, flagged_k, diagnostics)``, ``correction`` the model-space repair of the
    current global model and ``flagged_k`` ([K] bool) the clients flagged (to leave out of this round)."""
    cache = state.cache
    alarm, n_up = audit(state, losses, reporting, cohort)
    if detection == "no_audit":
      alarm = cache.has & jnp.any(cache.kept)
    diagnostics = dict(audit_alarm=alarm, audit_exceedances=n_up)
    correction = jax.tree.map(jnp.zeros_like, state.server.params)
    if not repairs:
      return state, correction, jnp.zeros((k_total,), bool), diagnostics
    if context is None or context.server_data is None:
      raise ValueError("fedvsa: the Shapley step scores coalition models on server-held data; give the run "
                       "server data (server.root_dataset_size > 0)")
    phi = jax.lax.cond(alarm, lambda: shapley_values(cache, context.server_data, key),
                       lambda: jnp.zeros((c_slots,), jnp.float32))
    bad = (phi < -flag_eps) if flag_rule == "lt0" else (phi <= flag_eps)
    flagged_prev = alarm & cache.kept & bad
    if hotfix == "subtract":
      correction = jax.tree.map(lambda h: -tau * h, weighted_sum(jnp.where(flagged_prev, cache.weights, 0.0),
                                                                 cache.deltas))
    else:
      clean = split_variables(recon(cache, weights_of(cache.losses, cache.kept & ~flagged_prev)))[0]
      correction = jax.tree.map(lambda a, w: jnp.where(jnp.any(flagged_prev), tau * (a - w), 0.0), clean,
                                state.server.params)
    flagged_k = jnp.zeros((k_total,), bool).at[jnp.where(flagged_prev, cache.ids, k_total)].set(True, mode="drop")
    diagnostics.update(shapley_values=phi, shapley_flagged=flagged_prev, shapley_ids=cache.ids,
                       num_shapley_flagged=jnp.sum(flagged_prev).astype(jnp.int32),
                       shapley_flagged_attackers=jnp.sum(flagged_prev & cache.malicious).astype(jnp.int32),
                       shapley_flagged_benign=jnp.sum(flagged_prev & ~cache.malicious).astype(jnp.int32))
    if blacklist:
      state = state._replace(blacklist=state.blacklist | flagged_k)
    return state, correction, flagged_k, diagnostics

  def server_review(state: FedVSAState, reports, weights, key, context: Optional[RoundContext] = None):
    """``repaired_round="retrain"``: the detection on the reports of the model the cohort downloaded, before it
    trains. A repair is applied to the global model here (directly, not through the server optimizer), so the
    cohort trains from the repaired model; the clients flagged are left out of this round's aggregation."""
    losses = jnp.asarray(reports["loss"], jnp.float32)
    c = weights.shape[0]
    cohort = jnp.arange(c) if context is None else context.cohort
    reporting = (weights > 0) & jnp.isfinite(losses)
    state, correction, flagged_k, diagnostics = detect(state, losses, reporting, cohort, key, context)
    server = state.server
    repaired = server._replace(params=jax.tree.map(jnp.add, server.params, correction))
    diagnostics.update(review_loss=losses, repaired=jnp.any(flagged_k))
    return state._replace(server=repaired, excluded=flagged_k), diagnostics

  def server_update(state: FedVSAState, uploads, weights, key, context: Optional[RoundContext] = None):
    server = state.server
    deltas, losses = uploads["delta"], jnp.asarray(uploads["loss"], jnp.float32)
    c = weights.shape[0]
    cohort = jnp.arange(c) if context is None else context.cohort
    reporting = (weights > 0) & jnp.isfinite(losses) & finite_rows(deltas, c)
    if "model_state" in uploads:
      reporting &= finite_rows(uploads["model_state"], c)
    kept = reporting & ~state.blacklist[cohort]
    diagnostics = {}
    correction = jax.tree.map(jnp.zeros_like, server.params)
    flagged_k = state.excluded  # retrain: what this round's review flagged (none otherwise)
    if cached and not reviews:
      state, correction, flagged_k, diagnostics = detect(state, losses, reporting, cohort, key, context)
    # This round: flagged clients sampled again are left out (and, with a blacklist, for good).
    kept &= ~flagged_k[cohort]
    excluded = (weights > 0) & ~kept  # non-finite, flagged last round, blacklisted: what detection rates count
    if repaired_round == "skip":  # this round's updates started from the model just found poisoned
      kept &= ~jnp.any(flagged_k)
    p = weights_of(losses, kept)
    clean_deltas = zero_rows(deltas, kept)
    mean_delta = jax.tree.map(jnp.add, weighted_sum(p, clean_deltas), correction)
    new_server = apply_server_update(server_opt, server, mean_delta)
    states = {}
    if "model_state" in uploads:
      states = zero_rows(uploads["model_state"], kept)
      new_server = new_server._replace(model_state=mean_model_state(states, p, server.model_state))
    safe_losses = jnp.where(kept, losses, 0.0)
    new_state = state._replace(server=new_server, excluded=jnp.zeros_like(state.excluded))
    if cached:
      malicious = jnp.zeros((c,), bool) if context is None or context.malicious is None else context.malicious
      new_state = new_state._replace(
          cache=Cache(server.params, server.model_state, clean_deltas, states, safe_losses, kept, p,
                      cohort.astype(jnp.int32), jnp.asarray(malicious, bool), jnp.ones((), bool)),
          loss_max=jnp.maximum(state.loss_max, jnp.max(jnp.where(kept, losses, -jnp.inf))),
          last_loss=state.last_loss.at[jnp.where(kept, cohort, k_total)].set(losses, mode="drop"))
    diagnostics.update(flagged=excluded, aggregation_weights=p, reported_loss=losses,
                       nonfinite=(weights > 0) & ~reporting)
    return new_state, diagnostics

  def global_params(state: FedVSAState):
    return inner.global_params(state.server)

  def personal_params(payload, client_state, data, key):
    return inner.personal_params(payload, client_state, data, key)

  review = {}
  if reviews:  # the clients report the downloaded model's loss before training; the attacker on its own data
    review = dict(client_report=lambda payload, client_state, data, key: {"loss": report(payload, data)},
                  malicious_report=lambda payload, client_state, data, attack_data, key: {
                      "loss": report(payload, attack_data)},
                  server_review=server_review)
  return FedAlgorithm("fedvsa", init_server, inner.init_client, lambda state: inner.broadcast(state.server),
                      client_update, server_update, global_params, personal_params, uses_context=True,
                      malicious_update=malicious_update, malicious_weight=inner.malicious_weight, **review)
