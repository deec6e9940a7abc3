"""FedCAC (specs/fedcac.md): the properties of §6 at unit level, the hand-computed cases, the vectorised server step
against a per-client loop with exact rational arithmetic, a plain-loop round reference, strategies, the registry and a
short training run."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust import flat_random
from fedjax_robust.algorithms.fedavg import classification_loss, make_fedavg
from fedjax_robust.algorithms.fedcac import make_fedcac, server_step
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
from fedjax_robust.execution import make_strategy
from fedjax_robust.experiment import build_experiment
from fedjax_robust.metrics.sensitivity import (collaborator_matrix, critical_mask, critical_masks, mask_counts,
                                               num_critical, overlap_matrix, overlap_threshold, sensitivity)
from fedjax_robust.models import get_model, make_model
from fedjax_robust.simulation import Simulator, round_keys
from test_engine import make_data
from test_experiment import digits_config

pytestmark = pytest.mark.usefixtures("fast_compiles")  # tests/conftest.py: small programs compile faster

SGD = optax.sgd(0.1, momentum=0.9)
SPEC = LocalTrainSpec(epochs=1, batch_size=4)


def arr(*xs, dtype=np.float32):
  return jnp.asarray(np.array(xs, dtype))


def mask_of(s, tau):
  return np.asarray(critical_mask(jnp.asarray(s, jnp.float32), tau)).astype(int).tolist()


def reference_mask(s, tau):
  """C4 in numpy, straight from the spec's pseudo-code (a sort)."""
  s = np.asarray(s, np.float32)
  k = int(tau * s.size)
  if k == 0:
    return np.zeros(s.shape, bool)
  h = np.sort(s.reshape(-1))[::-1][k - 1]
  if h <= 1e-10:
    positive = s[s > 1e-20]
    if positive.size:
      h = positive.min()
  return s >= h


def mlp_setup(data=None, hidden=(8,)):
  data = data or make_data()
  model = make_model(get_model("mlp", 3, hidden=hidden))
  params = model.init(jax.random.key(1), jnp.zeros((1,) + data.feature_shape))["params"]
  return data, model, params


