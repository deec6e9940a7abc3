"""Client x client weights (``client_weight_matrix``, fedjax_robust/algorithms/base.py): what FedCAP, FedFomo, FedCAC
and FedAMP report equals what their rounds compute, the run stores it in client_weights.npz (single runs and the
seeds program) and plots it as a clients x clients heatmap."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from fedjax_robust import client_weights, plots
from fedjax_robust.algorithms.fedamp import attention, make_fedamp
from fedjax_robust.algorithms.fedcac import cohort_columns, make_fedcac
from fedjax_robust.algorithms.fedcap import make_fedcap
from fedjax_robust.algorithms.fedfomo import make_fedfomo
from fedjax_robust.client import LocalTrainSpec
from fedjax_robust.execution import make_strategy
from fedjax_robust.run import make_run
from fedjax_robust.simulation import Simulator
from test_engine import make_data, setup

K = 4
SPEC = LocalTrainSpec(epochs=2, batch_size=3, drop_last=True, shuffle=False)
KEY = client_weights.KEY


def rounds_of(alg, rounds, cohort=None, strategy="vmap", data=None):
  """``[(state before the round, the round's host metrics)]`` of ``rounds`` rounds on the tiny engine case, and the
  final state. ``alg``: the algorithm, given the model."""
  data, params, apply_fn = setup(data=data)
  sim = Simulator(alg(apply_fn), data, apply_fn, make_strategy(strategy), cohort_size=cohort)
  state = sim.init(params, 3)
  out = []
  for _ in range(rounds):
    before = state
    state, metrics = sim.run_round(state)
    out.append((before, jax.device_get(metrics)))
  return out, state


def softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


# ------------------------------------------------------------------------------------------------------ FedCAP
@pytest.mark.parametrize("strategy", ["vmap", "sequential"])
def test_fedcap_rows_are_the_customization_weights_of_eqs_4_5(strategy):
  """Round 1: an empty pool, every row 0 (everyone gets w^0). Round 2, full participation: row k is φ on k and
  (1 − φ)·softmax_i≠k(α·cos(d̃_k, d̃_i)) elsewhere, by hand from the pool, and the row times the pool's recovered
  models is the ŵ_k the server sent."""
  alpha, phi = 10.0, 0.3
  built = []
  alg = lambda f: built.append(make_fedcap(f, optax.sgd(0.1), SPEC, K, alpha=alpha, phi=phi)) or built[-1]
  out, _ = rounds_of(alg, 2, strategy=strategy)
  (_, first), (before, second) = out
  assert first[KEY].shape == (K, K) and not first[KEY].any()
  matrix, cohort = np.asarray(second[KEY], np.float64), np.asarray(second["cohort"])
  d = np.asarray(before.server.pool_updates, np.float64)
  cos = d @ d.T / np.outer(np.linalg.norm(d, axis=1), np.linalg.norm(d, axis=1))
  for row, k in enumerate(cohort):
    others = [i for i in range(K) if i != k]
    expected = np.zeros(K)
    expected[others] = (1 - phi) * softmax(alpha * cos[k, others])
    expected[k] = phi
    np.testing.assert_allclose(matrix[row], expected, atol=1e-5)
  np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-6)
  _, own = jax.jit(built[0].broadcast)(before.server, jnp.asarray(cohort))
  np.testing.assert_allclose(matrix @ np.asarray(before.server.pool_models), own["customized"], atol=1e-5)


@pytest.mark.parametrize("request_updates", [False, True])
def test_fedcap_rows_of_clients_outside_the_pool(request_updates):
  """Cohorts of 3 of 4: a member absent last round is outside the pool. Without request updates it gets the global
  model, whose row is the pool's Eq. 6 sample weights (the row times the pool's models is w^t); with them its row is
  the softmax over the whole pool, no self weight. Every row sums to 1 once the pool holds someone."""
  alg = lambda f: make_fedcap(f, optax.sgd(0.1), SPEC, K, alpha=5.0, phi=0.2, request_updates=request_updates)
  out, _ = rounds_of(alg, 4, cohort=3)
  outside_rows = 0
  for before, m in out[1:]:
    matrix, cohort = np.asarray(m[KEY], np.float64), np.asarray(m["cohort"])
    valid, n = np.asarray(before.server.pool_valid), np.asarray(before.server.pool_n, np.float64)
    np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-6)
    assert not matrix[:, ~valid].any()  # only the pool contributes
    global_flat = ravel_pytree(before.server.global_params)[0]
    for row, k in enumerate(cohort):
      if valid[k]:
        assert matrix[row, k] == pytest.approx(0.2, abs=1e-6)
        continue
      outside_rows += 1
      assert matrix[row, k] == 0
      if not request_updates:
        np.testing.assert_allclose(matrix[row], np.where(valid, n, 0) / n[valid].sum(), atol=1e-6)
        np.testing.assert_allclose(matrix[row] @ np.asarray(before.server.pool_models), global_flat, atol=1e-5)
  assert outside_rows  # the case was exercised


# ------------------------------------------------------------------------------------------------------ FedFomo
def test_fedfomo_rows_sum_to_one_and_add_up_to_the_affinity_matrix():
  """Round 1: nobody has uploaded, every client keeps its model (identity rows). Each row: the round's w_n at the
  received models' ids and 1 − Σ w_n on the diagonal; the off-diagonal entries summed over the rounds are P."""
  alg = lambda f: make_fedfomo(f, optax.sgd(0.3), SPEC, K, num_models=2, epsilon=0.0)
  data = make_data(sizes=(12, 15, 12, 14), test_sizes=(3, 3, 3, 3))
  out, final = rounds_of(alg, 3, data=data)
  np.testing.assert_array_equal(out[0][1][KEY][np.argsort(out[0][1]["cohort"])], np.eye(K))
  total = np.zeros((K, K))
  for _, m in out:
    square = client_weights.square(m["cohort"], m[KEY], K)
    np.testing.assert_allclose(square.sum(1), 1.0, atol=1e-6)
    assert (square >= 0).all() and ((square > 0).sum(1) <= 1 + 2).all()  # at most O = 2 received models weigh
    total += square - np.diag(np.diag(square))
  np.testing.assert_allclose(np.asarray(final.server.affinity), total, atol=1e-6)
  assert total.any()  # some client did take another's model


# ------------------------------------------------------------------------------------------------------ FedAMP, FedCAC
def test_fedamp_rows_are_the_attention_weights_sent():
  """Row i is ξ_i of the cloud model the server sent in that round (from the models stored before it); rows sum
  to 1."""
  alg = lambda f: make_fedamp(f, optax.sgd(0.1), SPEC, K, alpha_k=0.5, sigma=0.5, alpha_decay_every=0)
  out, _ = rounds_of(alg, 2, cohort=3)
  for before, m in out:
    xi, _ = attention(before.server.models, jnp.asarray(m["cohort"]), 0.5, 0.5)
    np.testing.assert_allclose(m[KEY], xi, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m[KEY]).sum(1), 1.0, atol=1e-5)


