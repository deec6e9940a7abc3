"""Model-poisoning attacks: hand-computed cases (numpy re-implementations of the specs), nested pytrees, jit."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from scipy.stats import norm

from fedjax_robust import attacks
from fedjax_robust.attacks import fang, model_poisoning as mp

KEY = jax.random.key(0)


def make_tree(c, seed=0, loc=0.0):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(loc, 1.0, (c, 3, 4)), jnp.float32),
          "b": {"c": jnp.asarray(rng.normal(loc, 1.0, (c, 5)), jnp.float32)}}


def flat(tree):
  leaves = jax.tree.leaves(tree)
  return np.concatenate([np.asarray(l, np.float64).reshape(l.shape[0], -1) for l in leaves], axis=1)


def mal_mask(c, ids):
  m = np.zeros(c, bool)
  m[list(ids)] = True
  return jnp.asarray(m)


def run(attack, tree, mal, context=None, key=KEY):
  return flat(jax.jit(attack.apply)(tree, mal, key, context))


# ------------------------------------------------------------------------------------------ simple
def test_sign_flip_negates_only_malicious_rows():
  t = make_tree(6)
  u, out = flat(t), run(attacks.sign_flip(), t, mal_mask(6, [1, 4]))
  np.testing.assert_allclose(out[[1, 4]], -u[[1, 4]], rtol=1e-6)
  np.testing.assert_array_equal(out[[0, 2, 3, 5]], u[[0, 2, 3, 5]])
  np.testing.assert_allclose(run(attacks.sign_flip(scale=3.0), t, mal_mask(6, [1]))[1], -3 * u[1], rtol=1e-6)


def test_model_replacement_scales_by_participants():
  t = make_tree(10)
  u = flat(t)
  out = run(attacks.make_attack("model_replacement"), t, mal_mask(10, [0, 3]))
  np.testing.assert_allclose(out[[0, 3]], 10 * u[[0, 3]], rtol=1e-6)
  np.testing.assert_array_equal(out[1:3], u[1:3])
  # 8 participants: factor 8; the non-participating malicious row 9 is untouched
  mask = jnp.asarray([True] * 8 + [False] * 2)
  out = run(attacks.scaling(), t, mal_mask(10, [0, 9]), {"mask": mask})
  np.testing.assert_allclose(out[0], 8 * u[0], rtol=1e-6)
  np.testing.assert_array_equal(out[9], u[9])
  np.testing.assert_allclose(run(attacks.scaling(factor=2.5), t, mal_mask(10, [0]))[0], 2.5 * u[0], rtol=1e-6)


def test_model_replacement_oracle_makes_weighted_mean_equal_target():
  t = make_tree(5)
  u = flat(t)
  w = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
  out = run(attacks.scaling(mode="oracle"), t, mal_mask(5, [2]), {"weights": jnp.asarray(w)})
  np.testing.assert_allclose(w @ out / w.sum(), u[2], atol=1e-4)  # FedVSA Eq. 10-11: aggregate = w_p - w^t


def test_boosting_and_alternating_schedule():
  t = make_tree(4)
  u = flat(t)
  np.testing.assert_allclose(run(attacks.boosting(), t, mal_mask(4, [0]))[0], 5 * u[0], rtol=1e-6)
  alt = attacks.boosting(factor=3.0, alternate=True)
  np.testing.assert_allclose(run(alt, t, mal_mask(4, [0]), {"round": 2})[0], 3 * u[0], rtol=1e-6)
  np.testing.assert_allclose(run(alt, t, mal_mask(4, [0]), {"round": 1})[0], u[0], rtol=1e-6)
  with pytest.raises(ValueError, match="round"):
    alt.apply(t, mal_mask(4, [0]), KEY, {})


def test_gaussian_replace_and_add():
  rng = np.random.default_rng(1)
  t = {"w": jnp.asarray(rng.normal(0, 2.0, (4, 4000)), jnp.float32)}
  u = flat(t)
  out = run(attacks.gaussian(), t, mal_mask(4, [1]))  # FedCAP A2: N(0, std(own update)) replaces the upload
  np.testing.assert_array_equal(out[[0, 2, 3]], u[[0, 2, 3]])
  assert abs(out[1].std() / u[1].std() - 1) < 0.05 and abs(out[1].mean()) < 0.15
  assert abs(np.corrcoef(out[1], u[1])[0, 1]) < 0.1
  out = run(attacks.gaussian(sigma=0.5, mode="add"), t, mal_mask(4, [1]))
  assert abs((out[1] - u[1]).std() - 0.5) < 0.03


# ------------------------------------------------------------------------------------------ LIE / IPM
def test_lie_z_values_of_the_spec():
  assert float(mp.lie_z(20, 6)) == pytest.approx(0.36611, abs=1e-4)
  assert float(mp.lie_z(36, 10)) == pytest.approx(0.39573, abs=1e-4)
  assert float(mp.lie_z(20, 6)) == pytest.approx(norm.ppf(9 / 14), abs=1e-5)
  assert np.isfinite(float(mp.lie_z(20, 12)))  # s <= 0: clipped, not NaN


def test_lie_full_and_partial_knowledge_by_hand():
  t = make_tree(20, seed=2)
  u = flat(t)
  ids = [1, 8, 10, 17, 18, 19]
  mal = mal_mask(20, ids)
  out = run(attacks.lie(), t, mal)
  expected = u.mean(0) - 0.366106 * u.std(0, ddof=1)  # N=20, M=6: s=5, z=Phi^-1(9/14)
  for i in ids:
    np.testing.assert_allclose(out[i], expected, atol=1e-5)
  benign = [i for i in range(20) if i not in ids]
  np.testing.assert_array_equal(out[benign], u[benign])
  # partial knowledge: statistics over the attackers' own honest updates only
  part = run(attacks.lie(knowledge="partial"), t, mal)
  np.testing.assert_allclose(part[1], u[ids].mean(0) - 0.366106 * u[ids].std(0, ddof=1), atol=1e-5)
  assert np.abs(part[1] - out[1]).max() > 0.1
  # z override
  np.testing.assert_allclose(run(attacks.lie(z=1.5), t, mal)[1], u.mean(0) - 1.5 * u.std(0, ddof=1), atol=1e-5)
  assert np.all(np.isfinite(run(attacks.lie(), t, mal_mask(20, range(12)))))


def test_ipm_is_minus_eps_times_benign_mean():
  t = make_tree(8, seed=3)
  u = flat(t)
  ids = [0, 5]
  benign = [i for i in range(8) if i not in ids]
  out = run(attacks.ipm(), t, mal_mask(8, ids))
  for i in ids:
    np.testing.assert_allclose(out[i], -8 * u[benign].mean(0), atol=1e-5)
  assert float(out[0] @ u[benign].mean(0)) < 0
  np.testing.assert_allclose(run(attacks.ipm(epsilon=0.5), t, mal_mask(8, ids))[5], -0.5 * u[benign].mean(0),
                             atol=1e-6)
  np.testing.assert_allclose(run(attacks.ipm(knowledge="partial"), t, mal_mask(8, ids))[0], -8 * u[ids].mean(0),
                             atol=1e-5)


def test_statistics_never_read_rows_outside_the_reference():
  """An attacker's own honest update is discarded under IPM (FedCAP's A8 reads the benign uploads only), so a
  diverged (NaN / inf) attacker row, or a non-participating one, must not leak into the crafted vector: a dot
  with a zero weight still reads the row (0 * nan = nan)."""
  t = make_tree(8, seed=3)
  u = flat(t)
  ids, benign = [0, 5], [1, 2, 3, 4, 6, 7]
  bad = jax.tree.map(lambda x: x.at[0].set(jnp.nan).at[5].set(jnp.inf), t)
  out = run(attacks.ipm(), bad, mal_mask(8, ids))
  for i in ids:
    np.testing.assert_allclose(out[i], -8 * u[benign].mean(0), atol=1e-5)
  # A non-participating NaN row is outside every statistic too (LIE over the 7 participants).
  mask = jnp.arange(8) != 6
  nan6 = jax.tree.map(lambda x: x.at[6].set(jnp.nan), t)
  clean = run(attacks.lie(), t, mal_mask(8, [1]), {"mask": mask})
  np.testing.assert_allclose(run(attacks.lie(), nan6, mal_mask(8, [1]), {"mask": mask})[1], clean[1], atol=1e-6)
  assert np.all(np.isfinite(clean[1]))


# ---------------------------------------------------------------------------------- Min-Max / Min-Sum
def np_search(cond, gamma_init=2.0, step=1.0, tol=0.02, min_step=0.1):
  """FedCAP's loop (spec 2.2), verbatim."""
  gamma, succ = gamma_init, 0.0
  while abs(succ - gamma) > tol:
    if cond(gamma):
      succ = gamma
      gamma += step / 2
    else:
      gamma -= step / 2
    step = max(step / 2, min_step)
  return succ


