"""SCAFFOLD, FedDyn, FedNova, FedDC (spec fedvsa.md §3): hand-checked client and server steps on a linear model,
padding, FedNova = FedAvg for equal step counts, vmap == sequential over 2 rounds, registry refusals, end to end."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust.aggregators import make_mean
from fedjax_robust.algorithms.feddc import make_feddc
from fedjax_robust.algorithms.feddyn import make_feddyn
from fedjax_robust.algorithms.fedavg import make_fedavg
from fedjax_robust.algorithms.fednova import make_fednova, normalizing_constant
from fedjax_robust.algorithms.registry import BuildContext, build_algorithm
from fedjax_robust.algorithms.scaffold import make_scaffold
from fedjax_robust.client import ClientData, LocalTrainSpec
from fedjax_robust.execution import make_strategy
from fedjax_robust.experiment import default_config, run_experiment
from fedjax_robust.models import get_model, make_model
from fedjax_robust.optim import optimizer_from_config
from fedjax_robust.simulation import Simulator
from test_engine import assert_trees_close, make_data, setup
from test_experiment import digits_config
from test_pfl_baselines import assert_trees_equal, client, padded_pair, softmax

ALGORITHMS = ("scaffold", "feddyn", "fednova", "feddc")
ONE_BY_ONE = LocalTrainSpec(epochs=1, batch_size=1, shuffle=False)
LINEAR = lambda p, x: x @ p["k"] + p["b"]
XS, YS = np.array([[1.0, 2.0], [-1.5, 0.5]], np.float32), np.array([1, 0])


def linear_params(seed):
  rng = np.random.default_rng(seed)
  return {"k": rng.normal(size=(2, 2)).astype(np.float32), "b": rng.normal(size=2).astype(np.float32)}


def ce_grad(p, x, y):
  r = softmax(x @ p["k"] + p["b"]) - np.eye(2)[y]
  return {"k": np.outer(x, r), "b": r}


def two_samples():
  return ClientData(jnp.asarray(XS), jnp.asarray(YS, jnp.int32), jnp.int32(2))


def jnp_tree(t):
  return jax.tree.map(jnp.asarray, t)


def stack(*trees):
  return jax.tree.map(lambda *a: jnp.stack([jnp.asarray(x) for x in a]), *trees)


def build(name, apply_fn, opt, spec, lr, num_clients=4, aggregator=None, **kw):
  if name == "scaffold":
    return make_scaffold(apply_fn, opt, spec, num_clients, lr=lr, aggregator=aggregator, **kw)
  if name == "feddyn":
    return make_feddyn(apply_fn, opt, spec, num_clients, alpha=kw.pop("alpha", 0.1), aggregator=aggregator, **kw)
  if name == "fednova":
    return make_fednova(apply_fn, opt, spec, **kw)
  return make_feddc(apply_fn, opt, spec, num_clients, lr=lr, alpha=kw.pop("alpha", 0.1), aggregator=aggregator, **kw)


# ------------------------------------------------------------------------------------------------------ SCAFFOLD
def test_scaffold_client_corrected_steps_and_option_ii_by_hand():
  """Two SGD steps y ← y − η(g(y) − c_i + c), then c_i⁺ = c_i − c + (x − y)/(Kη) with K = 2 (Alg. 1 lines 10, 12)."""
  x, c, ci, lr = linear_params(0), linear_params(1), linear_params(2), 0.3
  alg = make_scaffold(LINEAR, optax.sgd(lr), ONE_BY_ONE, num_clients=5, lr=lr)
  out = alg.client_update({"model": jnp_tree(x), "c": jnp_tree(c)}, {"c": jnp_tree(ci)}, two_samples(),
                          jax.random.key(0))
  y, losses = dict(x), []
  for xx, yy in zip(XS, YS):
    g = ce_grad(y, xx, yy)
    losses.append(-np.log(softmax(xx @ y["k"] + y["b"])[yy]))
    y = {n: y[n] - lr * (g[n] - ci[n] + c[n]) for n in y}
  ci_new = {n: ci[n] - c[n] + (x[n] - y[n]) / (2 * lr) for n in x}
  assert int(out.metrics["steps"]) == 2
  assert_trees_close(out.upload["delta"], {n: y[n] - x[n] for n in x}, atol=1e-6)
  assert_trees_close(out.state["c"], ci_new, atol=1e-5)
  assert_trees_close(out.upload["dc"], {n: ci_new[n] - ci[n] for n in x}, atol=1e-5)
  assert float(out.metrics["loss"]) == pytest.approx(np.mean(losses), abs=1e-6)  # the correction adds no value


def test_scaffold_with_zero_control_variates_trains_like_fedavg():
  x, opt, spec = linear_params(0), optax.sgd(0.1, momentum=0.5), LocalTrainSpec(epochs=2, batch_size=1)
  zero = jax.tree.map(jnp.zeros_like, jnp_tree(x))
  out = make_scaffold(LINEAR, opt, spec, 4, lr=0.1).client_update({"model": jnp_tree(x), "c": zero}, {"c": zero},
                                                                  two_samples(), jax.random.key(3))
  ref = make_fedavg(LINEAR, opt, spec).client_update(jnp_tree(x), {}, two_samples(), jax.random.key(3))
  assert_trees_close(out.upload["delta"], ref.upload["delta"], atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_scaffold_server_update_by_hand(weighted):
  """x ← x + η_g Δy, c ← c + (|S|/N) Δc (Alg. 1 lines 16-17); a non-finite upload is excluded from both."""
  x, c = linear_params(3), linear_params(4)
  dy = [linear_params(10 + i) for i in range(3)]
  dc = [linear_params(20 + i) for i in range(3)]
  dy[2]["b"][0] = np.nan  # excluded and flagged by the mean rule; its Δc is NaN too and must not reach c
  dc[2]["k"][0, 0] = np.nan
  n = np.array([3.0, 1.0, 2.0], np.float32)
  alg = make_scaffold(LINEAR, optax.sgd(0.1), ONE_BY_ONE, num_clients=5, lr=0.1, server_lr=0.5,
                      aggregator=make_mean(weighted=weighted))
  state = alg.init_server(jnp_tree(x))._replace(c=jnp_tree(c))
  new, diag = alg.server_update(state, {"delta": stack(*dy), "dc": stack(*dc)}, jnp.asarray(n), jax.random.key(0))
  p = n[:2] / n[:2].sum() if weighted else np.array([0.5, 0.5])
  assert_trees_close(new.params, {k: x[k] + 0.5 * (p[0] * dy[0][k] + p[1] * dy[1][k]) for k in x}, atol=1e-6)
  assert_trees_close(new.c, {k: c[k] + 2 / 5 * (p[0] * dc[0][k] + p[1] * dc[1][k]) for k in x}, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(diag["flagged"]), [False, False, True])


# ------------------------------------------------------------------------------------------------------ FedDyn
def test_feddyn_client_and_server_by_hand():
  """Client: SGD on L_k(θ) − <g_k, θ> + α/2 ||θ − θ^{t-1}||², then g_k ← g_k − α(θ_k − θ^{t-1}).
  Server: h ← h − α (1/m) Σ_P Δ_k, θ^t = mean_P θ_k − h/α (Alg. 1 lines 5-6, 9-10; m = 5 clients, |P| = 2)."""
  theta0, g, lr, alpha = linear_params(0), linear_params(1), 0.3, 0.7
  alg = make_feddyn(LINEAR, optax.sgd(lr), ONE_BY_ONE, num_clients=5, alpha=alpha,
                    aggregator=make_mean(weighted=False))
  out = alg.client_update(jnp_tree(theta0), {"grad": jnp_tree(g)}, two_samples(), jax.random.key(0))
  th = dict(theta0)
  for xx, yy in zip(XS, YS):
    ce = ce_grad(th, xx, yy)
    th = {n: th[n] - lr * (ce[n] - g[n] + alpha * (th[n] - theta0[n])) for n in th}
  delta = {n: th[n] - theta0[n] for n in th}
  assert_trees_close(out.upload["delta"], delta, atol=1e-6)
  assert_trees_close(out.state["grad"], {n: g[n] - alpha * delta[n] for n in g}, atol=1e-6)

  h0, other = linear_params(5), linear_params(6)
  state = alg.init_server(jnp_tree(theta0))._replace(h=jnp_tree(h0))
  new, _ = alg.server_update(state, {"delta": stack(delta, other)}, jnp.asarray([2.0, 9.0]), jax.random.key(0))
  h = {n: h0[n] - alpha / 5 * (delta[n] + other[n]) for n in h0}
  assert_trees_close(new.h, h, atol=1e-6)
  assert_trees_close(new.params, {n: theta0[n] + (delta[n] + other[n]) / 2 - h[n] / alpha for n in h}, atol=1e-5)


# ------------------------------------------------------------------------------------------------------ FedNova
def test_fednova_server_update_by_hand():
  """d_k = Δ_k / a_k, τ_eff = Σ p_k a_k, x ← x + τ_eff Σ p_k d_k with p_k = n_k / Σ n (a = 2, 4; n = 3, 1)."""
  x, d1, d2 = linear_params(0), linear_params(1), linear_params(2)
  alg = make_fednova(LINEAR, optax.sgd(0.1), ONE_BY_ONE)
  new, diag = alg.server_update(alg.init_server(jnp_tree(x)), {"delta": stack(d1, d2), "a": jnp.asarray([2.0, 4.0])},
                                jnp.asarray([3.0, 1.0]), jax.random.key(0))
  tau_eff = 0.75 * 2 + 0.25 * 4
  assert float(diag["tau_eff"]) == pytest.approx(tau_eff)
  assert_trees_close(new.params, {n: x[n] + tau_eff * (0.75 * d1[n] / 2 + 0.25 * d2[n] / 4) for n in x}, atol=1e-6)


def test_fednova_reduces_to_fedavg_when_every_client_takes_the_same_steps():
  """n = 3 and 4 rows, batch 2: both take a = 2 · ceil(n/2) = 4 steps, so τ_eff Σ p_k Δ_k / a = Σ p_k Δ_k, FedAvg's
  sample-weighted mean, also through server momentum (two server steps)."""
  x, opt, spec = linear_params(0), optax.sgd(0.2), LocalTrainSpec(epochs=2, batch_size=2)
  rng = np.random.default_rng(0)
  clients = [ClientData(jnp.asarray(rng.normal(size=(4, 2)), jnp.float32), jnp.asarray(rng.integers(0, 2, 4), jnp.int32),
                        jnp.int32(n)) for n in (3, 4)]
  weights = jnp.asarray([3.0, 4.0])
  finals = {}
  for name, alg in (("fednova", make_fednova(LINEAR, opt, spec, optax.sgd(1.0, momentum=0.9))),
                    ("fedavg", make_fedavg(LINEAR, opt, spec, optax.sgd(1.0, momentum=0.9)))):
    state, update = alg.init_server(jnp_tree(x)), jax.jit(alg.client_update)
    for r in range(2):
      outs = [update(alg.broadcast(state), {}, d, jax.random.key(r)) for d in clients]
      state, _ = alg.server_update(state, stack(*[o.upload for o in outs]), weights, jax.random.key(9))
    finals[name] = state.params
    if name == "fednova":
      assert [float(o.upload["a"]) for o in outs] == [4.0, 4.0]
  assert_trees_close(finals["fednova"], finals["fedavg"], atol=1e-6)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_fednova_momentum_normalizer_is_the_displacement_of_a_constant_gradient(rho):
  """Heavy-ball SGD from a zero buffer with a constant gradient v moves by −η a v after τ steps, a = [τ − ρ(1 − ρ^τ)
  /(1 − ρ)]/(1 − ρ) (FedNova's momentum a_k); τ for ρ = 0."""
  opt, v, w = optax.sgd(0.1, momentum=rho or None), jnp.asarray([1.0, -2.0]), jnp.zeros(2)
  s = opt.init(w)
  for _ in range(7):
    u, s = opt.update(v, s, w)
    w = optax.apply_updates(w, u)
  np.testing.assert_allclose(np.asarray(w), -0.1 * float(normalizing_constant(jnp.int32(7), rho)) * np.asarray(v),
                             rtol=1e-5)
  assert float(normalizing_constant(jnp.int32(0), rho)) == 0.0


# ------------------------------------------------------------------------------------------------------ FedDC
@pytest.mark.parametrize("drift_mean", ["cohort", "all"])
def test_feddc_client_and_server_by_hand(drift_mean):
  """Client: SGD on L(θ) + α/2||θ + h_i − w||² + <θ, c − c_i>; h_i ← h_i + θ_i − w; c_i⁺ = c_i − c + (w − θ_i)/(Kη).
  Server (N = 4): c ← c + (1/N) Σ Δc_i; w ← mean_S(θ_i + h_i) ("cohort") or mean_S θ_i + mean_all h_i ("all")."""
  w, c, ci, h, lr, alpha = linear_params(0), linear_params(1), linear_params(2), linear_params(3), 0.2, 0.6
  alg = make_feddc(LINEAR, optax.sgd(lr), ONE_BY_ONE, num_clients=4, lr=lr, alpha=alpha, drift_mean=drift_mean,
                   aggregator=make_mean(weighted=False))
  out = alg.client_update({"model": jnp_tree(w), "c": jnp_tree(c)}, {"c": jnp_tree(ci), "h": jnp_tree(h)},
                          two_samples(), jax.random.key(0))
  th = dict(w)
  for xx, yy in zip(XS, YS):
    ce = ce_grad(th, xx, yy)
    th = {n: th[n] - lr * (ce[n] + alpha * (th[n] + h[n] - w[n]) + c[n] - ci[n]) for n in th}
  h_new = {n: h[n] + th[n] - w[n] for n in w}
  ci_new = {n: ci[n] - c[n] + (w[n] - th[n]) / (2 * lr) for n in w}
  assert_trees_close(out.state["h"], h_new, atol=1e-6)
  assert_trees_close(out.state["c"], ci_new, atol=1e-5)
  uploaded = {n: th[n] - w[n] + (h_new[n] if drift_mean == "cohort" else 0.0) for n in w}
  assert_trees_close(out.upload["delta"], uploaded, atol=1e-6)

  # Server with a second client's uploads; the state's mean drift H starts at H0.
  up2, dc2, big_h = linear_params(7), linear_params(8), linear_params(9)
  state = alg.init_server(jnp_tree(w))._replace(c=jnp_tree(c), drift=jnp_tree(big_h))
  uploads = {"delta": stack(out.upload["delta"], up2), "dc": stack(out.upload["dc"], dc2)}
  new, _ = alg.server_update(state, uploads, jnp.asarray([2.0, 5.0]), jax.random.key(0))
  mean_up = {n: (np.asarray(out.upload["delta"][n]) + up2[n]) / 2 for n in w}
  assert_trees_close(new.c, {n: c[n] + (np.asarray(out.upload["dc"][n]) + dc2[n]) / 4 for n in w}, atol=1e-5)
  if drift_mean == "cohort":
    assert_trees_close(new.params, {n: w[n] + mean_up[n] for n in w}, atol=1e-6)
    assert_trees_close(new.drift, big_h, atol=0)
  else:
    drift = {n: big_h[n] + 2 * mean_up[n] / 4 for n in w}
    assert_trees_close(new.drift, drift, atol=1e-6)
    assert_trees_close(new.params, {n: w[n] + mean_up[n] + drift[n] for n in w}, atol=1e-5)


# ------------------------------------------------------------------------------------------------------ all four
def nonzero_state(alg, params, scale=0.05):
  """The algorithm's initial client/server states with every leaf moved away from 0 (control variates, drifts)."""
  bump = lambda t: jax.tree.map(lambda a: a + scale * jnp.cos(jnp.arange(a.size, dtype=a.dtype).reshape(a.shape)), t)
  return bump(alg.init_client(params)), bump(alg.init_server(params))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_padded_steps_are_exact_noops_and_an_empty_client_changes_nothing(name):
  data, params, apply_fn = setup()
  alg = build(name, apply_fn, optax.sgd(0.1, momentum=0.9), LocalTrainSpec(epochs=2, batch_size=3, shuffle=False),
              lr=0.1)
  client_state, server = nonzero_state(alg, params)
  payload = alg.broadcast(server)
  tight, padded = padded_pair(data, 0)
  update = jax.jit(alg.client_update)
  a = update(payload, client_state, tight, jax.random.key(3))
  b = update(payload, client_state, padded, jax.random.key(3))
  assert int(a.metrics["steps"]) == int(b.metrics["steps"]) == 6  # K = 2 epochs x ceil(7/3)
  assert_trees_close(a.upload, b.upload, atol=1e-6)
  assert_trees_close(a.state, b.state, atol=1e-6)
  empty = update(payload, client_state, ClientData(tight.x, tight.y, jnp.int32(0)), jax.random.key(3))
  assert int(empty.metrics["steps"]) == 0
  assert_trees_equal(empty.state, client_state)  # K = 0: c_i, g_k, h_i kept (no division by K η)
  for field in ("delta", "dc"):
    if field in empty.upload and not (name == "feddc" and field == "delta"):  # FedDC cohort uploads h_i too
      assert all(not np.asarray(leaf).any() for leaf in jax.tree.leaves(empty.upload[field]))


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_vmap_rounds_equal_sequential(name):
  """Two rounds with a cohort of 3 of 4 clients (partial participation: client states are gathered/scattered)."""
  data, params, apply_fn = setup()
  alg = build(name, apply_fn, optax.sgd(0.05, momentum=0.5), LocalTrainSpec(epochs=2, batch_size=3, drop_last=True),
              lr=0.05)
  finals = {}
  for strategy in ("vmap", "sequential"):
    sim = Simulator(alg, data, apply_fn, make_strategy(strategy), cohort_size=3)
    state = sim.init(params, seed=4)
    for _ in range(2):
      state, _ = sim.run_round(state)
    finals[strategy] = state
  assert_trees_close(finals["vmap"].server, finals["sequential"].server, atol=2e-5)
  assert_trees_close(finals["vmap"].clients, finals["sequential"].clients, atol=2e-5)
  if name != "fednova":  # the others' client states (c_i, g_k, h_i) moved
    assert any(np.abs(np.asarray(leaf)).max() > 0 for leaf in jax.tree.leaves(finals["vmap"].clients))


class DenseBN(nn.Module):
  """Dense -> masked BatchNorm -> ReLU -> Dense: the engine's BatchNorm conventions without a conv to compile."""

  @nn.compact
  def __call__(self, x, train=False, mask=None):
    x = nn.Dense(4)(x.reshape((x.shape[0], -1)))
    row_mask = None if mask is None else jnp.broadcast_to(jnp.asarray(mask, bool)[:, None], x.shape)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x, mask=row_mask)
    return nn.Dense(3)(nn.relu(x))