def test_fedcac_rows_are_uniform_over_each_clients_collaborators():
  """cohort_columns puts the cohort's [C, C] weights at the members' ids; a round's rows are uniform over
  C_i ∪ {i} (Eq. 10): each row's nonzero entries are equal, include the diagonal, and sum to 1."""
  mix = jnp.asarray([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [1 / 3, 1 / 3, 1 / 3]])
  np.testing.assert_allclose(cohort_columns(mix, jnp.asarray([3, 0, 2]), 5),
                             [[0.5, 0, 0, 0.5, 0], [1.0, 0, 0, 0, 0], [1 / 3, 0, 1 / 3, 1 / 3, 0]], atol=1e-7)
  alg = lambda f: make_fedcac(f, optax.sgd(0.1), SPEC, K, tau=0.5, beta=4, eval_before_aggregation=False)
  out, _ = rounds_of(alg, 2, cohort=3)
  for _, m in out:
    square = client_weights.square(m["cohort"], m[KEY], K)
    for k in m["cohort"]:
      row = square[k]
      assert row[k] > 0 and np.allclose(row[row > 0], row[k]) and row.sum() == pytest.approx(1.0, abs=1e-6)


# ------------------------------------------------------------------------------------------------------ storage
def test_the_log_writes_when_its_rounds_double_keeps_a_resumed_runs_rounds_and_square_places_rows(tmp_path):
  path = tmp_path / client_weights.FILE
  log = client_weights.Log(path)
  written = []
  for t in range(1, 6):
    log.add(t, [t % 3, 2], np.full((2, 3), t))
    written.append(len(client_weights.load(path)[0]))
  assert written == [1, 2, 2, 4, 4]  # rewritten after the 1st, 2nd, 4th round
  log.flush()
  rounds, cohort, matrix = client_weights.load(path)
  assert rounds.tolist() == [1, 2, 3, 4, 5] and cohort.shape == (5, 2) and matrix.dtype == np.float32
  assert client_weights.Log(path, keep_through=3).rounds == [1, 2, 3]  # a run resumed after round 3
  assert len(client_weights.load(path)[0]) == 5  # ... rewrites the file only when it stores a round
  client_weights.Log(path)  # a fresh run deletes an earlier run's file
  assert not path.exists()
  square = client_weights.square([2, 0], [[0.1, 0.2, 0.7], [1.0, 0.0, 0.0]], 3)
  np.testing.assert_allclose(square[[0, 2]], [[1.0, 0, 0], [0.1, 0.2, 0.7]])
  assert np.isnan(square[1]).all()
  with pytest.raises(ValueError, match="cohort of 2"):
    client_weights.square([0, 1], np.zeros((2, 4)), 3)