def stacked(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


# ------------------------------------------------------------------------------------ client step: C3, C4
def test_sensitivity_is_elementwise_change_times_trained_value():  # §6 item 1
  w0 = {"a": arr(1, 2, 3, 4), "b": arr(1.0, -1.0)}
  we = {"a": arr(2, 2, 0, 3), "b": arr(3.0, -2.0)}
  s = sensitivity(w0, we)
  np.testing.assert_array_equal(s["a"], [2, 0, 0, 3])  # unchanged entry and zero trained value give 0
  np.testing.assert_array_equal(s["b"], [6, 2])


@pytest.mark.parametrize("tau, expected", [(0.5, [1, 0, 1, 0]), (0.75, [1, 0, 1, 1]), (1.0, [1, 0, 1, 1]),
                                           (0.2, [0, 0, 0, 0])])
def test_worked_example_masks(tau, expected):  # §6 item 2
  s = sensitivity(arr(1, 1, 1, 1), arr(2, 1, -3, 0.5))
  np.testing.assert_array_equal(s, [2, 0, 12, 0.25])
  assert mask_of(s, tau) == expected  # τ = 1: the 4th value is 0 <= 1e-10 -> fallback to 0.25 (3 of 4 critical)


def test_k_is_floor_in_double_precision():  # §5-A4
  assert num_critical(0.57, 100) == 56 and num_critical(0.5, 7) == 3 and num_critical(1.0, 9) == 9
  assert sum(mask_of(np.arange(1, 101), 0.57)) == 56


def test_distinct_sensitivities_give_exactly_k_per_tensor_and_order_within_each_tensor():  # §6 item 3
  rng = np.random.default_rng(0)
  tree = {"big": jnp.asarray(rng.permutation(35).reshape(5, 7) + 1.0, jnp.float32),
          "small": jnp.asarray(rng.permutation(13) * 1e-3 + 1e-3, jnp.float32)}  # far smaller values than "big"
  for tau in (0.1, 0.3, 0.5, 0.9):
    masks = critical_masks(tree, tau)
    for name in tree:
      m, s = np.asarray(masks[name]), np.asarray(tree[name])
      assert m.sum() == int(tau * s.size)
      if m.any() and (~m).any():
        assert s[m].min() >= s[~m].max()
    assert np.asarray(masks["small"]).sum() > 0  # per tensor, not a global top-tau


def test_masks_match_the_numpy_reference_with_zeros_and_ties():
  rng = np.random.default_rng(1)
  masks = {tau: jax.jit(jax.vmap(lambda s, tau=tau: critical_mask(s, tau))) for tau in (0.0, 0.2, 0.5, 0.8, 1.0)}
  values = rng.choice([0.0, 1e-25, 1e-12, 0.5, 1.0, 2.0], size=(30, 3, 5)) * (rng.random((30, 3, 5)) < 0.7)
  for tau, fn in masks.items():
    got = np.asarray(fn(jnp.asarray(values, jnp.float32)))
    for trial, s in enumerate(values):
      np.testing.assert_array_equal(got[trial],
                                    reference_mask(s, tau), err_msg=f"{trial} {tau} {s}")


def test_ties_at_the_threshold_are_included():  # §6 item 4
  assert mask_of([3.0] * 6, 0.2) == [1] * 6  # all equal: all critical for any k >= 1
  assert mask_of([5, 3, 3, 3, 1], 0.4) == [1, 1, 1, 1, 0]  # k = 2, threshold 3: 4 critical entries
  assert mask_of([0.0, 0.0, 0.0], 0.5) == [1, 1, 1]  # all-zero tensor: h = 0 kept, every entry critical (C4)
  assert mask_of([0.0, 1e-30, 2.0, 0.0], 0.75) == [0, 0, 1, 0]  # fallback: only S > 1e-20 entries


def test_mask_is_layout_and_scale_invariant():  # §6 item 5
  s = flat_random.uniform(jax.random.key(0), (4, 3, 5)) + 0.1
  m = np.asarray(critical_mask(s, 0.4))
  np.testing.assert_array_equal(np.asarray(critical_mask(s.transpose(2, 0, 1), 0.4)), m.transpose(2, 0, 1))
  np.testing.assert_array_equal(np.asarray(critical_mask(s.reshape(6, 10), 0.4)), m.reshape(6, 10))
  np.testing.assert_array_equal(np.asarray(critical_mask(7.5 * s, 0.4)), m)
  # critical and non-critical masks partition the tensor (§6 item 6)
  g = ~m
  assert np.all(m.astype(int) + g.astype(int) == 1) and not np.any(m & g)


def test_reverse_and_random_selections():  # spec §2
  s = {"a": jnp.asarray(np.arange(10.0) + 1, jnp.float32), "b": jnp.asarray([2.0, 2.0, 1.0, 5.0], jnp.float32)}
  rev = critical_masks(s, 0.3, "sensitivity_reverse")
  np.testing.assert_array_equal(rev["a"], np.arange(10) < 3)
  np.testing.assert_array_equal(rev["b"], [False, False, True, False])  # k = 1
  rnd = critical_masks(s, 0.3, "random", jax.random.key(0))
  assert int(rnd["a"].sum()) == 3 and int(rnd["b"].sum()) == 1
  draws = {tuple(np.flatnonzero(critical_masks(s, 0.3, "random", jax.random.key(i))["a"])) for i in range(6)}
  assert len(draws) > 1  # redrawn per key
  with pytest.raises(ValueError, match="tau"):
    critical_masks(s, 1.5)
  with pytest.raises(ValueError, match="selection"):
    critical_masks(s, 0.5, "magnitude")


# ------------------------------------------------------------------------------------ server step: S1-S4
def test_overlap_identity_identical_disjoint_and_asymmetric():  # §6 items 7, 8
  m = jnp.asarray([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], bool)
  o, valid = overlap_matrix(*mask_counts({"w": m}))
  o = np.asarray(o)
  np.testing.assert_array_equal(np.diag(o), 1.0)
  assert o[0, 1] == 1.0 and o[0, 2] == 0.0 and o[2, 0] == 0.0
  assert o[3, 4] == pytest.approx(2 / 3) and o[4, 3] == 0.0  # O_ab = 1 - 2/6, O_ba = 1 - 2/2
  assert bool(valid.all())


def test_vectorised_counts_equal_the_naive_double_loop_bit_for_bit():  # §6 item 9
  rng = np.random.default_rng(2)
  masks = {"a": rng.random((5, 3, 11)) < 0.4, "b": rng.random((5, 23)) < 0.6, "c": rng.random((5, 2)) < 0.5}
  flat = np.concatenate([masks[k].reshape(5, -1) for k in sorted(masks)], axis=1).astype(np.int64)
  naive = np.array([[int(np.sum(flat[i] * flat[j])) for j in range(5)] for i in range(5)])
  for block in (2 ** 24, 7):  # 7: several column blocks per tensor, summed in int32
    k, inter = mask_counts(jax.tree.map(jnp.asarray, masks), block=block)
    assert k.dtype == jnp.int32 and inter.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(k), flat.sum(1))
    np.testing.assert_array_equal(np.asarray(inter), naive)


