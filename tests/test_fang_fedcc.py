"""FedCC's attacks (spec fedcc.md §2.2-2.4) and the baselines' code-compat switches (§3), on hand-computed tiny cases.

The Fang attacks are defined on models ``w_i``; the engine hands them updates ``u_i = w_i - w_G``. The tests
build the cohort from models and a non-zero ``w_G`` and check the attacks against the models' arithmetic.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust import attacks, flat_random
from fedjax_robust.aggregators import make_aggregator
from fedjax_robust.attacks import fang
from fedjax_robust.round_context import RoundContext

KEY = jax.random.key(0)


def mal_mask(c, ids):
  m = np.zeros(c, bool)
  m[list(ids)] = True
  return jnp.asarray(m)


@functools.lru_cache(maxsize=None)
def _jitted(attack):
  return jax.jit(attack.apply)


def apply(attack, updates, mal, context=None, key=KEY):
  return np.asarray(_jitted(attack)(jnp.asarray(updates, jnp.float32), mal, key, context), np.float64)


# ---------------------------------------------------------------------------------- numpy references
def np_krum(x, f, code=False):
  """Krum's pick. Standard: n-f-2 smallest squared distances to the others. ``code``: the FedCC code's
  ``aggregate.krum``: ``||(w_i - w_j)^2||_2`` and the k smallest entries of the row INCLUDING the self 0."""
  n = len(x)
  k = n - f - 2
  if code:
    d = np.sqrt(((x[:, None] - x[None]) ** 4).sum(-1))
    scores = [np.sort(d[i])[:k].sum() for i in range(n)]
  else:
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    scores = [np.sort(np.delete(d[i], i))[:k].sum() for i in range(n)]
  return int(np.argmin(scores))


def np_lambda0_models(benign_models, w_g, f):
  """Spec §2.2 on MODELS: unsquared distances, Gamma_i = the n-f-2 nearest other benign models."""
  b = np.asarray(benign_models, np.float64)
  n = len(b) + f
  d = b.shape[1]
  dist = np.sqrt(((b[:, None] - b[None]) ** 2).sum(-1))
  first = min(np.sort(np.delete(dist[i], i))[: n - f - 2].sum() for i in range(len(b)))
  second = max(np.linalg.norm(b - w_g, axis=1))
  return first / ((n - 2 * f - 1) * math.sqrt(d)) + second / math.sqrt(d)


def np_fang_krum_models(benign_models, w_g, f, s, code_krum=False, lambda_min=1e-5):
  """The spec's sequential loop, literally, on models (attackers at indices 0..f-1)."""
  lam0 = np_lambda0_models(benign_models, w_g, f)
  lam, last = lam0, None
  while lam > lambda_min:
    models = np.vstack([np.tile(w_g - lam * s, (f, 1)), benign_models])
    if np_krum(models, f, code_krum) < f:
      return lam, lam0
    last, lam = lam, lam / 2
  return (lam0 if last is None else last), lam0


# ------------------------------------------------------------------------------------------- Fang-Krum
# 5 x 2: client 0 is the attacker (its honest model is ignored), clients 1-4 are benign models at the corners of
# a 4 x 4 square around w_G + (0.5, 0.25). n = 5, f = 1: |Gamma| = n-f-2 = 2, n-2f-1 = 2, d = 2.
W_G = np.array([1.0, -2.0])
SQUARE = np.array([[2.5, 2.25], [-1.5, 2.25], [2.5, -1.75], [-1.5, -1.75]])
BENIGN = W_G + SQUARE
HONEST_MAL = W_G + np.array([40.0, -30.0])


def _cohort():
  models = np.vstack([HONEST_MAL, BENIGN])
  return models - W_G, mal_mask(5, [0]), {"global_params": jnp.asarray(W_G, jnp.float32)}


