"""Engine v2 (issue 28): model state and randomness, step hooks, typed round context with declared needs,
server data, many-model scoring, cohort samplers, algorithm registry, and the new-user bugs."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fedjax_robust import flat_random
from fedjax_robust.aggregators import make_aggregator
from fedjax_robust.algorithms.fedavg import classification_loss, make_fedavg
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.execution import make_strategy
from fedjax_robust.metrics import count_correct
from fedjax_robust.metrics.evaluation import score_models
from fedjax_robust.models import get_model, make_model
from fedjax_robust.round_context import RoundContext
from fedjax_robust.sampling import ForcedSampler, parse_schedule, sample_cohort
from fedjax_robust.simulation import Simulator
from test_engine import assert_trees_close, make_data

BN_KW = dict(widths=(3, 4), fc_dim=6)
SPEC = LocalTrainSpec(epochs=2, batch_size=4)


def bn_setup(sizes=(7, 12, 3, 9), seed=0):
  data = make_data(sizes=sizes, shape=(4, 4, 2), seed=seed)
  model = make_model(get_model("bn_cnn", 3, **BN_KW))
  variables = model.init(jax.random.key(1), jnp.zeros((1, 4, 4, 2)))
  return data, model, variables


def client_data(data, k, tight=False):
  n = int(data.n_train[k])
  rows = slice(0, n) if tight else slice(None)
  return ClientData(jnp.asarray(data.x_train[k, rows]), jnp.asarray(data.y_train[k, rows]), jnp.int32(n))


# ------------------------------------------------------------------------------------------ 1. model interface
def test_batchnorm_training_statistics_ignore_padded_rows():
  _, model, v = bn_setup()
  x = flat_random.normal(jax.random.key(2), (6, 4, 4, 2))
  mask = jnp.array([True] * 4 + [False] * 2)
  logits, state = model.apply(v, x, train=True, mask=mask)
  logits2, state2 = model.apply(v, x.at[4:].set(1e3), train=True, mask=mask)
  real, _ = model.apply(v, x[:4], train=True, mask=mask[:4])
  np.testing.assert_allclose(logits[:4], logits2[:4], atol=1e-5)
  np.testing.assert_allclose(logits[:4], real, atol=1e-5)
  assert_trees_close(state, state2, atol=1e-6)
  # running stats moved in training, unchanged in eval mode; eval output does not depend on the batch
  assert not np.allclose(state["batch_stats"]["bn1"]["mean"], v["batch_stats"]["bn1"]["mean"])
  _, eval_state = model.apply(v, x)
  assert_trees_close(eval_state, {"batch_stats": v["batch_stats"]}, atol=0)
  np.testing.assert_allclose(model.apply(v, x)[0][:2], model.apply(v, x[:2])[0], atol=1e-5)


def test_padded_steps_leave_batch_stats_unchanged():
  """A padded copy of a client equals the tight one: params, and BatchNorm statistics too."""
  data, model, v = bn_setup()
  params, state = v["params"], {"batch_stats": v["batch_stats"]}
  opt = optax.sgd(0.1, momentum=0.9)
  loss = classification_loss(model)
  tight = local_train(loss, opt, params, opt.init(params), client_data(data, 2, tight=True), jax.random.key(3), SPEC,
                      state)
  padded = local_train(loss, opt, params, opt.init(params), client_data(data, 2), jax.random.key(3), SPEC, state)
  assert int(tight.metrics["steps"]) == 2 * 1
  assert_trees_close(tight.params, padded.params, atol=1e-6)
  assert_trees_close(tight.model_state, padded.model_state, atol=1e-6)
  assert not np.allclose(padded.model_state["batch_stats"]["bn2"]["var"], state["batch_stats"]["bn2"]["var"])


def test_dropout_is_applied_in_training_and_off_at_evaluation():
  data = make_data(shape=(4, 4, 1))
  model = make_model(get_model("mlp", 3, hidden=(16,), dropout_rate=0.5))
  params = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))["params"]
  opt, c = optax.sgd(0.1), client_data(data, 1)
  with_dropout = local_train(classification_loss(model), opt, params, opt.init(params), c, jax.random.key(1), SPEC)
  again = local_train(classification_loss(model), opt, params, opt.init(params), c, jax.random.key(1), SPEC)
  no_dropout = make_model(get_model("mlp", 3, hidden=(16,), dropout_rate=0.0))
  plain = local_train(classification_loss(no_dropout), opt, params, opt.init(params), c, jax.random.key(1), SPEC)
  assert_trees_close(with_dropout.params, again.params, atol=0)  # deterministic per key
  assert not np.allclose(with_dropout.params["fc1"]["kernel"], plain.params["fc1"]["kernel"], atol=1e-4)
  x = jnp.asarray(data.x_test[0])
  np.testing.assert_array_equal(model.logits(params, x), no_dropout.logits(params, x))


def _plain_loop_fedavg_bn(data, model, variables, rounds, keep_bn_local, seed):
  """FedAvg / FedBN written as a plain loop over clients (full participation), each client's training a jitted
  ``local_train`` on its own rows with the engine's keys."""
  from fedjax_robust.algorithms.fedavg import put_paths, state_owned_params, take_paths
  from fedjax_robust.simulation import round_keys
  params, state = variables["params"], {"batch_stats": variables["batch_stats"]}
  opt = optax.sgd(0.05)
  k = data.num_clients
  local = [(take_paths(params, state_owned_params(params, state)), state) for _ in range(k)]
  train = jax.jit(lambda p, s, d, key: local_train(classification_loss(model), opt, p, opt.init(p), d, key, SPEC, s))
  run_key = jax.random.key(seed)
  for t in range(rounds):
    _, client_key, _, _ = round_keys(run_key, t)
    results = []
    for c in range(k):
      start_p, start_s = params, state
      if keep_bn_local:
        start_p, start_s = put_paths(params, local[c][0]), local[c][1]
      r = train(start_p, start_s, client_data(data, c), jax.random.fold_in(client_key, c))
      results.append(r)
      if keep_bn_local:
        local[c] = (take_paths(r.params, state_owned_params(r.params, r.model_state)), r.model_state)
    w = data.n_train.astype(np.float32) / data.n_train.sum()
    params = jax.tree.map(lambda g, *ps: g + sum(wi * (p - g) for wi, p in zip(w, ps)), params,
                          *[r.params for r in results])
    state = jax.tree.map(lambda *ss: sum(wi * s for wi, s in zip(w, ss)), *[r.model_state for r in results])
  return params, state, local


