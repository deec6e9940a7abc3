"""Weighted mean of stacked client updates (FedAvg, McMahan et al. 2017, Alg. 1)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def weighted_mean(updates: PyTree, weights: jax.Array) -> PyTree:
  """``sum_i w_i u_i / sum_i w_i`` over the leading client axis of every leaf.

  Weights are typically sample counts ``n_i``; a client with weight 0 does not
  count. If every weight is 0 the result is 0 (no update), never NaN.
  """
  weights = jnp.asarray(weights, jnp.float32)
  total = jnp.sum(weights)
  scale = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)

  def combine(u):
    return jnp.tensordot(scale.astype(u.dtype), u, axes=1)

  return jax.tree.map(combine, updates)
