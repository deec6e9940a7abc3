"""The round engine: padded steps are no-ops, strategies agree, the plain loop agrees, determinism."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust.algorithms.fedavg import make_fedavg, make_local
from fedjax_robust.client import plain_loss, ClientData, LocalTrainSpec, local_train, masked_cross_entropy
from fedjax_robust.data.federated import FederatedData, stack_padded
from fedjax_robust.execution import make_strategy
from fedjax_robust.reference import ReferenceFedAvg
from fedjax_robust.simulation import Simulator


class TinyNet(nn.Module):
  conv: bool = False

  @nn.compact
  def __call__(self, x):
    if self.conv:
      x = nn.relu(nn.Conv(3, (3, 3))(x))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(8)(x))
    return nn.Dense(3)(x)


def make_data(sizes=(7, 12, 3, 9), test_sizes=(4, 2, 5, 3), shape=(4, 4, 1), seed=0) -> FederatedData:
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(n,) + shape).astype(np.float32) for n in sizes]
  ys = [rng.integers(0, 3, size=n).astype(np.int32) for n in sizes]
  xt = [rng.normal(size=(n,) + shape).astype(np.float32) for n in test_sizes]
  yt = [rng.integers(0, 3, size=n).astype(np.int32) for n in test_sizes]
  x_train, n_train = stack_padded(xs)
  y_train, _ = stack_padded(ys)
  x_test, n_test = stack_padded(xt)
  y_test, _ = stack_padded(yt)
  return FederatedData("toy", 3, x_train, y_train, n_train, x_test, y_test, n_test,
                       np.concatenate(xt), np.concatenate(yt))


def setup(conv=False, data=None):
  data = data or make_data()
  model = TinyNet(conv)
  params = model.init(jax.random.key(1), jnp.zeros((1,) + data.feature_shape))["params"]
  apply_fn = lambda p, x: model.apply({"params": p}, x)
  return data, params, apply_fn


def assert_trees_close(a, b, atol=1e-5):
  """Same tree structure (a missing or extra leaf fails) and leaves equal to within atol / rtol 1e-5."""
  assert jax.tree.structure(a) == jax.tree.structure(b), (jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5)


@pytest.mark.parametrize("opt", [optax.sgd(0.1, momentum=0.9), optax.adam(0.01)])
def test_padding_rows_and_padded_steps_are_exact_noops(opt):
  """A client padded to 20 rows trains exactly like the same client stored unpadded."""
  data, params, apply_fn = setup()
  loss_fn = plain_loss(lambda p, x, y, m: masked_cross_entropy(apply_fn(p, x), y, m))
  spec = LocalTrainSpec(epochs=2, batch_size=3)
  x, y, n = data.x_train[0], data.y_train[0], int(data.n_train[0])
  key = jax.random.key(3)
  tight = ClientData(jnp.asarray(x[:n]), jnp.asarray(y[:n]), jnp.int32(n))
  pad = 20 - x.shape[0]
  padded = ClientData(jnp.pad(x, [(0, pad), (0, 0), (0, 0), (0, 0)]), jnp.pad(y, (0, pad)), jnp.int32(n))
  # Different n_max gives a different permutation draw; compare with shuffling off.
  spec = spec._replace(shuffle=False)
  p1, s1, m1, _ = local_train(loss_fn, opt, params, opt.init(params), tight, key, spec)
  p2, s2, m2, _ = local_train(loss_fn, opt, params, opt.init(params), padded, key, spec)
  assert int(m1["steps"]) == int(m2["steps"]) == 2 * 3  # ceil(7/3) = 3 per epoch
  assert_trees_close(p1, p2, atol=1e-6)
  assert_trees_close(s1, s2, atol=1e-6)


def test_client_without_data_changes_nothing():
  data, params, apply_fn = setup()
  opt = optax.adam(0.01)
  loss_fn = plain_loss(lambda p, x, y, m: masked_cross_entropy(apply_fn(p, x), y, m))
  empty = ClientData(jnp.asarray(data.x_train[0]), jnp.asarray(data.y_train[0]), jnp.int32(0))
  state0 = opt.init(params)
  p, s, m, _ = local_train(loss_fn, opt, params, state0, empty, jax.random.key(0), LocalTrainSpec(epochs=3))
  assert int(m["steps"]) == 0
  assert_trees_close(p, params, atol=0)
  assert_trees_close(s, state0, atol=0)  # Adam's step count too


@pytest.mark.parametrize("drop_last, expected", [(False, [3, 4, 1, 3]), (True, [2, 4, 1, 3])])
def test_number_of_local_steps_matches_a_dataloader(drop_last, expected):
  data, params, apply_fn = setup()
  alg = make_fedavg(apply_fn, optax.sgd(0.1), LocalTrainSpec(epochs=1, batch_size=3, drop_last=drop_last))
  sim = Simulator(alg, data, apply_fn)
  prep = sim._prepare(sim.init(params), sim.train)
  out = sim._map_clients(prep)
  # sizes (7, 12, 3, 9), B=3: ceil -> 3,4,1,3; floor -> 2,4,1,3
  assert np.asarray(out.metrics["steps"]).tolist() == expected


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
@pytest.mark.parametrize("conv", [False, True])
def test_strategies_agree_with_the_plain_sequential_loop(conv):
  data, params, apply_fn = setup(conv)
  opt = optax.sgd(0.05, momentum=0.5)
  spec = LocalTrainSpec(epochs=2, batch_size=4, unroll=True)
  alg = make_fedavg(apply_fn, opt, spec)
  finals = {}
  for name in ("vmap", "shard_map", "sequential"):
    sim = Simulator(alg, data, apply_fn, make_strategy(name), cohort_size=3)
    state = sim.init(params, seed=7)
    for _ in range(2):
      state, _ = sim.run_round(state)
    finals[name] = state.server.params
  ref = ReferenceFedAvg(apply_fn, opt, spec, data, cohort_size=3)
  p = params
  for t in range(2):
    p = ref.run_round(p, jax.random.key(7), t)
  for name, final in finals.items():
    assert_trees_close(final, p, atol=2e-5)


def test_shard_map_pads_cohorts_that_do_not_divide_the_devices():
  assert jax.device_count() == 4
  data, params, apply_fn = setup()
  alg = make_fedavg(apply_fn, optax.sgd(0.1), LocalTrainSpec(epochs=1, batch_size=4))
  a = Simulator(alg, data, apply_fn, make_strategy("shard_map"), cohort_size=3)
  b = Simulator(alg, data, apply_fn, make_strategy("vmap"), cohort_size=3)
  sa, _ = a.run_round(a.init(params))
  sb, _ = b.run_round(b.init(params))
  assert_trees_close(sa.server.params, sb.server.params)
  assert a.evaluate(sa)["client_acc"] == pytest.approx(b.evaluate(sb)["client_acc"])


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_fedprox_with_mu_zero_is_fedavg_and_mu_pulls_towards_the_global_model():
  data, params, apply_fn = setup()
  spec = LocalTrainSpec(epochs=3, batch_size=4)
  run = {}
  for mu in (0.0, 0.0001, 10.0):
    alg = make_fedavg(apply_fn, optax.sgd(0.1), spec, mu=mu)
    sim = Simulator(alg, data, apply_fn)
    state, _ = sim.run_round(sim.init(params))
    run[mu] = state.server.params
  plain = make_fedavg(apply_fn, optax.sgd(0.1), spec)
  sim = Simulator(plain, data, apply_fn)
  state, _ = sim.run_round(sim.init(params))
  assert_trees_close(run[0.0], state.server.params, atol=0)
  dist = lambda p: sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params)))
  assert dist(run[10.0]) < dist(run[0.0])
  ref = ReferenceFedAvg(apply_fn, optax.sgd(0.1), spec, data, mu=10.0)
  assert_trees_close(run[10.0], ref.run_round(params, jax.random.key(0), 0))


def test_same_seed_same_metrics_different_seed_different_metrics():
  data, params, apply_fn = setup()
  alg = make_fedavg(apply_fn, optax.sgd(0.1), LocalTrainSpec(epochs=1, batch_size=4))

  def run(seed):
    sim = Simulator(alg, data, apply_fn, cohort_size=2)
    state = sim.init(params, seed=seed)
    losses = []
    for _ in range(3):
      state, m = sim.run_round(state)
      losses.append(float(m["train_loss"]))
    return losses, jax.tree.leaves(state.server.params)

  (l1, p1), (l2, p2), (l3, _) = run(0), run(0), run(1)
  assert l1 == l2
  assert all(np.array_equal(a, b) for a, b in zip(p1, p2))
  assert l1 != l3


def test_server_momentum_is_fedavgm():
  data, params, apply_fn = setup()
  spec = LocalTrainSpec(epochs=1, batch_size=4)
  sims = {}
  for beta in (0.0, 0.9):
    alg = make_fedavg(apply_fn, optax.sgd(0.1), spec, server_opt=optax.sgd(1.0, momentum=beta or None))
    sim = Simulator(alg, data, apply_fn)
    state = sim.init(params)
    state, _ = sim.run_round(state)
    sims[beta] = (sim, state)
  # After one round momentum is only the first gradient: identical.
  assert_trees_close(sims[0.0][1].server.params, sims[0.9][1].server.params, atol=1e-6)
  s0, _ = sims[0.0][0].run_round(sims[0.0][1])
  s9, _ = sims[0.9][0].run_round(sims[0.9][1])
  diff = sum(float(jnp.abs(a - b).sum()) for a, b in zip(jax.tree.leaves(s0.server.params),
                                                          jax.tree.leaves(s9.server.params)))
  assert diff > 1e-4


def test_local_training_keeps_clients_apart():
  data, params, apply_fn = setup()
  alg = make_local(apply_fn, optax.sgd(0.1), LocalTrainSpec(epochs=1, batch_size=4))
  sim = Simulator(alg, data, apply_fn, cohort_size=2)
  state = sim.init(params)
  state, _ = sim.run_round(state)
  trained = [k for k in range(4) if not np.allclose(
      np.asarray(jax.tree.leaves(state.clients["params"])[0][k]), np.asarray(jax.tree.leaves(params)[0]))]
  assert len(trained) == 2  # only the sampled cohort changed
  metrics = sim.evaluate(state)
  assert "global_test_acc" not in metrics and len(metrics["client_acc"]) == 4


def test_fedavg_ft_evaluates_finetuned_models():
  data, params, apply_fn = setup()
  spec = LocalTrainSpec(epochs=1, batch_size=4)
  plain = Simulator(make_fedavg(apply_fn, optax.sgd(0.1), spec), data, apply_fn)
  ft = Simulator(make_fedavg(apply_fn, optax.sgd(0.1), spec, finetune_epochs=5, ft_mode="finetune"), data, apply_fn)
  s1, _ = plain.run_round(plain.init(params))
  s2, _ = ft.run_round(ft.init(params))
  m1, m2 = plain.evaluate(s1), ft.evaluate(s2)
  assert m1["global_test_acc"] == m2["global_test_acc"]  # same global model
  assert m1["client_acc"] != m2["client_acc"]  # but a different per-client model


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_fedavg_ft_last_local_scores_each_clients_last_trained_model():
  """FedCAP's FedAvg-FT: a client is scored with the model it trained in its last round; unsampled ones keep init."""
  data, params, apply_fn = setup()
  spec = LocalTrainSpec(epochs=1, batch_size=4)
  alg = make_fedavg(apply_fn, optax.sgd(0.1), spec, ft_mode="last_local")
  sim = Simulator(alg, data, apply_fn, cohort_size=2)
  state = sim.init(params)
  prep = sim._prepare(state, sim.train)
  out = sim._map_clients(prep)
  state, _ = sim.run_round(state)
  cohort = np.asarray(prep.cohort)
  for i, k in enumerate(cohort):
    trained = jax.tree.map(lambda d, p: p + d[i], out.upload["delta"], params)
    assert_trees_close(jax.tree.map(lambda a: a[k], state.clients["params"]), trained, atol=1e-6)
  other = next(k for k in range(4) if k not in cohort)
  assert_trees_close(jax.tree.map(lambda a: a[other], state.clients["params"]), params, atol=0)
  m = sim.evaluate(state)
  by_hand = [np.mean(np.argmax(np.asarray(apply_fn(jax.tree.map(lambda a: a[k], state.clients["params"]),
                                                   data.x_test[k, : data.n_test[k]])), -1)
                     == data.y_test[k, : data.n_test[k]]) for k in range(4)]
  np.testing.assert_allclose(m["client_acc"], by_hand)


