"""Weighted mean of stacked client updates (FedAvg, McMahan et al. 2017, Alg. 1)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import KEPT_MEAN, Aggregator, combine, finish, normalize, prepare

PyTree = Any


def weighted_mean(updates: PyTree, weights: jax.Array) -> PyTree:
  """``sum_i w_i u_i / sum_i w_i`` over the leading client axis of every leaf.

  Weights are typically sample counts ``n_i``; a client with weight 0 does not
  count. If every weight is 0 the result is 0 (no update), never NaN.
  (This is the bare FedAvg kernel: it does NOT screen non-finite uploads; the
  ``mean`` :class:`Aggregator` below does.)
  """
  weights = jnp.asarray(weights, jnp.float32)
  total = jnp.sum(weights)
  scale = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)

  def combine_leaf(u):
    return jnp.tensordot(scale.astype(u.dtype), u, axes=1)

  return jax.tree.map(combine_leaf, updates)


def make_mean(weighted: bool = True, num_clients=None) -> Aggregator:
  """Mean of the valid uploads: sample-weighted (FedAvg) or uniform (``weighted=False``, FedCC's FedAvg, spec §3).

  Unlike :func:`weighted_mean`, it excludes (and flags) non-finite uploads and
  masked-out clients, so one NaN upload cannot turn the global model into NaN.
  """
  del num_clients

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    coeffs = normalize(p.weights if weighted else p.valid.astype(jnp.float32))
    return finish(p, combine(coeffs, p.updates), coeffs)

  return Aggregator("mean", aggregate, averaging=KEPT_MEAN)
