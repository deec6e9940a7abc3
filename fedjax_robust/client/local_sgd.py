"""Local mini-batch training of one client, with padding-aware exact no-op steps.

Clients hold different numbers of samples, but a mapped kernel needs one static
shape. So client ``k`` with ``n_k`` real samples (out of ``n_max`` padded rows)
runs the static number of steps of the largest client, and every step past its
own ``ceil(n_k / B)`` per epoch (``floor`` with ``drop_last``) is an exact
no-op: parameters AND optimizer state (momentum, Adam moments, step counts) are
left at their previous values (in a rolled loop a ``lax.cond`` skips the step, so a client
trained alone pays for its own steps only; in unrolled code, and under ``vmap``, the step is
computed and selected away). A sequential implementation that loops
over ``ceil(n_k / B)`` batches therefore produces the same numbers.

Shuffling: each epoch draws a fresh permutation of the client's ``n_k`` real
samples (padding rows are sorted to the end), like a PyTorch ``DataLoader``
with ``shuffle=True``. The last batch of an epoch may be partial; its loss is the
mean over its real samples only, as in PyTorch.

Model state and step hooks (engine v2): the loss sees a :class:`Batch` with
the real-row mask, a per-step key (dropout) and the model state (BatchNorm
running statistics), and returns the new model state, which is selected back on
padded steps like everything else. An optional ``batch_transform`` rewrites the
inputs before each step with the current model and its own per-step key
(adversarial training generates PGD examples there).

Augmentation (``LocalTrainSpec.augment``, ``data.augment``; fedjax_robust/data/augment.py): each step's batch
is augmented first, with a key folded from the step key, so the batch transform (and ``Batch.x_clean``: TRADES'
clean reference) sees the augmented batch, as an attack on a DataLoader's output would.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust import compilation

PyTree = Any


class Batch(NamedTuple):
  """What one local step's loss sees: the (possibly transformed) mini-batch, its real-row mask, the step's
  dropout key, the model state (non-trainable collections such as BatchNorm's ``batch_stats``; ``{}``) and,
  when a batch transform rewrote ``x``, the clean inputs it started from (TRADES and MART compare the two)."""

  x: jax.Array
  y: jax.Array
  mask: jax.Array  # [B] bool: real rows (padding and the unused tail of a partial batch are False)
  key: jax.Array
  model_state: PyTree = {}
  x_clean: Optional[jax.Array] = None  # the batch before ``batch_transform`` (None without one)


# loss_fn(params, batch) -> (loss, new_model_state): the step's scalar loss and the model state after the forward
# pass (BatchNorm's updated running statistics; the input ``batch.model_state`` when the model has none).
LossFn = Callable[[PyTree, Batch], tuple[jax.Array, PyTree]]
# batch_transform(variables, x, y, mask, key) -> x': rewrites the batch with the current model before the step
# (adversarial training: PGD examples). It calls the model in the mode it needs (eval for the attack, spec A8);
# ``variables`` = {"params": params, **model_state}.
BatchTransform = Callable[[dict, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def plain_loss(fn: Callable[[PyTree, jax.Array, jax.Array, jax.Array], jax.Array]) -> LossFn:
  """Adapts a stateless ``fn(params, x, y, mask) -> loss`` (no dropout, no model state) to :data:`LossFn`."""

  def loss_fn(params, batch: Batch):
    return fn(params, batch.x, batch.y, batch.mask), batch.model_state

  return loss_fn


class LocalResult(NamedTuple):
  params: PyTree
  opt_state: PyTree
  metrics: dict  # {"loss": mean loss over the real steps, "steps": number of real steps}
  model_state: PyTree = {}


class ClientData(NamedTuple):
  """One client's padded samples (or a stack of them, with a leading client axis)."""

  x: jax.Array  # [n_max, *feature_shape]
  y: jax.Array  # [n_max]
  n: jax.Array  # [] number of real samples


class LocalTrainSpec(NamedTuple):
  """Static description of the local loop (hashable, so it can close over jit)."""

  epochs: int = 1
  batch_size: int = 10
  drop_last: bool = False  # FedCAP's code drops the last partial batch.
  shuffle: bool = True  # FedCAP's code does not shuffle training loaders.
  unroll: bool | int = 1  # lax.scan unroll; True only under XLA:CPU's conv-in-loop trap (experiment.conv_loop_trap)
  # (x [B, H, W, C], key) -> x': training-time augmentation of every step's batch (data/augment.py's hashable
  # Augmentation; None = off). Only local training applies it: evaluation never augments.
  augment: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None


def steps_per_epoch(n, batch_size: int, drop_last: bool):
  """Number of real optimizer steps one epoch over ``n`` samples takes (works on ints and arrays)."""
  if isinstance(n, int):
    return n // batch_size if drop_last else math.ceil(n / batch_size)
  return n // batch_size if drop_last else (n + batch_size - 1) // batch_size


def num_local_steps(n_max: int, spec: LocalTrainSpec) -> int:
  """Static number of scan steps for a padded client of ``n_max`` rows (all epochs)."""
  return spec.epochs * max(steps_per_epoch(n_max, spec.batch_size, spec.drop_last), 1)


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy over the real (mask = 1) samples of a batch."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  mask = mask.astype(ce.dtype)
  return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def epoch_permutations(key: jax.Array, n: jax.Array, n_max: int, epochs: int, shuffle: bool = True) -> jax.Array:
  """``[epochs, n_max]`` sample orders: a permutation of ``0..n-1`` followed by the padding rows.

  Sorting uniform draws with the padding rows pinned above 1 gives a uniformly
  random order of the real rows with a static shape. Row ``i``'s draw in epoch ``e`` comes from its own key
  ``fold_in(fold_in(key, e), i)``, so the order of the real rows does not depend on ``n_max``: a client padded
  to more rows (several seeds' partitions stacked in one program) trains exactly as it would alone.
  """
  positions = jnp.arange(n_max)
  if not shuffle:
    return jnp.broadcast_to(positions, (epochs, n_max))
  row_draw = lambda e, i: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, e), i))
  draws = jax.vmap(lambda e: jax.vmap(lambda i: row_draw(e, i))(positions))(jnp.arange(epochs))
  draws = jnp.where(positions[None, :] < n, draws, 2.0 + positions[None, :])
  return jnp.argsort(draws, axis=1)


