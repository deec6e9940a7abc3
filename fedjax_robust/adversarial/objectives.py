"""Local training objectives: what a client's step minimises, and the adversarial batch that feeds it.

An :class:`Objective` is two factories, each given the model and the client's training data:

* ``transform(model, data) -> BatchTransform`` (or ``None``): rewrites each mini-batch's inputs with the current
  model before the step (``fedjax_robust.client.local_train``'s hook; its own per-step key). The attack sees the
  model in eval mode (dropout off, BatchNorm running statistics; FedALC spec A8) unless ``train_mode``.
* ``loss(model, data) -> LossFn``: the step's loss in train mode. It sees the transformed batch as ``batch.x``
  and the clean one as ``batch.x_clean`` (TRADES and MART compare the two).

The FedAvg family (fedavg, fedprox, fedavg_ft, fedbn, local) trains with any of them
(``adversarial.objective``), so FedAvg-AT is ``objective=pgd_at`` and FedProx-AT adds the proximal term on top.

======== ============================================================== ================================
name      loss on a mini-batch                                          adversarial inputs
======== ============================================================== ================================
ce        CE(F(x), y)                                                   none
pgd_at    CE(F(x_adv), y): FedPGD / FedAvg-AT (Madry et al. 2018)        PGD on CE
fedalc    CE(w ⊙ F(x_adv), y), ``w`` from the batch's class counts      PGD on CE (uncalibrated)
          (Qiao et al. 2024, Eqs. 5-7; ``calibration.py``)
fat       CE over a batch whose first ``adv_fraction`` of rows are       PGD on CE
          adversarial (FAT, Zizzo et al. 2020)
trades    CE(F(x), y) + β KL(p(x) ‖ p(x_adv)) (Zhang et al. 2019)        KL ascent from x + 0.001·N(0, I)
mart      BCE(p(x_adv), y) + λ KL(p(x) ‖ p(x_adv)) (1 − p_y(x))          PGD on CE
          (Wang et al. 2020)
calfat    CE(s (F(x_adv) + τ log n_c), y) with the client's class        KL ascent between the calibrated
          counts ``n_c`` (Chen et al. 2022, spec §3.2)                   softmaxes of x_adv and x
======== ============================================================== ================================

Every mean is over the batch's real rows (``batch.mask``); padding rows change nothing.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_robust import flat_random
from fedjax_robust.adversarial.attacks import LinfParams, cross_entropy, linf_ascent, pgd
from fedjax_robust.adversarial.calibration import calibrated_cross_entropy, check_calibration, log_prior_logits
from fedjax_robust.client import Batch, BatchTransform, ClientData, LossFn, masked_cross_entropy
from fedjax_robust.compilation import has_conv
from fedjax_robust.models.interface import Model, train_logits

PyTree = Any


class Objective(NamedTuple):
  name: str
  loss: Callable[[Model, ClientData], LossFn]
  transform: Optional[Callable[[Model, ClientData], BatchTransform]] = None

  @property
  def adversarial(self) -> bool:
    return self.transform is not None


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _kl(p_log: jax.Array, q_log: jax.Array) -> jax.Array:
  """Per-row ``KL(p ‖ q)`` from log-probabilities."""
  return jnp.sum(jnp.exp(p_log) * (p_log - q_log), axis=-1)


def attack_logits(model: Model, mask: jax.Array, key: jax.Array, train_mode: bool):
  """``(variables, x) -> logits`` the attack differentiates: eval mode (spec A8), or train mode (``train_mode``:
  dropout with ``key``, batch statistics of the real rows, running statistics left untouched)."""
  if train_mode:
    return lambda v, z: model.apply(v, z, train=True, rng=key, mask=mask)[0]
  return lambda v, z: model.apply(v, z)[0]


def client_class_counts(data: ClientData, num_classes: int) -> jax.Array:
  """``[C]`` label counts of a client's real training rows (CalFAT's prior)."""
  real = jnp.arange(data.y.shape[0]) < data.n
  return jnp.sum(jax.nn.one_hot(data.y, num_classes) * real[:, None], axis=0)


# ------------------------------------------------------------------------------------------ transforms
def pgd_transform(attack: LinfParams, train_mode: bool = False, fraction: float = 1.0):
  """PGD on plain, uncalibrated CE (spec §1.3 and property 4); with ``fraction < 1`` only the first
  ``round(fraction · n_real)`` rows of the (shuffled) batch become adversarial (FAT)."""

  def factory(model: Model, data: ClientData) -> BatchTransform:
    del data

    def transform(variables, x, y, mask, key):
      start_key, dropout_key = jax.random.split(key)
      x_adv = pgd(attack_logits(model, mask, dropout_key, train_mode), variables, x, y, start_key, attack)
      if fraction >= 1.0:
        return x_adv
      rows = jnp.round(fraction * jnp.sum(mask)).astype(jnp.int32)
      chosen = (jnp.arange(x.shape[0]) < rows).reshape((-1,) + (1,) * (x.ndim - 1))
      return jnp.where(chosen, x_adv, x)

    return transform

  return factory


def kl_transform(attack: LinfParams, train_mode: bool = False, calibrate=None):
  """TRADES' inner maximisation: L∞ ascent on ``KL(p(x) ‖ p(x'))`` from ``x + 0.001·N(0, I)``; ``calibrate``
  maps logits first (CalFAT: the calibrated softmaxes)."""
  calibrate_for = calibrate or (lambda data: (lambda z: z))

  def factory(model: Model, data: ClientData) -> BatchTransform:
    cal = calibrate_for(data)

    def transform(variables, x, y, mask, key):
      del y
      start_key, dropout_key = jax.random.split(key)
      logits = attack_logits(model, mask, dropout_key, train_mode)
      clean_log = jax.lax.stop_gradient(jax.nn.log_softmax(cal(logits(variables, x))))
      example_loss = lambda z: _kl(clean_log, jax.nn.log_softmax(cal(logits(variables, z))))
      noise = jax.vmap(lambda i: flat_random.normal(jax.random.fold_in(start_key, i), x.shape[1:], x.dtype))(
          jnp.arange(x.shape[0]))
      start = jnp.clip(x + 0.001 * noise, 0.0, 1.0)
      return linf_ascent(example_loss, x, start, attack.eps, attack.step_size, attack.steps, has_conv(variables),
                         attack.unroll)

    return transform

  return factory


# ------------------------------------------------------------------------------------------ losses
def cross_entropy_loss(calibration: Optional[dict] = None):
  """CE in train mode on ``batch.x`` (clean or adversarial), FedALC-calibrated when ``calibration`` is given."""

  def factory(model: Model, data: ClientData) -> LossFn:
    del data

    def loss_fn(params, batch: Batch):
      logits, model_state = train_logits(model, params, batch.model_state, batch.x, batch.key, batch.mask)
      if calibration is None:
        return masked_cross_entropy(logits, batch.y, batch.mask), model_state
      return calibrated_cross_entropy(logits, batch.y, batch.mask, **calibration), model_state

    return loss_fn

  return factory


def _clean_and_adversarial(model, params, batch: Batch):
  """Train-mode logits of the clean and the adversarial batch (BatchNorm statistics threaded through both)."""
  clean_key, adv_key = jax.random.split(batch.key)
  clean, state = train_logits(model, params, batch.model_state, batch.x_clean, clean_key, batch.mask)
  adv, state = train_logits(model, params, state, batch.x, adv_key, batch.mask)
  return clean, adv, state


def trades_loss(beta: float):
  def factory(model: Model, data: ClientData) -> LossFn:
    del data

    def loss_fn(params, batch: Batch):
      clean, adv, state = _clean_and_adversarial(model, params, batch)
      kl = _kl(jax.nn.log_softmax(clean), jax.nn.log_softmax(adv))
      return masked_cross_entropy(clean, batch.y, batch.mask) + beta * _masked_mean(kl, batch.mask), state

    return loss_fn

  return factory


def mart_loss(beta: float):
  """MART (Wang et al. ICLR 2020, Eq. 9): boosted CE on the adversarial example (CE plus the margin term
  ``−log(1 − max_{k≠y} p_k(x_adv))``) and the KL to the clean prediction weighted by ``1 − p_y(x)``."""

  def factory(model: Model, data: ClientData) -> LossFn:
    del data

    def loss_fn(params, batch: Batch):
      clean, adv, state = _clean_and_adversarial(model, params, batch)
      adv_prob = jax.nn.softmax(adv)
      onehot = jax.nn.one_hot(batch.y, adv.shape[-1])
      other = jnp.max(jnp.where(onehot > 0, -jnp.inf, adv_prob), axis=-1)
      bce = cross_entropy(adv, batch.y) - jnp.log(1.0001 - other + 1e-12)
      clean_prob = jax.nn.softmax(clean)
      true_prob = jnp.sum(clean_prob * onehot, axis=-1)
      kl = jnp.sum(clean_prob * (jnp.log(clean_prob + 1e-12) - jnp.log(adv_prob + 1e-12)), axis=-1)
      return _masked_mean(bce + beta * kl * (1.0000001 - true_prob), batch.mask), state

    return loss_fn

  return factory


def calfat_loss(scale: float, tau: float):
  def factory(model: Model, data: ClientData) -> LossFn:
    def loss_fn(params, batch: Batch):
      logits, state = train_logits(model, params, batch.model_state, batch.x, batch.key, batch.mask)
      prior = client_class_counts(data, logits.shape[-1])
      return masked_cross_entropy(log_prior_logits(logits, prior, scale, tau), batch.y, batch.mask), state

    return loss_fn

  return factory


def calfat_calibration(scale: float, tau: float):
  """The attack-side calibration of CalFAT: logits -> the client's log-prior-adjusted logits."""

  def calibrate_for(data: ClientData):
    return lambda z: log_prior_logits(z, client_class_counts(data, z.shape[-1]), scale, tau)

  return calibrate_for


