"""Scoring many models at once: ``M`` stacked models on one dataset (or one dataset each), in chunks.

Client evaluation, FedFomo's candidate models and (later) Shapley values all ask the same question:
how well do these ``M`` models do on these rows? :func:`score_models` answers it in one compiled
kernel: ``lax.map`` over chunks of ``model_chunk`` models (each chunk a ``vmap``), and inside it a
``lax.map`` over fixed-size data batches, so neither all models' activations nor the whole dataset's
are ever materialised at once. Results stay on device.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

PyTree = Any


class Scores(NamedTuple):
  correct: jax.Array  # [M] int32: correctly classified real rows
  loss_sum: jax.Array  # [M] float32: summed cross-entropy over the real rows
  count: jax.Array  # [M] int32: real rows scored

  @property
  def accuracy(self) -> jax.Array:
    return self.correct / jnp.maximum(self.count, 1)

  @property
  def mean_loss(self) -> jax.Array:
    return self.loss_sum / jnp.maximum(self.count, 1)


def _batches(x, y, n, batch_size, mask=None):
  total = y.shape[0]
  n = total if n is None else n
  valid = jnp.arange(total) < n
  if mask is not None:
    valid = valid & jnp.asarray(mask, bool)
  b = min(int(batch_size), total)
  num = -(-total // b)
  pad = num * b - total
  xb = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((num, b) + x.shape[1:])
  yb = jnp.pad(y, (0, pad)).reshape(num, b)
  vb = jnp.pad(valid, (0, pad)).reshape(num, b)
  return xb, yb, vb


def score_one(logits_fn: Callable, model: PyTree, x, y, n=None, batch_size: int = 1024, mask=None) -> Scores:
  """One model on ``x`` / ``y`` (first ``n`` rows real, and of those the ``mask`` ones if given): correct,
  summed loss and count, batch by batch."""
  xb, yb, vb = _batches(x, y, n, batch_size, mask)

  def batch(args):
    xi, yi, vi = args
    logits = logits_fn(model, xi)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, yi)
    return (jnp.sum((jnp.argmax(logits, -1) == yi) & vi).astype(jnp.int32),
            jnp.sum(jnp.where(vi, ce, 0.0)).astype(jnp.float32))

  if xb.shape[0] == 1:
    correct, loss = batch((xb[0], yb[0], vb[0]))
  else:
    c, l = jax.lax.map(batch, (xb, yb, vb))
    correct, loss = jnp.sum(c), jnp.sum(l)
  return Scores(correct, loss, jnp.sum(vb).astype(jnp.int32))


def score_models(logits_fn: Callable, models: PyTree, x, y, n=None, *, batch_size: int = 1024,
                 model_chunk: Optional[int] = None, per_model_data: bool = False, mask=None) -> Scores:
  """``M`` stacked models (leading axis on every leaf) scored on one dataset, or on one each.

  ``logits_fn(model, x) -> logits`` (e.g. ``Model.logits``, which takes params or variables).
  ``per_model_data``: ``x`` / ``y`` / ``n`` have a leading ``M`` axis too (model ``i`` on its own rows).
  ``model_chunk``: models per ``vmap`` chunk (default all at once); memory grows with it (and a chunk of conv
  nets becomes one grouped convolution: ``model_chunk=1`` scores them one after another).
  ``mask``: ``[N]`` bool (``[M, N]`` with ``per_model_data``), the rows to score among the first ``n``
  (FedFomo's validation window, which is not a prefix).
  Returns :class:`Scores` with ``[M]`` fields.
  """
  m = jax.tree.leaves(models)[0].shape[0]
  chunk = m if model_chunk is None else max(1, min(int(model_chunk), m))
  if per_model_data:
    n = jnp.full((m,), y.shape[1], jnp.int32) if n is None else jnp.asarray(n)
    rows = jnp.ones(y.shape[:2], bool) if mask is None else jnp.asarray(mask, bool)
    fn = lambda args: score_one(logits_fn, args[0], args[1], args[2], args[3], batch_size, args[4])
    return jax.lax.map(fn, (models, x, y, n, rows), batch_size=chunk)
  fn = lambda model: score_one(logits_fn, model, x, y, n, batch_size, mask)
  return jax.lax.map(fn, models, batch_size=chunk)