def test_evaluation_counts_by_hand():
  data, params, apply_fn = setup()
  sim = Simulator(make_fedavg(apply_fn, optax.sgd(0.1), LocalTrainSpec()), data, apply_fn, eval_batch_size=2)
  m = sim.evaluate(sim.init(params))
  preds = [np.argmax(np.asarray(apply_fn(params, data.x_test[k, : data.n_test[k]])), -1) for k in range(4)]
  correct = np.array([np.sum(p == data.y_test[k, : data.n_test[k]]) for k, p in enumerate(preds)])
  np.testing.assert_allclose(m["client_acc"], correct / data.n_test)
  assert m["client_acc_weighted"] == pytest.approx(correct.sum() / data.n_test.sum())
  glob = np.argmax(np.asarray(apply_fn(params, data.x_global_test)), -1)
  assert m["global_test_acc"] == pytest.approx(np.mean(glob == data.y_global_test))


def test_fedadam_is_a_config_away():
  """Server Adam on the pseudo-gradient -Δ (Reddi et al. 2021): first step moves each weight by ~lr·sign(Δ)."""
  from fedjax_robust.optim import make_optimizer
  data, params, apply_fn = setup()
  spec = LocalTrainSpec(epochs=1, batch_size=4)
  alg = make_fedavg(apply_fn, optax.sgd(0.1), spec, server_opt=make_optimizer("adam", 0.01, eps=1e-12))
  plain = make_fedavg(apply_fn, optax.sgd(0.1), spec)
  s_adam, _ = Simulator(alg, data, apply_fn).run_round(Simulator(alg, data, apply_fn).init(params))
  sim = Simulator(plain, data, apply_fn)
  s_avg, _ = sim.run_round(sim.init(params))
  for p0, pa, pv in zip(jax.tree.leaves(params), jax.tree.leaves(s_adam.server.params),
                        jax.tree.leaves(s_avg.server.params)):
    delta = np.asarray(pv - p0)
    moved = np.asarray(pa - p0)
    big = np.abs(delta) > 1e-6
    np.testing.assert_allclose(moved[big], 0.01 * np.sign(delta[big]), rtol=1e-3)