def test_torch_batchnorm_running_statistics_by_hand():
  """PyTorch's BatchNorm2d update over the real rows only: mean and the UNBIASED variance over the m real values
  per channel (here 3 rows x 2 x 2 = 12), momentum 0.1; output normalised with the biased variance; a batch with
  no real row changes nothing; evaluation uses the running statistics."""
  from fedjax_robust.models.layers import TorchBatchNorm
  bn = TorchBatchNorm(momentum=0.9, epsilon=1e-5)
  x = np.asarray(flat_random.normal(jax.random.key(0), (4, 2, 2, 3)), np.float64) * 2.0 + 1.0
  mask = np.array([True, True, True, False])  # one flag per row
  v = bn.init(jax.random.key(1), jnp.zeros((1, 2, 2, 3)))
  assert jax.tree.map(np.shape, v) == {"params": {"scale": (3,), "bias": (3,)},
                                       "batch_stats": {"mean": (3,), "var": (3,)}}  # flax's names
  y, state = bn.apply(v, jnp.asarray(x, jnp.float32), use_running_average=False, mask=mask,
                      mutable=["batch_stats"])
  real = x[:3].reshape(-1, 3)
  mean, biased, unbiased = real.mean(0), real.var(0), real.var(0, ddof=1)
  np.testing.assert_allclose(state["batch_stats"]["mean"], 0.1 * mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state["batch_stats"]["var"], 0.9 + 0.1 * unbiased, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(y)[:3], (x[:3] - mean) / np.sqrt(biased + 1e-5), rtol=1e-4, atol=1e-5)
  _, unchanged = bn.apply(v, jnp.asarray(x, jnp.float32), use_running_average=False,
                          mask=np.zeros(4, bool), mutable=["batch_stats"])
  np.testing.assert_array_equal(unchanged["batch_stats"]["var"], v["batch_stats"]["var"])
  np.testing.assert_array_equal(unchanged["batch_stats"]["mean"], v["batch_stats"]["mean"])
  stats = {"params": v["params"], "batch_stats": state["batch_stats"]}
  y_eval = bn.apply(stats, jnp.asarray(x, jnp.float32), use_running_average=True)
  np.testing.assert_allclose(y_eval, (x - 0.1 * mean) / np.sqrt(0.9 + 0.1 * unbiased + 1e-5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("keep_bn_local", [False, True])
def test_batchnorm_fedavg_and_fedbn_strategies_equal_plain_loop(keep_bn_local):
  data, model, variables = bn_setup()
  alg = make_fedavg(model, optax.sgd(0.05), SPEC, keep_norm_local=keep_bn_local,
                    name="fedbn" if keep_bn_local else "fedavg")
  finals = {}
  for strategy in ("vmap", "sequential", "shard_map"):
    sim = Simulator(alg, data, model, make_strategy(strategy))
    state = sim.init(variables, seed=4)
    for _ in range(2):
      state, _ = sim.run_round(state)
    finals[strategy] = state
    metrics = sim.evaluate(state)
    assert 0 <= metrics["client_acc_mean"] <= 1 and "global_test_acc" in metrics
  ref_params, ref_state, ref_local = _plain_loop_fedavg_bn(data, model, variables, 2, keep_bn_local, 4)
  for strategy, state in finals.items():
    assert_trees_close(state.server.params, ref_params, atol=2e-5)
    assert_trees_close(state.server.model_state, ref_state, atol=2e-5)
    if keep_bn_local:
      for c in range(data.num_clients):
        own = jax.tree.map(lambda a: a[c], state.clients["norm"])
        assert_trees_close(own["params"], ref_local[c][0], atol=2e-5)
        assert_trees_close(own["state"], ref_local[c][1], atol=2e-5)


def test_stateless_only_algorithms_refuse_batchnorm():
  from fedjax_robust.algorithms.ditto import make_ditto
  _, model, _ = bn_setup()
  with pytest.raises(ValueError, match="BatchNorm"):
    make_ditto(model, optax.sgd(0.1), SPEC)
  with pytest.raises(ValueError, match="FedBN"):
    make_fedavg(make_model(get_model("mlp", 3)), optax.sgd(0.1), SPEC, keep_norm_local=True)


# ------------------------------------------------------------------------------------------ 2. step hooks
@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_batch_transform_sees_current_model_and_a_per_step_key():
  """An FGSM-style transform inside local training equals a hand-written step loop; padded == tight."""
  data = make_data(shape=(4, 4, 1))
  model = make_model(get_model("mlp", 3, hidden=(8,)))
  params = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))["params"]
  eps = 0.1

  def fgsm_with_noise(variables, x, y, mask, key):
    def loss(xx):
      logits = model.apply(variables, xx)[0]  # eval mode, spec A8
      return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, y) * mask)
    return x + eps * jnp.sign(jax.grad(loss)(x)) + 0.01 * flat_random.normal(key, x.shape)

  spec = LocalTrainSpec(epochs=2, batch_size=4, shuffle=False)
  opt = optax.sgd(0.1)
  loss_fn = classification_loss(model)
  out = local_train(loss_fn, opt, params, opt.init(params), client_data(data, 0), jax.random.key(5), spec,
                    batch_transform=fgsm_with_noise)
  tight = local_train(loss_fn, opt, params, opt.init(params), client_data(data, 0, tight=True), jax.random.key(5),
                      spec, batch_transform=fgsm_with_noise)
  assert_trees_close(out.params, tight.params, atol=1e-6)
  # hand-written loop: client 0 has 7 rows -> 2 steps per epoch (4 + 3), unshuffled
  from fedjax_robust.client.local_sgd import STEP_KEY_STREAM, Batch
  root = jax.random.fold_in(jax.random.key(5), STEP_KEY_STREAM)
  x_all, y_all, n = np.asarray(data.x_train[0]), np.asarray(data.y_train[0]), int(data.n_train[0])
  p = params
  for epoch in range(2):
    for j in range(2):
      rows = np.arange(j * 4, j * 4 + 4)
      mask = rows < n
      rows = np.where(mask, rows, 0)
      tkey, lkey = jax.random.split(jax.random.fold_in(jax.random.fold_in(root, epoch), j))
      x = fgsm_with_noise({"params": p}, jnp.asarray(x_all[rows]), jnp.asarray(y_all[rows]), jnp.asarray(mask), tkey)
      grads = jax.grad(lambda q: loss_fn(q, Batch(x, jnp.asarray(y_all[rows]), jnp.asarray(mask), lkey, {}))[0])(p)
      p = jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)
  assert_trees_close(out.params, p, atol=1e-6)
  plain = local_train(loss_fn, opt, params, opt.init(params), client_data(data, 0), jax.random.key(5), spec)
  assert not np.allclose(plain.params["head"]["kernel"], out.params["head"]["kernel"], atol=1e-5)