def test_fang_krum_lambda0_by_hand():
  # unsquared benign distances: sides 4, diagonals 4 sqrt 2 -> every Gamma_i sum = 4 + 4 = 8, min = 8;
  # max_i ||w_i - w_G|| = ||(2.5, 2.25)|| = sqrt(11.3125)
  # lambda_0 = 8 / (2 sqrt 2) + sqrt(11.3125) / sqrt 2 = 2 sqrt 2 + sqrt(5.65625)
  expected = 2 * math.sqrt(2) + math.sqrt(5.65625)
  assert expected == pytest.approx(5.206714, abs=1e-6)
  assert np_lambda0_models(BENIGN, W_G, 1) == pytest.approx(expected, rel=1e-12)
  u, mal, _ = _cohort()
  lam0 = float(fang.fang_lambda0(jnp.asarray(u, jnp.float32), ~mal, 5, 1))
  assert lam0 == pytest.approx(expected, rel=1e-6)  # on updates: w_G cancels; the attacker's own model is ignored


def test_fang_krum_picks_a_malicious_index_by_hand():
  # s = sign(mean benign - w_G) = sign((0.5, 0.25)) = (1, 1); crafted model c = w_G - lambda (1, 1).
  # Krum, n = 5, f = 1, k = 2 squared distances; benign-benign: sides 16, diagonals 32, so every benign scores
  # 32 unless c comes closer. d2 = ||c - (w_G + (-1.5, -1.75))||^2 (nearest benign), d2' the second nearest:
  #   lambda_0   = 5.2067: d2 = 25.69 -> benign 4 scores 16 + 16 = 32, c scores 25.69 + 69.3   -> benign
  #   lambda_0/2 = 2.6033: d2 = 1.946 -> benign 4 scores 1.946 + 16, c scores 1.946 + 24.77  -> benign
  #   lambda_0/4 = 1.3017: d2 = 0.240 -> benign 4 scores 16.24, c scores 0.240 + 12.654 = 12.89 -> MALICIOUS
  u, mal, ctx = _cohort()
  out = apply(attacks.fang_krum(), u, mal, ctx)
  lam0 = 2 * math.sqrt(2) + math.sqrt(5.65625)
  np.testing.assert_allclose(out[0], -lam0 / 4 * np.ones(2), rtol=1e-6)  # sent model w_G - (lambda_0 / 4) (1, 1)
  np.testing.assert_array_equal(out[1:], u[1:])  # benign uploads untouched
  assert np_krum(out + W_G, 1) == 0  # Krum over the received MODELS picks the attacker
  r = make_aggregator("krum", num_byzantine=1).aggregate({"w": jnp.asarray(out, jnp.float32)})
  np.testing.assert_allclose(np.asarray(r.update["w"]), out[0], rtol=1e-6)  # and so does our Krum rule
  lam, ref0 = np_fang_krum_models(BENIGN, W_G, 1, np.ones(2))
  assert lam == pytest.approx(lam0 / 4, rel=1e-12) and ref0 == pytest.approx(lam0, rel=1e-12)
  search = jax.jit(fang.fang_krum_search)(jnp.asarray(u, jnp.float32), mal, jnp.ones(5, bool),
                                          jnp.ones(2, jnp.float32), jnp.float32(lam0), 1)
  assert bool(search.success) and int(search.num_tried) == 3
  assert float(search.lam) == pytest.approx(lam0 / 4, rel=1e-6)


def test_fang_krum_global_sign_direction():
  # fang_dir = global_sign: s = sign(w_G) = (1, -1), crafted model w_G - lambda (1, -1): the weights shrink to 0
  u, mal, ctx = _cohort()
  out = apply(attacks.make_attack("fang_krum", fang_dir="global_sign"), u, mal, ctx)
  s = np.sign(W_G)
  lam, _ = np_fang_krum_models(BENIGN, W_G, 1, s)
  np.testing.assert_allclose(out[0], -lam * s, rtol=1e-5)
  np.testing.assert_allclose(out[0] / -s, out[0][0] / -s[0])  # one common lambda along -sign(w_G)
  same = apply(attacks.fang_krum(direction="global_sign"), u, mal, ctx)
  np.testing.assert_array_equal(out, same)
  with pytest.raises(ValueError, match="global_params"):
    attacks.fang_krum(direction="global_sign").apply(jnp.asarray(u), mal, KEY, {})
  with pytest.raises(ValueError, match="not both"):
    attacks.make_attack("fang_krum", fang_dir="change", direction="change")