def np_condition(ref, objective, squared=False):
  d = np.sqrt(((ref[:, None] - ref[None]) ** 2).sum(-1))
  if squared:
    d = d ** 2
  if objective == "max":
    threshold = d[np.triu_indices(len(ref), 1)].max()
  else:
    threshold = d.sum(1).max()
  mu, sd = ref.mean(0), ref.std(0, ddof=1)

  def cond(gamma):
    dist = np.sqrt(((ref - (mu - gamma * sd)) ** 2).sum(-1))
    dist = dist ** 2 if squared else dist
    return (dist.max() if objective == "max" else dist.sum()) <= threshold

  return cond, mu, sd


def test_gamma_search_matches_fedcap_loop():
  for bound in [3.3, 0.7, 2.0, -1.0, 5.55]:
    ref = np_search(lambda g: g <= bound)
    got = float(jax.jit(lambda b: mp.gamma_search(lambda g: g <= b))(bound))
    assert got == pytest.approx(ref, abs=1e-5), bound
  # Shejwalkar & Houmansadr's constants converge to the boundary
  got = float(mp.gamma_search(lambda g: g <= 3.3, gamma_init=10.0, step_init=10.0, tol=1e-5, min_step=0.0))
  assert got == pytest.approx(3.3, abs=1e-4)