# ------------------------------------------------------------------------------------------ 3. context and needs
def _config(**overrides):
  from fedjax_robust.experiment import default_config
  c = default_config()
  c.rounds = 2
  c.output.progress = False
  c.data.num_clients = 6
  c.model = ml_collections.ConfigDict({"name": "mlp", "hidden": (16,)})
  for key, value in overrides.items():
    node = c
    *path, leaf = key.split(".")
    for part in path:
      node = node[part]
    with node.unlocked():
      node[leaf] = value
  return c


@pytest.mark.fast_compiles  # tests/conftest.py
def test_flare_runs_end_to_end_with_engine_computed_features(tmp_path):
  from fedjax_robust.experiment import run_experiment
  c = _config(**{"aggregator.name": "flare", "attack.name": "sign_flip", "attack.fraction": 0.34,
                 "server.root_dataset_size": 20})
  summary = run_experiment(c, tmp_path / "flare")
  assert math.isfinite(summary["final"]["train_loss"]) and summary["final"]["global_test_acc"] > 0


def test_flare_features_are_each_client_models_penultimate_activations():
  from fedjax_robust.round_context import compute_needs
  model = make_model(get_model("mlp", 3, hidden=(5,)))
  gp = model.init(jax.random.key(0), jnp.zeros((1, 4)))["params"]
  deltas = jax.tree.map(lambda a: flat_random.normal(jax.random.key(1), (3,) + a.shape), gp)
  server = ClientData(flat_random.normal(jax.random.key(2), (7, 4)), jnp.zeros((7,), jnp.int32), jnp.int32(7))
  ctx = RoundContext(jnp.int32(0), jnp.arange(3), jnp.zeros(3, bool), jnp.ones(3), gp, server)
  out = compute_needs(("features", "penultimate_weights"), ctx, deltas,
                      features_fn=lambda p, x: model.features({"params": p}, x), penultimate="fc1")
  for i in range(3):
    client = jax.tree.map(lambda g, d: g + d[i], gp, deltas)
    np.testing.assert_allclose(out.get("features")[i], model.features({"params": client}, server.x), atol=1e-5)
    np.testing.assert_allclose(out.get("penultimate_weights")[i], client["fc1"]["kernel"], atol=1e-6)
  assert out.get("round") == 0 and out.get("nothing", 5) == 5 and "features" in out.as_dict()


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_fltrust_server_data_as_round_argument_equals_closed_over_root_set():
  data = make_data(shape=(4, 4, 1))
  model = make_model(get_model("mlp", 3, hidden=(8,)))
  params = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))["params"]
  root = client_data(make_data(sizes=(10,), test_sizes=(1,), shape=(4, 4, 1), seed=3), 0)
  results = []
  for closure in (True, False):
    alg = make_fedavg(model, optax.sgd(0.1), SPEC, aggregator=make_aggregator("fltrust"),
                      root_data=root if closure else None)
    sim = Simulator(alg, data, model, cohort_size=3, server_data=None if closure else root)
    state = sim.init(params, seed=1)
    for _ in range(2):
      state, metrics = sim.run_round(state)
    results.append((state.server.params, metrics["aggregation_weights"]))
  assert_trees_close(results[0][0], results[1][0], atol=0)
  np.testing.assert_array_equal(results[0][1], results[1][1])
  with pytest.raises(ValueError, match="server-held data"):
    alg = make_fedavg(model, optax.sgd(0.1), SPEC, aggregator=make_aggregator("fltrust"))
    Simulator(alg, data, model).run_round(Simulator(alg, data, model).init(params))