# ------------------------------------------------------------------------------------------ registry
class ObjectiveEntry(NamedTuple):
  build: Callable[[LinfParams, bool, Any], Objective]  # (training attack, attack train mode, options) -> Objective
  options: dict = {}  # its block adversarial.<name>: field -> default


OBJECTIVES: dict[str, ObjectiveEntry] = {}


def register_objective(name: str, build, options: Optional[dict] = None) -> None:
  if name in OBJECTIVES:
    raise ValueError(f"objective {name!r} is already registered")
  OBJECTIVES[name] = ObjectiveEntry(build, dict(options or {}))


def _fedalc(attack, train_mode, o) -> Objective:
  calibration = {"variant": str(o.calib_variant), "axis": str(o.calib_axis), "absent": str(o.absent),
                 "normalize": str(o.normalize)}
  check_calibration(**calibration)
  return Objective("fedalc", cross_entropy_loss(calibration), pgd_transform(attack, train_mode))


def _fat(attack, train_mode, o) -> Objective:
  fraction = float(o.adv_fraction)
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"adversarial.fat.adv_fraction must be in [0, 1], got {fraction}")
  return Objective("fat", cross_entropy_loss(), pgd_transform(attack, train_mode, fraction))


register_objective("ce", lambda attack, train_mode, o: Objective("ce", cross_entropy_loss()))
register_objective("pgd_at", lambda attack, train_mode, o: Objective("pgd_at", cross_entropy_loss(),
                                                                      pgd_transform(attack, train_mode)))
