"""Adversarial kernels, FedALC's calibration and the training objectives (specs/fedalc.md §7)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust.adversarial import (CWParams, LinfParams, bim, calibrated_cross_entropy, calibration_weights,
                                       cw_l2, cw_linf, fgsm, objective_from_config, adversarial_config, pgd,
                                       robust_accuracy)
from fedjax_robust.adversarial.calibration import calibrate_logits, log_prior_logits
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train, masked_cross_entropy
from fedjax_robust.algorithms.fedavg import classification_loss, objective_transform
from fedjax_robust.models import get_model, make_model

EPS = 8 / 255
C = 10


def linear(params, x):
  return x.reshape(x.shape[0], -1) @ params["w"] + params["b"]


def _digits(n=256):
  from sklearn.datasets import load_digits
  d = load_digits()
  x = (d.images[:n] / 16.0).astype(np.float32)[..., None]
  return jnp.asarray(x), jnp.asarray(d.target[:n], jnp.int32)


@pytest.fixture(scope="module")
def trained_linear():
  """A softmax regression on 8x8 digits in [0, 1], trained to ~95% train accuracy (a fixed model)."""
  x, y = _digits(512)
  params = {"w": jnp.zeros((64, C)), "b": jnp.zeros((C,))}
  opt = optax.adam(0.05)
  state = opt.init(params)
  loss = lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(linear(p, x), y))

  @jax.jit
  def step(p, s):
    g = jax.grad(loss)(p)
    u, s = opt.update(g, s)
    return optax.apply_updates(p, u), s

  for _ in range(200):
    params, state = step(params, state)
  return params, x[:128], y[:128]


def _ce(params, x, y):
  return float(jnp.mean(optax.softmax_cross_entropy_with_integer_labels(linear(params, x), y)))


# ------------------------------------------------------------------------------------------ kernels
def test_fgsm_equals_its_closed_form_on_a_linear_model(trained_linear):
  params, x, y = trained_linear
  p = jax.nn.softmax(linear(params, x))
  grad_logits = p - jax.nn.one_hot(y, C)  # dCE/dz
  grad_x = (grad_logits @ params["w"].T).reshape(x.shape)
  expected = np.clip(np.asarray(x) + EPS * np.sign(np.asarray(grad_x)), 0, 1)
  np.testing.assert_allclose(fgsm(linear, params, x, y, None, LinfParams(EPS)), expected, atol=1e-7)


@pytest.mark.parametrize("kernel", [fgsm, bim, pgd, cw_linf])
def test_linf_kernels_stay_in_the_ball_and_the_pixel_box(kernel, trained_linear):
  params, x, y = trained_linear
  out = np.asarray(kernel(linear, params, x, y, jax.random.key(0), LinfParams(EPS, 2 / 255, 5)))
  assert np.all(np.abs(out - np.asarray(x)) <= EPS + 1e-6)
  assert out.min() >= 0 and out.max() <= 1
  if kernel is fgsm:  # every pixel not clipped moved by exactly eps
    moved = np.abs(out - np.asarray(x))
    inside = (out > 0) & (out < 1)
    assert np.all((np.abs(moved[inside] - EPS) < 1e-6) | (moved[inside] < 1e-7))


def test_zero_steps_return_the_input_and_one_bim_step_of_eps_is_fgsm(trained_linear):
  params, x, y = trained_linear
  np.testing.assert_array_equal(pgd(linear, params, x, y, jax.random.key(0), LinfParams(EPS, 2 / 255, 0, False)), x)
  np.testing.assert_array_equal(bim(linear, params, x, y, None, LinfParams(EPS, EPS, 1)),
                                fgsm(linear, params, x, y, None, LinfParams(EPS)))


def test_attacks_raise_the_loss_of_a_fixed_model(trained_linear):
  params, x, y = trained_linear
  clean = _ce(params, x, y)
  attacks = {name: _ce(params, k(linear, params, x, y, jax.random.key(1), LinfParams(EPS, 2 / 255, 10)), y)
             for name, k in (("fgsm", fgsm), ("bim", bim), ("pgd", pgd))}
  assert all(v >= clean for v in attacks.values()), (clean, attacks)
  assert attacks["pgd"] >= attacks["fgsm"] and attacks["bim"] >= attacks["fgsm"]
  acc = lambda z: float(jnp.mean(jnp.argmax(linear(params, z), -1) == y))
  assert acc(pgd(linear, params, x, y, jax.random.key(1), LinfParams(EPS, 2 / 255, 10))) <= acc(x)


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_batched_kernels_equal_a_per_example_loop(trained_linear):
  params, x, y = trained_linear
  x, y = x[:6], y[:6]
  for kernel, prm in ((bim, LinfParams(EPS, 2 / 255, 5)), (fgsm, LinfParams(EPS)),
                      (cw_l2, CWParams(steps=20, lr=0.05))):
    batched = kernel(linear, params, x, y, None, prm)
    for i in range(6):
      np.testing.assert_allclose(batched[i:i + 1], kernel(linear, params, x[i:i + 1], y[i:i + 1], None, prm),
                                 atol=1e-6)
  # PGD's random start is drawn per row, so a row's result does not depend on the rows after it (padding)
  key = jax.random.key(3)
  np.testing.assert_allclose(pgd(linear, params, x, y, key)[:2], pgd(linear, params, x[:2], y[:2], key), atol=1e-6)


def test_attacks_run_under_vmap_over_clients_with_different_weights(trained_linear):
  params, x, y = trained_linear
  stacked = jax.tree.map(lambda a: jnp.stack([a, 0.5 * a, -a]), params)
  keys = jax.random.split(jax.random.key(0), 3)
  out = jax.jit(jax.vmap(lambda p, k: pgd(linear, p, x[:8], y[:8], k)))(stacked, keys)
  for i in range(3):
    np.testing.assert_allclose(out[i], pgd(linear, jax.tree.map(lambda a: a[i], stacked), x[:8], y[:8], keys[i]),
                               atol=1e-6)


def test_no_gradient_flows_from_the_adversarial_examples_into_the_model(trained_linear):
  params, x, y = trained_linear
  g = jax.grad(lambda p: jnp.sum(pgd(linear, p, x[:4], y[:4], jax.random.key(0))))(params)
  assert all(float(jnp.abs(a).max()) == 0.0 for a in jax.tree.leaves(g))


def test_cw_returns_clean_inputs_or_misclassified_ones(trained_linear):
  params, x, y = trained_linear
  out = cw_l2(linear, params, x, y, None, CWParams(c=5.0, steps=50, lr=0.05))
  changed = np.any(np.asarray(out) != np.asarray(x), axis=(1, 2, 3))
  pred = np.asarray(jnp.argmax(linear(params, out), -1))
  assert np.all(pred[changed] != np.asarray(y)[changed])
  assert changed.any()
  assert np.mean(pred == np.asarray(y)) <= np.mean(np.asarray(jnp.argmax(linear(params, x), -1)) == np.asarray(y))
  # torchattacks' batch-level early stop and no early stop are options; both keep the same guarantee
  for mode in ("batch", "none"):
    o = cw_l2(linear, params, x[:16], y[:16], None, CWParams(c=5.0, steps=20, lr=0.05, early_stop=mode))
    ch = np.any(np.asarray(o) != np.asarray(x[:16]), axis=(1, 2, 3))
    assert np.all(np.asarray(jnp.argmax(linear(params, o), -1))[ch] != np.asarray(y[:16])[ch])


def test_robust_accuracy_counts_every_row_once_with_a_partial_last_batch(trained_linear):
  params, x, y = trained_linear
  clean_correct, count = robust_accuracy(linear, params, x[:50], y[:50], jax.random.key(0), None, None, 16)
  assert int(count) == 50
  assert int(clean_correct) == int(jnp.sum(jnp.argmax(linear(params, x[:50]), -1) == y[:50]))
  adv_correct, _ = robust_accuracy(linear, params, x[:50], y[:50], jax.random.key(0), pgd, LinfParams(0.3, 0.05, 10),
                                   16)
  assert int(adv_correct) < int(clean_correct)


# ------------------------------------------------------------------------------------------ calibration
COUNTS = [20, 0, 0, 8, 0, 0, 0, 4, 0, 0]
Y_GOLDEN = jnp.asarray(np.repeat(np.arange(10), COUNTS), jnp.int32)  # 32 labels with these counts
Z = jnp.asarray([1, 0, 0, 2, 0, 0, 0, -1, 0, 0], jnp.float32)


@pytest.mark.parametrize("variant,expected", [
    ("inv_sqrt_freq", [1.2649, 1, 1, 2.0, 1, 1, 1, 2.8284, 1, 1]),
    ("eq5_literal", [3.5355, 0, 0, 1.4142, 0, 0, 0, 0.7071, 0, 0]),
    ("sqrt_freq", [0.7906, 0, 0, 0.5, 0, 0, 0, 0.3536, 0, 0]),
])
def test_calibration_weights_golden_values(variant, expected):
  w = calibration_weights(Y_GOLDEN, jnp.ones(32, bool), C, variant)
  np.testing.assert_allclose(w, expected, atol=1e-4)


def test_calibrated_cross_entropy_golden_values():
  mask = jnp.ones(32, bool)
  w = calibration_weights(Y_GOLDEN, mask, C)
  for label, plain, calibrated, sample_axis in ((0, 1.860784, 2.912549, 1.886812), (3, 0.860784, 0.177460, 0.235881),
                                                (7, 3.860784, 7.005887, 8.565724)):
    y = jnp.asarray([label])
    ce = lambda z: float(optax.softmax_cross_entropy_with_integer_labels(z, y)[0])
    assert ce(Z[None]) == pytest.approx(plain, abs=1e-5)
    assert ce(calibrate_logits(Z[None], y, w, "class")) == pytest.approx(calibrated, abs=1e-5)
    assert ce(calibrate_logits(Z[None], y, w, "sample")) == pytest.approx(sample_axis, abs=1e-5)
  uniform = calibration_weights(jnp.arange(30) % 10, jnp.ones(30, bool), C)
  np.testing.assert_allclose(uniform, np.full(10, np.sqrt(10)), rtol=1e-6)
  y3 = jnp.asarray([3])
  assert float(optax.softmax_cross_entropy_with_integer_labels(calibrate_logits(Z[None], y3, uniform), y3)[0]) == \
      pytest.approx(0.053491, abs=1e-5)


def test_calibration_properties():
  rng = np.random.default_rng(0)
  y = jnp.asarray(rng.choice(10, 32, p=np.linspace(1, 10, 10) / 55), jnp.int32)
  mask = jnp.ones(32, bool)
  w = np.asarray(calibration_weights(y, mask, C))
  counts = np.bincount(np.asarray(y), minlength=10)
  present = counts > 0
  assert np.all(w[present] >= 1)
  for j in np.flatnonzero(present):  # rarer class in the batch -> larger weight
    for k in np.flatnonzero(present):
      if counts[j] < counts[k]:
        assert w[j] > w[k]
  # order of the batch does not matter; padded rows change neither counts nor loss
  perm = rng.permutation(32)
  np.testing.assert_allclose(calibration_weights(y[perm], mask, C), w)
  logits = jnp.asarray(rng.normal(size=(32, 10)), jnp.float32)
  padded_y = jnp.concatenate([y, jnp.zeros(8, jnp.int32)])
  padded_logits = jnp.concatenate([logits, 100 * jnp.ones((8, 10))])
  padded_mask = jnp.concatenate([mask, jnp.zeros(8, bool)])
  np.testing.assert_allclose(calibrated_cross_entropy(padded_logits, padded_y, padded_mask),
                             calibrated_cross_entropy(logits, y, mask), rtol=1e-6)
  # a single-class batch: every weight is 1, so the calibrated loss IS plain CE
  single = jnp.full((32,), 4, jnp.int32)
  np.testing.assert_array_equal(calibration_weights(single, mask, C), np.ones(10))
  assert float(calibrated_cross_entropy(logits, single, mask)) == float(masked_cross_entropy(logits, single, mask))
  # variant none is plain CE bit for bit; the weights carry no gradient
  assert float(calibrated_cross_entropy(logits, y, mask, "none")) == float(masked_cross_entropy(logits, y, mask))
  g = jax.grad(lambda z: calibrated_cross_entropy(z, y, mask))(logits)
  wz = np.asarray(w)[None, :]
  p = jax.nn.softmax(logits * wz)
  np.testing.assert_allclose(g, (p - jax.nn.one_hot(y, 10)) * wz / 32, atol=1e-6)
  # absent classes: 'one' keeps the logit, 'as_one' uses n_j = 1 (the largest weight), normalisation by the mean
  w_as_one = np.asarray(calibration_weights(Y_GOLDEN, jnp.ones(32, bool), C, absent="as_one"))
  assert w_as_one[1] == pytest.approx(np.sqrt(32))
  w_norm = np.asarray(calibration_weights(Y_GOLDEN, jnp.ones(32, bool), C, normalize="mean"))
  assert w_norm[[0, 3, 7]].mean() == pytest.approx(1.0)
  with pytest.raises(ValueError, match="calib_variant"):
    calibration_weights(y, mask, C, "sqrt")


def test_calfat_log_prior():
  z = jnp.zeros((1, 3))
  out = log_prior_logits(z, jnp.asarray([9.0, 0.0, 1.0]), scale=10.0, tau=0.1)
  np.testing.assert_allclose(out, [[10 * 0.1 * np.log(9 + 1e-7), 10 * 0.1 * np.log(1 + 1e-7),
                                    10 * 0.1 * np.log(1 + 1e-7)]], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------ objectives
def _objective(name, **options):
  cfg = adversarial_config()
  with cfg.unlocked():
    cfg.objective = name
    cfg.steps = 3  # a short attack keeps the compiles small; the kernels' own tests use 5-10 steps
    for k, v in options.items():
      cfg[name][k] = v
  return objective_from_config(cfg)


def _client():
  x, y = _digits(70)
  x = jnp.concatenate([x, jnp.zeros((10,) + x.shape[1:])])  # 10 padding rows
  y = jnp.concatenate([y, jnp.zeros(10, jnp.int32)])
  return ClientData(x, y, jnp.int32(70))


def _train(objective, model, params, mu=0.0, steps=None):
  data = _client()
  opt = optax.adam(1e-2)
  spec = LocalTrainSpec(epochs=1, batch_size=32)
  loss = classification_loss(model, params, mu, objective, data)
  return local_train(loss, opt, params, opt.init(params), data, jax.random.key(5), spec, {},
                     objective_transform(objective, model, data))


@pytest.fixture(scope="module")
def dropout_cnn():
  module = get_model("mlp", 10, hidden=(32,), dropout_rate=0.2)
  model = make_model(module)
  return model, model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"]


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_fedalc_without_calibration_is_fedavg_at_bit_for_bit(dropout_cnn):
  model, params = dropout_cnn
  a = _train(_objective("fedalc", calib_variant="none"), model, params)
  b = _train(_objective("pgd_at"), model, params)
  for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(u, v)
  c = _train(_objective("fedalc"), model, params)
  assert not np.allclose(jax.tree.leaves(c.params)[0], jax.tree.leaves(b.params)[0])


def test_fat_fractions_bracket_clean_and_adversarial_training(dropout_cnn):
  model, params = dropout_cnn
  pairs = ((_objective("fat", adv_fraction=1.0), _objective("pgd_at")), (_objective("fat", adv_fraction=0.0),
                                                                          _objective("ce")))
  for fat, reference in pairs:
    a, b = _train(fat, model, params), _train(reference, model, params)
    for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
      np.testing.assert_allclose(u, v, atol=1e-7)


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_trades_with_zero_beta_is_clean_training_and_every_objective_trains():
  model = make_model(get_model("mlp", 10, hidden=(32,)))  # no dropout: the clean pass's key does not matter
  params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"]
  a, b = _train(_objective("trades", beta=0.0), model, params), _train(_objective("ce"), model, params)
  for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(u, v, atol=1e-6)
  for name in ("pgd_at", "fedalc", "fat", "trades", "mart", "calfat"):
    result = _train(_objective(name), model, params)
    assert np.isfinite(float(result.metrics["loss"])), name
    assert int(result.metrics["steps"]) == 3  # ceil(70 / 32): padded steps are no-ops
  with pytest.raises(ValueError, match="unknown adversarial.objective"):
    _objective("madry")


# ------------------------------------------------------------------------------------------ compile choices
def test_training_attack_unroll_rolls_the_loop_past_the_budget(monkeypatch):
  """``adversarial.unroll=auto``: unrolled on the CPU for conv nets while local steps x attack steps stays within
  the budget, rolled beyond it (E = 5 on Fashion-MNIST did not compile in 10 min / 17 GB unrolled); explicit values
  win; bad values fail loudly; the environment override still overrides."""
  from fedjax_robust.adversarial import training_attack_unroll
  from fedjax_robust.adversarial.attacks import TRAINING_ATTACK_UNROLL_BUDGET as budget
  monkeypatch.delenv("FEDJAX_ROBUST_ATTACK_UNROLL", raising=False)
  assert jax.default_backend() == "cpu"  # the suite runs on the CPU (CI); elsewhere auto never unrolls
  assert training_attack_unroll("auto", True, budget // 10, 10) is True  # exactly at the budget: unrolled
  assert training_attack_unroll("auto", True, budget // 10 + 1, 10) == 1  # one step more: rolled
  assert training_attack_unroll("auto", True, 80, 10) == 1  # FedALC Fashion-MNIST, E = 5 (800 attack steps)
  assert training_attack_unroll("auto", True, 25, 10) is True  # stored MNIST E = 1 cells: 19-25 steps
  assert training_attack_unroll("auto", False, 16, 10) == 1  # no convolutions: a rolled loop is fast
  assert training_attack_unroll("true", True, 80, 10) is True
  assert training_attack_unroll("false", True, 16, 10) == 1
  assert training_attack_unroll(5, True, 80, 10) == 5
  for bad in ("sometimes", "0", -2):
    with pytest.raises(ValueError, match="adversarial.unroll"):
      training_attack_unroll(bad, True, 16, 10)
  monkeypatch.setenv("FEDJAX_ROBUST_ATTACK_UNROLL", "false")
  assert training_attack_unroll("true", True, 16, 10) is False


def test_training_attack_loop_unroll_changes_no_number(trained_linear, dropout_cnn):
  """``LinfParams.unroll`` is a compile choice: the PGD and TRADES kernels give the same examples rolled as
  unrolled."""
  params, x, y = trained_linear
  key = jax.random.key(3)
  rolled = pgd(linear, params, x, y, key, LinfParams(EPS, 2 / 255, 5, True, 1))
  unrolled = pgd(linear, params, x, y, key, LinfParams(EPS, 2 / 255, 5, True, True))
  np.testing.assert_allclose(rolled, unrolled, atol=1e-6)
  model, mlp_params = dropout_cnn
  cfg = adversarial_config()
  with cfg.unlocked():
    cfg.objective, cfg.steps = "trades", 3
  mask = jnp.ones((x.shape[0],), bool)
  data = ClientData(x, y, jnp.asarray(x.shape[0]))
  outs = [objective_from_config(cfg, u).transform(model, data)({"params": mlp_params}, x, y, mask, key)
          for u in (1, True)]
  np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)
  assert not np.allclose(outs[0], x)  # the attack moved the inputs


def test_experiment_resolves_the_training_attack_unroll_from_its_local_steps(monkeypatch):
  """The experiment hands the objective the unroll its client program can afford. Under the conv-in-loop trap (a
  conv net on the CPU with ``model.conv_impl=xla``) the attack stays unrolled for a short local loop and rolls for
  a long one (``adversarial.unroll=auto``); with the default conv impl (``auto``: canonical on the CPU) there is no
  trap, and the local steps and the attack are rolled loops at any length."""
  import ml_collections
  import fedjax_robust.experiment as experiment_module
  from fedjax_robust.experiment import build_experiment, default_config
  monkeypatch.delenv("FEDJAX_ROBUST_ATTACK_UNROLL", raising=False)
  original = experiment_module.objective_from_config
  for impl, expected in (("xla", [True, 1]), ("auto", [1, 1])):
    seen, experiments = [], []
    monkeypatch.setattr(experiment_module, "objective_from_config",
                        lambda cfg, attack_unroll=None: seen.append(attack_unroll) or original(cfg, attack_unroll))
    for epochs in (1, 20):  # 2 clients of up to 810 digits, batch 64: 13 local steps per epoch (130, 2,600 attack steps)
      c = default_config()
      c.data.name, c.data.num_clients, c.data.normalize = "digits", 2, False
      c.model = ml_collections.ConfigDict({"name": "bn_cnn", "widths": (2,), "fc_dim": 4, "conv_impl": impl})
      c.client.epochs, c.client.batch_size = epochs, 64
      c.adversarial.objective, c.adversarial.steps = "pgd_at", 10
      c.eval.metrics = "accuracy,robust"
      experiments.append(build_experiment(c))
    assert [u for u in seen if u is not None] == expected, (impl, seen)
    assert [e.conv_loop_trap for e in experiments] == [impl == "xla"] * 2
    assert [e.unroll for e in experiments] == ([True, True] if impl == "xla" else [1, 1])
    # Robust evaluation's attack loops (FGSM, BIM, PGD, CW) follow the same trap flag.
    unrolls = {p.unroll for e in experiments for _, _, p in e.simulator.eval_options["robust"].attacks}
    assert unrolls == ({True} if impl == "xla" else {1}), unrolls


def test_a_long_unrolled_client_program_is_announced(caplog):
  """More than LONG_UNROLL_STEPS unrolled local steps (the CPU's choice under the conv-in-loop trap,
  ``model.conv_impl=xla``) log one warning naming the step count and the ways out; a short program, or a rolled one
  (the default conv impl at any length), logs none."""
  import logging
  import ml_collections
  from fedjax_robust.experiment import LONG_UNROLL_STEPS, build_experiment, default_config, long_unroll_warning
  assert long_unroll_warning(True, LONG_UNROLL_STEPS) is None
  assert str(LONG_UNROLL_STEPS + 1) in long_unroll_warning(True, LONG_UNROLL_STEPS + 1)
  assert long_unroll_warning(1, 10 * LONG_UNROLL_STEPS) is None
  assert long_unroll_warning(5, 10 * LONG_UNROLL_STEPS) is None
  for impl, epochs, expected in (("xla", 1, 0), ("xla", 10, 1), ("auto", 10, 0)):  # 13 steps per epoch
    c = default_config()
    c.data.name, c.data.num_clients, c.data.normalize = "digits", 2, False
    c.model = ml_collections.ConfigDict({"name": "bn_cnn", "widths": (2,), "fc_dim": 4, "conv_impl": impl})
    c.client.epochs, c.client.batch_size = epochs, 64
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedjax_robust"):
      build_experiment(c)
    assert sum("local steps into one client program" in r.getMessage() for r in caplog.records) == expected
