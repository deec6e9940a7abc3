"""Robust evaluation: accuracy of a model on adversarial test inputs, batched on device.

``robust_accuracy`` attacks a dataset batch by batch (``lax.map``; each batch its own key) with any kernel of
:mod:`fedjax_robust.adversarial.attacks` and counts the correctly classified real rows. The ``robust``
evaluator (``eval.metrics=accuracy,robust``) runs it for the global model after every evaluated round with the
attacks of ``eval.robust`` (FedALC spec §2: FGSM, BIM, PGD, CW with ε = 8/255, a = 2/255) and reports
``robust_natural_acc`` (clean accuracy on the same rows) and ``robust_acc_<attack>`` for each.

Cost: an attack of K gradient steps costs K + 1 forward/backward passes per image (PGD-10: 11; CW-L2 with 50
steps: up to 51), so robust evaluation of the full 10,000-image test set is far more expensive than a round of
training on 5,000 images; ``eval.robust.examples`` scores the first N test rows only (a stated reduction).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_robust import compilation
from fedjax_robust.adversarial.attacks import CWParams, LinfParams, bim, cw_l2, cw_linf, fgsm, pgd

PyTree = Any


def _eval_attacks(cfg, unroll=None) -> dict[str, tuple[Callable, Any]]:
  """Attack name -> (kernel, its parameters) from the ``eval.robust`` block; ``unroll``: every attack loop's
  (None = :func:`attacks.attack_unroll`'s choice for the model)."""
  eps, step, steps = float(cfg.eps), float(cfg.step_size), int(cfg.steps)
  cw = CWParams(float(cfg.cw_c), float(cfg.cw_kappa), int(cfg.cw_steps), float(cfg.cw_lr), str(cfg.cw_early_stop),
                bool(cfg.cw_torchattacks_margin), unroll)
  return {
      "fgsm": (fgsm, LinfParams(eps, eps, 1, False, unroll)),
      "bim": (bim, LinfParams(eps, step, steps, False, unroll)),
      "pgd": (pgd, LinfParams(eps, step, steps, True, unroll)),
      "pgd20": (pgd, LinfParams(eps, step, 20, True, unroll)),  # stronger extra (not in the paper)
      "cw": (cw_l2, cw),
      "cw_linf": (cw_linf, LinfParams(eps, step, 20, True, unroll)),  # stronger extra (not in the paper)
  }


EVAL_ATTACK_NAMES = ("fgsm", "bim", "pgd", "pgd20", "cw", "cw_linf")


def default_robust_eval_config():
  import ml_collections
  return ml_collections.ConfigDict({
      "attacks": "fgsm,bim,pgd,cw",  # comma-separated names from EVAL_ATTACK_NAMES
      "eps": 8 / 255, "step_size": 2 / 255, "steps": 10,  # FGSM uses one step of size eps (FedALC spec A12)
      "cw_c": 1.0, "cw_kappa": 0.0, "cw_steps": 50, "cw_lr": 0.01,  # torchattacks' CW defaults (spec §2.2)
      "cw_early_stop": "example",  # example | batch (torchattacks: depends on the batch) | none
      "cw_torchattacks_margin": False,  # True: torchattacks' max over (1 - onehot) * z (counts the zeroed true logit)
      "examples": 0,  # score the first N rows of the global test set (0 = all of it)
      "batch_size": 500,  # rows attacked at once
  })


class RobustEvalSpec(NamedTuple):
  attacks: tuple[tuple[str, Callable, Any], ...]  # (name, kernel, params)
  examples: int
  batch_size: int


def robust_eval_from_config(cfg, unroll: bool | int | None = None) -> RobustEvalSpec:
  """The ``eval.robust`` block, checked. ``unroll``: how every attack's step loop compiles (None: unrolled on the
  CPU for conv nets, :func:`attacks.attack_unroll`; the experiment passes 1, a rolled loop, when its model's
  convolutions are not under XLA:CPU's conv-in-loop trap, ``experiment.conv_loop_trap``)."""
  cfg = cfg if cfg is not None else default_robust_eval_config()
  names = [n for n in str(cfg.attacks).replace(" ", "").split(",") if n]
  unknown = [n for n in names if n not in EVAL_ATTACK_NAMES]
  if unknown or not names:
    raise ValueError(f"eval.robust.attacks: unknown or empty {unknown or names}; choose from {EVAL_ATTACK_NAMES}")
  if float(cfg.eps) < 0 or float(cfg.step_size) < 0 or int(cfg.steps) < 0:
    raise ValueError("eval.robust eps, step_size and steps must be >= 0")
  if int(cfg.examples) < 0 or int(cfg.batch_size) < 1:
    raise ValueError(f"eval.robust.examples must be >= 0 and batch_size >= 1, got {cfg.examples}, {cfg.batch_size}")
  table = _eval_attacks(cfg, unroll)
  if table["cw"][1].early_stop not in ("example", "batch", "none"):
    raise ValueError(f"eval.robust.cw_early_stop must be example, batch or none, got {cfg.cw_early_stop!r}")
  return RobustEvalSpec(tuple((n,) + table[n] for n in names), int(cfg.examples), int(cfg.batch_size))


def robust_accuracy(logits_fn: Callable, variables: PyTree, x: jax.Array, y: jax.Array, key: jax.Array,
                    attack: Callable, params: Any, batch_size: int = 500) -> tuple[jax.Array, jax.Array]:
  """``(correct, count)`` of ``logits_fn(variables, ·)`` on ``attack``'s examples for every row of ``x``.

  Batches of ``batch_size`` rows (the last one padded; padded rows attacked but not counted), batch ``i``
  attacked with ``fold_in(key, i)``. ``attack=None`` scores the clean inputs.
  """
  total = y.shape[0]
  b = max(1, min(int(batch_size), total))
  num = -(-total // b)
  pad = num * b - total
  xb = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((num, b) + x.shape[1:])
  yb = jnp.pad(y, (0, pad)).reshape(num, b)
  valid = (jnp.arange(num * b) < total).reshape(num, b)

  def one(args):
    i, xi, yi, vi = args
    if attack is not None:
      xi = attack(logits_fn, variables, xi, yi, jax.random.fold_in(key, i), params)
    hit = jnp.argmax(logits_fn(variables, xi), -1) == yi
    return jnp.sum(hit & vi).astype(jnp.int32)

  correct = compilation.map(one, (jnp.arange(num), xb, yb, valid))  # one batch: no loop (compilation.scan)
  return jnp.sum(correct), jnp.int32(total)


ROBUST_KEY_STREAM = 0xAD7


def evaluate_robust(model, global_model: PyTree, x: jax.Array, y: jax.Array, key: jax.Array,
                    spec: RobustEvalSpec) -> dict:
  """The ``robust`` evaluator's values: natural and per-attack robust accuracy of ``global_model``."""
  if spec.examples:
    x, y = x[: spec.examples], y[: spec.examples]
  logits_fn = model.logits  # eval mode; takes params or variables
  key = jax.random.fold_in(key, ROBUST_KEY_STREAM)
  out = {}
  correct, count = robust_accuracy(logits_fn, global_model, x, y, key, None, None, spec.batch_size)
  out["robust_natural_acc"] = correct / count
  for i, (name, attack, params) in enumerate(spec.attacks):
    correct, count = robust_accuracy(logits_fn, global_model, x, y, jax.random.fold_in(key, i), attack, params,
                                     spec.batch_size)
    out[f"robust_acc_{name}"] = correct / count
  return out