def test_batchnorm_statistics_are_averaged_like_fedavgs():
  """A BatchNorm model under SCAFFOLD: clients train from the global statistics and the server's new ones are the
  clients' sample-weighted mean, as FedAvg's (two clients, first round: c = c_i = 0, so the same training and the
  same statistics as FedAvg's)."""
  data = make_data()
  model = make_model(DenseBN(), state_collections=("batch_stats",))
  variables = model.init(jax.random.key(1), jnp.zeros((1, 4, 4, 1)))
  opt, spec = optax.sgd(0.1), LocalTrainSpec(epochs=1, batch_size=4)
  clients, weights = [client(data, 0), client(data, 1)], jnp.asarray(data.n_train[:2], jnp.float32)
  states = {}
  for name, alg in (("scaffold", make_scaffold(model, opt, spec, 4, lr=0.1)), ("fedavg", make_fedavg(model, opt, spec))):
    server = alg.init_server(variables["params"], {"batch_stats": variables["batch_stats"]})
    client_state = alg.init_client(variables["params"], {"batch_stats": variables["batch_stats"]})
    update = jax.jit(alg.client_update)  # one compile for both (equally padded) clients
    outs = [update(alg.broadcast(server), client_state, d, jax.random.key(k)) for k, d in enumerate(clients)]
    states[name], _ = alg.server_update(server, stack(*[o.upload for o in outs]), weights, jax.random.key(9))
  assert "batch_stats" in states["scaffold"].model_state
  assert_trees_close(states["scaffold"].model_state, states["fedavg"].model_state, atol=1e-6)
  assert_trees_close(states["scaffold"].params, states["fedavg"].params, atol=1e-6)
  stats = jax.tree.leaves(states["scaffold"].model_state)[0]
  assert not np.allclose(stats, jax.tree.leaves(variables["batch_stats"])[0])