WORKED_M = jnp.asarray([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0]], bool)
WORKED_W = jnp.asarray([[0.0] * 4, [3.0] * 4, [2.0] * 4], jnp.float32)


def test_worked_three_client_example():  # §6 item 10
  o, valid = overlap_matrix(*mask_counts({"w": WORKED_M}))
  np.testing.assert_array_equal(np.asarray(o)[~np.eye(3, dtype=bool)], [0.5, 1.0, 0.5, 0.5, 1.0, 0.5])
  expected_sets = {1: [[2], [], [0]], 2: [[2], [], [0]], 3: [[], [], []]}
  for t, thr in ((1, 5 / 6), (2, 1.0), (3, 7 / 6)):
    a, stats = collaborator_matrix(o, valid, t, 2)
    assert float(stats["overlap_mean"]) == pytest.approx(2 / 3) and float(stats["overlap_max"]) == 1.0
    assert float(stats["threshold"]) == pytest.approx(thr)
    assert [list(np.flatnonzero(row)) for row in np.asarray(a)] == expected_sets[t]
  step = server_step({"w": WORKED_W}, {"w": WORKED_M}, jnp.ones(3), 1, 2)
  np.testing.assert_allclose(step.global_params["w"], [5 / 3] * 4, rtol=1e-6)
  np.testing.assert_allclose(step.params["w"], [[1, 1, 5 / 3, 5 / 3], [3, 5 / 3, 3, 5 / 3], [1, 1, 5 / 3, 5 / 3]],
                             rtol=1e-6)
  step3 = server_step({"w": WORKED_W}, {"w": WORKED_M}, jnp.ones(3), 3, 2)  # t > β: critical entries own values
  np.testing.assert_array_equal(np.asarray(step3.params["w"])[np.asarray(WORKED_M)],
                                np.asarray(WORKED_W)[np.asarray(WORKED_M)])


def test_threshold_rises_and_collaborators_shrink_with_t():  # §6 item 11
  rng = np.random.default_rng(3)
  m = jnp.asarray(rng.random((6, 40)) < rng.uniform(0.3, 0.7, (6, 1)))
  o, valid = overlap_matrix(*mask_counts({"w": m}))
  beta = 5
  thr = [float(overlap_threshold(o, valid, t, beta)) for t in range(0, 9)]
  sizes = [int(collaborator_matrix(o, valid, t, beta)[0].sum()) for t in range(1, 9)]
  assert all(b >= a for a, b in zip(thr, thr[1:])) and all(b <= a for a, b in zip(sizes, sizes[1:]))
  _, stats = collaborator_matrix(o, valid, 1, beta)
  assert thr[0] == pytest.approx(float(stats["overlap_mean"]))
  assert thr[beta] == float(stats["overlap_max"])  # exactly, by the O_max - (1 - t/β)(O_max - O_avg) form
  assert sizes[beta - 1] >= 1 and sizes[beta] == 0  # the argmax pair still collaborates at t = β, nobody after