@pytest.mark.parametrize("name,objective,squared,knowledge", [
    ("min_max", "max", False, "full"), ("min_max", "max", False, "partial"),
    ("min_sum", "sum", False, "full"), ("min_sum", "sum", True, "partial")])
def test_min_max_min_sum_against_numpy_search(name, objective, squared, knowledge):
  t = make_tree(12, seed=4)
  u = flat(t)
  ids = [2, 3, 7, 11]
  params = {"squared": True} if squared else {}
  out = run(attacks.make_attack(name, knowledge=knowledge, **params), t, mal_mask(12, ids))
  ref = u if knowledge == "full" else u[ids]
  cond, mu, sd = np_condition(ref, objective, squared)
  gamma = np_search(cond)
  assert gamma > 0
  for i in ids:
    np.testing.assert_allclose(out[i], mu - gamma * sd, atol=1e-4)
  assert cond(gamma) and not cond(gamma + 0.1)  # satisfies the constraint; a larger gamma would not
  benign = [i for i in range(12) if i not in ids]
  np.testing.assert_array_equal(out[benign], u[benign])


def test_min_max_perturbations_and_gamma():
  """Each perturbation direction with gamma from FedCAP's search run here in numpy (not read back from the attack)."""
  t = make_tree(10, seed=5, loc=0.5)
  f = jnp.asarray(flat(t), jnp.float32)
  ref = jnp.ones(10, bool)
  u = np.asarray(f, np.float64)
  threshold = np.sqrt(((u[:, None] - u[None]) ** 2).sum(-1)).max()
  mu = u.mean(0)
  gammas = {}
  for pert in ["std", "unit_vec", "sign"]:
    crafted, gamma = mp.craft_min_max_sum(f, ref, "max", pert)
    dev = {"std": -u.std(0, ddof=1), "unit_vec": -mu / np.linalg.norm(mu), "sign": -np.sign(mu)}[pert]
    cond = lambda g: np.sqrt(((u - (mu + g * dev)) ** 2).sum(-1)).max() <= threshold
    gammas[pert] = np_search(cond)
    assert float(gamma) == pytest.approx(gammas[pert], abs=1e-4), pert
    np.testing.assert_allclose(crafted, mu + gammas[pert] * dev, atol=1e-4)
  assert min(gammas.values()) > 0 and len({round(g, 4) for g in gammas.values()}) > 1  # nonzero, per direction
  with pytest.raises(ValueError, match="perturbation"):
    attacks.min_max(perturbation="bogus")


# -------------------------------------------------------------------------------------------- Fang
def np_krum(x, f):
  n = len(x)
  d = ((x[:, None] - x[None]) ** 2).sum(-1)
  scores = [np.sort(np.delete(d[i], i))[: n - f - 2].sum() for i in range(n)]
  return int(np.argmin(scores))