def test_attacks_may_poison_several_upload_fields():
  from fedjax_robust.attacks import as_upload_transform, sign_flip
  transform = as_upload_transform(sign_flip(), np.array([True, False, False]), fields=("delta", "loss"))
  uploads = {"delta": {"w": jnp.ones((3, 2))}, "loss": jnp.array([1.0, 2.0, 3.0])}
  ctx = RoundContext(jnp.int32(0), jnp.arange(3), jnp.array([True, False, False]), jnp.ones(3))
  out = transform(uploads, jnp.arange(3), jax.random.key(0), ctx)
  np.testing.assert_array_equal(out["delta"]["w"][0], -1.0)
  np.testing.assert_array_equal(out["loss"], [-1.0, 2.0, 3.0])
  with pytest.raises(ValueError, match="attack.fields"):
    as_upload_transform(sign_flip(), np.ones(3, bool), fields=("model",))(uploads, jnp.arange(3), jax.random.key(0))


# ------------------------------------------------------------------------------------------ 4. many models
@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_score_models_equals_a_loop_over_models():
  model = make_model(get_model("mlp", 3, hidden=(6,)))
  stacked = jax.vmap(lambda k: model.init(k, jnp.zeros((1, 5)))["params"])(jax.random.split(jax.random.key(0), 5))
  x = flat_random.normal(jax.random.key(1), (23, 5))
  y = jax.random.randint(jax.random.key(2), (23,), 0, 3)
  scores = score_models(model.logits, stacked, x, y, 20, batch_size=8, model_chunk=2)
  for i in range(5):
    p = jax.tree.map(lambda a: a[i], stacked)
    correct, count = count_correct(model.logits, p, x, y, 20)
    logits = model.logits(p, x[:20])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y[:20]).sum()
    assert int(scores.correct[i]) == int(correct) and int(scores.count[i]) == int(count) == 20
    np.testing.assert_allclose(scores.loss_sum[i], loss, rtol=1e-5)
  per = score_models(model.logits, stacked, jnp.stack([x] * 5), jnp.stack([y] * 5), jnp.full((5,), 20),
                     batch_size=8, per_model_data=True)
  np.testing.assert_array_equal(per.correct, scores.correct)
  # a row mask that is not a prefix (FedFomo's validation window): only rows 4..9 are scored
  window = (jnp.arange(23) >= 4) & (jnp.arange(23) < 10)
  masked = score_models(model.logits, stacked, x, y, 20, batch_size=8, mask=window)
  for i in range(5):
    p = jax.tree.map(lambda a: a[i], stacked)
    logits = model.logits(p, x[4:10])
    assert int(masked.count[i]) == 6
    assert int(masked.correct[i]) == int(jnp.sum(jnp.argmax(logits, -1) == y[4:10]))
    np.testing.assert_allclose(masked.mean_loss[i],
                               optax.softmax_cross_entropy_with_integer_labels(logits, y[4:10]).mean(), rtol=1e-5)


