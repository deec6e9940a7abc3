"""Similarities between weight matrices, batched over clients: FedCC's kernel CKA and the other rows of its Table I.

Every function compares the global model's matrix ``X`` [h, p] with each client's ``Y_i`` [h, p] in ONE jitted call
(``vmap`` over the ``C`` clients, the global model's part computed once):

    scores = kernel_cka(w_global, w_clients)          # [h, p], [C, h, p] -> [C]
    scores = SIMILARITIES["linear_cka"].batched(w_global, w_clients)

Rows are the *examples* and columns the features (fedcc.md §1.2: the h output neurons of the penultimate layer,
each a row of its (out, in) weight matrix; a flax Dense kernel (in, out) must be transposed first, see
:func:`as_rows`). The pairwise forms (``kernel_cka_pair(x, y)``) are the same maths for one pair.

Kernel (RBF) CKA, exactly as fedcc.md §1.3 (Kornblith et al. 2019, with FedCC's bandwidth):

1. ``D[a, b] = ||x_a - x_b||^2`` through the Gram matrix of the *row-centered* matrix (subtracting the mean row
   changes no distance and removes most of the float32 cancellation of ``g_a + g_b - 2 <x_a, x_b>``); the diagonal
   is exactly 0, entries within float32 rounding of 0 (duplicate rows) are exactly 0, the rest are symmetrised.
2. Bandwidth by the median heuristic, separately for each matrix. ``bandwidth="nonzero_median"`` (default, FedCC's
   code): ``sigma_X^2 = sigma^2 * median{D[a, b] != 0}`` (numpy semantics: the mean of the two middle values for an
   even count; the median over unordered pairs equals the one over the full symmetric matrix).
   ``bandwidth="median"``: Kornblith's ``rbf(x, threshold=sigma)``, the median of all h^2 entries, zero diagonal
   included. The median is an exact radix selection (``aggregators/order.py``): sorting 100 x 512^2 values is slow
   on XLA:CPU.
3. ``K = exp(-D / (2 sigma_X^2))``; centred ``K~ = H K H``, ``H = I - 11^T / h`` (done as row / column / grand mean
   subtractions, O(h^2), never a matmul with H).
4. ``HSIC(K, L) = sum(K~ * L~)`` (no 1/(h-1)^2: it cancels) and ``CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))``,
   in [0, 1].
5. No nonzero distance (all rows equal) or a zero denominator: the score is NaN, as in the author code before its
   ``0 if isnan`` (FedCC maps NaN to 0, fedcc.md §1.3 step 7).

``debiased=True`` (kernel and linear CKA) replaces the centring by U-centring (Szekely & Rizzo; the unbiased HSIC
estimator of Song et al. 2012, Kornblith's ``center_gram(unbiased=True)``): diagonals zeroed, needs h >= 4; the
score may then leave [0, 1] slightly.

Linear CKA: the same with ``K = X X^T``. MMD (fedcc.md §1.3, the code's): biased MMD^2 with the fixed RBF kernel
``exp(-gamma ||x - y||^2)`` (gamma = 1), rows as samples, a *distance*. Cosine: cosine similarity of the flattened
matrices. Euclidean: ``||vec(X) - vec(Y)||``, a distance. FedCC's rule only uses cluster sizes, so the direction
matters only for its tie-break (``Similarity.higher_is_similar``).

Everything is float32 (inputs are cast); matmuls use ``Precision.HIGHEST`` so GPUs do not use TF32.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_robust.aggregators.order import kth_smallest

HIGHEST = jax.lax.Precision.HIGHEST
BANDWIDTHS = ("nonzero_median", "median")


def as_rows(kernel: jax.Array) -> jax.Array:
  """A layer's weight as (out, rest): a Dense kernel (in, out) -> (out, in); a conv (kh, kw, in, out) ->
  (out, kh*kw*in). Works on a stacked [C, ...] kernel with ``jax.vmap``."""
  kernel = jnp.asarray(kernel)
  return jnp.moveaxis(kernel, -1, 0).reshape(kernel.shape[-1], -1)


# ----------------------------------------------------------------------------------------- building blocks


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def _gram(x: jax.Array) -> jax.Array:
  return jnp.dot(x, x.T, precision=HIGHEST)


def sq_distances(x: jax.Array) -> jax.Array:
  """``[h, h]`` squared Euclidean distances between the rows of ``x`` [h, p] (float32, see module docstring).

  Entries below the float32 resolution of the Gram route, ``4 eps sqrt(p) (|x_a|^2 + |x_b|^2)``, are exactly 0, so
  duplicate rows count as zero distances for the median. (The squared norms come from ``x``, not from the Gram
  diagonal: reading the matmul's output twice makes XLA:CPU about 2x slower.)
  """
  x = _f32(x)
  x = x - jnp.mean(x, axis=0, keepdims=True)
  n = jnp.sum(x * x, axis=1)
  nn = n[:, None] + n[None, :]
  d = nn - 2.0 * _gram(x)
  d = jnp.where(d > (4.0 * float(jnp.finfo(jnp.float32).eps) * math.sqrt(x.shape[1])) * nn, d, 0.0)
  d = 0.5 * (d + d.T)
  return jnp.where(jnp.eye(d.shape[0], dtype=bool), 0.0, d)


def _median(values: jax.Array, ok: jax.Array) -> jax.Array:
  """numpy ``median(values[ok])`` (NaN when nothing is ok): an exact radix selection of the lower middle value,
  then the upper middle one in a single pass (the lower one again, or the smallest value above it)."""
  v = values.reshape(-1)
  ok = ok.reshape(-1)
  count = jnp.sum(ok)
  r_lo = jnp.maximum(count - 1, 0) // 2
  r_hi = count // 2
  lo = kth_smallest(v[:, None], ok[:, None], r_lo)[0]
  at_most_lo = jnp.sum(ok & (v <= lo))
  above = jnp.min(jnp.where(ok & (v > lo), v, jnp.inf))
  hi = jnp.where(at_most_lo > r_hi, lo, above)
  return jnp.where(count > 0, 0.5 * (lo + hi), jnp.nan)


def median_bandwidth(d: jax.Array, bandwidth: str = "nonzero_median") -> jax.Array:
  """The median heuristic's ``sigma^2`` (before the ``sigma`` multiplier) of a squared-distance matrix ``d``."""
  h = d.shape[0]
  if bandwidth == "nonzero_median":
    rows, cols = np.triu_indices(h, 1)  # each unordered pair once: the same median as the full symmetric matrix
    upper = d[rows, cols]
    return _median(upper, upper > 0)
  if bandwidth == "median":
    return _median(d, jnp.ones((h, h), bool))
  raise ValueError(f"bandwidth must be one of {BANDWIDTHS}, got {bandwidth!r}")


def rbf_gram(x: jax.Array, sigma: float = 1.0, bandwidth: str = "nonzero_median") -> jax.Array:
  """``K[a, b] = exp(-D[a, b] / (2 sigma^2 med))``; NaN everywhere when the bandwidth is 0 or undefined."""
  d = sq_distances(x)
  s2 = jnp.float32(sigma) ** 2 * median_bandwidth(d, bandwidth)
  ok = jnp.isfinite(s2) & (s2 > 0)
  return jnp.where(ok, jnp.exp(-d / (2.0 * jnp.where(ok, s2, 1.0))), jnp.nan)


def center(k: jax.Array, debiased: bool = False) -> jax.Array:
  """``H K H`` (``debiased=False``) or the U-centred Gram matrix (``debiased=True``) of a symmetric ``k``."""
  h = k.shape[-1]
  if not debiased:
    m = jnp.mean(k, axis=-1)
    return k - m[:, None] - m[None, :] + jnp.mean(m)
  if h < 4:
    raise ValueError(f"debiased CKA needs at least 4 rows, got {h}")
  eye = jnp.eye(h, dtype=bool)
  k = jnp.where(eye, 0.0, k)
  m = jnp.sum(k, axis=-1) / (h - 2)
  m = m - jnp.sum(m) / (2 * (h - 1))
  return jnp.where(eye, 0.0, k - m[:, None] - m[None, :])


def _hsic(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.sum(a * b, axis=(-2, -1))


def _cka_from_centered(kg: jax.Array, kc: jax.Array) -> jax.Array:
  """``[C]`` CKA between one centred Gram ``kg`` [h, h] and ``kc`` [C, h, h]; NaN where a denominator is 0."""
  num = _hsic(kg[None], kc)
  den = jnp.sqrt(_hsic(kg, kg) * _hsic(kc, kc))
  ok = jnp.isfinite(den) & (den > 0)
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), jnp.nan)