def test_local_krum_matches_numpy():
  x = flat(make_tree(9, seed=6))
  assert int(fang.krum_select(jnp.asarray(x, jnp.float32), jnp.ones(9, bool), 2)) == np_krum(x, 2)


def test_fang_lambda0_closed_form():
  # 3 benign 1-D updates, n = 5, f = 2 -> |Gamma| = 1, n - 2f - 1 = 0 -> floored to 1; d = 1
  x = jnp.asarray([[0.0], [1.0], [3.0], [9.0], [9.0]], jnp.float32)
  benign = jnp.asarray([True, True, True, False, False])
  # nearest other benign: 0->1 (1), 1->0 (1), 3->1 (2); min = 1; max ||u_i|| = 3
  assert float(fang.fang_lambda0(x, benign, 5, 2)) == pytest.approx(1 / 1 + 3.0)
  # a larger example: n = 10, f = 2, |Gamma| = 6, 2D
  rng = np.random.default_rng(0)
  y = rng.normal(size=(10, 2))
  b = np.arange(10) >= 2
  bx = y[b]
  dist = np.sqrt(((bx[:, None] - bx[None]) ** 2).sum(-1))
  first = min(np.sort(np.delete(dist[i], i))[:6].sum() for i in range(len(bx)))
  expected = first / ((10 - 4 - 1) * np.sqrt(2)) + np.linalg.norm(bx, axis=1).max() / np.sqrt(2)
  assert float(fang.fang_lambda0(jnp.asarray(y, jnp.float32), jnp.asarray(b), 10, 2)) == pytest.approx(expected,
                                                                                                      rel=1e-5)


def test_fang_krum_makes_krum_pick_a_malicious_update():
  t = make_tree(10, seed=7, loc=0.3)  # benign changes have a clear common direction
  u = flat(t)
  ids = [0, 1, 2]
  mal = mal_mask(10, ids)
  out = run(attacks.fang_krum(), t, mal)
  assert np_krum(out, 3) in ids  # an independent numpy Krum agrees
  benign = [i for i in range(3, 10)]
  np.testing.assert_array_equal(out[benign], u[benign])
  s = np.sign(u[benign].mean(0))
  lam = -out[0] / s
  np.testing.assert_allclose(lam, lam[0], rtol=1e-5)  # crafted = -lambda s with one common lambda
  lam0 = float(fang.fang_lambda0(jnp.asarray(u, jnp.float32), jnp.asarray(~np.asarray(mal)), 10, 3))
  assert 0 < lam[0] <= lam0 + 1e-6
  np.testing.assert_array_equal(out[0], out[1])
  # the code's direction: sign of the global weights (needs them)
  gp = jax.tree.map(lambda x: x[5], t)
  out = run(attacks.fang_krum(direction="global_sign"), t, mal, {"global_params": gp})
  np.testing.assert_allclose(np.sign(-out[0]), np.sign(flat(jax.tree.map(lambda x: x[None], gp))[0]))
  with pytest.raises(ValueError, match="global_params"):
    attacks.fang_krum(direction="global_sign").apply(t, mal, KEY, {})
  out = run(attacks.fang_krum(krum_compat=True), t, mal)
  assert np.all(np.isfinite(out))
  # partial knowledge: direction from the attackers' own updates; Krum over M crafted + M own honest ones
  t = make_tree(12, seed=12, loc=0.3)
  u = flat(t)
  ids = [0, 1, 2, 3, 4]
  out = run(attacks.fang_krum(knowledge="partial"), t, mal_mask(12, ids))
  lam = -out[0] / np.sign(u[ids].mean(0))
  np.testing.assert_allclose(lam, lam[0], rtol=1e-5)
  assert np_krum(np.concatenate([out[ids], u[ids]]), 5) < 5