# ------------------------------------------------------------------------------------------ 5. samplers, registry
def test_forced_sampler_puts_clients_in_at_given_rounds():
  sampler = ForcedSampler(parse_schedule("2:7,4:7+1"), num_clients=10, cohort_size=3)
  key = jax.random.key(0)
  for t in range(6):  # t completed rounds -> round t + 1
    cohort = np.asarray(sampler.sample(jax.random.fold_in(key, t), jnp.int32(t), 10, 3))
    assert len(set(cohort)) == 3 and list(cohort) == sorted(cohort)
    if t + 1 == 2:
      assert 7 in cohort
    if t + 1 == 4:
      assert {1, 7} <= set(cohort)
  hits = sum(7 in np.asarray(sample_cohort(jax.random.key(i), 10, 3)) for i in range(50))
  assert hits < 50  # the uniform draw alone does not always contain 7
  with pytest.raises(ValueError, match="forces 2 clients"):
    ForcedSampler({3: [1, 2]}, num_clients=10, cohort_size=1)
  with pytest.raises(ValueError, match="round:id"):
    parse_schedule("3-1")


def test_forced_sampler_from_config_through_the_engine(tmp_path):
  from fedjax_robust.experiment import build_experiment
  exp = build_experiment(_config(**{"server.participation": 0.5, "sampler.name": "forced", "sampler.forced": "1:5"}))
  _, metrics = exp.simulator.run_round(exp.init_state())
  assert 5 in np.asarray(metrics["cohort"])


