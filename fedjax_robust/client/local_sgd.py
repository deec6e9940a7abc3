"""Local mini-batch training of one client, with padding-aware exact no-op steps.

Clients hold different numbers of samples, but a mapped kernel needs one static
shape. So client ``k`` with ``n_k`` real samples (out of ``n_max`` padded rows)
runs the static number of steps of the largest client, and every step past its
own ``ceil(n_k / B)`` per epoch (``floor`` with ``drop_last``) is an exact
no-op: parameters AND optimizer state (momentum, Adam moments, step counts) are
selected back to their previous values. A sequential implementation that loops
over ``ceil(n_k / B)`` batches therefore produces the same numbers.

Shuffling: each epoch draws a fresh permutation of the client's ``n_k`` real
samples (padding rows are sorted to the end), like a PyTorch ``DataLoader``
with ``shuffle=True``. The last batch of an epoch may be partial; its loss is the
mean over its real samples only, as in PyTorch.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

PyTree = Any
# loss_fn(params, x_batch, y_batch, sample_mask) -> scalar loss.
LossFn = Callable[[PyTree, jax.Array, jax.Array, jax.Array], jax.Array]


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
  unroll: bool | int = 1  # lax.scan unroll; True avoids the XLA:CPU conv-in-loop trap.


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
  random order of the real rows with a static shape.
  """
  positions = jnp.arange(n_max)
  if not shuffle:
    return jnp.broadcast_to(positions, (epochs, n_max))
  draws = jax.random.uniform(key, (epochs, n_max))
  draws = jnp.where(positions[None, :] < n, draws, 2.0 + positions[None, :])
  return jnp.argsort(draws, axis=1)


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
) -> tuple[PyTree, PyTree, dict[str, jax.Array]]:
  """Runs ``spec.epochs`` epochs of mini-batch training on one client.

  Returns the new params, the new optimizer state and ``{"loss": mean loss over
  the real steps, "steps": number of real steps}``.
  """
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

  grad_fn = jax.value_and_grad(loss_fn)

  def step(carry, inputs):
    p, s, loss_sum = carry
    idx, mask, active = inputs
    loss, grads = grad_fn(p, data.x[idx], data.y[idx], mask)
    updates, new_s = optimizer.update(grads, s, p)
    new_p = optax.apply_updates(p, updates)
    carry = (_select(active, new_p, p), _select(active, new_s, s), loss_sum + jnp.where(active, loss, 0.0))
    return carry, None

  (params, opt_state, loss_sum), _ = jax.lax.scan(
      step, (params, opt_state, jnp.zeros((), jnp.float32)), (order, sample_mask, step_active), unroll=spec.unroll
  )
  steps = (real_steps * spec.epochs).astype(jnp.int32)
  return params, opt_state, {"loss": loss_sum / jnp.maximum(steps, 1), "steps": steps}
