"""Counting correct predictions over padded arrays, in fixed-size batches on device."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

PyTree = Any


def count_correct(apply_fn: Callable[[PyTree, jax.Array], jax.Array], params: PyTree, x: jax.Array, y: jax.Array,
                  n: jax.Array | int | None = None, batch_size: int = 1024) -> tuple[jax.Array, jax.Array]:
  """Returns ``(#correct, #scored)`` over the first ``n`` rows of ``x``/``y`` (all rows if ``n`` is None).

  Rows are scored ``batch_size`` at a time (a ``lax.map``) so a large test set
  never materialises all its activations at once.
  """
  total = y.shape[0]
  n = total if n is None else n
  valid = jnp.arange(total) < n
  if total <= batch_size:
    preds = jnp.argmax(apply_fn(params, x), axis=-1)
    return jnp.sum((preds == y) & valid).astype(jnp.int32), jnp.sum(valid).astype(jnp.int32)
  num_batches = -(-total // batch_size)
  pad = num_batches * batch_size - total
  xb = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((num_batches, batch_size) + x.shape[1:])
  yb = jnp.pad(y, (0, pad)).reshape(num_batches, batch_size)
  vb = jnp.pad(valid, (0, pad)).reshape(num_batches, batch_size)

  def batch_correct(args):
    xi, yi, vi = args
    return jnp.sum((jnp.argmax(apply_fn(params, xi), axis=-1) == yi) & vi)

  correct = jnp.sum(jax.lax.map(batch_correct, (xb, yb, vb)))
  return correct.astype(jnp.int32), jnp.sum(valid).astype(jnp.int32)
