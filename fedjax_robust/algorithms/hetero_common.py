"""Shared pieces of the heterogeneity-tolerant baselines: SCAFFOLD, FedDyn, FedNova, FedDC (spec fedvsa.md §3).

* :func:`linear_term`: ``<a, w>`` as a loss term whose VALUE is 0 and whose gradient is exactly ``a``. The
  control-variate corrections (SCAFFOLD's ``c - c_i``, FedDyn's ``-∇L_k(θ_k^{t-1})``, FedDC's ``c - c_i``) only
  shift the local gradient; written this way they do so exactly, and the logged ``train_loss`` stays the data loss
  (plus the proximal term, as FedProx's), comparable across algorithms.
* :func:`aggregate_deltas`: the server half of :func:`~fedjax_robust.algorithms.fedavg.make_fedavg` up to the
  rule's result: the round context with what the rule declares in ``needs`` (FLTrust's reference update is plain
  cross-entropy training on the server data from the broadcast model with the clients' optimizer and schedule, as
  FedAvg's), then ``aggregator.aggregate``. The rule's effective weights then average every other per-client
  quantity (:func:`weighted_rows`), so a client a robust rule excludes moves nothing.
* :func:`included_count`: how many clients the rule kept (effective weight > 0), the ``|S|`` of the papers'
  ``|S|/N`` factors.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators import Aggregator
from fedjax_robust.aggregators.base import AggregateResult, combine
from fedjax_robust.algorithms.fedavg import classification_loss, tree_sub
from fedjax_robust.client import LocalTrainSpec, local_train
from fedjax_robust.models.interface import Model, merge_variables
from fedjax_robust.round_context import RoundContext, compute_needs

PyTree = Any


def tree_dot(a: PyTree, b: PyTree) -> jax.Array:
  return sum(jnp.sum(x * y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def linear_term(coeff: PyTree, params: PyTree) -> jax.Array:
  """``<coeff, w - stop_gradient(w)>``: exactly 0 in value, gradient exactly ``coeff`` (no gradient to ``coeff``)."""
  coeff = jax.lax.stop_gradient(coeff)
  return sum(jnp.sum(c * (p - jax.lax.stop_gradient(p))) for c, p in zip(jax.tree.leaves(coeff),
                                                                           jax.tree.leaves(params)))


def server_model(state) -> PyTree:
  """The broadcast model of a server state with ``params`` and ``model_state``: variables with BatchNorm state,
  bare params without."""
  return merge_variables(state.params, state.model_state) if state.model_state else state.params


def zeros_like_tree(tree: PyTree) -> PyTree:
  return jax.tree.map(jnp.zeros_like, tree)


def included_count(coeffs: jax.Array) -> jax.Array:
  """Number of clients with an effective weight > 0 (float32)."""
  return jnp.sum(coeffs > 0).astype(jnp.float32)


def weighted_rows(coeffs: jax.Array, stacked: PyTree) -> PyTree:
  """``Σ_i coeffs[i] x_i`` over the leading client axis, with the rows of zero-weight clients zeroed first (an
  excluded client's non-finite row never reaches the sum: ``0 · nan = nan``)."""
  c = coeffs.shape[0]
  keep = coeffs > 0
  clean = jax.tree.map(lambda a: jnp.where(keep.reshape((c,) + (1,) * (a.ndim - 1)), a, 0.0), stacked)
  return combine(jnp.where(keep, coeffs, 0.0), clean)


def aggregate_deltas(aggregator: Aggregator, model: Model, client_opt: optax.GradientTransformation,
                     spec: LocalTrainSpec, global_params: PyTree, model_state: dict, deltas: PyTree,
                     weights: jax.Array, key: jax.Array, context: Optional[RoundContext] = None) -> AggregateResult:
  """The rule's aggregate of the uploaded ``deltas`` ``[C, ...]`` (each relative to ``global_params``, the model
  the cohort received), with the round context the rule declares it needs."""
  root_key, agg_key = jax.random.split(key)

  def reference_update(gp, server_data):
    trained = local_train(classification_loss(model), client_opt, gp, client_opt.init(gp), server_data, root_key,
                          spec, model_state)
    return tree_sub(trained.params, gp)

  features_fn = None
  if model.features is not None:
    features_fn = lambda p, x: model.features(merge_variables(p, model_state), x)
  if context is None:  # called directly (tests)
    c = weights.shape[0]
    context = RoundContext(jnp.zeros((), jnp.int32), jnp.arange(c), jnp.zeros((c,), bool), weights)
  context = context._replace(global_params=global_params)
  context = compute_needs(aggregator.needs, context, deltas, features_fn=features_fn,
                          penultimate=getattr(model.module, "penultimate", None), reference_update=reference_update)
  return aggregator.aggregate(deltas, weights, jnp.ones(weights.shape, bool), agg_key, context)
