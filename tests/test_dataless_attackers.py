"""Dataless attackers (``attack.dataless``, FedCC's code, specs/fedcc.md §2.6 [R]): f crafted models besides the K
benign partitions every round, with a nominal aggregation weight."""

import copy
import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust.data import with_dataless_clients
from fedjax_robust.experiment import build_experiment, run_experiment
from fedjax_robust.simulation import _client_metrics, check_nominal_weight, nominal_weights

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_experiment import digits_config  # noqa: E402


def test_with_dataless_clients_appends_empty_clients():
  from fedjax_robust.data import build_federated_data
  data = build_federated_data(digits_config().data)
  grown = with_dataless_clients(data, 3)
  k = data.num_clients
  assert grown.num_clients == k + 3 and grown.info["dataless_clients"] == [k, k + 1, k + 2]
  assert grown.x_train.shape == (k + 3,) + data.x_train.shape[1:]
  assert grown.x_test.shape == (k + 3,) + data.x_test.shape[1:]
  np.testing.assert_array_equal(grown.n_train, np.concatenate([data.n_train, [0, 0, 0]]))
  np.testing.assert_array_equal(grown.n_test, np.concatenate([data.n_test, [0, 0, 0]]))
  np.testing.assert_array_equal(grown.x_train[:k], data.x_train)  # the partitions are untouched
  assert not grown.x_train[k:].any() and not grown.y_train[k:].any()
  assert [len(i) for i in grown.client_train_indices[k:]] == [0, 0, 0]
  assert with_dataless_clients(data, 0) is data
  with pytest.raises(ValueError, match=">= 0"):
    with_dataless_clients(data, -1)


def test_nominal_weights_by_hand():
  w = jnp.asarray([10.0, 0.0, 30.0, 0.0, 5.0])
  mal = jnp.asarray([False, True, False, False, True])
  # 'mean': the benign members with data weigh 10 and 30 -> 20 for the dataless attacker (row 1); the benign client
  # without data (row 3) still must not count; the attacker with data (row 4) keeps its 5.
  np.testing.assert_allclose(nominal_weights(w, mal, "mean"), [10.0, 20.0, 30.0, 0.0, 5.0])
  np.testing.assert_allclose(nominal_weights(w, mal, 2.5), [10.0, 2.5, 30.0, 0.0, 5.0])
  # no benign member with data: 1
  np.testing.assert_allclose(nominal_weights(jnp.zeros(2), jnp.asarray([True, False]), "mean"), [1.0, 0.0])
  assert check_nominal_weight(None) is None and check_nominal_weight("mean") == "mean"
  assert check_nominal_weight("4") == 4.0
  for bad in (0, -1, float("nan"), "median"):
    with pytest.raises(ValueError, match="dataless_weight"):
      check_nominal_weight(bad)


def test_client_means_leave_out_clients_without_a_test_split():
  m = _client_metrics(np.asarray([8, 3, 0]), np.asarray([10, 4, 0]), np.asarray([True, False, False]))
  assert m["client_acc"] == [0.8, 0.75, 0.0]
  assert m["client_acc_mean"] == pytest.approx(0.775) and m["benign_acc_mean"] == pytest.approx(0.8)
  assert m["client_acc_weighted"] == pytest.approx(11 / 14)
  assert np.isnan(_client_metrics(np.asarray([1, 0]), np.asarray([2, 0]), np.asarray([False, True]))[
      "benign_acc_mean"])


def dataless_config(**overrides):
  c = digits_config(**{"rounds": 4, **overrides})
  c.attack.name, c.attack.dataless = "fang_median", 3
  return c


def test_every_round_holds_the_f_dataless_attackers_and_n_minus_f_partitions(tmp_path):
  exp = build_experiment(dataless_config())
  assert exp.data.num_clients == 13 and exp.simulator.cohort_size == 10
  np.testing.assert_array_equal(np.flatnonzero(exp.malicious), [10, 11, 12])
  run_experiment(dataless_config(rounds=6), tmp_path / "run")
  records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  seen = set()
  for r in records:
    cohort = r["cohort"]
    assert len(cohort) == 10 and cohort[-3:] == [10, 11, 12] and all(0 <= i < 10 for i in cohort[:7])
    seen |= set(cohort[:7])
    assert r["local_steps"] > 0
  assert len(seen) > 7  # the benign slots are drawn from all the partitions, round by round
  # Table IV's shape: K = 20 partitions at C = 0.5 -> n = 10 = 7 benign + 3 crafted.
  exp = build_experiment(dataless_config(**{"data.num_clients": 20, "server.participation": 0.5}))
  assert exp.data.num_clients == 23 and exp.simulator.cohort_size == 10


def test_crafted_models_of_dataless_attackers_reach_the_rule(tmp_path):
  """Fang-Median's crafted models wreck the uniform mean (spec §5 (a)) only because their nominal weight lets them
  count: given weight 0 (their sample count) the same run learns."""
  exp = build_experiment(dataless_config(**{"aggregator.name": "mean", "aggregator.weighted": False}))
  uncounted_sim = copy.copy(exp.simulator)
  uncounted_sim.dataless_weight = None
  uncounted_sim._build()

  def accuracy_after_4_rounds(sim):
    state = sim.init(exp.params, 0)
    for _ in range(4):
      state, _ = sim.run_round(state)
    return sim.evaluate(state)["global_test_acc"]

  assert accuracy_after_4_rounds(exp.simulator) < 0.2
  assert accuracy_after_4_rounds(uncounted_sim) > 0.5


@pytest.mark.parametrize("overrides, match", [
    ({"attack.name": "none"}, "upload attack"),
    ({"attack.clients": "1,2"}, "both name the attackers"),
    ({"attack.data.kind": "label_flip"}, "no data"),
    ({"sampler.name": "forced", "sampler.forced": "2:1"}, "every round"),
    ({"sampler.name": "stratified", "sampler.attackers": 2}, "sampler.attackers"),
    ({"server.participation": 0.3}, "benign slots"),
    ({"attack.dataless_weight": "0"}, "dataless_weight"),
])
def test_dataless_config_errors(overrides, match):
  c = dataless_config()
  c.update_from_flattened_dict(overrides)
  with pytest.raises(ValueError, match=match):
    build_experiment(c)


def test_dataless_attackers_in_a_vmapped_seeds_run(tmp_path):
  """Seeds share the dataless attackers (the last f ids) and their nominal weight; each seed's run equals its
  single run."""
  from fedjax_robust.run import run_seeds
  c = dataless_config(**{"rounds": 2, "seeds": "0,1", "aggregator.name": "median"})
  run_seeds(c, tmp_path / "seeds")
  for seed in (0, 1):
    malicious = json.loads((tmp_path / "seeds" / f"seed_{seed}" / "malicious.json").read_text())
    assert malicious["malicious_clients"] == [10, 11, 12]
  from fedjax_robust.run import seed_config
  single = run_experiment(seed_config(dataless_config(**{"rounds": 2, "aggregator.name": "median"}), 1),
                          tmp_path / "one")
  seed_1 = json.loads((tmp_path / "seeds" / "seed_1" / "summary.json").read_text())
  assert seed_1["final"]["global_test_acc"] == pytest.approx(single["final"]["global_test_acc"], abs=1e-6)