def test_fang_krum_fallback_is_the_last_lambda_tried():
  # f = 1 and the crafted model pushed AWAY from a tight benign cluster: Krum never picks it; the code sends
  # the last lambda > 1e-5 of the halving sequence.
  u = np.array([[0.0, 0.0], [1.0, 1.0], [1.2, 0.9], [0.9, 1.1], [1.1, 1.2]])
  mal = mal_mask(5, [0])
  out = apply(attacks.fang_krum(), u, mal)
  lam0 = float(fang.fang_lambda0(jnp.asarray(u, jnp.float32), ~mal, 5, 1))
  j = math.ceil(math.log2(lam0 / 1e-5)) - 1  # the last j with lambda_0 2^-j > 1e-5
  lam = lam0 * 2.0 ** -j
  assert 1e-5 < lam <= 2e-5
  np.testing.assert_allclose(out[0], -lam * np.ones(2), rtol=1e-5)
  ref, _ = np_fang_krum_models(u[1:], np.zeros(2), 1, np.ones(2))
  assert ref == pytest.approx(lam, rel=1e-5)
  search = fang.fang_krum_search(jnp.asarray(u, jnp.float32), mal, jnp.ones(5, bool), jnp.ones(2),
                                 jnp.float32(lam0), 1)
  assert not bool(search.success) and int(search.num_tried) == j + 1
  # lambda_0 <= 1e-5: nothing is tried and lambda_0 itself is sent (here 0: all benign models equal w_G)
  out = apply(attacks.fang_krum(), np.vstack([u[:1], np.zeros((4, 2))]), mal)
  np.testing.assert_array_equal(out[0], 0.0)


@pytest.mark.parametrize("f", [1, 2, 3, 4])
@pytest.mark.parametrize("code_krum", [False, True])
def test_vectorised_search_equals_the_sequential_loop(f, code_krum):
  rng = np.random.default_rng(10 * f + code_krum)
  w_g = rng.normal(size=16)
  attack = attacks.fang_krum(krum_compat=code_krum)
  for trial in range(4):
    benign = w_g + rng.normal(0.2 * trial, 1.0, size=(10 - f, 16))
    models = np.vstack([w_g + rng.normal(size=(f, 16)), benign])
    out = apply(attack, models - w_g, mal_mask(10, range(f)))
    s = np.sign(benign.mean(0) - w_g)
    lam, _ = np_fang_krum_models(benign, w_g, f, s, code_krum)
    np.testing.assert_allclose(out[:f], np.tile(-lam * s, (f, 1)), rtol=2e-5, atol=1e-9)


def test_fang_krum_crafted_models_are_all_equal_and_only_malicious_rows_change():
  rng = np.random.default_rng(3)
  u = rng.normal(0.3, 1.0, size=(10, 7))
  ids = [2, 5, 7]
  out = apply(attacks.fang_krum(), u, mal_mask(10, ids))
  for i in ids[1:]:
    np.testing.assert_array_equal(out[i], out[ids[0]])
  others = [i for i in range(10) if i not in ids]
  np.testing.assert_array_equal(out[others], np.asarray(jnp.asarray(u, jnp.float32))[others])


# -------------------------------------------------------------------------------------------- Fang-Med
# 5 x 4: clients 0, 1 attack; 2-4 benign. One coordinate per case of the spec's rule (b = 2):
#   j=0: mean 0.7 < w_G 1.0  -> s=-1 (push up),   w_max =  0.9 > 0  -> [0.9, 1.8]
#   j=1: mean -0.6 < w_G 0   -> s=-1,             w_max = -0.3 <= 0 -> [-0.3, -0.15]
#   j=2: mean 0.6 > w_G 0.2  -> s=+1 (push down), w_min =  0.4 > 0  -> [0.2, 0.4]
#   j=3: mean 0.1 > w_G -0.5 -> s=+1,             w_min = -0.2 <= 0 -> [-0.4, -0.2]
MED_WG = np.array([1.0, 0.0, 0.2, -0.5])
MED_BENIGN = np.array([[0.5, -0.9, 0.4, -0.2], [0.7, -0.6, 0.6, 0.1], [0.9, -0.3, 0.8, 0.4]])
MED_LO = np.array([0.9, -0.3, 0.2, -0.4])
MED_HI = np.array([1.8, -0.15, 0.4, -0.2])