register_objective("fedalc", _fedalc, options={
    "calib_variant": "inv_sqrt_freq",  # inv_sqrt_freq | eq5_literal | sqrt_freq | inv_freq | none (spec §1.4, A1)
    "calib_axis": "class",  # class: w_j scales every sample's j-th logit | sample: w_{y_b} scales row b (A2)
    "absent": "auto",  # weight of a class absent from the batch: auto | one | zero | as_one (A3)
    "normalize": "none",  # none | mean: divide by the present classes' mean weight (A21, ablation only)
})
register_objective("fat", _fat, options={"adv_fraction": 0.5})  # share of each batch made adversarial
register_objective("trades", lambda attack, train_mode, o: Objective(
    "trades", trades_loss(float(o.beta)), kl_transform(attack, train_mode)), options={"beta": 6.0})
register_objective("mart", lambda attack, train_mode, o: Objective(
    "mart", mart_loss(float(o.beta)), pgd_transform(attack, train_mode)), options={"beta": 6.0})
register_objective("calfat", lambda attack, train_mode, o: Objective(
    "calfat", calfat_loss(float(o.scale), float(o.tau)),
    kl_transform(attack, train_mode, calfat_calibration(float(o.scale), float(o.tau)))),
    options={"scale": 10.0, "tau": 0.1})


def adversarial_config():
  """``config.adversarial``: the local objective, the training attack, and each objective's own block."""
  import ml_collections
  blocks = {name: ml_collections.ConfigDict(dict(e.options)) for name, e in OBJECTIVES.items() if e.options}
  config = ml_collections.ConfigDict({
      "objective": "ce",  # ce | pgd_at | fedalc | fat | trades | mart | calfat
      # The training attack (L∞, [0, 1] pixel units; FedALC spec §1.3 / A4-A5: torchattacks' PGD defaults).
      "eps": 8 / 255, "step_size": 2 / 255, "steps": 10, "random_start": True,
      "attack_train_mode": False,  # attack the model in train mode (dropout on); default eval mode (spec A8)
      # auto | true | false | int: how the training attack's step loop compiles. auto unrolls it on the CPU for conv
      # nets unless local steps x attack steps passes a budget (attacks.training_attack_unroll); same numbers.
      "unroll": "auto",
      **blocks,
  })
  config.lock()
  return config


def objective_from_config(config, attack_unroll: bool | int | None = None) -> Objective:
  """The :class:`Objective` ``config.objective`` names (``config`` = the ``adversarial`` block); ``attack_unroll``:
  the training attack's loop unroll (``LinfParams.unroll``; the experiment resolves ``config.unroll`` with
  :func:`~fedjax_robust.adversarial.attacks.training_attack_unroll`), None = the model's default."""
  if config is None:
    return OBJECTIVES["ce"].build(LinfParams(), False, {})
  name = str(config.get("objective", "ce"))
  if name not in OBJECTIVES:
    raise ValueError(f"unknown adversarial.objective {name!r}; choose one of {tuple(OBJECTIVES)}")
  attack = LinfParams(float(config.eps), float(config.step_size), int(config.steps), bool(config.random_start),
                      attack_unroll)
  if attack.eps < 0 or attack.step_size < 0 or attack.steps < 0:
    raise ValueError(f"adversarial eps, step_size and steps must be >= 0, got {attack}")
  return OBJECTIVES[name].build(attack, bool(config.get("attack_train_mode", False)), config.get(name) or {})
