"""FedVSA (spec shared/specs/fedvsa.md): weights, inference loss, audit, Shapley values, reconstruction, hotfix,
the model-replacement adversary, and an end-to-end attack-and-recovery run (spec §7)."""

import json
import logging
import math

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust import flat_random
from fedjax_robust.algorithms.fedvsa import (Cache, inference_loss, loss_audit, make_fedvsa, recon, value_weights,
                                             weighted_sum)
from fedjax_robust.client import ClientData, LocalTrainSpec
from fedjax_robust.metrics.shapley import all_coalitions, exact_shapley, permutation_prefixes, tmc_shapley
from fedjax_robust.models import get_model
from fedjax_robust.models.interface import make_model
from fedjax_robust.round_context import RoundContext


# ------------------------------------------------------------------------------------------ weights (§7 1-6)
def test_equal_losses_give_uniform_weights_with_or_without_clipping():
  for mode in ("mean", "none", "median"):
    p = value_weights(jnp.full((5,), 3.7), jnp.ones(5, bool), mode)
    np.testing.assert_allclose(p, 0.2, rtol=1e-6)


def test_weights_are_normalised_and_finite_for_extreme_reports():
  losses = jnp.array([1e30, -1e30, 0.5, 3e38, 2.0], jnp.float32)
  for mode in ("mean", "none", "median", "fixed"):
    p = value_weights(losses, jnp.ones(5, bool), mode, clip_value=1.0)
    assert np.all(np.isfinite(p)) and np.all(np.asarray(p) >= 0)
    np.testing.assert_allclose(np.sum(p), 1.0, atol=1e-6)
  # Mean clipping does not bound a lone exaggerating reporter (spec §1.4): it alone sits at the clip.
  p = value_weights(jnp.array([1e30, 1.0, 2.0]), jnp.ones(3, bool))
  assert p[0] > 0.99


def test_non_members_get_zero_weight_and_no_members_gives_zeros():
  p = value_weights(jnp.array([1.0, 2.0, 3.0]), jnp.array([True, False, True]), "none")
  assert p[1] == 0
  np.testing.assert_allclose(np.asarray(p)[[0, 2]], jax.nn.softmax(jnp.array([1.0, 3.0])), rtol=1e-6)
  np.testing.assert_array_equal(value_weights(jnp.ones(3), jnp.zeros(3, bool)), 0.0)


def test_shift_invariance():
  f = jnp.array([0.3, 1.2, 2.5, 0.9])
  for mode in ("mean", "none"):
    np.testing.assert_allclose(value_weights(f, jnp.ones(4, bool), mode),
                               value_weights(f + 7.0, jnp.ones(4, bool), mode), rtol=1e-5)


def test_mean_clipping_monotonicity_and_bound():
  f = jnp.array([0.5, 1.0, 2.0, 4.5])  # mean 2.0
  p = np.asarray(value_weights(f, jnp.ones(4, bool)))
  assert p[2] == pytest.approx(p[3])  # at or above the mean: the same maximal weight
  assert p[0] / p[1] == pytest.approx(math.exp(0.5 - 1.0), rel=1e-5)
  assert p.max() / p.min() == pytest.approx(math.exp(2.0 - 0.5), rel=1e-5)
  q = np.asarray(value_weights(f, jnp.ones(4, bool), "none"))
  assert np.all(np.diff(q) > 0)  # without clipping: higher loss, higher weight
  np.testing.assert_allclose(q, jax.nn.softmax(f), rtol=1e-6)
  t = np.asarray(value_weights(f, jnp.ones(4, bool), "none", temperature=2.0))
  np.testing.assert_allclose(t, jax.nn.softmax(f / 2.0), rtol=1e-6)


def test_aggregate_is_linear_and_identity_on_equal_models():
  p = value_weights(jnp.array([0.2, 1.4, 0.7]), jnp.ones(3, bool))
  w = {"a": jnp.arange(6.0).reshape(3, 2)}
  same = {"a": jnp.tile(jnp.array([[1.5, -2.0]]), (3, 1))}
  np.testing.assert_allclose(weighted_sum(p, same)["a"], [1.5, -2.0], rtol=1e-6)
  lin = weighted_sum(p, {"a": 3.0 * w["a"] + 1.0})["a"]
  np.testing.assert_allclose(lin, 3.0 * weighted_sum(p, w)["a"] + 1.0, rtol=1e-6)


