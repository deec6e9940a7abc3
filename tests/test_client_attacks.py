"""Client-side attacks (attacks/client_attacks.py): the attackers' own local procedure, run by the engine for the
cohort's attackers only (FedCC's targeted backdoor, spec §2.4)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust.algorithms.fedavg import classification_loss, make_fedavg
from fedjax_robust.attacks.client_attacks import backdoor_training
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.execution import make_strategy
from fedjax_robust.simulation import Simulator
from test_engine import assert_trees_close, make_data, setup

SPEC = LocalTrainSpec(epochs=1, batch_size=8)


def d_mal(data):
  return ClientData(jnp.asarray(data.x_global_test[:2]), jnp.array([2, 2], jnp.int32), jnp.int32(2))


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_backdoor_training_alternates_own_epochs_and_d_mal_passes():
  """E_mal x [one epoch on the client's data with its optimizer, one pass over D_mal with Adam(lr, wd)]: equal to
  the same steps written out with local_train."""
  data, params, apply_fn = setup()
  client = ClientData(jnp.asarray(data.x_train[0]), jnp.asarray(data.y_train[0]), jnp.asarray(data.n_train[0]))
  attack_data = d_mal(data)
  loss = classification_loss(apply_fn)
  opt = optax.adam(1e-3)
  attack = backdoor_training(epochs=2, lr=5e-3, weight_decay=5e-3)
  key = jax.random.key(4)
  result = attack.train(loss, opt, params, client, attack_data, key, SPEC)
  p, s_own = params, opt.init(params)
  bad_opt = optax.chain(optax.add_decayed_weights(5e-3), optax.adam(5e-3))
  s_bad = bad_opt.init(params)
  for e in range(2):
    k = jax.random.fold_in(key, e)
    own = local_train(loss, opt, p, s_own, client, jax.random.fold_in(k, 0), SPEC)
    bad = local_train(loss, bad_opt, own.params, s_bad, attack_data, jax.random.fold_in(k, 1),
                      LocalTrainSpec(1, 100, False, True, SPEC.unroll))
    p, s_own, s_bad = bad.params, own.opt_state, bad.opt_state
  assert_trees_close(result.params, p, atol=1e-6)
  # the attacker's model leans to the target label on D_mal more than the same epochs of honest training do
  honest = local_train(loss, opt, params, opt.init(params), client, key, SPEC._replace(epochs=2)).params
  target_prob = lambda q: float(jax.nn.softmax(apply_fn(q, attack_data.x))[:, 2].mean())
  assert target_prob(result.params) > target_prob(honest)


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
@pytest.mark.parametrize("strategy", ["vmap", "sequential"])
def test_engine_runs_the_client_attack_for_attackers_only(strategy):
  """Benign clients' uploads are exactly those of a run without the client attack; an attacker's differ; the
  vectorized and the sequential engine agree."""
  data, params, apply_fn = setup()
  mal = np.array([False, True, False, True])
  attack = backdoor_training(epochs=2)
  opt = optax.sgd(0.1)
  finals = {}
  for name, alg in (("honest", make_fedavg(apply_fn, opt, SPEC)),
                    ("attacked", make_fedavg(apply_fn, opt, SPEC, client_attack=attack))):
    kwargs = {"attack_data": d_mal(data)} if name == "attacked" else {}
    sim = Simulator(alg, data, apply_fn, make_strategy(strategy), cohort_size=3, malicious=mal, **kwargs)
    state = sim.init(params, 0)
    prep = sim._prepare(state, sim.train, sim.inputs.malicious)
    finals[name] = (np.asarray(prep.cohort), sim._client_outputs(prep, sim.inputs))
    if name == "attacked":
      assert sim.attack_slots == 2
  cohort, honest = finals["honest"]
  _, attacked = finals["attacked"]
  for i, k in enumerate(cohort):
    a = jax.tree.map(lambda x: x[i], attacked.upload)
    h = jax.tree.map(lambda x: x[i], honest.upload)
    if mal[k]:
      assert not np.allclose(jax.tree.leaves(a)[0], jax.tree.leaves(h)[0])
    else:
      assert_trees_close(a, h, atol=0)


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_an_attacker_holding_only_the_attack_data_is_weighted_by_its_size():
  """FedVSA's model-replacement adversary holds only its flipped sample (spec §2): sample-weighted FedAvg weighs it
  by the sample's size, not by its client slot's partition (3 rows here), and the round's global model is that
  weighted mean of the cohort's models. FedCC's backdoor attacker keeps its own count."""
  from fedjax_robust.attacks.client_attacks import flipped_training
  data, params, apply_fn = setup()  # partition sizes 7, 12, 3, 9
  mal = np.array([False, False, True, False])
  attack = flipped_training()
  attack_data, _ = attack.make_data(data, seed=0)
  assert int(attack_data.n) == (7 + 12 + 3 + 9) // 4
  alg = make_fedavg(apply_fn, optax.sgd(0.1), SPEC, client_attack=attack)
  sim = Simulator(alg, data, apply_fn, make_strategy("vmap"), malicious=mal, attack_data=attack_data)
  state = sim.init(params, 0)
  prep = sim._prepare(state, sim.train, sim.inputs.malicious, sim.inputs.attack_data)
  expected = np.where(mal, int(attack_data.n), data.n_train)[np.asarray(prep.cohort)]
  np.testing.assert_array_equal(np.asarray(prep.weights), expected)
  uploads = sim._client_outputs(prep, sim.inputs).upload["delta"]
  new_state, _ = sim.run_round(state)
  p = expected / expected.sum()
  manual = jax.tree.map(lambda w, d: w + jnp.tensordot(jnp.asarray(p, d.dtype), d, 1), params, uploads)
  assert_trees_close(new_state.server.params, manual, atol=1e-6)
  assert make_fedavg(apply_fn, optax.sgd(0.1), SPEC, client_attack=backdoor_training()).malicious_weight is None


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_vmap_equals_sequential_with_a_client_attack():
  data, params, apply_fn = setup()
  mal = np.array([True, False, False, False])
  alg = make_fedavg(apply_fn, optax.sgd(0.1), SPEC, client_attack=backdoor_training(epochs=2))
  states = []
  for name in ("vmap", "sequential"):
    sim = Simulator(alg, data, apply_fn, make_strategy(name), malicious=mal, attack_data=d_mal(data),
                    backdoor=(np.asarray(data.x_global_test[:2]), 2))
    state = sim.init(params, 0)
    for _ in range(2):
      state, _ = sim.run_round(state)
    states.append((state, sim.evaluate(state)))
  assert_trees_close(states[0][0].server.params, states[1][0].server.params, atol=1e-5)
  assert states[0][1]["backdoor_confidence"] == pytest.approx(states[1][1]["backdoor_confidence"], abs=1e-5)


def test_client_attack_needs_its_data_and_a_fedavg_family_algorithm():
  from fedjax_robust.experiment import default_config, build_experiment
  data, params, apply_fn = setup()
  alg = make_fedavg(apply_fn, optax.sgd(0.1), SPEC, client_attack=backdoor_training())
  with pytest.raises(ValueError, match="attack_data"):
    Simulator(alg, data, apply_fn, malicious=np.array([True, False, False, False]))
  c = default_config()
  c.data.name, c.data.num_clients = "digits", 4
  c.algorithm.name = "ditto"
  c.attack.client.name, c.attack.clients = "backdoor_training", "0"
  with pytest.raises(ValueError, match="client-side attack"):
    build_experiment(c)