@pytest.mark.fast_compiles  # tests/conftest.py
def test_algorithm_registry_declarations():
  from fedjax_robust.algorithms.registry import ALGORITHMS
  from fedjax_robust.experiment import build_experiment, cohort_size
  assert {"fedavg", "fedprox", "fedavg_ft", "fedbn", "local", "ditto", "fedrod", "fedcap", "fedfomo"} <= set(ALGORITHMS)
  assert cohort_size(_config(**{"algorithm.name": "local", "server.participation": 0.5}), 6) == 6
  with pytest.raises(ValueError, match="unknown algorithm"):
    build_experiment(_config(**{"algorithm.name": "fedsomething"}))
  with pytest.raises(ValueError, match="aggregates nothing"):
    build_experiment(_config(**{"algorithm.name": "local", "aggregator.name": "median"}))
  with pytest.raises(ValueError, match="aggregates nothing"):
    build_experiment(_config(**{"algorithm.name": "fedcap", "aggregator.weighted": False}))
  # engine.unroll=false: CPU's default for a conv net unrolls every local step (~20 here), which made this round
  # compile ~4x longer; what is checked (FedBN from the registry, its norm state) does not depend on the unroll.
  exp = build_experiment(_config(**{"algorithm.name": "fedbn", "model": ml_collections.ConfigDict(
      {"name": "bn_cnn", "widths": (2,), "fc_dim": 4}), "data.name": "digits", "engine.unroll": "false"}))
  state, _ = exp.simulator.run_round(exp.init_state())
  assert "norm" in state.clients and "batch_stats" in state.server.model_state


# ------------------------------------------------------------------------------------------ 9. bugs
def test_default_mean_screens_non_finite_uploads_and_takes_its_parameters(tmp_path):
  from fedjax_robust.experiment import build_experiment
  exp = build_experiment(_config(**{"attack.name": "gaussian", "attack.params": ml_collections.ConfigDict(
      {"sigma": float("inf")}), "attack.fraction": 0.34}))
  state = exp.init_state()
  for _ in range(2):
    state, metrics = exp.simulator.run_round(state)
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(state.server.params))
  cohort = np.asarray(metrics["cohort"])
  np.testing.assert_array_equal(np.asarray(metrics["flagged"]), exp.malicious[cohort])
  assert float(metrics["detection_tpr"]) == 1.0
  assert exp.simulator.evaluate(state)["global_test_acc"] > 0.2
  # unweighted mean is honoured; unknown parameters are refused
  build_experiment(_config(**{"aggregator.weighted": False}))
  with pytest.raises(ValueError, match="unknown parameter"):
    build_experiment(_config(**{"aggregator.bogus": 1}))