def _check_pair(x, xs):
  if x.ndim != 2 or xs.ndim != 3 or xs.shape[1:] != x.shape:
    raise ValueError(f"expected a global matrix [h, p] and client matrices [C, h, p], got {x.shape} and {xs.shape}")


# ----------------------------------------------------------------------------------------- batched kernels


@functools.partial(jax.jit, static_argnames=("sigma", "bandwidth", "debiased"))
def kernel_cka(x: jax.Array, ys: jax.Array, sigma: float = 1.0, bandwidth: str = "nonzero_median",
               debiased: bool = False) -> jax.Array:
  """``[C]`` RBF-kernel CKA of ``x`` [h, p] against every ``ys[i]`` [h, p] (fedcc.md §1.3)."""
  x, ys = _f32(x), _f32(ys)
  _check_pair(x, ys)
  prep = lambda m: center(rbf_gram(m, sigma, bandwidth), debiased)
  return _cka_from_centered(prep(x), jax.vmap(prep)(ys))


@functools.partial(jax.jit, static_argnames=("debiased",))
def linear_cka(x: jax.Array, ys: jax.Array, debiased: bool = False) -> jax.Array:
  """``[C]`` linear CKA (``K = X X^T``) of ``x`` [h, p] against every ``ys[i]``."""
  x, ys = _f32(x), _f32(ys)
  _check_pair(x, ys)

  def prep(m):
    m = m - jnp.mean(m, axis=0, keepdims=True)  # H X X^T H = X_c X_c^T; centring again below only removes rounding
    g = _gram(m)
    return center(0.5 * (g + g.T), debiased)

  return _cka_from_centered(prep(x), jax.vmap(prep)(ys))