def test_global_model_is_also_scored_on_client_splits():
  data, params, apply_fn = setup()
  sim = Simulator(make_fedavg(apply_fn, optax.sgd(0.1), LocalTrainSpec(), ft_mode="last_local"), data, apply_fn,
                  malicious=np.array([False, True, False, False]))
  m = sim.evaluate(sim.init(params))
  preds = [np.argmax(np.asarray(apply_fn(params, data.x_test[k, : data.n_test[k]])), -1) for k in range(4)]
  correct = np.array([np.sum(p == data.y_test[k, : data.n_test[k]]) for k, p in enumerate(preds)])
  assert m["global_client_acc_weighted"] == pytest.approx(correct.sum() / data.n_test.sum())
  benign = [0, 2, 3]
  assert m["global_benign_acc_weighted"] == pytest.approx(correct[benign].sum() / data.n_test[benign].sum())
  assert m["benign_acc_weighted"] == pytest.approx(correct[benign].sum() / data.n_test[benign].sum())  # init models


def test_benign_train_loss_ignores_a_diverged_attacker():
  """The round's ``benign_train_loss`` averages the benign cohort only: with Local training (nothing shared), an
  attacker whose own training is NaN leaves it bitwise unchanged, while ``train_loss`` turns NaN."""
  data, params, apply_fn = setup()
  mal = np.array([False, True, False, False])
  alg = make_local(apply_fn, optax.sgd(0.1), LocalTrainSpec(epochs=1, batch_size=4))

  def first_round_metrics(d):
    sim = Simulator(alg, d, apply_fn, malicious=mal)
    return sim.run_round(sim.init(params))[1]

  x = np.array(data.x_train)
  x[1] = np.nan
  clean, diverged = first_round_metrics(data), first_round_metrics(dataclasses.replace(data, x_train=x))
  assert np.isnan(float(diverged["train_loss"]))
  assert float(diverged["benign_train_loss"]) == float(clean["benign_train_loss"])
  assert float(clean["benign_train_loss"]) != pytest.approx(float(clean["train_loss"]), abs=1e-6)