def _med_cohort():
  models = np.vstack([MED_WG + 5.0, MED_WG - 5.0, MED_BENIGN])  # the attackers' own models are ignored
  return models - MED_WG, mal_mask(5, [0, 1]), {"global_params": jnp.asarray(MED_WG, jnp.float32)}


def test_fang_med_ranges_per_coordinate_and_sign():
  u, mal, ctx = _med_cohort()
  sent = apply(attacks.fang_median(), u, mal, ctx) + MED_WG  # the models the attackers send
  for k in (0, 1):
    assert np.all((sent[k] >= MED_LO - 1e-6) & (sent[k] <= MED_HI + 1e-6)), sent[k]
  # exactly the affine-uniform rule with the attacker's own u ~ U(0, 1) per coordinate
  r = np.asarray(flat_random.uniform(KEY, (5, 4), jnp.float32), np.float64)
  w_max, w_min = MED_BENIGN.max(0), MED_BENIGN.min(0)
  expected = np.array([w_max[0] + r[:, 0] * (2 * w_max[0] - w_max[0]),  # [w_max, b w_max]
                       w_max[1] + r[:, 1] * (w_max[1] / 2 - w_max[1]),  # [w_max, w_max / b]
                       w_min[2] + r[:, 2] * (w_min[2] / 2 - w_min[2]),  # [w_min / b, w_min]
                       w_min[3] + r[:, 3] * (2 * w_min[3] - w_min[3])]).T  # [b w_min, w_min]
  np.testing.assert_allclose(sent[:2], expected[:2], atol=1e-6)
  assert np.all(np.abs(sent[0] - sent[1]) > 1e-4)  # independent draws per attacker and coordinate
  np.testing.assert_array_equal(sent[2:], np.asarray(jnp.asarray(u, jnp.float32))[2:] + MED_WG)
  # the coordinate-wise median moves against the benign change in every coordinate
  s = np.sign(MED_BENIGN.mean(0) - MED_WG)
  assert np.all((np.median(sent, 0) - np.median(MED_BENIGN, 0)) * s < 0)


def test_fang_med_global_sign_and_zero_direction():
  # fang_dir = global_sign: s = sign(w_G) = (+1, 0, +1, -1)
  u, mal, ctx = _med_cohort()
  sent = apply(attacks.make_attack("fang_median", fang_dir="global_sign"), u, mal, ctx) + MED_WG
  # j=0 push down from w_min = 0.5 > 0: [0.25, 0.5]; j=2 from w_min = 0.4: [0.2, 0.4]; j=3 push up from w_max = 0.4:
  # [0.4, 0.8] (the benign models sit ABOVE w_G = -0.5 there, so "away from the change" is no longer the target)
  lo = np.array([0.25, MED_WG[1], 0.2, 0.4])
  hi = np.array([0.5, MED_WG[1], 0.4, 0.8])
  for k in (0, 1):
    assert np.all((sent[k] >= lo - 1e-6) & (sent[k] <= hi + 1e-6)), sent[k]
  np.testing.assert_array_equal(sent[:2, 1], 0.0)  # s_j = 0: the coordinate stays at w_G (here 0)