def test_gradient_identity_eq21_and_convexity_thm1():
  centers = jnp.array([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]])
  losses = lambda w: jnp.sum(jnp.square(w[None] - centers), axis=1)  # convex, non-negative F_k
  w = jnp.array([0.3, -0.2])
  g = jax.grad(lambda v: jax.scipy.special.logsumexp(losses(v)))(w)
  per_client = jax.jacobian(losses)(w)
  np.testing.assert_allclose(g, jax.nn.softmax(losses(w)) @ per_client, rtol=1e-5)
  big_f = lambda v: jax.scipy.special.logsumexp(losses(v))
  rng = np.random.default_rng(0)
  for _ in range(20):
    a, b, beta = rng.normal(size=2), rng.normal(size=2), rng.uniform()
    assert big_f(beta * a + (1 - beta) * b) <= beta * big_f(a) + (1 - beta) * big_f(b) + 1e-5


# ------------------------------------------------------------------------------------------ inference loss (§7 9)
def _tiny_model():
  model = make_model(get_model("mlp", 3, hidden=(4,)))
  params = model.init(jax.random.key(0), jnp.zeros((1, 5)))["params"]
  return model, params


def test_inference_loss_reductions_and_equals_server_side_evaluation():
  model, params = _tiny_model()
  x = flat_random.normal(jax.random.key(1), (23, 5))
  y = jax.random.randint(jax.random.key(2), (23,), 0, 3)
  data = ClientData(x, y, jnp.int32(20))  # 3 padding rows
  ce = optax.softmax_cross_entropy_with_integer_labels(model.logits(params, x[:20]), y[:20])
  mean = inference_loss(model.logits, params, data, batch_size=7)
  np.testing.assert_allclose(mean, jnp.mean(ce), rtol=1e-5)
  total = inference_loss(model.logits, params, data, reduction="sum", batch_size=7)
  np.testing.assert_allclose(total, 20 * mean, rtol=1e-5)
  sbm = inference_loss(model.logits, params, data, reduction="sum_batch_means", loader_batch=10)
  np.testing.assert_allclose(sbm, total / 10, rtol=1e-5)
  # A partial last loader batch is averaged over its own rows (ICPP code).
  sbm6 = inference_loss(model.logits, params, data, reduction="sum_batch_means", loader_batch=6)
  np.testing.assert_allclose(sbm6, sum(np.mean(ce[i:i + 6]) for i in range(0, 20, 6)), rtol=1e-5)
  probs = jax.nn.softmax(model.logits(params, x[:20]))
  onehot = jax.nn.one_hot(y[:20], 3)
  np.testing.assert_allclose(inference_loss(model.logits, params, data, "mse"),
                             jnp.mean(jnp.square(probs - onehot)), rtol=1e-5)
  np.testing.assert_allclose(inference_loss(model.logits, params, data, "l1"),
                             jnp.mean(jnp.abs(probs - onehot)), rtol=1e-5)


# ------------------------------------------------------------------------------------------ audit (§7 10)
def test_loss_audit_boundaries():
  reporting = jnp.ones(4, bool)
  dr, n = loss_audit(jnp.array([3.0, 3.0, 1.0, 1.0]), reporting, 2.0)
  assert bool(dr) and int(n) == 2  # exactly half exceed: Dr = 1
  dr, n = loss_audit(jnp.array([3.0, 2.0, 2.0, 1.0]), reporting, 2.0)
  assert not bool(dr) and int(n) == 1  # equal to the reference does not count (strict)
  dr, _ = loss_audit(jnp.array([1.9, 1.5, 1.0, 0.5]), reporting, 2.0)
  assert not bool(dr)  # decreasing losses
  dr, _ = loss_audit(jnp.array([9.0, 9.0]), jnp.zeros(2, bool), 2.0)
  assert not bool(dr)  # nobody reporting (e.g. no history)
  dr, n = loss_audit(jnp.array([3.0, 3.0, 3.0]), reporting[:3], jnp.array([1.0, jnp.nan, 5.0]),
                     has_reference=jnp.array([True, False, True]))
  assert int(n) == 1 and bool(dr)  # per-client references: 1 of the 2 clients with one


# ------------------------------------------------------------------------------------------ Shapley (§7 12-14)
def _table_game(m, fn):
  return jnp.asarray([fn(z) for z in all_coalitions(m)], jnp.float32)


def test_exact_shapley_hand_computed_three_player_game():
  # v: {}=0, {0}=1, {1}=2, {2}=0, {01}=4, {02}=1, {12}=2, {012}=4 (player 2 is a null player).
  table = {(): 0, (0,): 1, (1,): 2, (2,): 0, (0, 1): 4, (0, 2): 1, (1, 2): 2, (0, 1, 2): 4}
  v = _table_game(3, lambda z: table[tuple(np.flatnonzero(z))])
  phi = np.asarray(exact_shapley(v))
  # phi_0 = 1/3 [v0-v] + 1/6 [v01-v1] + 1/6 [v02-v2] + 1/3 [v012-v12] = 1/3 + 2/6 + 1/6 + 2/3 = 1.5
  np.testing.assert_allclose(phi, [1.5, 2 / 3 + 3 / 6 + 2 / 6 + 3 / 3, 0.0], rtol=1e-6)
  np.testing.assert_allclose(phi.sum(), 4.0, rtol=1e-6)  # efficiency