def test_fang_median_intervals_and_median_moves_against_the_change():
  t = make_tree(10, seed=8, loc=0.2)
  u = flat(t)
  ids = [0, 1, 2]
  benign = list(range(3, 10))
  out = run(attacks.fang_median(), t, mal_mask(10, ids))  # update space (no global params)
  np.testing.assert_array_equal(out[benign], u[benign])
  s = np.sign(u[benign].mean(0))
  w_max, w_min = u[benign].max(0), u[benign].min(0)
  lo = np.where(s < 0, np.where(w_max > 0, w_max, w_max / 2), np.where(w_min > 0, w_min / 2, 2 * w_min))
  hi = np.where(s < 0, np.where(w_max > 0, 2 * w_max, w_max), np.where(w_min > 0, w_min, w_min))
  for i in ids:
    assert np.all((out[i] >= lo - 1e-6) & (out[i] <= hi + 1e-6))
  assert not np.allclose(out[0], out[1])  # independent draws per attacker
  shift = np.median(out, 0) - np.median(u, 0)
  assert np.all(shift * s <= 1e-7) and np.mean(shift * s < 0) > 0.8


def test_fang_trimmed_mean_model_space_compat_and_partial():
  t = make_tree(10, seed=9, loc=0.1)
  u = flat(t)
  ids = [0, 1, 2]
  benign = list(range(3, 10))
  gp = {"w": jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(3, 4), "b": {"c": jnp.asarray([.5, -.5, 0, 1, -1.])}}
  wg = flat(jax.tree.map(lambda x: x[None], gp))[0]
  ctx = {"global_params": gp}
  models = u + wg
  out = run(attacks.fang_trimmed_mean(), t, mal_mask(10, ids), ctx) + wg
  s = np.sign(u[benign].mean(0))
  w_max, w_min = models[benign].max(0), models[benign].min(0)
  up_ok = (out[0] >= np.minimum(w_max, np.where(w_max > 0, 2 * w_max, w_max / 2)) - 1e-5) & \
      (out[0] <= np.maximum(w_max, np.where(w_max > 0, 2 * w_max, w_max / 2)) + 1e-5)
  down_ok = (out[0] >= np.minimum(w_min, np.where(w_min > 0, w_min / 2, 2 * w_min)) - 1e-5) & \
      (out[0] <= np.maximum(w_min, np.where(w_min > 0, w_min / 2, 2 * w_min)) + 1e-5)
  assert np.all(np.where(s < 0, up_ok, down_ok))
  # compat (FedCC code bug): model value 0 where w_G <= 0, max_rand + min_rand elsewhere
  out = run(attacks.fang_trimmed_mean(compat=True), t, mal_mask(10, ids), ctx) + wg
  np.testing.assert_allclose(out[0][wg <= 0], 0.0, atol=1e-6)
  up_end = np.where(w_max > 0, 2 * w_max, w_max / 2)
  down_end = np.where(w_min > 0, w_min / 2, 2 * w_min)
  lo = np.minimum(w_max, up_end) + np.minimum(w_min, down_end)
  hi = np.maximum(w_max, up_end) + np.maximum(w_min, down_end)
  pos = wg > 0
  assert np.all((out[0][pos] >= lo[pos] - 1e-5) & (out[0][pos] <= hi[pos] + 1e-5))
  # partial knowledge: mu +- [3, 4] sigma of the attackers' own models
  out = run(attacks.fang_trimmed_mean(knowledge="partial"), t, mal_mask(10, ids), ctx) + wg
  mu, sd = models[ids].mean(0), models[ids].std(0, ddof=1)
  sp = np.sign(u[ids].mean(0))
  z = (out[1] - mu) / sd
  assert np.all(np.where(sp < 0, (z >= 3 - 1e-3) & (z <= 4 + 1e-3), (z <= -3 + 1e-3) & (z >= -4 - 1e-3)))


def test_exaggerate_sends_kappa_times_the_largest_finite_benign_value():
  """FedVSA spec §2 option "exaggerate": the attacker reports kappa x the largest benign report (by hand)."""
  loss = jnp.array([0.7, 2.0, jnp.inf, 3.0, 9.0], jnp.float32)
  mal = mal_mask(5, [0])
  mask = jnp.array([True, True, True, True, False])  # row 4 does not take part: its 9.0 is no reference
  out = np.asarray(jax.jit(attacks.exaggerate().apply)(loss, mal, KEY, {"mask": mask}))
  np.testing.assert_allclose(out, [30.0, 2.0, np.inf, 3.0, 9.0])  # 10 x max(2, 3); inf skipped; benign untouched
  out = np.asarray(attacks.exaggerate(kappa=4.0).apply(loss, mal_mask(5, [0, 3]), KEY, {"mask": mask}))
  np.testing.assert_allclose(out[[0, 3]], [8.0, 8.0])  # 4 x 2.0: the other attacker's 3.0 is not benign
  alone = np.asarray(attacks.exaggerate().apply(jnp.array([0.5, jnp.nan]), mal_mask(2, [0]), KEY))
  np.testing.assert_allclose(alone[0], 5.0)  # no finite benign value: kappa x its own honest report
  t = make_tree(4, seed=3)  # coordinate by coordinate on a pytree
  u = flat(t)
  np.testing.assert_allclose(run(attacks.exaggerate(2.0), t, mal_mask(4, [2]))[2], 2.0 * u[[0, 1, 3]].max(0),
                             rtol=1e-6)