def test_fang_med_code_compat():
  # fang_med_compat (FedCC / NDSS-notebook bug): deviation = sign(w_G), [dev > 0] in BOTH terms, one shared u:
  #   sent = [w_G > 0] * (w_max + u (max_far - w_max) + min_far + u (w_min - min_far)), 0 elsewhere
  u, mal, ctx = _med_cohort()
  sent = apply(attacks.make_attack("fang_median", fang_med_compat=True), u, mal, ctx) + MED_WG
  r = np.asarray(flat_random.uniform(KEY, (5, 4), jnp.float32), np.float64)[:2]
  w_max, w_min = MED_BENIGN.max(0), MED_BENIGN.min(0)
  max_far = np.where(w_max > 0, 2 * w_max, w_max / 2)
  min_far = np.where(w_min > 0, w_min / 2, 2 * w_min)
  expected = np.where(MED_WG > 0, w_max + r * (max_far - w_max) + min_far + r * (w_min - min_far), 0.0)
  np.testing.assert_allclose(sent[:2], expected, atol=1e-6)
  assert np.all(sent[:2, [1, 3]] == 0)  # w_G <= 0 -> model value 0
  # by hand, coordinate 0 (w_G = 1 > 0): max in [0.9, 1.8] rising with u, min_rand = 0.25 + u (0.5 - 0.25)
  np.testing.assert_allclose(sent[:2, 0], 0.9 + 0.9 * r[:, 0] + 0.25 + 0.25 * r[:, 0], atol=1e-6)
  same = apply(attacks.fang_median(compat=True), u, mal, ctx)
  np.testing.assert_array_equal(sent[:2] - MED_WG, same[:2])


def test_fang_med_model_space_differs_from_update_space():
  # the b-rule reads the SIGN of the models: in model space (the spec) it is not the rule applied to updates
  u, mal, ctx = _med_cohort()
  model_space = apply(attacks.fang_median(), u, mal, ctx)
  update_space = apply(attacks.fang_median(space="update"), u, mal, ctx)
  assert not np.allclose(model_space[:2], update_space[:2])
  with pytest.raises(ValueError, match="global_params"):
    attacks.fang_median(space="model").apply(jnp.asarray(u), mal, KEY, {})


