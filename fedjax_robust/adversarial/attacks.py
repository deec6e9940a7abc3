"""Adversarial example kernels: FGSM, BIM, PGD, CW-L∞ and CW-L2 as pure, jittable functions.

Every kernel has one signature, so local adversarial training (inside one client's step, ``vmap``ped over
clients by the engine) and robust evaluation (a whole test set in batches) call the same code::

    x_adv = pgd(logits_fn, variables, x, y, key, LinfParams(eps=8/255, step_size=2/255, steps=10))

``logits_fn(variables, x) -> logits`` is the model as the attacker sees it (eval mode by default: dropout off,
BatchNorm running statistics; FedALC spec A8). Pixels live in [0, 1] and ε, step sizes are in those units: a
dataset's mean/std normalisation belongs inside the model (``data.normalize='model'``, spec A10), never in the
inputs an attack perturbs. No gradient flows from ``x_adv`` back into ``variables`` (the kernels differentiate
with respect to the input only, and return ``stop_gradient``'ed arrays).

Every example is attacked independently of the others in its batch (the losses are per-example sums and CW's
early stop is per example), so the batched kernel equals a per-example loop and padding rows never change a
real row's result (FedALC spec §7 properties 1-6).

* FGSM (Goodfellow et al. 2015): ``clip01(x + ε·sign ∇x CE)``, one step of size ε (spec A12).
* BIM (Kurakin et al. 2017): K steps of size ``a`` from ``x``, projected onto the ε-ball around the clean input
  and clipped to [0, 1] after every step (spec §1.3, Eq. 4 with its typo fixed: gradient at the iterate).
* PGD (Madry et al. 2018): BIM from a uniform random start ``clip01(x + U(-ε, ε))`` (spec A5).
* CW-L∞: PGD on the Carlini-Wagner margin loss instead of CE (a stronger extra, spec §2.2).
* CW-L2 (Carlini & Wagner 2017, as torchattacks v3.4/v3.5 implements it, spec §2.2): Adam on ``w`` with
  ``x' = (tanh w + 1)/2`` minimising ``‖x' − x‖² + c·max(z_y − max_{k≠y} z_k, −κ)``; each example keeps its
  smallest-L2 misclassified ``x'`` (else ``x``); early stop when an example's cost rose since the last check
  (every ``⌊steps/10⌋`` steps). No ε bound.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_robust import compilation, flat_random

PyTree = Any
LogitsFn = Callable[[PyTree, jax.Array], jax.Array]  # (variables, x) -> logits


class LinfParams(NamedTuple):
  """An L∞ attack: radius ``eps``, step ``step_size``, ``steps`` iterations, uniform random start or not.
  Defaults: torchattacks' PGD defaults, the values FedALC states for its attacks (spec §2.2)."""

  eps: float = 8 / 255
  step_size: float = 2 / 255
  steps: int = 10
  random_start: bool = True
  # How the step loop compiles: None = :func:`attack_unroll`'s choice for the model; True / False / an int = that
  # ``fori_loop`` unroll. Local adversarial training sets it per experiment (:func:`training_attack_unroll`).
  unroll: bool | int | None = None


class CWParams(NamedTuple):
  """CW-L2 (spec §2.2, torchattacks defaults): trade-off ``c``, confidence ``kappa``, Adam ``steps`` and ``lr``.
  ``early_stop``: 'example' (each example stops when its own cost rose; independent of the batch), 'batch'
  (torchattacks: the batch's summed cost, so results depend on the batch) or 'none'. ``torchattacks_margin``:
  the other-class max over ``(1 - onehot) * z``, which counts the zeroed true logit (torchattacks' quirk)."""

  c: float = 1.0
  kappa: float = 0.0
  steps: int = 50
  lr: float = 0.01
  early_stop: str = "example"
  torchattacks_margin: bool = False
  unroll: bool | int | None = None  # the Adam loop's unroll; None = :func:`attack_unroll`'s choice for the model


