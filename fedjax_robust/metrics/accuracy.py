"""Counting correct predictions over padded arrays, in fixed-size batches on device."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

PyTree = Any


def _batched_sum(score: Callable, x: jax.Array, y: jax.Array, n, batch_size: int):
  """``score(x_batch, y_batch, valid_batch) -> pytree`` summed over fixed-size batches of the first ``n`` rows
  (one call when everything fits one batch; else a ``lax.map``, so a large test set never materialises all its
  activations at once). Also returns the number of rows scored."""
  total = y.shape[0]
  n = total if n is None else n
  valid = jnp.arange(total) < n
  scored = jnp.sum(valid).astype(jnp.int32)
  if total <= batch_size:
    return score(x, y, valid), scored
  num_batches = -(-total // batch_size)
  pad = num_batches * batch_size - total
  xb = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((num_batches, batch_size) + x.shape[1:])
  yb = jnp.pad(y, (0, pad)).reshape(num_batches, batch_size)
  vb = jnp.pad(valid, (0, pad)).reshape(num_batches, batch_size)
  sums = jax.lax.map(lambda args: score(*args), (xb, yb, vb))
  return jax.tree.map(lambda a: jnp.sum(a, axis=0), sums), scored


def count_correct(apply_fn: Callable[[PyTree, jax.Array], jax.Array], params: PyTree, x: jax.Array, y: jax.Array,
                  n: jax.Array | int | None = None, batch_size: int = 1024) -> tuple[jax.Array, jax.Array]:
  """Returns ``(#correct, #scored)`` over the first ``n`` rows of ``x``/``y`` (all rows if ``n`` is None),
  ``batch_size`` rows at a time."""
  def score(xi, yi, vi):
    return jnp.sum((jnp.argmax(apply_fn(params, xi), axis=-1) == yi) & vi)

  correct, scored = _batched_sum(score, x, y, n, batch_size)
  return correct.astype(jnp.int32), scored


def count_correct_per_class(apply_fn: Callable[[PyTree, jax.Array], jax.Array], params: PyTree, x: jax.Array,
                            y: jax.Array, n: jax.Array | int | None = None,
                            batch_size: int = 1024) -> tuple[jax.Array, jax.Array]:
  """``(correct [K], count [K])`` per true class over the first ``n`` rows (``K`` = the logits' width).

  Why: under label skew a global model's accuracy can hide classes it has stopped predicting (the ones rare on the
  clients that hold them), which per-class and worst-class accuracy show; FedALC's calibration (its spec A1)
  reweights exactly those classes' logits in training."""
  def score(xi, yi, vi):
    logits = apply_fn(params, xi)
    onehot = jax.nn.one_hot(yi, logits.shape[-1], dtype=jnp.int32) * vi[:, None]
    hit = (jnp.argmax(logits, axis=-1) == yi)[:, None]
    return jnp.sum(onehot * hit, axis=0), jnp.sum(onehot, axis=0)

  (correct, count), _ = _batched_sum(score, x, y, n, batch_size)
  return correct.astype(jnp.int32), count.astype(jnp.int32)