# ------------------------------------------------------------------------------------------------------ registry
def build_ctx(**overrides):
  c = default_config()
  c.update_from_flattened_dict(overrides)
  return BuildContext(c, make_model(get_model("mlp", 3)), optimizer_from_config(c.client),
                      optimizer_from_config(c.server), LocalTrainSpec(), None, 10, 5)


def test_registry_options_and_refusals():
  c = default_config()
  assert c.algorithm.scaffold.server_lr == 1.0 and c.algorithm.feddyn.alpha == 0.01
  assert c.algorithm.feddc.alpha == 0.01 and c.algorithm.feddc.drift_mean == "cohort"
  for name in ALGORITHMS:
    assert build_algorithm(name, build_ctx(**{"algorithm.name": name})).name == name
  with pytest.raises(ValueError, match="client.optimizer='sgd'"):
    build_algorithm("scaffold", build_ctx(**{"algorithm.name": "scaffold", "client.optimizer": "adam"}))
  with pytest.raises(ValueError, match="client.optimizer='sgd'"):
    build_algorithm("fednova", build_ctx(**{"algorithm.name": "fednova", "client.optimizer": "adam"}))
  with pytest.raises(ValueError, match="server_lr"):
    build_algorithm("scaffold", build_ctx(**{"algorithm.name": "scaffold", "server.lr": 0.5}))
  with pytest.raises(ValueError, match="own server update"):
    build_algorithm("feddyn", build_ctx(**{"algorithm.name": "feddyn", "server.momentum": 0.9}))
  with pytest.raises(ValueError, match="its own aggregation rule"):
    build_algorithm("fednova", build_ctx(**{"algorithm.name": "fednova", "aggregator.name": "median"}))
  with pytest.raises(ValueError, match="resets the client optimizer"):
    build_algorithm("feddc", build_ctx(**{"algorithm.name": "feddc", "client.persist_optimizer_state": True}))
  with pytest.raises(ValueError, match="alpha"):
    build_algorithm("feddyn", build_ctx(**{"algorithm.name": "feddyn", "algorithm.feddyn.alpha": 0.0}))
  with pytest.raises(ValueError, match="drift_mean"):
    build_algorithm("feddc", build_ctx(**{"algorithm.name": "feddc", "algorithm.feddc.drift_mean": "some"}))
  with pytest.raises(ValueError, match="momentum"):
    make_fednova(LINEAR, optax.sgd(0.1), ONE_BY_ONE, momentum=1.0)


# ------------------------------------------------------------------------------------------------------ end to end
@pytest.mark.fast_compiles  # tests/conftest.py
@pytest.mark.parametrize("name", ALGORITHMS)
def test_learns_on_non_iid_digits(tmp_path, name):
  """3 rounds on Dirichlet(0.5) digits, 10 clients, all of them every round (the partial-participation state
  bookkeeping is checked above). Chance is 10%; this seed measures 0.74 (FedNova) to 0.80 (SCAFFOLD) global
  accuracy, FedAvg 0.67. 0.6 leaves room for backend numerics while a broken server step (a sign or scale error in
  c, h or τ_eff) falls far below it."""
  summary = run_experiment(digits_config(rounds=3, **{"algorithm.name": name}), tmp_path / name)
  assert summary["final"]["global_test_acc"] > 0.6
  assert summary["final"]["client_acc_weighted"] > 0.6
