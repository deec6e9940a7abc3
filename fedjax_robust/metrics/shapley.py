"""Shapley values of a cooperative game played by a cohort's clients (FedVSA spec §1.6, Eq. 13).

A *game* gives a utility ``v(z)`` to every coalition ``z ∈ {0,1}^m`` (here: the accuracy of the model the
coalition's uploads would aggregate to). Evaluating ``v`` is the expensive part, so both estimators are split
into (1) the coalitions to evaluate, as static boolean masks, which the caller scores all at once with a batched
many-model kernel, and (2) a cheap combination of the values:

* exact enumeration: :func:`all_coalitions` (``2^m`` masks, bit ``k`` of row ``i`` = ``(i >> k) & 1``), then
  :func:`exact_shapley`, ``φ_k = Σ_{z ∌ k} |z|!(m-|z|-1)!/m! · (v(z ∪ {k}) − v(z))``;
* truncated Monte-Carlo (Ghorbani & Zou 2019, "Extended-TMC-Shapley" of the paper):
  :func:`permutation_prefixes` (``P`` random orders, each with its ``m + 1`` prefixes), then :func:`tmc_shapley`,
  which walks each order, credits each client the change it brings, and stops evaluating an order (credits 0)
  once the prefix is within ``tol`` of ``v(all)``. With ``tol = 0`` nothing is truncated and every order's credits
  sum to ``v(all) − v(∅)`` exactly.

The paper's ``C_k`` (Eq. 13, no ``1/m``) is ``m · φ_k``; only its sign is used for flagging, so ``φ`` is reported.
Clients absent from every coalition (slots of a static cohort that were not aggregated) are null players: their
``φ`` is 0 and, by the null-player property, the others' values are those of the game without them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def all_coalitions(m: int) -> np.ndarray:
  """``[2^m, m]`` bool: row ``i`` is the coalition whose members are the set bits of ``i``."""
  if not 0 <= m <= 20:
    raise ValueError(f"exact Shapley enumerates 2^m coalitions; m={m} is outside [0, 20]")
  ids = np.arange(2 ** m)
  return ((ids[:, None] >> np.arange(m)[None, :]) & 1).astype(bool)


def _exact_tables(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """For each player k: the indices of coalitions without k, the same with k added, and their Shapley weights."""
  ids = np.arange(2 ** m)
  sizes = np.array([bin(i).count("1") for i in ids])
  without, with_k, weight = [], [], []
  for k in range(m):
    z = ids[(ids >> k) & 1 == 0]
    without.append(z)
    with_k.append(z | (1 << k))
    s = sizes[z]
    weight.append(np.array([math.factorial(int(a)) * math.factorial(m - int(a) - 1) for a in s]) / math.factorial(m))
  return np.stack(without), np.stack(with_k), np.stack(weight).astype(np.float64)


def exact_shapley(values: jax.Array) -> jax.Array:
  """Shapley values ``[m]`` from the utilities ``[2^m]`` of :func:`all_coalitions`' rows (in that order)."""
  size = int(values.shape[0])
  m = size.bit_length() - 1
  if 2 ** m != size:
    raise ValueError(f"exact_shapley needs 2^m values, got {size}")
  if m == 0:
    return jnp.zeros((0,), values.dtype)
  without, with_k, weight = _exact_tables(m)
  gains = values[with_k] - values[without]  # [m, 2^(m-1)]
  return jnp.sum(jnp.asarray(weight, values.dtype) * gains, axis=1)


def permutation_prefixes(key: jax.Array, m: int, permutations: int) -> tuple[jax.Array, jax.Array]:
  """``P`` uniformly random orders of ``m`` players and their prefixes.

  Returns ``(orders [P, m] int32, prefixes [P, m + 1, m] bool)``: ``prefixes[p, j]`` holds the first ``j`` players
  of order ``p`` (``j = 0`` is the empty coalition, ``j = m`` everyone)."""
  if permutations < 1:
    raise ValueError(f"TMC-Shapley needs at least one permutation, got {permutations}")
  keys = jax.random.split(key, permutations)
  orders = jax.vmap(lambda k: jax.random.permutation(k, m))(keys).astype(jnp.int32)
  position = jnp.argsort(orders, axis=1)  # position[p, k]: where player k stands in order p
  prefixes = position[:, None, :] < jnp.arange(m + 1)[None, :, None]
  return orders, prefixes


def tmc_shapley(orders: jax.Array, prefix_values: jax.Array, tol: float = 0.0) -> jax.Array:
  """Truncated Monte-Carlo Shapley values ``[m]``.

  ``orders``: ``[P, m]`` from :func:`permutation_prefixes`; ``prefix_values``: ``[P, m + 1]`` utilities of its
  prefixes (column 0 = ``v(∅)``, column ``m`` = ``v(all)``). Along each order, once ``|v(all) − v_prev| < tol``
  the remaining players get no credit (their prefixes count as unevaluated), as in Ghorbani & Zou's Alg. 1.
  """
  p, m = orders.shape
  v_full = prefix_values[:, -1]

  def walk(carry, j):
    v_prev = carry
    truncated = jnp.abs(v_full - v_prev) < tol
    v_new = jnp.where(truncated, v_prev, prefix_values[:, j + 1])
    return v_new, v_new - v_prev

  _, credit = jax.lax.scan(walk, prefix_values[:, 0], jnp.arange(m))  # credit[j, p]: order p's j-th player
  phi = jnp.zeros((m,), prefix_values.dtype).at[orders.T.reshape(-1)].add(credit.reshape(-1))
  return phi / p
