"""``jax.random`` draws of any shape, drawn flat and reshaped: the same numbers, compiled several times faster on CPU.

JAX's PRNGs number the values of a draw by their row-major position: ``jax.random.uniform(key, (84, 10))`` is
``jax.random.uniform(key, (840,)).reshape(84, 10)`` bit for bit (threefry, partitionable or not, and rbg; the tests
check each implementation). XLA:CPU does not compile the two alike. The partitionable threefry (JAX's default)
builds a multi-dimensional draw's counter from one 64-bit iota per axis, and XLA:CPU turns that into slow code:
with jax 0.10.2 on a 2-core VM, one ``uniform`` of shape (84, 10) or (5, 5, 3, 6) took 1.5-2.1 s to compile, the
flat draw 0.3 s (benchmarks/README.md §8). A model's init draws once per layer, so it paid that for every layer:
ResNet-8's eager init took 7.7 s (15.3 s with the test suite's compiler flags), 5.4 s (4.5 s) with flat draws.
So did a PGD random start (one draw per image), dropout masks and the noise attacks inside a round program.

These functions take the arguments of their ``jax.random`` namesakes (``shape`` required) and return the same
arrays; a scalar or one-dimensional draw is passed through unchanged. Use them wherever a draw has two or more
axes; ``models.layers`` builds its initialisers and dropout on them.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp


def _flat(draw, shape: Sequence[int]):
  """``draw(flat_shape)`` reshaped to ``shape``; ``draw(shape)`` when ``shape`` has fewer than two axes."""
  shape = tuple(int(d) for d in shape)
  if len(shape) < 2:
    return draw(shape)
  return draw((math.prod(shape),)).reshape(shape)


def uniform(key: jax.Array, shape: Sequence[int], dtype=jnp.float32, minval=0.0, maxval=1.0) -> jax.Array:
  """``jax.random.uniform(key, shape, dtype, minval, maxval)`` (scalar bounds)."""
  return _flat(lambda s: jax.random.uniform(key, s, dtype, minval, maxval), shape)


def normal(key: jax.Array, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
  """``jax.random.normal(key, shape, dtype)``."""
  return _flat(lambda s: jax.random.normal(key, s, dtype), shape)


def truncated_normal(key: jax.Array, lower, upper, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
  """``jax.random.truncated_normal(key, lower, upper, shape, dtype)`` (scalar bounds)."""
  return _flat(lambda s: jax.random.truncated_normal(key, lower, upper, s, dtype), shape)


def bernoulli(key: jax.Array, p, shape: Sequence[int]) -> jax.Array:
  """``jax.random.bernoulli(key, p, shape)`` (scalar ``p``)."""
  return _flat(lambda s: jax.random.bernoulli(key, p, s), shape)