STEP_KEY_STREAM = 0x5EED  # fold_in tag of the per-step keys (the shuffles use ``key`` itself)
AUGMENT_KEY_STREAM = 0xA6  # fold_in tag of a step's augmentation key (the transform / loss keys stay as they were)


def _select(pred: jax.Array, new: PyTree, old: PyTree) -> PyTree:
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def local_train(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    params: PyTree,
    opt_state: PyTree,
    data: ClientData,
    key: jax.Array,
    spec: LocalTrainSpec,
    model_state: PyTree = None,
    batch_transform: Optional[BatchTransform] = None,
) -> LocalResult:
  """Runs ``spec.epochs`` epochs of mini-batch training on one client.

  ``key`` draws the epochs' shuffles and, independently, one key per step (by epoch and batch index), split
  into the batch transform's key and the loss's dropout key (``spec.augment`` folds its own from it).
  ``model_state`` (e.g. BatchNorm statistics) is threaded through the steps as ``loss_fn`` returns it.
  ``spec.augment`` augments each batch first; ``batch_transform`` then rewrites its inputs from the current
  ``{"params", **model_state}`` before the gradient step (no gradient flows through either).

  Padded steps (past the client's own ``ceil(n / B)`` per epoch) are exact no-ops for params, optimizer
  state AND model state. Returns :class:`LocalResult` ``(params, opt_state, metrics, model_state)``.
  """
  model_state = {} if model_state is None or (isinstance(model_state, tuple) and not model_state) else model_state
  n_max = data.y.shape[0]
  batch = spec.batch_size
  per_epoch = max(steps_per_epoch(n_max, batch, spec.drop_last), 1)
  order = epoch_permutations(key, data.n, n_max, spec.epochs, spec.shuffle)
  pad = per_epoch * batch - n_max
  if pad > 0:  # the last (partial) batch of the largest client reads past n_max: point it at row 0, masked.
    order = jnp.concatenate([order, jnp.zeros((spec.epochs, pad), order.dtype)], axis=1)
  order = order[:, : per_epoch * batch].reshape(spec.epochs * per_epoch, batch)
  slot = jnp.arange(per_epoch * batch).reshape(per_epoch, batch)
  sample_mask = jnp.tile(slot < data.n, (spec.epochs, 1))
  real_steps = steps_per_epoch(data.n, batch, spec.drop_last)
  step_active = jnp.tile(jnp.arange(per_epoch) < real_steps, spec.epochs)
  step_root = jax.random.fold_in(key, STEP_KEY_STREAM)
  # (epoch, batch) names a step independently of the padding: a tight and a padded copy of a client draw the same
  # per-step keys, so dropout and adversarial transforms keep padded == unpadded.
  step_ids = jnp.stack([jnp.repeat(jnp.arange(spec.epochs), per_epoch),
                        jnp.tile(jnp.arange(per_epoch), spec.epochs)], axis=1)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(carry, idx, mask, i):
    p, s, ms, loss_sum = carry
    step_key = jax.random.fold_in(jax.random.fold_in(step_root, i[0]), i[1])
    transform_key, loss_key = jax.random.split(step_key)
    x, y = data.x[idx], data.y[idx]
    if spec.augment is not None:
      x = spec.augment(x, jax.random.fold_in(step_key, AUGMENT_KEY_STREAM))
    clean = None
    if batch_transform is not None:
      clean, x = x, jax.lax.stop_gradient(batch_transform({"params": jax.lax.stop_gradient(p), **(ms or {})}, x,
                                                          y, mask, transform_key))
    (loss, new_ms), grads = grad_fn(p, Batch(x, y, mask, loss_key, ms, clean))
    updates, new_s = optimizer.update(grads, s, p)
    return optax.apply_updates(p, updates), new_s, new_ms, loss_sum + loss

  def step(carry, inputs):
    idx, mask, active, i = inputs
    if spec.unroll is True:  # straight-line code: a padded step is computed, then selected away
      return _select(active, train_step(carry, idx, mask, i), carry), None
    # In a loop body a padded step is skipped (the sequential strategy pads every client to the largest; under
    # vmap the cond becomes the same select). Not in unrolled code: branches are computations of their own, which
    # XLA:CPU's conv-in-loop trap (experiment.conv_loop_trap) would leave off Eigen.
    return jax.lax.cond(active, lambda c: train_step(c, idx, mask, i), lambda c: c, carry), None

  (params, opt_state, model_state, loss_sum), _ = compilation.scan(
      step, (params, opt_state, model_state, jnp.zeros((), jnp.float32)),
      (order, sample_mask, step_active, step_ids), unroll=spec.unroll
  )
  steps = (real_steps * spec.epochs).astype(jnp.int32)
  return LocalResult(params, opt_state, {"loss": loss_sum / jnp.maximum(steps, 1), "steps": steps}, model_state)
