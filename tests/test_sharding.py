"""Sharding of the client axis under ``shard_map`` (issue 28, section 7).

Four forced host devices come from ``tests/conftest.py`` (``XLA_FLAGS`` is set
there before JAX starts). Checked here: ``place_clients`` shards a population's
leading client axis with ``NamedSharding(mesh, P('clients'))`` (each device
holds ``K / devices`` rows), ``place_replicated`` replicates; a cohort that
does not divide the devices is padded with masked slots (clients with no data,
never copies of client 0) and still equals ``vmap``; and a jitted round —
gather from sharded client state, ``shard_map``, scatter back — gives ``vmap``'s
numbers.
"""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding

from fedjax_robust import flat_random
from fedjax_robust.algorithms.fedavg import make_fedavg
from fedjax_robust.client import plain_loss, ClientData, LocalTrainSpec, local_train, masked_cross_entropy
from fedjax_robust.data.federated import FederatedData, stack_padded
from fedjax_robust.execution import CLIENT_AXIS, make_strategy
from fedjax_robust.simulation import Simulator

NUM_DEVICES = 4


@pytest.fixture(scope="module")
def shard():
  assert jax.device_count() == NUM_DEVICES, "tests/conftest.py forces 4 host devices before JAX starts"
  return make_strategy("shard_map")


def client_data(sizes, n_max=6, dim=3, seed=0) -> ClientData:
  """Clients with ``sizes[i]`` real rows (all nonzero features), padded to ``n_max``."""
  rng = np.random.default_rng(seed)
  x = np.zeros((len(sizes), n_max, dim), np.float32)
  y = np.zeros((len(sizes), n_max), np.int32)
  for i, n in enumerate(sizes):
    x[i, :n] = rng.uniform(1.0, 2.0, size=(n, dim))
    y[i, :n] = rng.integers(1, 3, size=n)
  return ClientData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(sizes, jnp.int32))


def kernel(w, data: ClientData, key):
  """A one-client function reading everything it is given: masked mean of ``x @ w``, plus noise from ``key``."""
  mask = (jnp.arange(data.x.shape[0]) < data.n).astype(jnp.float32)
  score = jnp.sum((data.x @ w) * mask) / jnp.maximum(data.n, 1)
  return {"score": score + jax.random.normal(key), "n": data.n, "labels": jnp.sum(data.y)}


def assert_trees_equal(a, b, atol=1e-6):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-6)


def host(a):
  """``a`` as numpy (the raw data of a typed key array)."""
  return np.asarray(jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a)


def spec_of(a):
  assert isinstance(a.sharding, NamedSharding), a.sharding
  return tuple(a.sharding.spec)