@functools.partial(jax.jit, static_argnames=("gamma",))
def mmd(x: jax.Array, ys: jax.Array, gamma: float = 1.0) -> jax.Array:
  """``[C]`` biased MMD^2 between the rows of ``x`` and of each ``ys[i]``, RBF kernel ``exp(-gamma ||a - b||^2)``."""
  x, ys = _f32(x), _f32(ys)
  _check_pair(x, ys)
  shift = jnp.mean(x, axis=0, keepdims=True)  # a common translation changes no distance
  x = x - shift
  ys = ys - shift[None]
  nx = jnp.sum(x * x, axis=-1)
  kxx = jnp.mean(jnp.exp(-gamma * sq_distances(x)))

  def one(y):
    ny = jnp.sum(y * y, axis=-1)
    dxy = jnp.maximum(nx[:, None] + ny[None, :] - 2.0 * jnp.dot(x, y.T, precision=HIGHEST), 0.0)
    return jnp.mean(jnp.exp(-gamma * sq_distances(y))) - 2.0 * jnp.mean(jnp.exp(-gamma * dxy))

  return kxx + jax.vmap(one)(ys)


@jax.jit
def cosine(x: jax.Array, ys: jax.Array) -> jax.Array:
  """``[C]`` cosine similarity of ``vec(x)`` and each ``vec(ys[i])``; NaN when a norm is 0."""
  x, ys = _f32(x), _f32(ys)
  _check_pair(x, ys)
  a = x.reshape(-1)
  b = ys.reshape(ys.shape[0], -1)
  num = jnp.sum(b * a[None], axis=1)
  den = jnp.sqrt(jnp.sum(a * a)) * jnp.sqrt(jnp.sum(b * b, axis=1))
  ok = jnp.isfinite(den) & (den > 0)
  return jnp.where(ok, jnp.clip(num / jnp.where(ok, den, 1.0), -1.0, 1.0), jnp.nan)


@jax.jit
def euclidean(x: jax.Array, ys: jax.Array) -> jax.Array:
  """``[C]`` Euclidean distance ``||vec(x) - vec(ys[i])||`` (computed directly, no cancellation)."""
  x, ys = _f32(x), _f32(ys)
  _check_pair(x, ys)
  return jnp.sqrt(jnp.sum(jnp.square(ys - x[None]), axis=(1, 2)))


# ----------------------------------------------------------------------------------------- registry


class Similarity(NamedTuple):
  """``batched(x [h, p], ys [C, h, p], **params) -> [C]``; ``params``: the keyword parameters it accepts."""

  name: str
  batched: Callable[..., jax.Array]
  higher_is_similar: bool  # False for distances (MMD, Euclidean)
  params: tuple[str, ...] = ()

  def pair(self, x, y, **params) -> jax.Array:
    """The score of one pair of matrices ``x``, ``y`` [h, p] (the batched kernel on a cohort of one)."""
    return self.batched(x, jnp.asarray(y)[None], **params)[0]


SIMILARITIES: dict[str, Similarity] = {
    "kernel_cka": Similarity("kernel_cka", kernel_cka, True, ("sigma", "bandwidth", "debiased")),
    "linear_cka": Similarity("linear_cka", linear_cka, True, ("debiased",)),
    "mmd": Similarity("mmd", mmd, False, ("gamma",)),
    "cosine": Similarity("cosine", cosine, True),
    "euclidean": Similarity("euclidean", euclidean, False),
}


def get_similarity(name: str) -> Similarity:
  if name not in SIMILARITIES:
    raise ValueError(f"unknown similarity {name!r}; known: {sorted(SIMILARITIES)}")
  return SIMILARITIES[name]


def kernel_cka_pair(x, y, **params) -> jax.Array:
  return SIMILARITIES["kernel_cka"].pair(x, y, **params)


def linear_cka_pair(x, y, **params) -> jax.Array:
  return SIMILARITIES["linear_cka"].pair(x, y, **params)