def random_round(c=5, seed=0, state=True):
  rng = np.random.default_rng(seed)
  params = {"k": jnp.asarray(rng.normal(size=(c, 4, 3)), jnp.float32), "b": jnp.asarray(rng.normal(size=(c, 5)),
                                                                                         jnp.float32)}
  masks = {"k": jnp.asarray(rng.random((c, 4, 3)) < 0.5), "b": jnp.asarray(rng.random((c, 5)) < 0.5)}
  stats = {"batch_stats": {"bn": {"mean": jnp.asarray(rng.normal(size=(c, 3)), jnp.float32)}}} if state else {}
  n = jnp.asarray(rng.integers(3, 9, size=c), jnp.float32)
  return params, masks, stats, n


def reference_server_step(params, masks, stats, n, t, beta, collaboration="time_varying", number=1,
                          non_critical="all", bn_mode="local"):
  """A per-client Python loop: exact integer counts, overlaps and threshold as Fractions, float64 models."""
  c = len(n)
  p_leaves, treedef = jax.tree.flatten(params)
  p = [np.asarray(leaf, np.float64) for leaf in p_leaves]
  m = [np.asarray(leaf, bool) for leaf in jax.tree.leaves(masks)]
  flat = [np.concatenate([leaf[i].reshape(-1) for leaf in m]).astype(np.int64) for i in range(c)]
  size = [int(f.sum()) for f in flat]
  overlap = {}
  for i in range(c):
    for j in range(c):
      if i != j and size[i] > 0:
        inter = int(np.dot(flat[i], flat[j]))
        overlap[i, j] = Fraction(size[i] - size[j] + 2 * inter, 2 * size[i])
  sets = []
  for i in range(c):
    others = [j for j in range(c) if (i, j) in overlap]
    if collaboration == "none" or not overlap:
      sets.append([])
    elif collaboration == "number":
      sets.append(sorted(sorted(others, key=lambda j: (-overlap[i, j], j))[:number]))
    else:
      avg = sum(overlap.values()) / len(overlap)
      top = max(overlap.values())
      thr = avg + Fraction(t, beta) * (top - avg)
      sets.append([j for j in others if overlap[i, j] >= thr])
  weights = np.asarray(n, np.float64) / np.sum(n)
  out = []
  for leaf, mask in zip(p, m):
    mean = sum(weights[i] * leaf[i] for i in range(c))
    rows = []
    for i in range(c):
      members = [i] + sets[i]
      u = sum(leaf[j] for j in members) / len(members)
      rows.append(u if non_critical == "as_critical" else np.where(mask[i], u, mean))
    out.append(np.stack(rows))
  stats_in = jax.tree.map(np.asarray, stats)
  out_stats = []
  for i in range(c):
    members = [i] + sets[i]
    out_stats.append(jax.tree.map(lambda a: a[i] if bn_mode == "local" else sum(a[j] for j in members) / len(members),
                                  stats_in))
  return jax.tree.unflatten(treedef, out), sets, out_stats


@pytest.mark.parametrize("collaboration, non_critical, bn_mode", [
    ("time_varying", "all", "local"), ("number", "all", "critical"), ("none", "as_critical", "local"),
    ("time_varying", "as_critical", "critical")])