def test_rule_and_attack_parameters_from_the_command_line():
  from fedjax_robust.experiment import apply_open_overrides, default_config, split_open_overrides
  argv = ["run.py", "--config", "c.py", "--config.rounds=3", "--config.aggregator.name=krum",
          "--config.aggregator.num_byzantine=1", "--config.attack.params.sigma=inf", "--config.model.hidden=(32,)"]
  rest, taken = split_open_overrides(argv)
  assert rest == ["run.py", "--config", "c.py", "--config.rounds=3"]
  c = apply_open_overrides(default_config(), taken)
  c.lock()
  assert c.aggregator.name == "krum" and c.aggregator.num_byzantine == 1
  assert math.isinf(c.attack.params.sigma) and tuple(c.model.hidden) == (32,)
  with pytest.raises(ValueError, match="expected a int"):
    apply_open_overrides(default_config(), [("aggregator.num_byzantine", "2"), ("aggregator.num_byzantine", "two")])


@pytest.mark.parametrize("override, message", [
    ({"client.lr": float("nan")}, "learning rate must be a finite number"),
    ({"attack.name": "sign_flip", "attack.fraction": 1.5}, r"attack.fraction must be in \[0, 1\]"),
    ({"attack.name": "sign_flip", "attack.fraction": 0.05}, "rounds down to 0"),
    ({"data.partition.name": "dirichlet", "data.partition.alpha": float("inf")}, "IID limit"),
])
def test_bad_inputs_are_clear_errors(override, message):
  from fedjax_robust.experiment import build_experiment
  with pytest.raises(ValueError, match=message):
    build_experiment(_config(**override))


def test_every_client_malicious_warns(caplog):
  from fedjax_robust.experiment import build_experiment
  with caplog.at_level("WARNING"):
    build_experiment(_config(**{"attack.name": "sign_flip", "attack.fraction": 1.0}))
  assert "every client is malicious" in caplog.text


# ------------------------------------------------------------------------------------------ 4. evaluators
def test_evaluators_are_chosen_in_the_config():
  from fedjax_robust.experiment import build_experiment
  exp = build_experiment(_config(**{"eval.metrics": "accuracy"}))
  state, _ = exp.simulator.run_round(exp.init_state())
  metrics = exp.simulator.evaluate(state)
  assert {"global_test_acc", "global_client_acc_weighted", "client_acc_mean"} <= set(metrics)
  assert isinstance(metrics["global_test_acc"], float)
  with pytest.raises(ValueError, match="unknown evaluator"):
    build_experiment(_config(**{"eval.metrics": "accuracy,robustness"}))
  with pytest.raises(ValueError, match="no backdoor attack"):
    build_experiment(_config(**{"eval.metrics": "backdoor"}))
  bd = build_experiment(_config(**{"attack.data.kind": "backdoor", "attack.fraction": 0.34}))
  assert bd.simulator.evaluators == ("accuracy", "backdoor")
  assert "backdoor_asr" in bd.simulator.evaluate(bd.init_state())