# -------------------------------------------------------------------------------------- targeted (boosting)
def test_boosting_factor_on_models():
  # w_sent = w_G + alpha_m (w_local - w_G), alpha_m = 5 by default
  w_g = np.array([0.5, -1.0, 2.0])
  w_local = np.array([[0.7, -1.5, 2.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
  u = w_local - w_g
  sent = apply(attacks.make_attack("boosting"), u, mal_mask(3, [0])) + w_g
  np.testing.assert_allclose(sent[0], w_g + 5 * (w_local[0] - w_g), atol=1e-6)
  np.testing.assert_allclose(sent[0], [1.5, -3.5, 2.0], atol=1e-6)  # by hand
  np.testing.assert_allclose(sent[1:], w_local[1:], atol=1e-6)
  sent = apply(attacks.boosting(factor=3.5), u, mal_mask(3, [0])) + w_g
  np.testing.assert_allclose(sent[0], w_g + 3.5 * (w_local[0] - w_g), atol=1e-6)


def test_boosting_krum_alternating_quirk_through_the_engine_hook():
  # the code boosts in rounds with (t - 1) mod 2 == 0 (t 1-based), i.e. 0-based round index even
  u = jnp.asarray([[1.0, -2.0], [0.5, 0.5], [0.1, 0.2]])
  attack = attacks.make_attack("boosting", alternate=True)
  transform = attacks.as_upload_transform(attack, np.array([True, False, False]))
  cohort = jnp.arange(3)
  for rnd, factor in [(0, 5.0), (1, 1.0), (2, 5.0), (3, 1.0)]:
    ctx = RoundContext(jnp.int32(rnd), cohort, None, jnp.ones(3))
    out = jax.jit(transform)({"delta": u}, cohort, KEY, ctx)["delta"]
    np.testing.assert_allclose(out[0], factor * u[0])
    np.testing.assert_array_equal(out[1:], u[1:])


def test_semantic_backdoor_set_matches_the_spec():
  rng = np.random.default_rng(0)
  y_test = rng.integers(0, 10, size=200)
  x_test = rng.normal(size=(200, 4, 4, 1)).astype(np.float32)
  x, y, y_src, y_tgt, idx = attacks.semantic_backdoor_set(x_test, y_test, 10, seed=3, return_indices=True)
  assert x.shape == (1, 4, 4, 1) and y.tolist() == [y_tgt] and y_src != y_tgt  # r = 1 by default
  assert y_test[idx[0]] == y_src and np.array_equal(x[0], x_test[idx[0]])
  x5, y5, s5, t5 = attacks.semantic_backdoor_set(x_test, y_test, 10, r=5, seed=3)
  assert (s5, t5) == (y_src, y_tgt) and len(x5) == 5 and np.all(y5 == t5)  # fixed per seed


# ------------------------------------------------------------------------------- baselines' code switches (§3)
def test_krum_code_distance_and_self_inclusion():
  rng = np.random.default_rng(5)
  for f in (0, 1, 3):
    x = rng.normal(size=(10, 6))
    r = make_aggregator("krum", num_byzantine=f, distance="fedcc", count_self=True).aggregate(
        {"w": jnp.asarray(x, jnp.float32)})
    np.testing.assert_allclose(np.asarray(r.update["w"]), x[np_krum(x, f, code=True)], rtol=1e-6)
    r = make_aggregator("krum", num_byzantine=f).aggregate({"w": jnp.asarray(x, jnp.float32)})
    np.testing.assert_allclose(np.asarray(r.update["w"]), x[np_krum(x, f)], rtol=1e-6)


def test_median_lower_is_torch_median():
  x = np.array([[4.0, -1.0], [1.0, 3.0], [3.0, 0.0], [2.0, 2.0]])  # n = 4: torch.median -> 2nd smallest
  r = make_aggregator("median", even="lower").aggregate({"w": jnp.asarray(x)})
  np.testing.assert_allclose(np.asarray(r.update["w"]), [2.0, 0.0])
  r = make_aggregator("median").aggregate({"w": jnp.asarray(x)})
  np.testing.assert_allclose(np.asarray(r.update["w"]), [2.5, 1.0])


def np_code_bulyan(x, f):
  """FedCC code's Bulyan as described in spec §3 (our own numpy transcription of its steps)."""
  idx = list(range(len(x)))
  picked = []
  while len(picked) < len(x) - 2 * f:
    k = len(idx) - 2 - f
    if k <= 0:
      break
    rem = x[idx]
    d = np.sort(((rem[:, None] - rem[None]) ** 2).sum(-1), axis=1)  # self 0 included
    picked.append(idx.pop(int(np.argmin(d[:, :k].sum(1)))))
  sel = x[picked]
  med = np.sort(sel, 0)[(len(sel) - 1) // 2]  # torch.median: lower middle
  order = np.argsort(np.abs(sel - med), axis=0, kind="stable")
  return np.take_along_axis(sel, order, 0)[: len(sel) - 2 * f].mean(0), picked  # Python slicing


@pytest.mark.parametrize("f, theta, beta", [(0, 8, 8), (1, 7, 5), (3, 4, 2)])
def test_bulyan_code_compat(f, theta, beta):
  rng = np.random.default_rng(f)
  x = rng.normal(size=(10, 5))
  expected, picked = np_code_bulyan(x, f)
  r = jax.jit(make_aggregator("bulyan", num_byzantine=f, fedcc_code=True).aggregate)({"w": jnp.asarray(x, jnp.float32)})
  assert int(r.diagnostics["theta"]) == theta == len(picked) and int(r.diagnostics["beta"]) == beta
  assert sorted(np.flatnonzero(np.asarray(r.diagnostics["selected"]))) == sorted(picked)
  np.testing.assert_allclose(np.asarray(r.update["w"]), expected, rtol=1e-5, atol=1e-6)


def test_bulyan_default_stays_standard():
  x = flat_random.normal(jax.random.PRNGKey(2), (10, 3))
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  close(make_aggregator("bulyan", num_byzantine=0).aggregate({"w": x}).update["w"], jnp.mean(x, 0))  # f=0: FedAvg
  r = make_aggregator("bulyan", num_byzantine=3, strict=False).aggregate({"w": x})
  assert int(r.diagnostics["theta"]) == 4 and int(r.diagnostics["beta"]) == 1  # beta clamped to >= 1 [R]
