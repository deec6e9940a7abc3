"""Per-coordinate order statistics without sorting: exact radix (bitwise binary-search) selection.

``jnp.sort`` along the client axis is slow on XLA:CPU (one comparator call per
comparison: ~15-20 s for a [100, 1M] array on 2 cores). The coordinate-wise
rules only need a few order statistics per coordinate, so they use
:func:`kth_smallest`: map each float32 to a monotone uint32 key and build the
r-th smallest key bit by bit (32 passes of "count the values below a
candidate", a fused compare-and-sum over the client axis). It is exact (it
returns one of the input values), handles a traced rank ``r`` and invalid
clients (key = max, never selected while ``r < n``), and runs ~10x faster than
the sort on CPU. On CPU the work is done in column tiles that stay in cache
(``column_tiles``); on accelerators the whole array is processed at once.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

_SIGN = 0x80000000


def _to_key(x: jax.Array) -> jax.Array:
  """float32 -> uint32 with the same order (-0.0 sorts just below +0.0)."""
  b = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  neg = (b & jnp.uint32(_SIGN)) != 0
  return jnp.where(neg, ~b, b | jnp.uint32(_SIGN))


def _from_key(k: jax.Array) -> jax.Array:
  pos = (k & jnp.uint32(_SIGN)) != 0
  b = jnp.where(pos, k & jnp.uint32(0x7FFFFFFF), ~k)
  return lax.bitcast_convert_type(b, jnp.float32)


def kth_smallest(x: jax.Array, valid: jax.Array, r) -> jax.Array:
  """``[T]``: the ``r``-th smallest (0-based) of the valid rows of ``x`` [C, T], per column (exact).

  ``valid`` is [C] or [C, T]; requires ``0 <= r < #valid`` (per column) for a meaningful result.
  """
  valid = valid if valid.ndim == 2 else valid[:, None]
  keys = jnp.where(valid, _to_key(x), jnp.uint32(0xFFFFFFFF))
  r = jnp.asarray(r)

  def body(i, prefix):
    cand = prefix | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
    below = jnp.sum(keys < cand[None, :], axis=0, dtype=jnp.int32)
    return jnp.where(below <= r, cand, prefix)

  return _from_key(lax.fori_loop(0, 32, body, jnp.zeros(x.shape[1:], jnp.uint32)))


def tile_width(num_rows: int) -> int:
  """Columns per tile so that a [C, tile] float32 block is ~256 KiB (fits in L2)."""
  t = 128
  while t * 2 * num_rows * 4 <= 256 * 1024 and t < 8192:
    t *= 2
  return t


def column_tiles(fn: Callable, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Applies ``fn(block [C, T], col_ok [T]) -> (out [T], contrib [C])`` to column blocks of ``x`` [C, D].

  Returns ``(out [D], contrib [C] summed over blocks)``. ``col_ok`` marks real
  (non-padding) columns; ``fn`` must give padding columns zero contribution.
  On CPU the blocks are tiles processed by ``lax.map`` (cache friendly); on
  other backends ``fn`` sees the whole array at once.
  """
  c, d = x.shape
  if jax.default_backend() != "cpu" or d <= tile_width(c):
    return fn(x, jnp.ones((d,), bool))
  t = tile_width(c)
  nt = -(-d // t)
  pad = nt * t - d
  xp = jnp.pad(x, ((0, 0), (0, pad))).reshape(c, nt, t).transpose(1, 0, 2)
  ok = (jnp.arange(nt * t) < d).reshape(nt, t)
  out, contrib = lax.map(lambda a: fn(a[0], a[1]), (xp, ok))
  return out.reshape(-1)[:d], jnp.sum(contrib, axis=0)
