"""A plain sequential FedAvg, written the way today's PyTorch FL code is written.

A Python loop over clients and over mini-batches, one jitted SGD step per
batch, batches gathered on the host. It is the independent reference the
vectorized engine is tested against (same keys, so the same shuffles and
cohorts: ``tests/test_engine.py``) and the "sequential baseline" of
``benchmarks/rounds_per_second.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_robust.client import LocalTrainSpec, epoch_permutations, masked_cross_entropy, steps_per_epoch
from fedjax_robust.simulation import round_keys, sample_cohort

PyTree = Any


class ReferenceFedAvg:
  """Sequential FedAvg / FedProx with plain server averaging (``w ← w + Σ n_k Δ_k / Σ n_k``)."""

  def __init__(self, apply_fn: Callable, client_opt: optax.GradientTransformation, spec: LocalTrainSpec, data,
               cohort_size: int | None = None, mu: float = 0.0):
    self.client_opt, self.spec, self.mu = client_opt, spec, mu
    self.x, self.y, self.n = np.asarray(data.x_train), np.asarray(data.y_train), np.asarray(data.n_train)
    self.num_clients = len(self.n)
    self.cohort_size = cohort_size or self.num_clients

    def loss_fn(params, anchor, x, y):
      loss = masked_cross_entropy(apply_fn(params, x), y, jnp.ones(y.shape[0]))
      if mu:
        loss += 0.5 * mu * sum(jnp.sum(jnp.square(a - b)) for a, b in
                               zip(jax.tree.leaves(params), jax.tree.leaves(anchor)))
      return loss

    @jax.jit
    def sgd_step(params, opt_state, anchor, x, y):
      loss, grads = jax.value_and_grad(loss_fn)(params, anchor, x, y)
      updates, opt_state = client_opt.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    self._step = sgd_step

  def local_update(self, params: PyTree, client: int, key: jax.Array) -> PyTree:
    """One client's local epochs, batch by batch; returns its trained params."""
    n, spec = int(self.n[client]), self.spec
    order = np.asarray(epoch_permutations(key, n, self.x.shape[1], spec.epochs, spec.shuffle))
    anchor, local, opt_state = params, params, self.client_opt.init(params)
    for epoch in range(spec.epochs):
      for b in range(steps_per_epoch(n, spec.batch_size, spec.drop_last)):
        idx = order[epoch, b * spec.batch_size: min((b + 1) * spec.batch_size, n)]
        local, opt_state, _ = self._step(local, opt_state, anchor, self.x[client, idx], self.y[client, idx])
    return local

  def run_round(self, params: PyTree, run_key: jax.Array, round_index: int) -> PyTree:
    cohort_key, client_key, _, _ = round_keys(run_key, round_index)
    cohort = np.asarray(sample_cohort(cohort_key, self.num_clients, self.cohort_size))
    total = float(self.n[cohort].sum())
    new = jax.tree.map(jnp.zeros_like, params)
    for c in cohort:
      local = self.local_update(params, int(c), jax.random.fold_in(client_key, int(c)))
      w = float(self.n[c]) / total
      new = jax.tree.map(lambda acc, l, p: acc + w * (l - p), new, local, params)
    return jax.tree.map(jnp.add, params, new)
