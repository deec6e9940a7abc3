"""Plain sequential FedAvg and FedCAP, written the way today's PyTorch FL code is written.

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
from jax.flatten_util import ravel_pytree

from fedjax_robust.client import LocalTrainSpec, epoch_permutations, masked_cross_entropy, steps_per_epoch
from fedjax_robust.compilation import jit
from fedjax_robust.models.interface import as_model, stateless_apply
from fedjax_robust.simulation import round_keys, sample_cohort

PyTree = Any


def _squared_distance(a: PyTree, b: PyTree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def client_batches(x: np.ndarray, y: np.ndarray, n: int, spec: LocalTrainSpec, key: jax.Array):
  """One client's mini-batches ``(x_b, y_b)`` over its ``spec.epochs`` epochs, in the engine's order for ``key``
  (a short last batch unless ``drop_last``); ``x``, ``y`` are its padded rows."""
  order = np.asarray(epoch_permutations(key, n, x.shape[0], spec.epochs, spec.shuffle))
  for epoch in range(spec.epochs):
    for b in range(steps_per_epoch(n, spec.batch_size, spec.drop_last)):
      idx = order[epoch, b * spec.batch_size: min((b + 1) * spec.batch_size, n)]
      yield x[idx], y[idx]


class ReferenceFedAvg:
  """Sequential FedAvg / FedProx with plain server averaging (``w ← w + Σ n_k Δ_k / Σ n_k``)."""

  def __init__(self, apply_fn: Any, client_opt: optax.GradientTransformation, spec: LocalTrainSpec, data,
               cohort_size: int | None = None, mu: float = 0.0):
    apply_fn = stateless_apply(as_model(apply_fn), "the reference FedAvg loop")
    self.client_opt, self.spec, self.mu = client_opt, spec, mu
    self.x, self.y, self.n = np.asarray(data.x_train), np.asarray(data.y_train), np.asarray(data.n_train)
    self.num_clients = len(self.n)
    self.cohort_size = cohort_size or self.num_clients

    def loss_fn(params, anchor, x, y):
      loss = masked_cross_entropy(apply_fn(params, x), y, jnp.ones(y.shape[0]))
      if mu:
        loss += 0.5 * mu * _squared_distance(params, anchor)
      return loss

    @jit
    def sgd_step(params, opt_state, anchor, x, y):
      loss, grads = jax.value_and_grad(loss_fn)(params, anchor, x, y)
      updates, opt_state = client_opt.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    self._step = sgd_step

  def local_update(self, params: PyTree, client: int, key: jax.Array) -> PyTree:
    """One client's local epochs, batch by batch; returns its trained params."""
    anchor, local, opt_state = params, params, self.client_opt.init(params)
    for x, y in client_batches(self.x[client], self.y[client], int(self.n[client]), self.spec, key):
      local, opt_state, _ = self._step(local, opt_state, anchor, x, y)
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