def test_a_pure_evaluator_is_compiled_once_under_every_strategy():
  """Under ``sequential`` (not traceable) a pure evaluator is one program traced at the first evaluation and reused
  after, as inside the traceable strategies' evaluation program; left eager, its loops were compiled anew at every
  evaluation (a FedALC round on the CPU spent ~40 s recompiling the robust evaluation). Same values either way."""
  from fedjax_robust.metrics import evaluators as ev
  traces = []

  def probe(sim, state, global_model, inputs):
    traces.append(state.round)
    x = inputs.global_test[0]
    total, _ = jax.lax.scan(lambda c, xi: (c + jnp.sum(sim.model.logits(global_model, xi[None])), None), 0.0, x)
    return {"probe_logit_sum": total}

  ev.register_evaluator("_probe_pure", probe, pure=True)
  try:
    data, model, variables = bn_setup()
    alg = make_fedavg(model, optax.sgd(0.05), SPEC)
    sums = {}
    for strategy in ("sequential", "vmap"):
      traces.clear()
      sim = Simulator(alg, data, model, make_strategy(strategy), evaluators=("accuracy", "_probe_pure"))
      state = sim.init(variables, seed=0)
      before = sim.evaluate(state)
      state, _ = sim.run_round(state)
      after = sim.evaluate(state)
      assert len(traces) == 1, (strategy, traces)
      assert "client_acc_mean" in after  # the strategy-dependent evaluator still runs beside it
      sums[strategy] = (before["probe_logit_sum"], after["probe_logit_sum"])
    assert sums["sequential"][0] != sums["sequential"][1]  # the reused program reads the new model
    np.testing.assert_allclose(sums["sequential"], sums["vmap"], rtol=1e-5)
  finally:
    del ev.EVALUATORS["_probe_pure"]
    ev.PURE_EVALUATORS.discard("_probe_pure")
  assert {"robust", "backdoor"} <= ev.PURE_EVALUATORS and "accuracy" not in ev.PURE_EVALUATORS


def test_resuming_a_run_stored_before_a_config_field_existed():
  """A stored config without a field added later (left at its default) is the same experiment."""
  import json
  from fedjax_robust.experiment import default_config, resume_mismatches
  current = json.loads(default_config().to_json_best_effort())
  stored = json.loads(default_config().to_json_best_effort())
  del stored["sampler"], stored["attack"]["fields"]
  assert resume_mismatches(stored, current) == []
  current["sampler"]["name"] = "forced"
  assert resume_mismatches(stored, current) == ["sampler.name"]


def test_each_algorithm_owns_its_config_block():
  """config.algorithm.<name>.* comes from the registry entry's declared options; a field the algorithm does not
  declare (misspelled, or another algorithm's) is refused when set, and the builder reads its own block."""
  from fedjax_robust.algorithms.registry import ALGORITHMS
  from fedjax_robust.experiment import default_config
  c = default_config()
  for name, entry in ALGORITHMS.items():
    if entry.options:
      assert dict(c.algorithm[name]) == dict(entry.options), name
  assert c.algorithm.fedprox.mu == 0.01 and c.algorithm.ditto.lamda == 1.0 and "mu" not in c.algorithm
  with pytest.raises(AttributeError):
    c.algorithm.fedprox.lamda = 0.5  # Ditto's field, not FedProx's
  with pytest.raises(AttributeError):
    c.algorithm.mu = 0.1  # no flat fields any more


def test_stratified_sampler_puts_exactly_m_attackers_in_every_round():
  """FedCC's placement (spec §2.6): f = 30% of every round's n participants are attackers, each part uniform."""
  from fedjax_robust.sampling import StratifiedSampler, sampler_from_config
  mal = jnp.asarray(np.arange(20) % 3 == 0)  # 7 attackers of 20
  sampler = StratifiedSampler(3, 10)
  seen = set()
  for t in range(30):
    cohort = np.asarray(sampler.sample(jax.random.key(t), jnp.int32(t), 20, 10, malicious=mal))
    assert len(set(cohort)) == 10 and list(cohort) == sorted(cohort)
    assert int(np.asarray(mal)[cohort].sum()) == 3
    seen |= set(cohort.tolist())
  assert seen == set(range(20))  # both parts are drawn at random, everyone shows up
  eligible = jnp.asarray(np.arange(20) != 3)
  for t in range(10):
    cohort = np.asarray(sampler.sample(jax.random.key(t), jnp.int32(t), 20, 10, eligible, mal))
    assert 3 not in cohort and int(np.asarray(mal)[cohort].sum()) == 3
  assert sampler_from_config({"name": "stratified", "attackers": -1}, 20, 10, attack_fraction=0.3).attackers == 3
  with pytest.raises(ValueError, match="attackers per round"):
    StratifiedSampler(11, 10)