def test_vectorised_server_step_equals_a_per_client_loop(collaboration, non_critical, bn_mode):
  for seed in range(3):
    params, masks, stats, n = random_round(seed=seed)
    for t in (1, 2, 4, 5, 6):
      step = server_step(params, masks, n, t, 4, stats, collaboration, 2, non_critical, bn_mode)
      ref, sets, ref_stats = reference_server_step(params, masks, stats, n, t, 4, collaboration, 2, non_critical,
                                                   bn_mode)
      assert [list(np.flatnonzero(r)) for r in np.asarray(step.collaborators)] == sets, (seed, t)
      for a, b in zip(jax.tree.leaves(step.params), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
      for i, s in enumerate(ref_stats):
        np.testing.assert_allclose(step.model_state["batch_stats"]["bn"]["mean"][i], s["batch_stats"]["bn"]["mean"],
                                   rtol=1e-6, atol=1e-6)


def test_after_beta_critical_parameters_are_exactly_local():  # §6 item 12
  params, masks, stats, n = random_round(seed=4)
  step = server_step(params, masks, n, 11, 10, stats)
  assert not bool(step.collaborators.any())
  for k in params:
    m = np.asarray(masks[k])
    np.testing.assert_array_equal(np.asarray(step.params[k])[m], np.asarray(params[k])[m])
    np.testing.assert_array_equal(np.asarray(step.params[k])[~m],
                                  np.broadcast_to(np.asarray(step.global_params[k]), m.shape)[~m])


@pytest.mark.parametrize("t", [1, 2, 50])
def test_identical_masks_make_everyone_collaborate_and_fedcac_equal_fedavg(t):  # §6 items 13, 21
  params, masks, _, _ = random_round(seed=5, state=False)
  same = jax.tree.map(lambda m: jnp.broadcast_to(m[0], m.shape), masks)
  step = server_step(params, same, jnp.full((5,), 500.0), t, 2)
  assert bool(step.collaborators.sum() == 5 * 4)
  for k in params:
    uniform = np.mean(np.asarray(params[k]), axis=0)
    np.testing.assert_allclose(step.global_params[k], uniform, rtol=1e-6, atol=1e-7)  # equal n: uniform mean
    np.testing.assert_allclose(step.params[k], np.broadcast_to(uniform, params[k].shape), rtol=1e-6, atol=1e-6)


def test_customized_model_always_includes_the_client():  # §6 items 14, 17
  params, masks, _, n = random_round(seed=6, state=False)
  positive = jax.tree.map(lambda p: jnp.abs(p) + 1e-3, params)
  ones = jax.vmap(lambda s: critical_masks(s, 1.0))(positive)  # τ = 1, all S > 1e-10: all-ones masks
  assert all(bool(m.all()) for m in jax.tree.leaves(ones))
  alone = server_step(params, ones, n, 1, 2, collaboration="none")  # C_i = ∅, all critical: Separate training
  for k in params:
    np.testing.assert_array_equal(alone.params[k], params[k])
  everyone = server_step(params, ones, n, 1, 2)  # all-ones masks: O ≡ 1, C_i = all others (§6 item 17)
  for k in params:
    np.testing.assert_allclose(everyone.params[k], np.broadcast_to(np.mean(params[k], 0), params[k].shape),
                               rtol=1e-6, atol=1e-6)


def test_personalized_model_selects_u_and_global_exactly():  # §6 item 15
  params, masks, _, n = random_round(seed=7, state=False)
  step = server_step(params, masks, n, 1, 3)
  weights = jnp.asarray(step.collaborators | jnp.eye(5, dtype=bool), jnp.float32)
  weights = weights / weights.sum(1, keepdims=True)
  for k in params:
    u = jnp.matmul(weights, params[k].reshape(5, -1), precision="highest").reshape(params[k].shape)
    m = np.asarray(masks[k])
    np.testing.assert_array_equal(np.asarray(step.params[k])[m], np.asarray(u)[m])
    np.testing.assert_array_equal(np.asarray(step.params[k])[~m],
                                  np.broadcast_to(np.asarray(step.global_params[k]), m.shape)[~m])


def test_empty_masks_are_guarded_and_give_fedavg():  # §5-A13, §6 item 16 (server part)
  params, masks, stats, n = random_round(seed=8)
  empty = jax.tree.map(jnp.zeros_like, masks)
  step = server_step(params, empty, n, 1, 2, stats)
  assert not bool(step.collaborators.any())
  for leaf in jax.tree.leaves((step.params, step.stats)):
    assert np.all(np.isfinite(np.asarray(leaf)))
  for k in params:
    np.testing.assert_array_equal(step.params[k], np.broadcast_to(step.global_params[k], params[k].shape))
  one_empty = jax.tree.map(lambda m: m.at[0].set(False), masks)  # row 0 out of O_avg/O_max, no collaborators
  step = server_step(params, one_empty, n, 1, 2, stats)
  assert not bool(step.collaborators[0].any()) and np.isfinite(float(step.stats["threshold"]))


def test_server_step_never_touches_local_batchnorm_statistics():  # §6 item 18
  params, masks, stats, n = random_round(seed=9)
  for t in (1, 3):
    step = server_step(params, masks, n, t, 3, stats)
    np.testing.assert_array_equal(step.model_state["batch_stats"]["bn"]["mean"], stats["batch_stats"]["bn"]["mean"])


def test_server_step_is_permutation_equivariant():  # §6 item 19
  params, masks, stats, n = random_round(seed=10)
  perm = np.array([3, 0, 4, 1, 2])
  take = lambda tree: jax.tree.map(lambda a: a[perm], tree)
  for t in (1, 2):
    step = server_step(params, masks, n, t, 3, stats)
    permuted = server_step(take(params), take(masks), n[perm], t, 3, take(stats))
    np.testing.assert_array_equal(np.asarray(permuted.collaborators),
                                  np.asarray(step.collaborators)[perm][:, perm])
    for a, b in zip(jax.tree.leaves(permuted.params), jax.tree.leaves(take(step.params))):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------ rounds through the engine
def plain_loop_rounds(model, params, data, tau, beta, rounds, run_key):
  """The reference: a Python loop over clients for local training, numpy masks, the per-client server loop."""
  c = data.x_train.shape[0]
  personal = [params] * c
  loss = classification_loss(model)
  train = jax.jit(lambda p, d, key: local_train(loss, SGD, p, SGD.init(p), d, key, SPEC).params)
  for r in range(rounds):
    _, client_key, _, _ = round_keys(run_key, r)
    trained, masks = [], []
    for i in range(c):
      d = ClientData(jnp.asarray(data.x_train[i]), jnp.asarray(data.y_train[i], jnp.int32), jnp.int32(data.n_train[i]))
      out = train(personal[i], d, jax.random.fold_in(client_key, i))
      trained.append(jax.tree.map(np.asarray, out))
      s = jax.tree.map(lambda a, b: np.abs((np.asarray(b) - np.asarray(a)) * np.asarray(b)), personal[i], out)
      masks.append(jax.tree.map(lambda x: reference_mask(x, tau), s))
    new, _, _ = reference_server_step(stacked(trained), stacked(masks), {}, data.n_train, r + 1, beta)
    personal = [jax.tree.map(lambda a: jnp.asarray(a[i], jnp.float32), new) for i in range(c)]
  return personal


def test_two_rounds_vmap_equal_sequential_equal_a_plain_loop():
  data, model, params = mlp_setup()
  alg = make_fedcac(model, SGD, SPEC, 4, tau=0.5, beta=2)
  states = {}
  for name in ("vmap", "sequential"):
    sim = Simulator(alg, data, model, make_strategy(name))
    s = sim.init(params, seed=3)
    for _ in range(2):
      s, metrics = sim.run_round(s)
    states[name] = s
  a, b = states["vmap"].server.personal_params, states["sequential"].server.personal_params
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  ref = plain_loop_rounds(model, params, data, 0.5, 2, 2, jax.random.key(3))
  for i, p in enumerate(ref):
    for x, y in zip(jax.tree.leaves(jax.tree.map(lambda l: l[i], a)), jax.tree.leaves(p)):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
  assert int(states["vmap"].server.round) == 2
  assert float(metrics["fedcac_threshold"]) == float(metrics["fedcac_overlap_max"])  # t = β = 2


def test_tau_zero_is_fedavg_on_trainable_parameters():  # §6 item 16
  data, model, params = mlp_setup()
  fedcac = Simulator(make_fedcac(model, SGD, SPEC, 4, tau=0.0, beta=2), data, model)
  fedavg = Simulator(make_fedavg(model, SGD, SPEC), data, model)
  s1, s2 = fedcac.init(params, seed=5), fedavg.init(params, seed=5)
  for _ in range(2):
    s1, m1 = fedcac.run_round(s1)
    s2, _ = fedavg.run_round(s2)
  assert float(m1["fedcac_critical_fraction"]) == 0.0 and float(m1["fedcac_collaborators_mean"]) == 0.0
  for stack_leaf, avg_leaf in zip(jax.tree.leaves(s1.server.personal_params), jax.tree.leaves(s2.server.params)):
    assert np.all(np.isfinite(stack_leaf))
    np.testing.assert_allclose(stack_leaf, np.broadcast_to(avg_leaf, stack_leaf.shape), rtol=1e-5, atol=1e-6)


def test_batchnorm_statistics_stay_local():  # §1.4, §6 items 16, 18
  data = make_data(shape=(4, 4, 2))
  model = make_model(get_model("bn_cnn", 3, widths=(3,), fc_dim=5))
  variables = model.init(jax.random.key(1), jnp.zeros((1, 4, 4, 2)))
  sim = Simulator(make_fedcac(model, SGD, SPEC._replace(unroll=True), 4, tau=0.0, beta=2), data, model)
  s, _ = sim.run_round(sim.init(variables, seed=0))
  server, clients = s.server, s.clients
  # τ = 0: every client's trainable parameters are w̄ (BatchNorm scale/bias included) ...
  for leaf, g in zip(jax.tree.leaves(server.personal_params), jax.tree.leaves(server.global_params)):
    np.testing.assert_array_equal(leaf, np.broadcast_to(g, leaf.shape))
  # ... while each client's running statistics are bit for bit the ones its own training produced
  for a, b in zip(jax.tree.leaves(server.personal_state), jax.tree.leaves(clients["trained"]["batch_stats"])):
    np.testing.assert_array_equal(a, b)
  means = np.asarray(server.personal_state["batch_stats"]["bn1"]["mean"])
  assert not np.allclose(means[0], means[1])
  # the global model carries the sample-weighted mean of the statistics (global-model metrics only)
  w = data.n_train / data.n_train.sum()
  np.testing.assert_allclose(server.global_state["batch_stats"]["bn1"]["mean"], np.tensordot(w, means, 1),
                             rtol=1e-5, atol=1e-7)
  assert "global_test_acc" in sim.evaluate(s)


def test_identical_clients_stay_identical_and_share_masks():  # §6 item 20
  data = make_data(sizes=(6, 6, 6), test_sizes=(2, 2, 2))
  data.x_train[:] = data.x_train[0]
  data.y_train[:] = data.y_train[0]
  _, model, params = mlp_setup(data)
  sim = Simulator(make_fedcac(model, SGD, SPEC._replace(shuffle=False), 3, tau=0.5, beta=1), data, model)
  s = sim.init(params, seed=0)
  for _ in range(2):
    s, metrics = sim.run_round(s)
    assert float(metrics["fedcac_overlap_mean"]) == float(metrics["fedcac_overlap_max"]) == 1.0
    assert float(metrics["fedcac_collaborators_mean"]) == 2.0  # identical masks: everyone, even after β (§5-A12)
  for leaf in jax.tree.leaves(s.server.personal_params):
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))