def test_matrices_and_their_mean_over_the_rounds_each_client_was_sampled():
  rounds, stack = plots.client_matrices([2, 4], [[0, 1], [1, 2]], [[[1, 0, 0], [0, 1, 0]], [[0, 0.5, 0.5],
                                                                                          [0, 0, 1]]], 3)
  assert rounds.tolist() == [2, 4] and stack.shape == (2, 3, 3)
  mean = plots.mean_over_rounds(stack)
  np.testing.assert_allclose(mean, [[1, 0, 0], [0, 0.75, 0.25], [0, 0, 1]])
  assert np.isnan(plots.mean_over_rounds(stack[:1])[2]).all()  # never sampled


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
@pytest.mark.parametrize("rounds,eval_every,last_rounds,evaluated", [(5, 2, 0, [2, 4, 5]), (4, 2, 1, [2, 4])])
def test_the_whole_run_program_carries_the_evaluated_rounds_matrices(rounds, eval_every, last_rounds, evaluated):
  """make_run (the seeds/grid program): ``trace.client_weights`` holds the matrix of each evaluated round only, equal
  to the round loop's; the per-round metrics do not carry it."""
  data, params, apply_fn = setup()
  alg = make_fedcap(apply_fn, optax.sgd(0.1), SPEC, K, alpha=10.0, phi=0.3, request_updates=True)
  sim = Simulator(alg, data, apply_fn, cohort_size=3)
  state = sim.init(params, 5)
  _, trace = jax.jit(make_run(sim, rounds, eval_every, last_rounds))(state, sim.inputs)
  assert KEY not in trace.rounds and trace.client_weights[KEY].shape == (len(evaluated), 3, K)
  loop = {}
  for t in range(1, rounds + 1):
    state, m = sim.run_round(state)
    loop[t] = np.asarray(m[KEY])
  np.testing.assert_allclose(trace.client_weights[KEY], np.stack([loop[t] for t in evaluated]), atol=1e-6)


# ------------------------------------------------------------------------------------------------------ a run
@pytest.mark.fast_compiles  # tests/conftest.py
@pytest.mark.plots
def test_a_fedcap_run_stores_the_evaluated_rounds_and_draws_the_heatmap(tmp_path):
  """digits, 10 clients, 7 per round, 3 rounds evaluated every 2: client_weights.npz holds rounds 2 and 3 with
  metrics.jsonl's cohorts, FedCAP's rows sum to 1, and the run's plots include client_weights.png."""
  from fedjax_robust.experiment import run_experiment
  from test_byzantine_e2e import byzantine_config
  c = byzantine_config("mean", "scaling", rounds=3, eval_every=2,
                       **{"algorithm.name": "fedcap", "server.participation": 0.7})  # request updates: 'auto'
  run_experiment(c, tmp_path / "run")
  rounds, cohort, matrix = client_weights.load(tmp_path / "run" / client_weights.FILE)
  records = {r["round"]: r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())}
  assert rounds.tolist() == [2, 3] and matrix.shape == (2, 7, 10)
  assert all(cohort[i].tolist() == records[t]["cohort"] for i, t in enumerate(rounds))
  assert KEY not in records[2]  # round records stay scalars and 1-D vectors
  np.testing.assert_allclose(matrix.sum(-1), 1.0, atol=1e-5)
  png = tmp_path / "run" / "plots" / "client_weights.png"
  assert png.stat().st_size > 1000 and (tmp_path / "run" / "plots" / "client_weights.svg").exists()
  assert plots.load_run(tmp_path / "run").client_weights[0].tolist() == [2, 3]
