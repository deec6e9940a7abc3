"""Parameter sensitivity, critical masks and mask overlap: FedCAC's batched kernels (``specs/fedcac.md`` §1.3, §1.5).

The design card's "sensitivity masks" kernel, as pure functions over pytrees. The client-side ones are written for
ONE client (the engine maps them over the client axis); the server-side ones take the cohort's stacked masks.

Client side (spec §1.3 steps C3-C4, paper Eqs. 5-6):

* :func:`sensitivity`: ``S = |Δ ⊙ w_E|`` with ``Δ = w_E - w_0`` for every trainable tensor (the whole-round change
  times the POST-training value, §5-A21).
* :func:`critical_mask`: one tensor's critical mask. ``k = floor(τ·n)`` is a static Python ``int(τ * n)`` (double
  precision, §5-A4: 0.57·100 -> 56); ``k = 0`` gives no critical entry; otherwise the threshold ``h`` is the
  ``k``-th largest value of ``S`` (an exact order statistic, :func:`fedjax_robust.aggregators.order.kth_smallest`:
  a radix selection, jit-friendly and faster than a sort on XLA:CPU), then the fallback of C4: when
  ``h <= 1e-10`` and some entry has ``S > 1e-20``, ``h`` becomes the smallest such entry (every entry with
  ``S > 1e-20`` is critical, none of the zero ones); when none has, ``h`` stays (an all-zero tensor with ``h = 0``
  is all critical, the reference's behaviour). ``M = [S >= h]``: ties at ``h`` are all included, so a tensor may
  hold more than ``k`` critical entries. Value based, hence independent of the tensor's layout (PyTorch OIHW vs
  flax HWIO).
* :func:`reverse_critical_mask` (ablation "Sensitivity_Reverse", spec §2): the ``k`` lowest sensitivities, ties at
  the ``k``-th smallest included, no fallback. :func:`random_critical_mask` (ablation "Random"): exactly ``k``
  entries drawn uniformly without replacement.
* :func:`critical_masks`: the per-tensor rule over a whole parameter tree (``selection`` picks one of the three).

Server side (spec §1.3 S1-S4, §1.5):

* :func:`mask_counts`: ``K_i = Σ_p M_i[p]`` and ``I_ij = Σ_ℓ M_{i,ℓ} M_{j,ℓ}^T`` as exact int32 counts. The
  products are float32 matmuls at ``Precision.HIGHEST`` (no TF32/bf16 path) of 0/1 matrices over column blocks of
  at most ``2**24`` entries, where every partial sum is an integer below ``2**24`` and so exact in float32; blocks
  are summed in int32 (§1.5 item 1).
* :func:`overlap_matrix`: ``O_ij = 1 - (K_i + K_j - 2 I_ij) / (2 K_i) = (K_i - K_j + 2 I_ij) / (2 K_i)`` (the
  code's formula, §5-A1; asymmetric, row client's ``K_i`` in the denominator, §5-A20). The numerator is an exact
  integer, so ``O`` carries one rounding (float64 when ``jax_enable_x64`` is on, float32 otherwise). Rows with
  ``K_i = 0`` are not valid (§5-A13: they get no collaborators and stay out of ``O_avg``/``O_max``).
* :func:`overlap_threshold`: ``Thr^t = O_avg + (t/β)(O_max - O_avg)`` (Eq. 7, 1-indexed ``t``, §5-A2) over the
  ordered pairs ``i ≠ j`` of valid rows, evaluated as ``O_max - (1 - t/β)(O_max - O_avg)`` — the same number in
  exact arithmetic, and exactly ``O_max`` at ``t = β`` in floating point too (§5-A25). ``O_avg`` is clamped into
  ``[O_min, O_max]`` so that equal overlaps give ``O_avg = O_max`` exactly (the degenerate case §5-A12).
* :func:`collaborator_matrix`: ``A_ij = [j ∈ C_i^t]`` (Eq. 8) for the three collaboration rules of spec §2:
  ``time_varying`` (``O_ij >= Thr^t``; for ``t > β`` with ``O_max > O_avg`` no pair qualifies, as in exact
  arithmetic — float rounding of ``Thr`` can never let the argmax pair through after ``β``), ``number``
  (the ``k`` other clients of highest ``O_ij``, ties to the lower index, for the whole run) and ``none``.
* :func:`customization_weights`: ``diag(1 / (A·1 + 1)) (A + I)``, the uniform weights of ``u_i`` over
  ``C_i ∪ {i}`` (Eq. 10, §1.5 item 3); an empty ``C_i`` gives the one-hot row, so ``u_i = w_i`` exactly.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_robust.aggregators.order import kth_smallest

PyTree = Any
HIGHEST = jax.lax.Precision.HIGHEST

SELECTIONS = ("sensitivity", "random", "sensitivity_reverse")
COLLABORATIONS = ("time_varying", "none", "number")
ZERO_THRESHOLD = 1e-10  # C4: a k-th largest sensitivity at or below this is "numerically zero"
POSITIVE_FLOOR = 1e-20  # C4: entries above this are the non-zero ones the fallback keeps
EXACT_BLOCK = 2 ** 24  # float32 counts up to this are exact


def overlap_dtype():
  """float64 with ``jax_enable_x64`` (spec §5-A25's recommendation), float32 otherwise."""
  return jax.dtypes.canonicalize_dtype(jnp.float64)


# ------------------------------------------------------------------------------------------------- client side
def sensitivity(start: PyTree, trained: PyTree) -> PyTree:
  """``|(w_E - w_0) ⊙ w_E|`` per entry of every tensor (spec C3, Eq. 5)."""
  return jax.tree.map(lambda w0, w: jnp.abs((w - w0) * w), start, trained)


def num_critical(tau: float, size: int) -> int:
  """``k = floor(τ·n)`` exactly as the reference computes it: Python ``int(τ * n)`` in double precision."""
  return int(float(tau) * int(size))


def _kth_largest(flat: jax.Array, k: int) -> jax.Array:
  n = flat.shape[0]
  return kth_smallest(flat[:, None], jnp.ones((n,), bool), n - k)[0]


def critical_mask(scores: jax.Array, tau: float, fallback: bool = True) -> jax.Array:
  """Bool mask of one tensor's critical entries (spec C4, Eq. 6; module docstring). ``tau`` is static."""
  n = int(np.prod(scores.shape, dtype=np.int64))
  k = num_critical(tau, n)
  if k == 0:
    return jnp.zeros(scores.shape, bool)
  flat = scores.reshape(-1).astype(jnp.float32)
  h = _kth_largest(flat, k)
  if fallback:
    smallest_positive = jnp.min(jnp.where(flat > POSITIVE_FLOOR, flat, jnp.inf))
    h = jnp.where((h <= ZERO_THRESHOLD) & jnp.isfinite(smallest_positive), smallest_positive, h)
  return scores >= h


def reverse_critical_mask(scores: jax.Array, tau: float) -> jax.Array:
  """The ``floor(τ·n)`` LOWEST sensitivities as critical (ablation "Sensitivity_Reverse"), ties included."""
  n = int(np.prod(scores.shape, dtype=np.int64))
  k = num_critical(tau, n)
  if k == 0:
    return jnp.zeros(scores.shape, bool)
  flat = scores.reshape(-1).astype(jnp.float32)
  h = kth_smallest(flat[:, None], jnp.ones((n,), bool), k - 1)[0]
  return scores <= h


def random_critical_mask(key: jax.Array, shape: tuple[int, ...], tau: float) -> jax.Array:
  """Exactly ``floor(τ·n)`` entries, uniformly without replacement (ablation "Random")."""
  n = int(np.prod(shape, dtype=np.int64))
  k = num_critical(tau, n)
  if k == 0:
    return jnp.zeros(shape, bool)
  chosen = jax.random.permutation(key, n)[:k]
  return jnp.zeros((n,), bool).at[chosen].set(True).reshape(shape)


def critical_masks(scores: PyTree, tau: float, selection: str = "sensitivity",
                   key: Optional[jax.Array] = None) -> PyTree:
  """The per-tensor critical masks of a parameter tree: top-``τ`` of ``scores`` within every tensor separately
  (spec §5-A3), by ``selection`` (``sensitivity`` | ``random`` (needs ``key``) | ``sensitivity_reverse``)."""
  check_tau(tau)
  if selection == "sensitivity":
    return jax.tree.map(lambda s: critical_mask(s, tau), scores)
  if selection == "sensitivity_reverse":
    return jax.tree.map(lambda s: reverse_critical_mask(s, tau), scores)
  if selection == "random":
    if key is None:
      raise ValueError("random critical masks need a key")
    leaves, treedef = jax.tree.flatten(scores)
    keys = jax.random.split(key, max(len(leaves), 1))
    return jax.tree.unflatten(treedef, [random_critical_mask(keys[i], s.shape, tau) for i, s in enumerate(leaves)])
  raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")


def check_tau(tau) -> None:
  if not isinstance(tau, (int, float, np.floating, np.integer)) or isinstance(tau, bool):
    raise ValueError(f"tau must be a number in [0, 1] known when the program is built (k = floor(tau * n) sets "
                     f"static shapes), got {tau!r}")
  if not 0.0 <= float(tau) <= 1.0:
    raise ValueError(f"tau must be in [0, 1], got {tau}")


# ------------------------------------------------------------------------------------------------- server side
def _rows(leaf: jax.Array) -> jax.Array:
  return leaf.reshape(leaf.shape[0], -1)


def mask_counts(masks: PyTree, block: int = EXACT_BLOCK) -> tuple[jax.Array, jax.Array]:
  """``(K [C], I [C, C])`` int32 of stacked masks (leading client axis on every leaf), exact (module docstring)."""
  leaves = jax.tree.leaves(masks)
  if not leaves:
    raise ValueError("mask_counts needs at least one mask tensor")
  c = leaves[0].shape[0]
  sizes = jnp.zeros((c,), jnp.int32)
  inter = jnp.zeros((c, c), jnp.int32)
  for leaf in leaves:
    m = _rows(leaf).astype(bool)
    sizes = sizes + jnp.sum(m, axis=1, dtype=jnp.int32)
    n = m.shape[1]
    nb = -(-n // block)
    mf = m.astype(jnp.float32)
    if nb > 1:
      mf = jnp.pad(mf, ((0, 0), (0, nb * block - n))).reshape(c, nb, block)
    else:
      mf = mf[:, None, :]
    blocks = jnp.einsum("cbn,dbn->bcd", mf, mf, precision=HIGHEST)
    inter = inter + jnp.sum(jnp.round(blocks).astype(jnp.int32), axis=0)
  return sizes, inter


def overlap_matrix(sizes: jax.Array, inter: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(O [C, C], valid_rows [C])``: ``O_ij = (K_i - K_j + 2 I_ij) / (2 K_i)`` (spec S2); rows with ``K_i = 0`` are
  invalid and hold 0."""
  valid = sizes > 0
  num = (sizes[:, None] - sizes[None, :] + 2 * inter).astype(overlap_dtype())
  den = jnp.where(valid, 2 * sizes, 1).astype(overlap_dtype())[:, None]
  return jnp.where(valid[:, None], num / den, 0.0), valid


def pair_mask(valid_rows: jax.Array) -> jax.Array:
  """The ordered pairs ``i ≠ j`` whose row ``i`` has a non-empty mask: those ``O_avg``, ``O_max`` and ``C_i`` use."""
  c = valid_rows.shape[0]
  return valid_rows[:, None] & ~jnp.eye(c, dtype=bool)


def overlap_stats(overlap: jax.Array, pairs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(O_avg, O_max, any_pair)`` over the valid ordered pairs; ``O_avg`` clamped into ``[O_min, O_max]``."""
  count = jnp.sum(pairs)
  any_pair = count > 0
  o_max = jnp.max(jnp.where(pairs, overlap, -jnp.inf))
  o_min = jnp.min(jnp.where(pairs, overlap, jnp.inf))
  o_avg = jnp.sum(jnp.where(pairs, overlap, 0.0)) / jnp.maximum(count, 1).astype(overlap.dtype)
  o_avg = jnp.clip(o_avg, o_min, o_max)
  zero = jnp.zeros((), overlap.dtype)
  return jnp.where(any_pair, o_avg, zero), jnp.where(any_pair, o_max, zero), any_pair


def threshold(o_avg, o_max, t, beta):
  """``Thr^t = O_avg + (t/β)(O_max - O_avg)`` (Eq. 7), evaluated as ``O_max - (1 - t/β)(O_max - O_avg)``."""
  dtype = jnp.result_type(o_avg)
  frac = jnp.asarray(t, dtype) / jnp.asarray(beta, dtype)
  return o_max - (1 - frac) * (o_max - o_avg)


def overlap_threshold(overlap: jax.Array, valid_rows: jax.Array, t, beta) -> jax.Array:
  """``Thr^t`` of :func:`threshold` over the valid ordered pairs of ``overlap``."""
  o_avg, o_max, _ = overlap_stats(overlap, pair_mask(valid_rows))
  return threshold(o_avg, o_max, t, beta)


def collaborator_matrix(overlap: jax.Array, valid_rows: jax.Array, t, beta, collaboration: str = "time_varying",
                        num_collaborators: int = 1) -> tuple[jax.Array, dict]:
  """``(A [C, C] bool, stats)``: ``A_ij = [j ∈ C_i^t]`` (never ``i`` itself; spec S3-S4 and §2's variants).

  ``t`` is the 1-indexed round and ``beta`` may be traced; ``num_collaborators`` (``number``) is static.
  ``stats``: ``threshold``, ``overlap_mean`` (O_avg), ``overlap_max`` (O_max)."""
  c = overlap.shape[0]
  pairs = pair_mask(valid_rows)
  o_avg, o_max, any_pair = overlap_stats(overlap, pairs)
  thr = threshold(o_avg, o_max, t, beta)
  stats = {"threshold": thr, "overlap_mean": o_avg, "overlap_max": o_max}
  if collaboration == "none":
    return jnp.zeros((c, c), bool), stats
  if collaboration == "time_varying":
    dtype = jnp.result_type(o_avg)
    past_horizon = (jnp.asarray(t, dtype) > jnp.asarray(beta, dtype)) & (o_max > o_avg)
    return pairs & (overlap >= thr) & ~past_horizon & any_pair, stats
  if collaboration == "number":
    if int(num_collaborators) < 0:
      raise ValueError(f"num_collaborators must be >= 0, got {num_collaborators}")
    k = min(int(num_collaborators), c - 1)
    if k == 0:
      return jnp.zeros((c, c), bool), stats
    scores = jnp.where(pairs, overlap, -jnp.inf)
    top, idx = jax.lax.top_k(scores, k)
    chosen = jnp.zeros((c, c), bool).at[jnp.arange(c)[:, None], idx].set(jnp.isfinite(top))
    return chosen & pairs, stats
  raise ValueError(f"collaboration must be one of {COLLABORATIONS}, got {collaboration!r}")


def customization_weights(collaborators: jax.Array) -> jax.Array:
  """``[C, C]`` float32 rows: uniform over ``C_i ∪ {i}`` (Eq. 10)."""
  a = collaborators | jnp.eye(collaborators.shape[0], dtype=bool)
  return a.astype(jnp.float32) / jnp.sum(a, axis=1, keepdims=True).astype(jnp.float32)


def mix_rows(weights: jax.Array, stacked: PyTree) -> PyTree:
  """``weights @ W`` per leaf (``[R, C]`` x ``[C, ...]`` -> ``[R, ...]``) at HIGHEST precision."""
  def one(leaf):
    out = jnp.matmul(weights.astype(leaf.dtype), _rows(leaf), precision=HIGHEST)
    return out.reshape((weights.shape[0],) + leaf.shape[1:])
  return jax.tree.map(one, stacked)