def test_each_upload_field_may_have_an_attack_of_its_own():
  """``attack.fields=delta,loss=exaggerate``: the run's attack on the model, the loss's own attack on the loss, each
  reading the honest uploads; a field poisoned twice, an attack with no field and stray parameters are refused."""
  plain, own = attacks.upload_fields_from_config("delta, loss=exaggerate", {"loss": {"kappa": 5.0}})
  assert plain == ("delta",) and list(own) == ["loss"] and own["loss"].name == "exaggerate"
  transform = attacks.as_upload_transform(attacks.scaling(factor=3.0), np.array([True, False, False]),
                                          fields=plain, field_attacks=own)
  uploads = {"delta": {"w": jnp.ones((3, 2))}, "loss": jnp.array([1.0, 2.0, 4.0])}
  out = jax.jit(transform)(uploads, jnp.arange(3), KEY)
  np.testing.assert_array_equal(out["delta"]["w"], [[3.0, 3.0], [1.0, 1.0], [1.0, 1.0]])
  np.testing.assert_array_equal(out["loss"], [20.0, 2.0, 4.0])  # 5 x 4, not the scaled 3 x 1
  assert transform.fields == ("delta", "loss")
  only_loss = attacks.as_upload_transform(None, np.array([True, False, False]),
                                          field_attacks=attacks.upload_fields_from_config("loss=exaggerate")[1])
  out = only_loss(uploads, jnp.arange(3), KEY)
  np.testing.assert_array_equal(out["delta"]["w"], uploads["delta"]["w"])
  np.testing.assert_array_equal(out["loss"], [40.0, 2.0, 4.0])
  for fields, params, match in [("delta,delta", None, "twice"), ("loss=", None, "expected"),
                                ("loss=bogus", None, "known attacks"), ("delta", {"loss": {"kappa": 2.0}}, "field_params"),
                                ("loss=exaggerate", {"loss": {"factor": 2.0}}, "accepts")]:
    with pytest.raises(ValueError, match=match):
      attacks.upload_fields_from_config(fields, params)
  with pytest.raises(ValueError, match="poisoned twice"):
    attacks.as_upload_transform(attacks.sign_flip(), np.ones(3, bool), fields=("loss",), field_attacks=own)
  with pytest.raises(ValueError, match="poisons no upload field"):
    attacks.as_upload_transform(attacks.sign_flip(), np.ones(3, bool), fields=(), field_attacks=own)


# ------------------------------------------------------------------------------ common properties
@pytest.mark.parametrize("name", sorted(set(attacks.ATTACKS) - {"scaling", "fang_trimmed_mean"}))  # minus aliases
def test_no_malicious_participant_means_no_change(name):
  t = make_tree(6, seed=10)
  ctx = {"global_params": jax.tree.map(lambda x: x[0], t), "round": 0}
  attack = attacks.make_attack(name)
  fn = jax.jit(attack.apply)
  for mal, mask in [(np.zeros(6, bool), np.ones(6, bool)), (mal_mask(6, [4, 5]), np.arange(6) < 4)]:
    out = fn(t, jnp.asarray(mal), KEY, {**ctx, "mask": jnp.asarray(mask)})
    jax.tree.map(np.testing.assert_array_equal, out, t)


def test_registry_and_config_errors():
  assert attacks.attack_from_config(None).name == "none"
  assert attacks.attack_from_config(ml_collections.ConfigDict({"name": "none"})).name == "none"
  a = attacks.attack_from_config(ml_collections.ConfigDict({"name": "min_sum", "squared": True}))
  assert a.name == "min_sum"
  assert attacks.make_attack("scaling").name == "scaling"
  with pytest.raises(ValueError, match="known attacks.*lie"):
    attacks.make_attack("bogus")
  with pytest.raises(ValueError, match="accepts.*epsilon"):
    attacks.make_attack("ipm", eps=3)
  with pytest.raises(ValueError, match="knowledge"):
    attacks.make_attack("lie", knowledge="omniscient")
  with pytest.raises(ValueError, match="name"):
    attacks.attack_from_config({"z": 1.0})