def cross_entropy(logits: jax.Array, y: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy on raw logits."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def cw_margin(logits: jax.Array, y: jax.Array, kappa: float = 0.0, torchattacks_margin: bool = False) -> jax.Array:
  """Per-example ``max(z_y − max_{k≠y} z_k, −κ)``: positive while the example is classified correctly."""
  onehot = jax.nn.one_hot(y, logits.shape[-1], dtype=logits.dtype)
  true = jnp.sum(onehot * logits, axis=-1)
  if torchattacks_margin:
    other = jnp.max((1 - onehot) * logits, axis=-1)
  else:
    other = jnp.max(jnp.where(onehot > 0, -jnp.inf, logits), axis=-1)
  return jnp.maximum(true - other, -kappa)


def input_gradient(example_loss: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
  """``∇x Σ_b loss_b(x)``: each row's gradient is its own example's (eval-mode models do not mix rows)."""
  return jax.grad(lambda z: jnp.sum(example_loss(z)))(x)


def project_linf(x_adv: jax.Array, x: jax.Array, eps: float) -> jax.Array:
  """Projection onto the L∞ ball of radius ``eps`` around the clean ``x``, then onto the pixel box [0, 1]."""
  return jnp.clip(x + jnp.clip(x_adv - x, -eps, eps), 0.0, 1.0)


def uniform_start(x: jax.Array, key: jax.Array, eps: float) -> jax.Array:
  """``clip01(x + U(-ε, ε))`` with row ``i``'s noise drawn from ``fold_in(key, i)``: a row's start does not depend
  on how many rows follow it (a padded batch attacks its real rows exactly as the unpadded one)."""
  noise = jax.vmap(lambda i: flat_random.uniform(jax.random.fold_in(key, i), x.shape[1:], x.dtype, -eps, eps))(
      jnp.arange(x.shape[0]))
  return jnp.clip(x + noise, 0.0, 1.0)


def linf_ascent(example_loss: Callable[[jax.Array], jax.Array], x: jax.Array, start: jax.Array, eps: float,
                step_size: float, steps: int, conv: bool = True, unroll: bool | int | None = None) -> jax.Array:
  """``steps`` signed-gradient ascent steps on ``example_loss`` from ``start``, each followed by the projection
  onto the ε-ball around ``x`` and [0, 1]. The loop every L∞ kernel (and TRADES' KL attack) shares; ``conv``:
  whether the attacked model has convolutions (:func:`attack_unroll`), ``unroll``: an explicit choice instead
  (``LinfParams.unroll``). The result is the same either way; only compile time and speed differ."""

  def step(_, x_k):
    return project_linf(x_k + step_size * jnp.sign(input_gradient(example_loss, x_k)), x, eps)

  if int(steps) == 0:
    return start
  return compilation.fori_loop(0, int(steps), step, start, unroll=attack_unroll(conv) if unroll is None else unroll)


def attack_unroll(conv: bool = True) -> bool | int:
  """How the attack loops are compiled: unrolled on CPU for conv nets (``conv``: :func:`compilation.has_conv` of
  the attacked model; XLA:CPU runs the convolutions of a loop body on a slow path, jax#12868: PGD-10 on the
  CNN-MNIST is 1.65x faster unrolled, CW-L2's 50 steps 2.1x for ~19 s more compilation,
  benchmarks/README.md §5), a rolled loop elsewhere.
  The environment variable FEDJAX_ROBUST_ATTACK_UNROLL (``auto``, ``true``, ``false`` or an int) overrides it."""
  import os
  value = os.environ.get("FEDJAX_ROBUST_ATTACK_UNROLL", "auto").lower()
  if value == "auto":
    return True if (jax.default_backend() == "cpu" and conv) else 1
  if value in ("true", "false"):
    return value == "true"
  return int(value)


# Local adversarial training puts one attack loop in every local step, so a fully unrolled client program holds
# local steps x attack steps gradient passes, and XLA:CPU's compile time and memory grow faster than that count.
# Measured (benchmarks/README.md §5; 2-core CPU, one FedALC client on the CNN-MNIST, batch 32, PGD-10): every loop
# unrolled, 18 local steps (180 attack steps) took 34 s to compile and run one round at 1.1 GB peak, 36 (360) 105 s
# at 1.9 GB; 90 steps (900) with the attack loop rolled 238 s at 4.6 GB, while the Fashion-MNIST cell's 155 steps
# with it unrolled had not compiled after 9 min at 17 GB. A rolled loop costs 2.2x per round at 36 steps.
# Beyond this many attack steps per client program ``auto`` rolls the loop.
TRAINING_ATTACK_UNROLL_BUDGET = 400


def training_attack_unroll(value, conv: bool, local_steps: int, attack_steps: int) -> bool | int:
  """The unroll of the training attack's loop inside a client's local steps (``adversarial.unroll``).

  ``auto``: :func:`attack_unroll`'s choice (unrolled on the CPU for conv nets), except that a client program of
  more than :data:`TRAINING_ATTACK_UNROLL_BUDGET` attack steps (``local_steps`` x ``attack_steps``) keeps a rolled
  loop, so that E = 5 on Fashion-MNIST compiles in minutes, not in tens of minutes at 17 GB. ``true`` / ``false``
  / an int: that unroll. FEDJAX_ROBUST_ATTACK_UNROLL, when set to anything but ``auto``, overrides both."""
  import os
  if os.environ.get("FEDJAX_ROBUST_ATTACK_UNROLL", "auto").lower() != "auto":
    return attack_unroll(conv)
  value = str(value).strip().lower()
  if value == "auto":
    choice = attack_unroll(conv)
    return 1 if choice is True and int(local_steps) * int(attack_steps) > TRAINING_ATTACK_UNROLL_BUDGET else choice
  if value in ("true", "false"):
    return True if value == "true" else 1
  try:
    unroll = int(value)
  except ValueError:
    raise ValueError(f"adversarial.unroll must be auto, true, false or a positive int, got {value!r}") from None
  if unroll < 1:
    raise ValueError(f"adversarial.unroll must be auto, true, false or a positive int, got {value!r}")
  return unroll


def _ce_loss(logits_fn, variables, y):
  return lambda z: cross_entropy(logits_fn(variables, z), y)


def fgsm(logits_fn: LogitsFn, variables: PyTree, x: jax.Array, y: jax.Array, key: jax.Array = None,
         params: LinfParams = LinfParams()) -> jax.Array:
  """One signed-gradient step of size ε (no random start; ``step_size``/``steps`` are ignored, spec A12)."""
  del key
  g = input_gradient(_ce_loss(logits_fn, variables, y), x)
  return jax.lax.stop_gradient(jnp.clip(x + params.eps * jnp.sign(g), 0.0, 1.0))


def bim(logits_fn: LogitsFn, variables: PyTree, x: jax.Array, y: jax.Array, key: jax.Array = None,
        params: LinfParams = LinfParams()) -> jax.Array:
  """Basic iterative method: PGD's steps from the clean input (``random_start`` ignored)."""
  del key
  out = linf_ascent(_ce_loss(logits_fn, variables, y), x, x, params.eps, params.step_size, params.steps,
                    compilation.has_conv(variables), params.unroll)
  return jax.lax.stop_gradient(out)


def pgd(logits_fn: LogitsFn, variables: PyTree, x: jax.Array, y: jax.Array, key: jax.Array,
        params: LinfParams = LinfParams()) -> jax.Array:
  """L∞ PGD on cross-entropy from a uniform random start in the ε-ball (``params.random_start``)."""
  start = uniform_start(x, key, params.eps) if params.random_start else x
  out = linf_ascent(_ce_loss(logits_fn, variables, y), x, start, params.eps, params.step_size, params.steps,
                    compilation.has_conv(variables), params.unroll)
  return jax.lax.stop_gradient(out)


def cw_linf(logits_fn: LogitsFn, variables: PyTree, x: jax.Array, y: jax.Array, key: jax.Array,
            params: LinfParams = LinfParams(steps=20)) -> jax.Array:
  """L∞ PGD that lowers the CW margin ``z_y − max_{k≠y} z_k`` instead of raising CE (spec §2.2 extras)."""
  loss = lambda z: -cw_margin(logits_fn(variables, z), y, kappa=jnp.inf)
  start = uniform_start(x, key, params.eps) if params.random_start else x
  out = linf_ascent(loss, x, start, params.eps, params.step_size, params.steps, compilation.has_conv(variables),
                    params.unroll)
  return jax.lax.stop_gradient(out)


def cw_l2(logits_fn: LogitsFn, variables: PyTree, x: jax.Array, y: jax.Array, key: jax.Array = None,
          params: CWParams = CWParams()) -> jax.Array:
  """Carlini-Wagner L2 (untargeted) with Adam in tanh space, torchattacks' procedure (see the module docstring).

  ``atanh(2x − 1)`` is taken of ``2x − 1`` clipped to ±(1 − 1e-6), so pixels at exactly 0 or 1 start at a
  finite ``w`` (torchattacks gets ±inf there, frozen by a zero gradient; the difference is < 1e-6 in pixels).
  """
  del key
  if params.early_stop not in ("example", "batch", "none"):
    raise ValueError(f"CWParams.early_stop must be 'example', 'batch' or 'none', got {params.early_stop!r}")
  b = x.shape[0]
  axes = tuple(range(1, x.ndim))
  w0 = jnp.arctanh(jnp.clip(2.0 * x - 1.0, -1 + 1e-6, 1 - 1e-6))
  opt = optax.adam(params.lr)
  check_every = max(int(params.steps) // 10, 1)

  def costs(w):
    adv = 0.5 * (jnp.tanh(w) + 1.0)
    l2 = jnp.sum(jnp.square(adv - x), axis=axes)
    logits = logits_fn(variables, adv)
    margin = cw_margin(logits, y, params.kappa, params.torchattacks_margin)
    return jnp.sum(l2 + params.c * margin), (adv, l2, l2 + params.c * margin, logits)

  def step(i, carry):
    w, opt_state, best_adv, best_l2, prev, done = carry
    grads, (adv, l2, cost, logits) = jax.grad(costs, has_aux=True)(w)
    updates, new_opt_state = opt.update(grads, opt_state, w)
    new_w = optax.apply_updates(w, updates)
    fooled = jnp.argmax(logits, -1) != y
    better = fooled & (l2 < best_l2) & ~done
    best_l2 = jnp.where(better, l2, best_l2)
    best_adv = jnp.where(better.reshape((b,) + (1,) * len(axes)), adv, best_adv)
    check = (i % check_every) == 0
    if params.early_stop == "example":
      rose, level = cost > prev, cost
    elif params.early_stop == "batch":
      rose, level = jnp.broadcast_to(jnp.sum(cost) > prev[0], (b,)), jnp.broadcast_to(jnp.sum(cost), (b,))
    else:
      rose, level = jnp.zeros((b,), bool), prev
    stop = check & rose
    new_done = done | stop
    prev = jnp.where(check & ~done, level, prev)
    keep = new_done.reshape((b,) + (1,) * len(axes))
    # A stopped example's w is frozen (Adam is elementwise, so the others' steps are unaffected).
    return jnp.where(keep, w, new_w), new_opt_state, best_adv, best_l2, prev, new_done

  init = (w0, opt.init(w0), x, jnp.full((b,), 1e10, x.dtype), jnp.full((b,), 1e10, x.dtype), jnp.zeros((b,), bool))
  unroll = attack_unroll(compilation.has_conv(variables)) if params.unroll is None else params.unroll
  out = compilation.fori_loop(0, int(params.steps), step, init, unroll=unroll)[2]
  return jax.lax.stop_gradient(out)