def test_deterministic_rounds_partial_participation_and_both_evaluations():  # §6 item 25, §5-A11, §3.6
  data, model, params = mlp_setup()
  sim = Simulator(make_fedcac(model, SGD, SPEC, 4, tau=0.5, beta=3), data, model, cohort_size=2)
  runs = []
  for _ in range(2):
    s, m = sim.run_round(sim.init(params, seed=7))
    runs.append((s, m))
  for a, b in zip(jax.tree.leaves((runs[0][0].server, runs[0][0].clients, runs[0][1])),
                  jax.tree.leaves((runs[1][0].server, runs[1][0].clients, runs[1][1]))):
    np.testing.assert_array_equal(a, b)
  state, metrics = runs[0]
  cohort = np.asarray(metrics["cohort"]).tolist()
  for k in set(range(4)) - set(cohort):  # non-participants keep their personalized model (and trained copy)
    for leaf, p in zip(jax.tree.leaves(state.server.personal_params), jax.tree.leaves(params)):
      np.testing.assert_array_equal(leaf[k], p)
  sizes = [p.size for p in jax.tree.leaves(params)]
  assert float(metrics["fedcac_critical_fraction"]) == pytest.approx(sum(int(0.5 * n) for n in sizes) / sum(sizes))
  record = sim.evaluate(state)
  assert record["client_acc_mean"] == record["after_aggregation_client_acc_mean"]
  assert "before_aggregation_client_acc_mean" in record and "global_test_acc" in record
  trained = state.clients["trained"]["params"]
  k = cohort[0]
  assert any(not np.array_equal(a[k], b[k]) for a, b in zip(jax.tree.leaves(trained),
                                                            jax.tree.leaves(state.server.personal_params)))