def test_exact_shapley_additive_symmetric_and_efficient():
  a = np.array([0.3, -0.1, 0.3, 0.0, 0.25])
  phi = exact_shapley(_table_game(5, lambda z: float(a @ z)))
  np.testing.assert_allclose(phi, a, atol=1e-6)
  rng = np.random.default_rng(0)
  vals = rng.uniform(size=2 ** 4)
  sym = lambda z: vals[int(z[0] | z[1]) + 2 * int(z[0] & z[1]) + 4 * int(z[2]) + 8 * int(z[3])]  # 0 and 1 symmetric
  v = _table_game(4, sym)
  phi = np.asarray(exact_shapley(v))
  assert phi[0] == pytest.approx(phi[1], abs=1e-6)
  np.testing.assert_allclose(phi.sum(), v[-1] - v[0], atol=1e-5)


def test_tmc_without_truncation_is_efficient_per_permutation_and_close_to_exact():
  m = 5
  rng = np.random.default_rng(1)
  vals = jnp.asarray(rng.uniform(size=2 ** m), jnp.float32)
  value_of = lambda masks: vals[jnp.sum(masks * (2 ** jnp.arange(m)), axis=-1)]
  orders, prefixes = permutation_prefixes(jax.random.key(3), m, 20000)
  prefix_values = value_of(prefixes)
  phi_one = tmc_shapley(orders[:1], prefix_values[:1])
  np.testing.assert_allclose(jnp.sum(phi_one), vals[-1] - vals[0], atol=1e-5)
  phi = tmc_shapley(orders, prefix_values)
  np.testing.assert_allclose(phi, exact_shapley(vals), atol=0.02)
  again = tmc_shapley(*permutation_prefixes(jax.random.key(3), m, 20000)[:1], prefix_values)
  np.testing.assert_array_equal(phi, again)  # seeded: deterministic


def test_tmc_truncation_stops_crediting_once_the_prefix_is_close_to_the_full_value():
  # Order (0, 1, 2): v({0}) already equals v(all) within tol, so players 1 and 2 get nothing.
  orders = jnp.array([[0, 1, 2]])
  prefix_values = jnp.array([[0.0, 0.995, 0.5, 1.0]])
  np.testing.assert_allclose(tmc_shapley(orders, prefix_values, tol=0.01), [0.995, 0.0, 0.0], atol=1e-7)
  np.testing.assert_allclose(tmc_shapley(orders, prefix_values, tol=0.0), [0.995, -0.495, 0.5], atol=1e-6)


# ------------------------------------------------------------------------------------------ reconstruction (§7 11)
def _cache(deltas, losses, kept, base):
  c = losses.shape[0]
  return Cache(base, {}, deltas, {}, losses, kept, value_weights(losses, kept), jnp.arange(c), jnp.zeros(c, bool),
               jnp.ones((), bool))


def test_reconstruction_of_empty_single_and_full_coalitions():
  base = {"w": jnp.array([1.0, -1.0])}
  deltas = {"w": jnp.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])}
  losses, kept = jnp.array([0.5, 1.5, 1.0]), jnp.ones(3, bool)
  cache = _cache(deltas, losses, kept, base)
  np.testing.assert_allclose(recon(cache, jnp.zeros(3))["w"], base["w"])
  for k in range(3):
    single = value_weights(losses, jnp.arange(3) == k)
    np.testing.assert_allclose(recon(cache, single)["w"], base["w"] + deltas["w"][k], rtol=1e-6)
  full = recon(cache, value_weights(losses, kept))["w"]
  np.testing.assert_allclose(full, base["w"] + value_weights(losses, kept) @ deltas["w"], rtol=1e-6)


# ------------------------------------------------------------------------------------------ the server step
SPEC = LocalTrainSpec(epochs=1, batch_size=4)


def _server_fixture(**kwargs):
  """A linear 2-class model, a server set it fits only from one side, and a FedVSA of 3 cohort slots."""
  model = make_model(get_model("mlp", 2, hidden=()))
  params = model.init(jax.random.key(0), jnp.zeros((1, 2)))["params"]
  params = jax.tree.map(jnp.zeros_like, params)
  x = jnp.array([[1.0, 0.0], [2.0, 0.5], [-1.0, 0.0], [-2.0, -0.5]])
  server = ClientData(x, jnp.array([1, 1, 0, 0]), jnp.int32(4))
  alg = make_fedvsa(model, optax.sgd(0.1), SPEC, num_clients=5, cohort_size=3, **kwargs)
  return model, params, server, alg


def _good_delta(params, scale):
  """An update that moves the linear head toward the server set's labels (class 1 for x0 > 0)."""
  return {"head": {"kernel": jnp.array([[-scale, scale], [0.0, 0.0]]), "bias": jnp.zeros(2)}}