def test_upload_transform_adapter_uses_cohort_ids():
  t = make_tree(3, seed=11)
  malicious_k = np.zeros(10, bool)
  malicious_k[7] = True
  fn = jax.jit(attacks.as_upload_transform(attacks.sign_flip(), malicious_k))
  out = fn({"delta": t, "other": jnp.ones(3)}, jnp.asarray([2, 7, 9]), KEY)
  np.testing.assert_allclose(flat(out["delta"])[1], -flat(t)[1])
  np.testing.assert_array_equal(flat(out["delta"])[[0, 2]], flat(t)[[0, 2]])
  np.testing.assert_array_equal(out["other"], jnp.ones(3))


def test_engine_hook_sign_flip_reverses_a_fedavg_round():
  """Every client malicious + sign flip: one FedAvg round moves the server model by exactly minus the plain round."""
  import optax
  from fedjax_robust.algorithms.fedavg import make_fedavg
  from fedjax_robust.client import LocalTrainSpec
  from fedjax_robust.simulation import Simulator
  from test_engine import setup

  data, params, apply_fn = setup()
  alg = make_fedavg(apply_fn, optax.sgd(0.1), LocalTrainSpec(epochs=1, batch_size=3))
  transform = attacks.as_upload_transform(attacks.sign_flip(), np.ones(data.num_clients, bool))
  plain, attacked = Simulator(alg, data, apply_fn), Simulator(alg, data, apply_fn, upload_transform=transform)
  f = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
  p0 = f(plain.init(params).server)
  d_plain = f(plain.run_round(plain.init(params))[0].server) - p0
  d_attacked = f(attacked.run_round(attacked.init(params))[0].server) - p0
  assert np.abs(d_plain).max() > 1e-3
  np.testing.assert_allclose(d_attacked, -d_plain, atol=1e-6)


# ------------------------------------------------------------------------------------------ craft
def test_craft_returns_what_every_row_would_send_from_the_participants_statistics():
  """craft: the reference is the participating rows only; every row (participating or not) gets the crafted vector."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
  mask = jnp.asarray([True, True, True, True, True, False])  # row 5 stands outside, like a request
  mal = mal_mask(6, [1, 5])
  ref = np.asarray(x)[:5]
  # LIE: mu - z sigma over the 5 participants, N=5, M=1 (row 5 is not a participant), in every row.
  z = float(attacks.lie_z(5, 1))
  expected = ref.mean(0) - z * ref.std(0, ddof=1)
  out = np.asarray(attacks.craft(attacks.lie(), x, mal, KEY, {"mask": mask}))
  np.testing.assert_allclose(out, np.broadcast_to(expected, (6, 5)), rtol=1e-5, atol=1e-6)
  # ... and apply agrees on the malicious participating row.
  np.testing.assert_allclose(np.asarray(attacks.lie().apply(x, mal, KEY, {"mask": mask}))[1], expected, rtol=1e-5)
  # With no malicious participant, apply changes nothing but the crafted vector still exists (z from M = 0).
  none = np.asarray(attacks.craft(attacks.lie(), x, jnp.zeros(6, bool), KEY, {"mask": mask}))
  np.testing.assert_allclose(none[5], ref.mean(0) - float(attacks.lie_z(5, 0)) * ref.std(0, ddof=1), rtol=1e-5,
                             atol=1e-6)
  # IPM: -N mean(benign participants), N = 5.
  ipm = np.asarray(attacks.craft(attacks.ipm(), x, mal, KEY, {"mask": mask}))
  np.testing.assert_allclose(ipm[5], -5 * ref[[0, 2, 3, 4]].mean(0), rtol=1e-5, atol=1e-6)
  # Own-update attacks answer row-wise, also for the row outside the cohort.
  np.testing.assert_allclose(np.asarray(attacks.craft(attacks.sign_flip(), x, mal, KEY, {"mask": mask})),
                             -np.asarray(x))
  assert "sign_flip" in attacks.OWN_UPDATE_ATTACKS and "lie" not in attacks.OWN_UPDATE_ATTACKS