class ReferenceFedCAP:
  """Sequential FedCAP, written the way the official PyTorch artifact is: a loop over
  clients, a loop over mini-batches with two jitted steps per batch (the prox step on ``v_k``, then the plain
  step on the local copy of ``ŵ_k``), and the server's pools as per-client dictionaries (``specs/fedcap.md`` §1).

  It shares no code with :mod:`fedjax_robust.algorithms.fedcap` beyond the batch order and the key schedule, so
  it is the independent check of the vectorized algorithm (``tests/test_fedcap.py``) and the sequential baseline
  of ``benchmarks/rounds_per_second.py --algorithm fedcap``. ``upload_transform`` is the simulator's attack hook
  ``(uploads, cohort, key, context) -> uploads`` on ``{"delta": stacked uploads}``.

  ``cohort_size`` < K gives partial participation (the engine's cohort draw), and ``request_updates`` lets a
  participant outside the pool customize from a request update trained from the pool's calibration reference
  w^{t-1} (spec §1.4, §1.6; honest requests only).
  """

  def __init__(self, apply_fn: Any, client_opt: optax.GradientTransformation, spec: LocalTrainSpec, data,
               alpha: float = 10.0, phi: float = 0.3, lamda: float = 0.1, norm_threshold: float = 10.0,
               upload_transform: Callable | None = None, cohort_size: int | None = None,
               request_updates: bool = False):
    apply_fn = stateless_apply(as_model(apply_fn), "the reference FedCAP loop")
    self.client_opt, self.spec = client_opt, spec
    self.request_updates = request_updates
    self.alpha, self.phi, self.norm_threshold = float(alpha), float(phi), float(norm_threshold)
    self.upload_transform = upload_transform
    self.x, self.y, self.n = np.asarray(data.x_train), np.asarray(data.y_train), np.asarray(data.n_train)
    self.num_clients = len(self.n)
    self.cohort_size = cohort_size or self.num_clients

    def ce(params, x, y):
      return masked_cross_entropy(apply_fn(params, x), y, jnp.ones(y.shape[0]))

    def personal_loss(v, anchor, x, y):  # Eq. 7: F_k(v) + λ/2 ||v - ŵ_k||², ŵ_k frozen
      return ce(v, x, y) + 0.5 * lamda * _squared_distance(v, anchor)

    def make_step(loss_fn):
      @jit
      def step(params, opt_state, *args):
        grads = jax.grad(loss_fn)(params, *args)
        updates, opt_state = client_opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
      return step

    self._personal_step = make_step(personal_loss)
    self._plain_step = make_step(ce)

  def init(self, params: PyTree) -> dict:
    flat, unravel = ravel_pytree(params)
    flat = np.asarray(flat, np.float64)
    # "reference": the model the pool's calibrated updates are relative to (w^{t-1}); w^0 before round 1
    return {"global": flat, "reference": flat, "unravel": unravel, "pool_models": {}, "pool_updates": {},
            "removed_round": {}, "v": [params] * self.num_clients, "round": 0}

  def customized(self, state: dict, k: int, request: np.ndarray | None = None) -> np.ndarray:
    """ŵ_k (Eqs. 3-5): for a pool member, φ on its own recovered model and 1 - φ on the softmax of α·cos over the
    other members; for a client outside the pool with a request update r_k, the softmax over the whole pool."""
    models, updates = state["pool_models"], state["pool_updates"]
    if k in models:
      others, r, self_weight = [i for i in sorted(models) if i != k], updates[k], self.phi
      if not others:
        return models[k]
    elif request is not None and models:
      others, r, self_weight = sorted(models), request, 0.0
    else:
      return state["global"]
    cos = np.array([r @ updates[i] / (np.linalg.norm(r) * np.linalg.norm(updates[i])) for i in others])
    logits = self.alpha * np.where(np.isfinite(cos), cos, -1.0)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    own = self_weight * models[k] if self_weight else 0.0
    return own + (1.0 - self_weight) * sum(pi * models[i] for pi, i in zip(p, others))

  def request_update(self, state: dict, k: int, key: jax.Array) -> np.ndarray:
    """r_k = SGD_E(w^{t-1}) - w^{t-1}: E epochs of plain SGD from the pool's calibration reference (spec §1.4)."""
    reference = state["unravel"](jnp.asarray(state["reference"], jnp.float32))
    w, opt = reference, self.client_opt.init(reference)
    request_key, _ = jax.random.split(key)  # the algorithm's request key / train key split
    for x, y in client_batches(self.x[k], self.y[k], int(self.n[k]), self.spec, request_key):
      w, opt = self._plain_step(w, opt, x, y)
    return np.asarray(ravel_pytree(w)[0], np.float64) - np.asarray(ravel_pytree(reference)[0], np.float64)

  def local_update(self, state: dict, k: int, customized: np.ndarray, key: jax.Array):
    """Client k's E epochs: per batch one prox step on v_k toward ŵ_k, then one plain step on w; returns (v, w)."""
    anchor = state["unravel"](jnp.asarray(customized, jnp.float32))
    v, w = state["v"][k], anchor
    v_opt, w_opt = self.client_opt.init(v), self.client_opt.init(w)
    _, train_key = jax.random.split(key)  # the algorithm's request key / train key split
    for x, y in client_batches(self.x[k], self.y[k], int(self.n[k]), self.spec, train_key):
      v, v_opt = self._personal_step(v, v_opt, anchor, x, y)
      w, w_opt = self._plain_step(w, w_opt, x, y)
    return v, w

  def run_round(self, state: dict, run_key: jax.Array) -> dict:
    cohort_key, client_key, aux_key, _ = round_keys(run_key, state["round"])
    clients = [int(c) for c in np.asarray(sample_cohort(cohort_key, self.num_clients, self.cohort_size))]
    sent, deltas, vs = {}, [], list(state["v"])
    for k in clients:
      key = jax.random.fold_in(client_key, k)
      outside = self.request_updates and k not in state["pool_models"]
      sent[k] = self.customized(state, k, self.request_update(state, k, key) if outside else None)
      vs[k], w = self.local_update(state, k, sent[k], key)
      deltas.append(np.asarray(ravel_pytree(w)[0], np.float64) - sent[k])  # d_k = w - ŵ_k
    if self.upload_transform is not None:
      unravel = state["unravel"]
      stacked = jax.vmap(unravel)(jnp.asarray(np.stack(deltas), jnp.float32))
      context = {"global_params": unravel(jnp.asarray(state["global"], jnp.float32)),
                 "weights": jnp.asarray(self.n[clients], jnp.float32), "round": state["round"]}
      poisoned = self.upload_transform({"delta": stacked}, jnp.asarray(clients), aux_key, context)["delta"]
      deltas = list(np.asarray(jax.vmap(lambda d: ravel_pytree(d)[0])(poisoned), np.float64))
    removed_round = dict(state["removed_round"])
    pool_models, pool_updates = {}, {}
    for k, delta in zip(clients, deltas):
      recovered = sent[k] + delta  # w̃_k = ŵ_k + d_k, with the server's own record of ŵ_k
      calibrated = recovered - state["global"]  # d̃_k = w̃_k - w^t
      if not np.linalg.norm(calibrated) <= self.norm_threshold:  # strictly greater, or NaN: removed for good
        removed_round.setdefault(k, state["round"] + 1)
      if k not in removed_round:
        pool_models[k], pool_updates[k] = recovered, calibrated
    new_global = state["global"]
    if pool_models:  # Eq. 6: sample-weighted mean of the pool's recovered models
      total = sum(float(self.n[k]) for k in pool_models)
      new_global = sum(float(self.n[k]) / total * m for k, m in pool_models.items())
    # the pool just stored is calibrated against this round's global model: the next round's request reference
    return {**state, "global": new_global, "reference": state["global"], "pool_models": pool_models,
            "pool_updates": pool_updates, "removed_round": removed_round, "v": vs, "round": state["round"] + 1}
