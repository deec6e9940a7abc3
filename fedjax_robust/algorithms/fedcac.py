"""FedCAC: cautiously aggressive collaboration (Wu et al., ICCV 2023), spec ``specs/fedcac.md`` §1.

Every client keeps a personalized model ``w_i``. One round ``t`` (1-indexed, spec §1.3):

1. **Local training** (C1-C2). Client ``i`` trains its personalized model ``w_i^{t,0}`` (with its own BatchNorm
   running statistics) for E epochs with a FRESH client optimizer (the reference re-creates SGD(0.1, momentum 0.9)
   every round; the optimizer itself is the config's, this module only never carries its state:
   ``resets_client_optimizer``) and mean cross-entropy, giving ``w_i^{t,E}``.
2. **Sensitivity and critical mask** (C3-C4, Eqs. 5-6), inside the client kernel: ``S = |(w^{t,E} - w^{t,0}) ⊙
   w^{t,E}|`` per trainable tensor, and per tensor the entries at or above the ``k``-th largest ``S``,
   ``k = floor(τ·n_ℓ)``, ties included, with the ``1e-10`` / ``1e-20`` fallback
   (:mod:`fedjax_robust.metrics.sensitivity`). Every trainable tensor is its own "layer" (§5-A3): a conv kernel, a
   Dense kernel and bias, a BatchNorm scale and bias. Upload: ``w^{t,E}``, the bool mask ``M_i`` and the BatchNorm
   statistics.
3. **Server** (S1-S6, vectorised as §1.5; :func:`server_step`): exact int32 mask sizes ``K`` and intersections
   ``I``, the asymmetric overlap ``O_ij = (K_i - K_j + 2 I_ij) / (2 K_i)`` (code formula, §5-A1), the threshold
   ``Thr^t = O_avg + (t/β)(O_max - O_avg)`` over ordered pairs (Eq. 7), collaborator sets
   ``C_i = {j ≠ i: O_ij >= Thr^t}`` (Eq. 8), the global model ``w̄ = Σ n_i w_i / Σ n_i`` (Eq. 9, sample
   weighted, §5-A10), customized models ``u_i`` = the uniform mean over ``C_i ∪ {i}`` as ONE matrix product
   ``U = diag(1/(A·1)) A W`` per tensor (Eq. 10), and the next personalized models
   ``w_i^{t+1,0} = M_i ⊙ u_i + (1 - M_i) ⊙ w̄`` (Eq. 11) for every client at once — a selection, not a blend, so
   critical entries equal ``u_i`` and the others ``w̄`` exactly (§6 item 15).

BatchNorm (§1.4, ``bn_mode``). ``"local"`` (default, the reference code): the running statistics are each client's
own, never averaged (§6 item 18: the server step returns them bit for bit); BatchNorm scale/bias are ordinary
trainable tensors with sensitivities and masks. ``"critical"``: the paper's literal sentence "following FedBN we set
these parameters [running mean/var] as critical parameters" read in the Eq. 11 sense: each client's statistics
become the uniform mean over ``C_i ∪ {i}`` (local again once ``C_i = ∅``, i.e. after ``β``).

Ablation switches (spec §2): ``selection`` = ``sensitivity`` (FedCAC) | ``random`` (exactly ``k`` uniform entries
per tensor, redrawn each round) | ``sensitivity_reverse`` (the ``k`` lowest); ``collaboration`` = ``time_varying``
(FedCAC) | ``none`` (critical parameters purely local from round 1) | ``number`` (each client averages its critical
parameters with the ``num_collaborators`` others of highest ``O_ij``, every round); ``non_critical`` = ``all``
(FedCAC: ``w̄``) | ``as_critical`` (every parameter takes ``u_i``, Table 3).

Degenerate and guarded cases, as the spec resolves them: ``t > β`` with ``O_max > O_avg`` leaves every ``C_i``
empty, so critical parameters are exactly the client's trained values (§6 item 12); equal overlaps
(``O_max = O_avg``, e.g. identical masks, or τ = 1) keep everyone collaborating forever (§5-A12, §6 items 13, 17);
a client with an empty mask (``K_i = 0``, e.g. τ = 0) gets no collaborators and is left out of ``O_avg``/``O_max``
(§5-A13), so τ = 0 is FedAvg on the trainable parameters with local BatchNorm statistics (§6 item 16). ``K`` and
``I`` are exact integers and ``O``/``Thr`` float64 when ``jax_enable_x64`` is on (float32 otherwise, §5-A25);
``Thr^β = O_max`` holds exactly in floating point (see :func:`fedjax_robust.metrics.sensitivity.threshold`).

Participation (§5-A11): the server step runs over the round's cohort only (the [PL] behaviour): ``O_avg``,
``O_max``, ``w̄`` and ``u_i`` come from the participants, and non-participants keep their personalized models.
With full participation (the paper's protocol) this is all clients.

Storage. The personalized models (and BatchNorm statistics) live in the server state, stacked ``[K, ...]`` (in the
simulation the server computes step C6 directly, S7); ``broadcast`` hands each cohort client its own row
(``uses_client_ids``). Evaluation (§3.6, §5-A9) scores ``after_aggregation`` = ``w_i^{t+1,0}`` (the primary
``client_acc_*``, the paper's metric) and, with ``eval_before_aggregation``, ``before_aggregation`` = the client's
last ``w_i^{t,E}`` (kept in the client state). ``global_params`` is ``w̄`` with the sample-weighted mean of the
uploaded statistics (used for the global-model metrics only; no client ever loads it).

Client x client weights (``client_weight_matrix``, :mod:`fedjax_robust.algorithms.base`): row ``i`` holds Eq. 10's
uniform weights ``1/(|C_i| + 1)`` over ``C_i ∪ {i}``, the mix of the cohort's trained models that client ``i``'s
critical parameters take (every parameter's with ``non_critical="as_critical"``); the non-critical ones take ``w̄``.
A diagonal of 1 is a client without collaborators.

The upload carries whole models, not the ``delta`` model attacks poison, so the registry refuses a model attack.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.algorithms.base import CLIENT_WEIGHT_MATRIX, ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import classification_loss
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.hparams import check
from fedjax_robust.metrics.sensitivity import (COLLABORATIONS, SELECTIONS, check_tau, collaborator_matrix,
                                               critical_masks, customization_weights, mask_counts, mix_rows,
                                               overlap_matrix, sensitivity)
from fedjax_robust.models.interface import Model, as_model, merge_variables, split_variables

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]

NON_CRITICAL = ("all", "as_critical")
BN_MODES = ("local", "critical")
RANDOM_SELECTION_STREAM = 0xCAC  # fold_in tag of the "random" selection's key (training uses the client key)


class FedCACState(NamedTuple):
  personal_params: PyTree  # [K, ...] w_i^{t,0}: every client's personalized trainable parameters
  personal_state: dict  # [K, ...] each client's BatchNorm statistics ({} for a stateless model)
  global_params: PyTree  # w̄ of the last round (θ0 before the first)
  global_state: dict  # sample-weighted mean of the last uploaded statistics (global-model metrics only)
  round: jax.Array  # int32: server steps so far; the next round is t = round + 1


class ServerStep(NamedTuple):
  params: PyTree  # [C, ...] next personalized models (Eq. 11)
  model_state: dict  # [C, ...] next BatchNorm statistics
  global_params: PyTree  # w̄ (Eq. 9)
  global_state: dict
  collaborators: jax.Array  # [C, C] bool A_ij = [j ∈ C_i]
  overlap: jax.Array  # [C, C] O_ij (0 on rows with K_i = 0)
  sizes: jax.Array  # [C] int32 K_i
  intersections: jax.Array  # [C, C] int32 I_ij
  stats: dict  # threshold, overlap_mean, overlap_max


def server_step(params: PyTree, masks: PyTree, weights: jax.Array, t, beta, model_state: dict | None = None,
                collaboration: str = "time_varying", num_collaborators: int = 1, non_critical: str = "all",
                bn_mode: str = "local") -> ServerStep:
  """FedCAC's server step for a cohort of ``C`` clients, all at once (spec §1.3 S1-S6 and C6, §1.5).

  ``params`` / ``masks``: the uploaded ``w_i^{t,E}`` and bool critical masks, leading axis ``C``; ``weights`` [C]:
  the sample counts of ``w̄``; ``t``: the 1-indexed round; ``beta`` may be traced; ``model_state``: the uploaded
  BatchNorm statistics ``[C, ...]`` (``{}``/None without).
  """
  if non_critical not in NON_CRITICAL:
    raise ValueError(f"non_critical must be one of {NON_CRITICAL}, got {non_critical!r}")
  if bn_mode not in BN_MODES:
    raise ValueError(f"bn_mode must be one of {BN_MODES}, got {bn_mode!r}")
  model_state = dict(model_state or {})
  sizes, inter = mask_counts(masks)
  overlap, valid = overlap_matrix(sizes, inter)
  collab, stats = collaborator_matrix(overlap, valid, t, beta, collaboration, num_collaborators)
  mix = customization_weights(collab)
  customized = mix_rows(mix, params)  # u_i (Eq. 10)
  w = weights.astype(jnp.float32)
  total = jnp.sum(w)
  c = w.shape[0]
  w = jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), jnp.full((c,), 1.0 / c, jnp.float32))
  mean = mix_rows(w[None], params)  # w̄ (Eq. 9), [1, ...]
  if non_critical == "all":
    new_params = jax.tree.map(lambda m, u, g: jnp.where(m, u, g), masks, customized, mean)
  else:  # "As Critical" (Table 3): every parameter takes u_i
    new_params = customized
  new_state = mix_rows(mix, model_state) if bn_mode == "critical" else model_state
  global_state = jax.tree.map(lambda a: a[0], mix_rows(w[None], model_state))
  return ServerStep(new_params, new_state, jax.tree.map(lambda a: a[0], mean), global_state, collab, overlap, sizes,
                    inter, stats)


def cohort_columns(mix: jax.Array, ids: jax.Array, num_clients: int) -> jax.Array:
  """``[C, C]`` weights over the cohort as ``[C, K]`` over client ids (``client_weight_matrix``): column ``ids[j]``
  holds column ``j``; clients outside the cohort weigh 0."""
  return jnp.zeros((mix.shape[0], num_clients), mix.dtype).at[:, ids].set(mix)


def make_fedcac(
    model: Model | ApplyFn,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    num_clients: int,
    tau: float = 0.5,
    beta: float = 100,
    selection: str = "sensitivity",
    collaboration: str = "time_varying",
    num_collaborators: int = 1,
    non_critical: str = "all",
    bn_mode: str = "local",
    eval_before_aggregation: bool = True,
    name: str = "fedcac",
) -> FedAlgorithm:
  """FedCAC (module docstring). ``num_clients`` = K, the number of personalized models the server stores.

  ``tau`` (static: it fixes the per-tensor counts ``floor(τ·n_ℓ)``): fraction of critical parameters per tensor;
  ``beta`` (may be traced): the collaboration horizon of Eq. 7. Spec §1.2 defaults: CIFAR-10 τ = 0.5, β = 100;
  CIFAR-100 τ = 0.4, β = 170; Tiny-ImageNet τ = 0.5, β = 170. ``selection``, ``collaboration`` (with
  ``num_collaborators`` for ``number``), ``non_critical``, ``bn_mode``: the switches of the module docstring.
  ``eval_before_aggregation``: also keep and score each client's ``w^{t,E}`` (costs one model per client).
  """
  check_tau(tau)
  tau = float(tau)
  check(beta, lambda v: v >= 1, f"{name}: beta must be >= 1, got {beta}")
  if num_clients < 1:
    raise ValueError(f"{name}: num_clients must be >= 1, got {num_clients}")
  if selection not in SELECTIONS:
    raise ValueError(f"{name}: selection must be one of {SELECTIONS}, got {selection!r}")
  if collaboration not in COLLABORATIONS:
    raise ValueError(f"{name}: collaboration must be one of {COLLABORATIONS}, got {collaboration!r}")
  if collaboration == "number" and int(num_collaborators) < 1:
    raise ValueError(f"{name}: collaboration='number' needs num_collaborators >= 1, got {num_collaborators}")
  if non_critical not in NON_CRITICAL:
    raise ValueError(f"{name}: non_critical must be one of {NON_CRITICAL}, got {non_critical!r}")
  if bn_mode not in BN_MODES:
    raise ValueError(f"{name}: bn_mode must be one of {BN_MODES}, got {bn_mode!r}")
  model = as_model(model)
  loss_fn = classification_loss(model)
  num_collaborators = int(num_collaborators)

  def stack(tree):
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + jnp.shape(a)), tree)

  def init_server(params, model_state=None):
    model_state = dict(model_state or {})
    return FedCACState(stack(params), stack(model_state), params, model_state, jnp.zeros((), jnp.int32))

  def init_client(params, model_state=None):
    if not eval_before_aggregation:
      return {}
    return {"trained": merge_variables(params, dict(model_state or {}))}

  def broadcast(state: FedCACState, ids: jax.Array):
    own = {"params": jax.tree.map(lambda a: a[ids], state.personal_params),
           "model_state": jax.tree.map(lambda a: a[ids], state.personal_state)}
    return {}, own

  def client_update(payload, client_state, data: ClientData, key):
    _, own = payload
    start, model_state = own["params"], own["model_state"]
    trained = local_train(loss_fn, client_opt, start, client_opt.init(start), data, key, spec, model_state)
    if selection == "random":
      masks = critical_masks(trained.params, tau, "random", jax.random.fold_in(key, RANDOM_SELECTION_STREAM))
    else:
      masks = critical_masks(sensitivity(start, trained.params), tau, selection)
    upload = {"params": trained.params, "mask": masks, "model_state": trained.model_state}
    new_state = {"trained": merge_variables(trained.params, trained.model_state)} if eval_before_aggregation else {}
    return ClientOutput(upload, new_state, trained.metrics)

  def server_update(state: FedCACState, uploads, weights, key, ids):
    del key
    t = state.round + 1
    step = server_step(uploads["params"], uploads["mask"], weights, t, beta, uploads["model_state"], collaboration,
                       num_collaborators, non_critical, bn_mode)
    scatter = lambda stored, new: jax.tree.map(lambda a, v: a.at[ids].set(v), stored, new)
    new_state = FedCACState(scatter(state.personal_params, step.params),
                            scatter(state.personal_state, step.model_state), step.global_params, step.global_state,
                            t)
    total = sum(m[0].size for m in jax.tree.leaves(uploads["mask"]))
    diagnostics = {
        "fedcac_threshold": step.stats["threshold"].astype(jnp.float32),
        "fedcac_overlap_mean": step.stats["overlap_mean"].astype(jnp.float32),
        "fedcac_overlap_max": step.stats["overlap_max"].astype(jnp.float32),
        "fedcac_collaborators_mean": jnp.mean(jnp.sum(step.collaborators, axis=1).astype(jnp.float32)),
        "fedcac_critical_fraction": jnp.mean(step.sizes.astype(jnp.float32)) / total,
        CLIENT_WEIGHT_MATRIX: cohort_columns(customization_weights(step.collaborators), ids, num_clients),
    }
    return new_state, diagnostics

  def global_params(state: FedCACState):
    return merge_variables(state.global_params, state.global_state) if state.global_state else state.global_params

  def personal_params(payload, client_state, data: ClientData, key):
    _, own = payload
    after = merge_variables(own["params"], own["model_state"])
    if not eval_before_aggregation:
      return after
    return {"after_aggregation": after, "before_aggregation": client_state["trained"]}

  return FedAlgorithm(name, init_server, init_client, broadcast, client_update, server_update, global_params,
                      personal_params, uses_client_ids=True,
                      eval_models=("after_aggregation", "before_aggregation") if eval_before_aggregation else ())