# ------------------------------------------------------------------------------------ registry and config
@pytest.mark.parametrize("kwargs, message", [
    ({"tau": 1.5}, "tau"), ({"tau": "half"}, "tau"), ({"beta": 0}, "beta"), ({"selection": "magnitude"}, "selection"),
    ({"collaboration": "all"}, "collaboration"), ({"collaboration": "number", "num_collaborators": 0}, "num_coll"),
    ({"non_critical": "none"}, "non_critical"), ({"bn_mode": "fedbn"}, "bn_mode")])
def test_bad_options_are_refused(kwargs, message):
  _, model, _ = mlp_setup()
  with pytest.raises(ValueError, match=message):
    make_fedcac(model, SGD, SPEC, 4, **kwargs)


def test_registry_entry_and_refusals():
  from fedjax_robust.algorithms.registry import ALGORITHMS
  entry = ALGORITHMS["fedcac"]
  assert entry.options == {"tau": 0.5, "beta": 100, "selection": "sensitivity", "collaboration": "time_varying",
                           "num_collaborators": 1, "non_critical": "all", "bn_mode": "local",
                           "eval_before_aggregation": True}
  assert not entry.aggregates and entry.resets_client_optimizer and entry.traced == ("beta",)
  for key, value, message in [("client.persist_optimizer_state", True, "resets the client optimizer"),
                              ("aggregator.name", "median", "aggregates nothing"),
                              ("attack.name", "sign_flip", "model attack")]:
    with pytest.raises(ValueError, match=message):
      build_experiment(digits_config(**{"algorithm.name": "fedcac", key: value}))


def test_fedcac_learns_digits_from_config():
  """A short FedCAC run on non-IID digits (10 clients, MLP): personalized accuracy far above chance (10%)."""
  c = digits_config(rounds=4, **{"algorithm.name": "fedcac", "algorithm.fedcac.beta": 3, "client.momentum": 0.9,
                                 "client.lr": 0.05, "engine.strategy": "vmap"})
  exp = build_experiment(c)
  sim = exp.simulator
  state = exp.init_state()
  first = sim.evaluate(state)["client_acc_mean"]
  for _ in range(4):
    state, metrics = sim.run_round(state)
  record = sim.evaluate(state)
  assert first < 0.3
  assert record["client_acc_mean"] > 0.75, record["client_acc_mean"]
  assert record["before_aggregation_client_acc_mean"] > 0.75
  assert 0.45 < float(metrics["fedcac_critical_fraction"]) < 0.5 + 1e-6