# ----------------------------------------------------------------------------------- placement
def test_place_clients_shards_the_leading_axis_over_the_mesh(shard):
  k = 8
  tree = {
      "data": client_data([3, 5, 1, 6, 2, 4, 6, 1], n_max=6),
      "params": {"w": jnp.ones((k, 3, 2)), "b": jnp.zeros((k, 2))},
      "keys": jax.random.split(jax.random.key(0), k),
      "flags": jnp.zeros((k,), bool),
      "round": jnp.int32(3),
  }
  placed = shard.place_clients(tree)
  assert jax.tree.structure(placed) == jax.tree.structure(tree)
  for before, after in zip(jax.tree.leaves(tree), jax.tree.leaves(placed)):
    np.testing.assert_array_equal(host(after), host(before))
    if before.ndim == 0:
      assert spec_of(after) == ()
      assert after.sharding.is_fully_replicated
      continue
    assert spec_of(after) == (CLIENT_AXIS,)
    assert after.sharding.mesh.shape == {CLIENT_AXIS: NUM_DEVICES}
    shards = after.addressable_shards
    assert len(shards) == NUM_DEVICES
    assert {s.device for s in shards} == set(jax.devices())
    # Each device holds K / devices rows, not a replica.
    assert all(s.data.shape == (k // NUM_DEVICES,) + before.shape[1:] for s in shards)
  x = placed["data"].x
  np.testing.assert_array_equal(np.concatenate([np.asarray(s.data) for s in sorted(
      x.addressable_shards, key=lambda s: s.index[0].start)]), np.asarray(tree["data"].x))


def test_place_clients_keeps_indivisible_populations_replicated_and_logs_once(shard, caplog):
  tree = {"a": jnp.ones((6, 2)), "b": jnp.arange(6)}
  with caplog.at_level(logging.INFO, logger="fedjax_robust.execution"):
    placed = shard.place_clients(tree)
    shard.place_clients(tree)
  for leaf in jax.tree.leaves(placed):
    assert spec_of(leaf) == ()
    assert leaf.sharding.is_fully_replicated
    assert all(s.data.shape == leaf.shape for s in leaf.addressable_shards)
  messages = [r.getMessage() for r in caplog.records if "place_clients" in r.getMessage()]
  assert len(messages) == 1 and "6 clients" in messages[0] and "replicated" in messages[0]


def test_place_replicated_puts_every_leaf_on_every_device(shard):
  server = {"params": {"w": jnp.ones((3, 2))}, "round": jnp.int32(1), "key": jax.random.key(4)}
  placed = shard.place_replicated(server)
  for leaf in jax.tree.leaves(placed):
    assert spec_of(leaf) == ()
    assert leaf.sharding.mesh.shape == {CLIENT_AXIS: NUM_DEVICES}
    assert len(leaf.addressable_shards) == NUM_DEVICES
    assert all(s.data.shape == leaf.shape for s in leaf.addressable_shards)


@pytest.mark.parametrize("name", ["vmap", "sequential"])
def test_place_is_the_identity_off_the_mesh(name):
  strategy = make_strategy(name)
  tree = {"a": jnp.ones((5, 2)), "b": jnp.int32(1)}
  assert strategy.place_clients(tree) is tree
  assert strategy.place_replicated(tree) is tree


def test_place_clients_on_a_submesh():
  strategy = make_strategy("shard_map", num_devices=2)
  placed = strategy.place_clients(jnp.arange(6.0))
  assert spec_of(placed) == (CLIENT_AXIS,)
  assert [s.data.shape for s in placed.addressable_shards] == [(3,), (3,)]
  assert {s.device for s in placed.addressable_shards} == set(jax.devices()[:2])


# ----------------------------------------------------------------------------------- padding
def test_padded_slots_are_masked_clients_not_copies_of_client_0(shard):
  """C=5 on 4 devices: the one-client function sees 5 real clients and 3 empty ones, never client 0 again."""
  sizes = [4, 6, 2, 5, 3]
  data = client_data(sizes)
  keys = jax.random.split(jax.random.key(11), len(sizes))
  w = jnp.ones((3,))
  calls = []

  def recording(w, d, key):
    # Under vmap the callback sees each device's batch; record every slot's n, feature sum and key data.
    jax.debug.callback(lambda n, xs, kd: calls.append((np.asarray(n), np.asarray(xs), np.asarray(kd))),
                       d.n, jnp.sum(d.x), jax.random.key_data(key))
    return kernel(w, d, key)

  out = shard.map(recording, (None, 0, 0), w, data, keys)
  jax.effects_barrier()
  ns = np.concatenate([np.atleast_1d(c[0]) for c in calls])
  xsums = np.concatenate([np.atleast_1d(c[1]) for c in calls])
  kds = np.concatenate([np.reshape(c[2], (-1, 2)) for c in calls])
  assert len(ns) == 8  # padded to the next multiple of 4 devices
  assert sorted(ns.tolist()) == sorted(sizes + [0, 0, 0])
  masked = ns == 0
  assert np.all(xsums[masked] == 0)  # no data at all, not client 0's rows
  real_kd = np.asarray(jax.random.key_data(keys))
  for kd in kds[masked]:
    assert not any(np.array_equal(kd, r) for r in real_kd)  # not a real client's key
    np.testing.assert_array_equal(kd, np.asarray(jax.random.key_data(jax.random.key(0))))
  # Only the 5 real outputs come back, and they are vmap's.
  assert np.asarray(out["n"]).tolist() == sizes
  assert_trees_equal(out, make_strategy("vmap").map(kernel, (None, 0, 0), w, data, keys))


@pytest.mark.parametrize("cohort", [1, 3, 4, 5, 7])
def test_padded_cohorts_equal_vmap_inside_jit(shard, cohort):
  sizes = [4, 6, 2, 5, 3, 1, 6][:cohort]
  data = client_data(sizes, seed=cohort)
  keys = jax.random.split(jax.random.key(cohort), cohort)
  w = jnp.array([0.5, -1.0, 2.0])
  raw_keys = jax.random.key_data(keys)  # old-style uint32 keys are padded with zeros, also valid
  run = lambda s: jax.jit(lambda w, d, k, rk: (s.map(kernel, (None, 0, 0), w, d, k),
                                               s.map(lambda d, k: kernel(w, d, jax.random.wrap_key_data(k)),
                                                     (0, 0), d, rk)))(w, data, keys, raw_keys)
  got, want = run(shard), run(make_strategy("vmap"))
  assert_trees_equal(got, want)
  assert np.asarray(got[0]["n"]).tolist() == sizes


def test_a_masked_slot_is_an_exact_noop_for_the_client_kernel():
  """The documented meaning of a zero row: ``n = 0`` -> zero local steps, parameters and optimizer state unchanged."""
  model = nn.Dense(3)
  params = model.init(jax.random.key(0), jnp.zeros((1, 4)))["params"]
  loss_fn = plain_loss(lambda p, x, y, m: masked_cross_entropy(model.apply({"params": p}, x), y, m))
  opt = optax.sgd(0.1, momentum=0.9)
  opt_state = opt.init(params)
  empty = ClientData(jnp.zeros((6, 4)), jnp.zeros((6,), jnp.int32), jnp.int32(0))
  new_params, new_state, metrics, _ = local_train(loss_fn, opt, params, opt_state, empty, jax.random.key(0),
                                               LocalTrainSpec(epochs=2, batch_size=2))
  assert int(metrics["steps"]) == 0
  assert_trees_equal(new_params, params, atol=0)
  assert_trees_equal(new_state, opt_state, atol=0)


# ----------------------------------------------------------------------------------- sharded inputs in jit
@pytest.mark.parametrize("cohort", [4, 5, 8])
def test_gather_map_scatter_over_sharded_client_state_in_jit_equals_vmap(shard, cohort):
  """A round's shape: gather the cohort from sharded state/data, map the clients, scatter back."""
  k = 8
  data = client_data([3, 5, 1, 6, 2, 4, 6, 1], n_max=6, seed=2)
  state = {"w": flat_random.normal(jax.random.key(1), (k, 3)), "count": jnp.zeros((k,), jnp.int32)}
  server = {"w": jnp.array([1.0, 0.5, -0.5])}
  idx = jnp.sort(jax.random.choice(jax.random.key(cohort), k, (cohort,), replace=False))
  keys = jax.random.split(jax.random.key(9), cohort)

  def one(server, client, d, key):
    w = server["w"] + client["w"]
    out = kernel(w, d, key)
    return {"w": client["w"] + 0.1 * out["score"], "count": client["count"] + d.n}, out["score"]

  def round_fn(strategy, server, state, data, idx, keys):
    cohort_state = jax.tree.map(lambda a: a[idx], state)
    cohort_data = jax.tree.map(lambda a: a[idx], data)
    new, scores = strategy.map(one, (None, 0, 0, 0), server, cohort_state, cohort_data, keys)
    server = {"w": server["w"] + jnp.mean(scores)}
    return server, jax.tree.map(lambda a, v: a.at[idx].set(v), state, new)

  placed_state, placed_data = shard.place_clients(state), shard.place_clients(data)
  placed_server = shard.place_replicated(server)
  assert spec_of(placed_state["w"]) == (CLIENT_AXIS,) and spec_of(placed_data.x) == (CLIENT_AXIS,)
  got = jax.jit(lambda *a: round_fn(shard, *a))(placed_server, placed_state, placed_data, idx, keys)
  want = jax.jit(lambda *a: round_fn(make_strategy("vmap"), *a))(server, state, data, idx, keys)
  assert_trees_equal(got, want)
  # Untouched clients keep their state; the cohort's count grew by its n.
  counts = np.asarray(got[1]["count"])
  np.testing.assert_array_equal(counts[np.asarray(idx)], np.asarray(data.n)[np.asarray(idx)])
  assert counts.sum() == int(np.asarray(data.n)[np.asarray(idx)].sum())


def test_simulator_round_over_placed_data_and_client_state_equals_vmap(shard):
  """The real client kernel (FedAvg, local SGD) on sharded train data and client state, cohort 5 of 8."""
  rng = np.random.default_rng(0)
  sizes, test_sizes = (7, 12, 3, 9, 5, 1, 8, 4), (3, 2, 4, 3, 1, 2, 3, 2)
  xs = [rng.normal(size=(n, 6)).astype(np.float32) for n in sizes]
  ys = [rng.integers(0, 3, size=n).astype(np.int32) for n in sizes]
  xt = [rng.normal(size=(n, 6)).astype(np.float32) for n in test_sizes]
  yt = [rng.integers(0, 3, size=n).astype(np.int32) for n in test_sizes]
  (x_train, n_train), (y_train, _) = stack_padded(xs), stack_padded(ys)
  (x_test, n_test), (y_test, _) = stack_padded(xt), stack_padded(yt)
  data = FederatedData("toy", 3, x_train, y_train, n_train, x_test, y_test, n_test, np.concatenate(xt),
                       np.concatenate(yt))
  model = nn.Dense(3)
  params = model.init(jax.random.key(1), jnp.zeros((1, 6)))["params"]
  apply_fn = lambda p, x: model.apply({"params": p}, x)
  alg = make_fedavg(apply_fn, optax.sgd(0.1, momentum=0.5), LocalTrainSpec(epochs=1, batch_size=4))

  finals = {}
  for name in ("vmap", "shard_map"):
    strategy = shard if name == "shard_map" else make_strategy(name)
    sim = Simulator(alg, data, apply_fn, strategy, cohort_size=5)
    state = sim.init(params, seed=3)
    if name == "shard_map":
      sim.train = strategy.place_clients(sim.train)
      state = state._replace(clients=strategy.place_clients(state.clients),
                             server=strategy.place_replicated(state.server))
      assert spec_of(sim.train.x) == (CLIENT_AXIS,)
    for _ in range(2):
      state, _ = sim.run_round(state)
    finals[name] = state.server
  assert_trees_equal(finals["shard_map"], finals["vmap"], atol=2e-5)