def _stack(*trees):
  return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def _context(ids, server, malicious=None):
  ids = jnp.asarray(ids)
  c = ids.shape[0]
  return RoundContext(jnp.int32(0), ids, jnp.zeros(c, bool) if malicious is None else jnp.asarray(malicious),
                      jnp.ones(c), None, server)


def _poisoned_round(alg, params, server, losses=(0.7, 0.7, 2.0), malicious=None):
  """Round 1 of the server-step tests: clients 0 and 1 send a good update, client 4 (the attacker, honest on
  poisoned data: a high loss) a boosted inverting one. Returns (state, diagnostics, good, bad)."""
  good = _good_delta(params, 1.0)
  bad = jax.tree.map(lambda a: -30.0 * a, good)  # a boosted model that inverts every prediction
  state, d = alg.server_update(alg.init_server(params), {"delta": _stack(good, good, bad), "loss": jnp.array(losses)},
                               jnp.ones(3), jax.random.key(1), context=_context([0, 1, 4], server, malicious))
  return state, d, good, bad


def test_round_after_a_poisoned_one_flags_the_attacker_and_removes_exactly_its_weighted_share():
  model, params, server, alg = _server_fixture(hotfix="subtract", tau=1.0)
  assert set(params) == {"head"}
  state, d1, good, bad = _poisoned_round(alg, params, server, malicious=[False, False, True])
  p1 = d1["aggregation_weights"]
  w_t = state.server.params
  assert not bool(d1["audit_alarm"])  # no history yet
  # Round 2: every reporter's loss rose above last round's max -> audit -> Shapley -> the attacker is flagged.
  zero = jax.tree.map(jnp.zeros_like, good)
  uploads2 = {"delta": _stack(zero, zero, zero), "loss": jnp.array([5.0, 5.0, 5.0])}
  state, d2 = alg.server_update(state, uploads2, jnp.ones(3), jax.random.key(2),
                                context=_context([1, 2, 3], server))
  assert bool(d2["audit_alarm"]) and int(d2["audit_exceedances"]) == 3
  np.testing.assert_array_equal(d2["shapley_flagged"], [False, False, True])
  assert int(d2["shapley_flagged_attackers"]) == 1 and int(d2["shapley_flagged_benign"]) == 0
  phi = np.asarray(d2["shapley_values"])
  assert phi[2] < 0 < phi[0]
  # Efficiency on the real utility: Σφ = A(w^t) − A(w^{t−1}).
  acc = lambda p: float(jnp.mean(jnp.argmax(model.logits(p, server.x), -1) == server.y))
  assert phi.sum() == pytest.approx(acc(w_t) - acc(params), abs=1e-5)
  # Identity local training this round: w^{t+1} = w^t − p^{t-1}_attacker · Δ_attacker.
  expected = jax.tree.map(lambda w, b: w - p1[2] * b, w_t, bad)
  for a, b in zip(jax.tree.leaves(state.server.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_skipping_the_repairing_round_drops_its_updates_trained_from_the_poisoned_model():
  model, params, server, alg = _server_fixture(repaired_round="skip")
  state, d1, good, bad = _poisoned_round(alg, params, server)
  w_t = state.server.params
  state, d2 = alg.server_update(state, {"delta": _stack(bad, good, good), "loss": jnp.full(3, 5.0)}, jnp.ones(3),
                                jax.random.key(2), context=_context([1, 2, 3], server))
  assert int(d2["num_shapley_flagged"]) == 1
  np.testing.assert_array_equal(d2["aggregation_weights"], 0.0)
  expected = jax.tree.map(lambda w, b: w - d1["aggregation_weights"][2] * b, w_t, bad)
  for a, b in zip(jax.tree.leaves(state.server.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert not bool(jnp.any(state.cache.kept))  # the next audit has no history


def test_retrain_repairs_the_global_model_in_the_review_before_the_cohort_trains():
  """``repaired_round="retrain"``: the review of round 2's reports (losses of the model the cohort downloaded)
  flags the attacker and removes its weighted share from w^t before anyone trains; the cohort's updates (trained
  from the repaired model) are then aggregated on it, with the flagged client, sampled again, left out."""
  model, params, server, alg = _server_fixture(repaired_round="retrain")
  assert alg.server_review is not None and alg.client_report is not None
  state, d1, good, bad = _poisoned_round(alg, params, server, malicious=[False, False, True])
  assert "audit_alarm" not in d1  # the audit runs in the review only
  w_t = state.server.params
  reviewed, r = alg.server_review(state, {"loss": jnp.full(3, 5.0)}, jnp.ones(3), jax.random.key(2),
                                  _context([4, 2, 3], server))
  assert bool(r["audit_alarm"]) and bool(r["repaired"]) and int(r["shapley_flagged_attackers"]) == 1
  repaired = jax.tree.map(lambda w, b: w - d1["aggregation_weights"][2] * b, w_t, bad)
  for a, b in zip(jax.tree.leaves(reviewed.server.params), jax.tree.leaves(repaired)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(reviewed.excluded, [False, False, False, False, True])
  half = jax.tree.map(lambda a: 0.5 * a, good)
  state, d2 = alg.server_update(reviewed, {"delta": _stack(bad, half, half), "loss": jnp.array([0.3, 0.4, 0.4])},
                                jnp.ones(3), jax.random.key(3), context=_context([4, 2, 3], server))
  assert "audit_alarm" not in d2 and "shapley_values" not in d2
  np.testing.assert_array_equal(d2["flagged"], [True, False, False])
  np.testing.assert_allclose(d2["aggregation_weights"], [0.0, 0.5, 0.5])
  expected = jax.tree.map(jnp.add, repaired, half)
  for a, b in zip(jax.tree.leaves(state.server.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert not bool(jnp.any(state.excluded))  # the exclusion lasts one round (no blacklist)
  # The cache is this round's, taken from the repaired model: recon(all) is the new global model.
  for a, b in zip(jax.tree.leaves(recon(state.cache, state.cache.weights)), jax.tree.leaves(state.server.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # A quiet review changes nothing.
  quiet, r3 = alg.server_review(state, {"loss": jnp.full(3, 0.1)}, jnp.ones(3), jax.random.key(4),
                                _context([0, 1, 2], server))
  assert not bool(r3["audit_alarm"]) and not bool(r3["repaired"])
  for a, b in zip(jax.tree.leaves(quiet.server.params), jax.tree.leaves(state.server.params)):
    np.testing.assert_array_equal(a, b)


def test_reaggregate_hotfix_gives_the_kept_clients_reconstruction():
  model, params, server, alg = _server_fixture(hotfix="reaggregate")
  losses1 = jnp.array([0.7, 0.9, 2.0])
  state, _, good, bad = _poisoned_round(alg, params, server, losses1)
  zero = jax.tree.map(jnp.zeros_like, good)
  state, d2 = alg.server_update(state, {"delta": _stack(zero, zero, zero), "loss": jnp.full(3, 5.0)}, jnp.ones(3),
                                jax.random.key(2), context=_context([1, 2, 3], server))
  assert np.asarray(d2["shapley_flagged"]).tolist() == [False, False, True]
  clean_p = value_weights(losses1, jnp.array([True, True, False]))
  expected = jax.tree.map(lambda b, g: b + (clean_p[0] + clean_p[1]) * g, params, good)
  for a, b in zip(jax.tree.leaves(state.server.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_flagged_client_sampled_again_is_left_out_and_nonfinite_uploads_are_dropped():
  model, params, server, alg = _server_fixture(blacklist=True)
  state, _, good, bad = _poisoned_round(alg, params, server)
  nan = jax.tree.map(lambda a: jnp.full_like(a, jnp.nan), good)
  state, d2 = alg.server_update(state, {"delta": _stack(good, nan, good), "loss": jnp.array([5.0, 5.0, 5.0])},
                                jnp.ones(3), jax.random.key(2), context=_context([4, 2, 3], server))
  np.testing.assert_array_equal(d2["flagged"], [True, True, False])  # the attacker again, and the NaN upload
  np.testing.assert_array_equal(d2["nonfinite"], [False, True, False])
  np.testing.assert_allclose(d2["aggregation_weights"], [0.0, 0.0, 1.0])
  assert bool(state.blacklist[4]) and int(state.blacklist.sum()) == 1
  assert np.all(np.isfinite(np.concatenate([np.ravel(a) for a in jax.tree.leaves(state.server.params)])))


def test_ablations_off_and_no_shapley_never_repair():
  for detection in ("off", "no_shapley"):
    model, params, server, alg = _server_fixture(detection=detection)
    state, _, good, bad = _poisoned_round(alg, params, None)
    w_t = state.server.params
    zero = jax.tree.map(jnp.zeros_like, good)
    state, d = alg.server_update(state, {"delta": _stack(zero, zero, zero), "loss": jnp.full(3, 5.0)},
                                 jnp.ones(3), jax.random.key(2), context=_context([1, 2, 3], None))
    assert "shapley_values" not in d
    assert ("audit_alarm" in d) == (detection == "no_shapley")
    for a, b in zip(jax.tree.leaves(state.server.params), jax.tree.leaves(w_t)):
      np.testing.assert_allclose(a, b, atol=1e-7)


def test_shapley_step_refuses_a_run_without_server_data():
  _, params, _, alg = _server_fixture()
  d = _good_delta(params, 1.0)
  with pytest.raises(ValueError, match="server-held data"):
    alg.server_update(alg.init_server(params), {"delta": _stack(d, d, d), "loss": jnp.ones(3)}, jnp.ones(3),
                      jax.random.key(0), context=_context([0, 1, 2], None))


def test_option_validation():
  model, _ = _tiny_model()
  for bad in ({"clip_mode": "max"}, {"detection": "sometimes"}, {"temperature": 0.0}, {"hotfix": "undo"},
              {"audit_quorum": 0.0}, {"inference_reduction": "median"}, {"repaired_round": "later"},
              {"repaired_round": "retrain", "detection": "no_shapley"}):
    with pytest.raises(ValueError, match="fedvsa"):
      make_fedvsa(model, optax.sgd(0.1), SPEC, num_clients=4, cohort_size=2, **bad)


# ------------------------------------------------------------------------------------------ threat (§7 17, 18, 22)
def test_flipped_training_data_is_an_iid_sample_with_shifted_labels():
  from types import SimpleNamespace
  from fedjax_robust.attacks.client_attacks import flipped_training
  # The adversary holds this sample only: FedVSA (through its FedAvg core) weighs it by the sample's size.
  model, _ = _tiny_model()
  alg = make_fedvsa(model, optax.sgd(0.1), SPEC, num_clients=4, cohort_size=2, client_attack=flipped_training())
  assert int(alg.malicious_weight(ClientData(None, None, np.int32(394)))) == 394
  y = np.arange(40).reshape(4, 10) % 10
  data = SimpleNamespace(num_clients=4, n_train=np.array([10, 10, 8, 10]), y_train=y,
                         x_train=np.arange(40.0).reshape(4, 10, 1), num_classes=10)
  attack_data, backdoor = flipped_training().make_data(data, seed=0)
  assert int(attack_data.n) == 38 // 4 and backdoor is None
  # Every row is a real training row whose label moved by one class: a perfect model on them is 0% on the truth.
  rows = np.asarray(attack_data.x)[:, 0].astype(int)
  np.testing.assert_array_equal(attack_data.y, (y.reshape(-1)[rows] + 1) % 10)
  assert all(r % 10 < (8 if r // 10 == 2 else 10) for r in rows)


def test_exclusive_forced_sampler_draws_the_adversary_only_in_its_rounds():
  from fedjax_robust.sampling import ForcedSampler
  sampler = ForcedSampler({3: [0], 5: [0]}, num_clients=10, cohort_size=3, exclusive=True)
  for r in range(8):
    for s in range(20):
      cohort = np.asarray(sampler.sample(jax.random.key(100 * r + s), r, 10, 3))
      assert len(set(cohort.tolist())) == 3
      assert (0 in cohort) == (r + 1 in (3, 5))


# ------------------------------------------------------------------------------------------ end to end (§7 24)
def _e2e_config(**overrides):
  from fedjax_robust.experiment import default_config
  c = default_config()
  c.rounds, c.eval_every, c.output.progress = 9, 1, False
  c.data.name, c.data.num_clients = "digits", 12
  c.data.partition.name, c.data.partition.alpha = "dirichlet", 1.0
  c.model.name, c.algorithm.name = "mlp", "fedvsa"
  c.client.epochs, c.client.batch_size, c.client.lr = 2, 10, 0.05
  c.server.cohort_size = 6
  c.server.root_source, c.server.root_dataset_size = "test", 200
  c.attack.name, c.attack.clients = "scaling", "0"
  c.attack.params = ml_collections.ConfigDict({"factor": 30.0})  # γ = 1/p̂ = m^t of the paper's 30-client cohorts
  c.attack.client.name = "flipped_training"
  c.sampler.name, c.sampler.forced, c.sampler.exclusive = "forced", "7:0", True
  for key, value in overrides.items():
    node = c
    *path, leaf = key.split(".")
    for part in path:
      node = node[part]
    node[leaf] = value
  return c


def _records(run_dir):
  return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


@pytest.mark.fast_compiles  # tests/conftest.py
def test_model_replacement_drop_and_recovery_end_to_end(tmp_path):
  """Spec §7 item 24 on the embedded digits (12 clients, 6 per round, an MLP): the adversary, forced in at round 7
  only, trains on flipped labels and boosts by 30; FedVSA's audit fires at round 8 (and never before), Shapley
  values flag it, and the hotfix recovers in that round; FedAvg, under the same submission, is still broken."""
  from fedjax_robust.experiment import run_experiment
  run_experiment(_e2e_config(), tmp_path / "vsa")
  rec = {r["round"]: r for r in _records(tmp_path / "vsa")}
  acc = {t: r["global_test_acc"] for t, r in rec.items()}
  assert acc[6] > 0.8  # learned before the attack
  assert acc[7] < 0.2  # the boosted flipped-label model replaces the global one
  assert acc[8] > acc[6] - 0.08  # recovered in the next round (spec §1.7)
  assert rec[8]["audit_alarm"] and rec[8]["shapley_flagged_attackers"] == 1
  assert not any(rec[t]["audit_alarm"] for t in range(1, 8))
  assert 0 in rec[7]["cohort"] and all(0 not in rec[t]["cohort"] for t in acc if t != 7)
  run_experiment(_e2e_config(**{"algorithm.name": "fedavg"}), tmp_path / "avg")
  avg = {r["round"]: r["global_test_acc"] for r in _records(tmp_path / "avg")}
  assert avg[6] == pytest.approx(acc[6], abs=0.05) and avg[7] < 0.2
  assert avg[8] < acc[8] - 0.3  # FedAvg needs several rounds (Fig. 3)


@pytest.mark.fast_compiles
def test_retrain_round_repairs_before_training_and_equals_between_vmap_and_sequential(tmp_path):
  """The two-phase round end to end (the review phase of the engine): at round 8 the cohort reports the poisoned
  model's losses, the review repairs it, and the cohort trains from the repaired model, so round 8 is back at
  round 6's accuracy; the sequential strategy runs the same review and lands on the same model."""
  from fedjax_robust.experiment import run_experiment
  run_experiment(_e2e_config(**{"algorithm.fedvsa.repaired_round": "retrain"}), tmp_path / "retrain")
  rec = {r["round"]: r for r in _records(tmp_path / "retrain")}
  acc = {t: r["global_test_acc"] for t, r in rec.items()}
  assert acc[7] < 0.2 and rec[8]["audit_alarm"] and rec[8]["repaired"]
  assert rec[8]["shapley_flagged_attackers"] == 1 and not any(rec[t]["repaired"] for t in range(1, 8))
  assert acc[8] > acc[6] - 0.03
  la, lb = _vmap_and_sequential_agree(lambda strategy: _e2e_config(**{
      "algorithm.fedvsa.repaired_round": "retrain", "rounds": 2, "engine.strategy": strategy,
      "sampler.forced": "1:0", "algorithm.fedvsa.detection": "no_audit"}))
  np.testing.assert_allclose(la[1]["review_loss"], lb[1]["review_loss"], rtol=1e-4)
  np.testing.assert_allclose(la[1]["shapley_values"], lb[1]["shapley_values"], atol=1e-5)
  assert bool(la[1]["repaired"]) == bool(lb[1]["repaired"]) and bool(la[1]["repaired"])


def test_review_phase_refuses_an_upload_attack_on_the_reported_loss_and_a_half_defined_review():
  """Upload attacks act on the training phase's uploads; a loss attack would miss the review's reports, where the
  audit reads them, so the engine says so instead of running an attack that silently does nothing there."""
  from fedjax_robust.experiment import build_experiment
  from fedjax_robust.simulation import Simulator
  exp = build_experiment(_e2e_config(**{"algorithm.fedvsa.repaired_round": "retrain", "attack.fields": "delta,loss"}))
  with pytest.raises(ValueError, match="review phase"):
    exp.simulator.run_round(exp.init_state())
  sim = exp.simulator
  with pytest.raises(ValueError, match="client_report and server_review"):
    Simulator(sim.algorithm._replace(client_report=None), exp.data, sim.model, cohort_size=6,
              malicious=sim.malicious, attack_data=sim.attack_data, server_data=sim.server_data)


@pytest.mark.fast_compiles  # tests/conftest.py
def test_an_exaggerating_adversary_reports_kappa_times_the_largest_benign_loss():
  """Spec §2's "exaggerate" report (``attack.fields=delta,loss=exaggerate``): in its round the adversary uploads the
  boosted model and claims 10x the cohort's largest benign loss, and FedVSA's mean-clipped softmax then gives it the
  largest weight; its honest report (``delta`` only) is the downloaded model's loss on its flipped sample."""
  from fedjax_robust.experiment import build_experiment
  reports = {}
  for fields in ("delta", "delta,loss=exaggerate"):
    exp = build_experiment(_e2e_config(**{"sampler.forced": "1:0", "attack.fields": fields}))
    _, metrics = exp.simulator.run_round(exp.init_state())
    reports[fields] = (np.asarray(metrics["cohort"]), np.asarray(metrics["reported_loss"]),
                       np.asarray(metrics["aggregation_weights"]))
  (cohort, honest, _), (cohort2, lied, weights) = reports["delta"], reports["delta,loss=exaggerate"]
  np.testing.assert_array_equal(cohort, cohort2)
  attacker = int(np.flatnonzero(cohort == 0)[0])
  benign = np.arange(len(cohort)) != attacker
  np.testing.assert_allclose(lied[benign], honest[benign], rtol=1e-6)
  np.testing.assert_allclose(lied[attacker], 10.0 * honest[benign].max(), rtol=1e-6)
  assert lied[attacker] > honest[attacker] and int(np.argmax(weights)) == attacker


@pytest.mark.fast_compiles  # tests/conftest.py
def test_an_attacker_reports_on_its_attack_data_in_the_review_phase_by_default():
  """Without its own ``malicious_report`` an attacker's review report is ``client_report`` on the attack's data:
  FedVSA's explicit one (the downloaded model's loss on the flipped sample) gives the same reports, and both differ
  from the attacker's honest report on its own partition slot."""
  from fedjax_robust.experiment import build_experiment
  from fedjax_robust.simulation import Simulator
  exp = build_experiment(_e2e_config(**{"algorithm.fedvsa.repaired_round": "retrain", "sampler.forced": "1:0"}))
  sim = exp.simulator
  reports = {}
  for name, alg in (("own", sim.algorithm), ("default", sim.algorithm._replace(malicious_report=None))):
    other = Simulator(alg, exp.data, sim.model, cohort_size=6, malicious=sim.malicious, attack_data=sim.attack_data,
                      server_data=sim.server_data, sampler=sim.sampler)
    _, metrics = other.run_round(exp.init_state())
    reports[name] = (np.asarray(metrics["cohort"]), np.asarray(metrics["review_loss"]))
  (cohort, own), (_, default) = reports["own"], reports["default"]
  np.testing.assert_allclose(default, own, rtol=1e-6)
  attacker = int(np.flatnonzero(cohort == 0)[0])
  honest = np.asarray(sim.algorithm.client_report(sim.algorithm.broadcast(exp.init_state().server),
                                                  None, jax.tree.map(lambda a: a[0], sim.train), None)["loss"])
  assert abs(float(own[attacker]) - float(honest)) > 1e-3


def _no_attack_config(strategy: str, detection: str, root_rows: int):
  """The end-to-end setting without the adversary: 4 clients a round drawn uniformly."""
  c = _e2e_config(**{"engine.strategy": strategy, "algorithm.fedvsa.detection": detection, "rounds": 3,
                     "server.cohort_size": 4, "attack.name": "none", "attack.client.name": "none",
                     "sampler.name": "uniform", "sampler.forced": "", "sampler.exclusive": False,
                     "server.root_dataset_size": root_rows})
  with c.attack.unlocked():
    c.attack.params = ml_collections.ConfigDict()
  return c


def _vmap_and_sequential_agree(config_of, rounds: int = 2):
  """Runs ``rounds`` rounds of ``config_of(strategy)`` under ``vmap`` and ``sequential``, checks the final global
  models agree and returns both strategies' per-round metrics."""
  from fedjax_robust.experiment import build_experiment
  results = []
  for strategy in ("vmap", "sequential"):
    exp = build_experiment(config_of(strategy))
    state = exp.init_state()
    logs = []
    for _ in range(rounds):
      state, metrics = exp.simulator.run_round(state)
      logs.append(metrics)
    results.append((state.server.server.params, logs))
  (pa, la), (pb, lb) = results
  for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
  return la, lb


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_vmap_equals_sequential_with_a_shapley_step_every_round():
  la, lb = _vmap_and_sequential_agree(lambda strategy: _no_attack_config(strategy, "no_audit", root_rows=60))
  for ma, mb in zip(la, lb):
    np.testing.assert_allclose(ma["reported_loss"], mb["reported_loss"], rtol=1e-4)
    np.testing.assert_allclose(ma["shapley_values"], mb["shapley_values"], atol=1e-5)
    assert bool(ma["audit_alarm"]) == bool(mb["audit_alarm"])
  assert bool(la[1]["audit_alarm"])  # no_audit: the Shapley step ran in round 2


@pytest.mark.parametrize("repaired_round", ["aggregate", "retrain"])
def test_shard_map_compiles_the_round_once_and_keeps_the_state_placed_as_init(caplog, repaired_round):
  """FedVSA's server keeps last round's per-client uploads; under ``shard_map`` they used to leave round 1 split
  over the devices while init had them replicated, so round 2 compiled the round again (~13 s per run in the
  notebook). The round now leaves the server replicated and the clients sharded, as init placed them; with the
  review phase too (its reports are mapped over the sharded cohort, its repair changes the server mid-round)."""
  from fedjax_robust.experiment import build_experiment
  config = _no_attack_config("shard_map", "full", root_rows=40)
  config.algorithm.fedvsa.repaired_round = repaired_round
  exp = build_experiment(config)
  state = exp.init_state()
  placed = jax.tree.map(lambda a: a.sharding, state)
  caplog.set_level(logging.WARNING, logger="jax._src.interpreters.pxla")
  with jax.log_compiles(True):
    for _ in range(3):
      state, _ = exp.simulator.run_round(state)
  assert jax.tree.map(lambda a: a.sharding, state) == placed
  compiles = [r for r in caplog.records if "Compiling jit(round_step)" in r.getMessage()]
  assert len(compiles) == 1, [r.getMessage()[:200] for r in compiles]
