"""Aggregation rules: hand-computed examples for every rule, invariances, masking, NaN/Inf screening, errors.

Every call goes through ``jax.jit`` (one compile per rule and shape, cached across
tests); XLA optimizations are turned down for this module only, since compile
time dominates these tiny inputs.
"""

import functools
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_robust import flat_random
from fedjax_robust.aggregators import (AGGREGATORS, AggregateResult, Aggregator, aggregator_from_config,
                                       make_aggregator, sanitize, weighted_mean)

KEY = jax.random.PRNGKey(0)


pytestmark = pytest.mark.usefixtures("fast_compiles")  # tests/conftest.py


@functools.lru_cache(maxsize=None)
def _jitted(name: str, params_json: str):
  return jax.jit(make_aggregator(name, **json.loads(params_json)).aggregate)


def jitted(name: str, **params):
  """The jitted ``aggregate`` of rule ``name`` (cached, so equal shapes compile once per session)."""
  return _jitted(name, json.dumps(params, sort_keys=True))


def col(values):
  """Scalars -> updates of shape [C, 1]."""
  return jnp.asarray(values, jnp.float32)[:, None]


PAD = 8  # hand examples are padded to 8 clients with masked-out rows, so a rule compiles once per leaf shape


def run(name, updates, weights=None, mask=None, key=KEY, context=None, **params) -> AggregateResult:
  """Jitted ``aggregate`` on ``updates`` padded to ``PAD`` clients (padding masked out; exact, see the
  masking test), with per-client outputs sliced back to the real clients."""
  c = jax.tree.leaves(updates)[0].shape[0]
  extra = max(PAD - c, 0)

  def pad(x, value=0):
    return jnp.concatenate([jnp.asarray(x), jnp.full((extra,) + jnp.shape(x)[1:], value, jnp.asarray(x).dtype)])

  weights = jnp.ones(c) if weights is None else weights
  mask = jnp.ones(c, bool) if mask is None else mask
  context = dict(context or {})
  if "features" in context:
    context["features"] = pad(context["features"])
  r = jitted(name, **params)(jax.tree.map(pad, updates), pad(weights, 1.0), pad(mask, False), key, context)
  cut = lambda v: v[:c] if jnp.ndim(v) and jnp.shape(v)[0] == c + extra else v  # noqa: E731
  return AggregateResult(r.update, r.weights[:c], r.flagged[:c], {k: cut(v) for k, v in r.diagnostics.items()})


def close(a, b, atol=1e-5):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=atol)


# ----------------------------------------------------------------------------------------- sanitize / mean


def test_sanitize_zeroes_nonfinite_and_masked_rows():
  u = {"a": jnp.array([[1.0, 2.0], [jnp.nan, 0.0], [3.0, 4.0], [5.0, 6.0]]), "b": jnp.array([1.0, 2.0, jnp.inf, 4.0])}
  clean, valid, nonfinite = sanitize(u, jnp.array([True, True, True, False]))
  assert valid.tolist() == [True, False, False, False]
  assert nonfinite.tolist() == [False, True, True, False]
  close(clean["a"], [[1, 2], [0, 0], [0, 0], [0, 0]])
  close(clean["b"], [1, 0, 0, 0])


def test_mean_weighted_uniform_and_nan_screening():
  u = col([1.0, 2.0, 6.0])
  w = jnp.array([1.0, 1.0, 2.0])
  r = run("mean", u, w)
  close(r.update, [15.0 / 4])  # (1 + 2 + 12) / 4
  close(r.weights, [0.25, 0.25, 0.5])
  close(run("mean", u, w, weighted=False).update, [3.0])
  close(weighted_mean(u, w), r.update)  # the bare FedAvg kernel is unchanged
  bad = col([1.0, jnp.nan, 6.0])
  r = run("mean", bad, w)
  close(r.update, [13.0 / 3])  # (1 + 12) / 3: the NaN upload is excluded
  assert r.flagged.tolist() == [False, True, False]
  assert r.diagnostics["nonfinite"].tolist() == [False, True, False]
  r = run("mean", u, jnp.array([1.0, 0.0, 1.0]))  # weight 0 = does not count
  close(r.update, [3.5])
  close(run("mean", u, mask=jnp.zeros(3, bool)).update, [0.0])  # nothing valid -> 0, not NaN


# ----------------------------------------------------------------------------------------- coordinate-wise


def test_median_by_hand():
  r = run("median", col([3.0, 1.0, 100.0, 2.0, -50.0]))
  close(r.update, [2.0])
  close(r.weights, [0, 0, 0, 1, 0])
  # 2-vectors: column 0 sorted 1,2,3,4,5 -> 3 (client 2); column 1 sorted -5,0,7,10,20 -> 7 (client 4)
  u = jnp.array([[1.0, 10.0], [2.0, 20.0], [3.0, -5.0], [4.0, 0.0], [5.0, 7.0]])
  r = run("median", u)
  close(r.update, [3.0, 7.0])
  close(r.weights, [0, 0, 0.5, 0, 0.5])
  assert not r.flagged.any()
  # ties: [1, 1, 1, 5, 6] -> 1; the three tied clients share the window
  r = run("median", col([1.0, 5.0, 1.0, 6.0, 1.0]))
  close(r.update, [1.0])
  close(r.weights, [1 / 3, 0, 1 / 3, 0, 1 / 3])


def test_median_even_count_modes():
  u = col([4.0, 1.0, 3.0, 99.0, 2.0])
  mask = jnp.array([True, True, True, False, True])  # valid values 1, 2, 3, 4
  close(run("median", u, mask=mask).update, [2.5])  # np.median (textbook, FedCAP)
  close(run("median", u, mask=mask).weights, [0, 0, 0.5, 0, 0.5])
  close(run("median", u, mask=mask, even="lower").update, [2.0])  # torch.median (FedCC code)
  close(run("median", u, mask=mask, even="upper").update, [3.0])


def test_trimmed_mean_by_hand():
  u = col([3.0, 1.0, 100.0, 2.0, -50.0])
  r = run("trimmed_mean", u, num_trimmed=1)  # drop -50 and 100 -> mean(1, 2, 3)
  close(r.update, [2.0])
  close(r.weights, [1 / 3, 1 / 3, 0, 1 / 3, 0])
  close(run("trimmed_mean", u, beta=0.2).update, [2.0])  # Q = floor(0.2 * 5) = 1
  close(run("trimmed_mean", u, beta=0.0).update, [11.2])  # plain mean (56 / 5)
  close(run("trimmed_mean", u, num_trimmed=2).update, [2.0])  # = median
  # 2-vectors, Q = 1: column 0 keeps 2,3,4 -> 3; column 1 keeps 0,7,10 -> 17/3
  v = jnp.array([[1.0, 10.0], [2.0, 20.0], [3.0, -5.0], [4.0, 0.0], [5.0, 7.0]])
  close(run("trimmed_mean", v, num_trimmed=1).update, [3.0, 17.0 / 3])
  # beta counts the VALID clients: 7 rows, two masked -> n = 5, Q = floor(0.2 * 5) = 1 (not floor(0.2 * 7) = 1 ...)
  # and 10 rows with 5 masked would give Q = 1 instead of 2
  w = col([3.0, 1.0, 100.0, 2.0, -50.0, 7.0, 8.0])
  r = run("trimmed_mean", w, mask=jnp.array([1, 1, 1, 1, 1, 0, 0], bool), beta=0.2)
  close(r.update, [2.0])
  assert int(r.diagnostics["num_trimmed"]) == 1
  r = run("trimmed_mean", w, beta=0.2)  # n = 7: Q = 1 -> drop -50 and 100 -> mean(3, 1, 2, 7, 8) = 4.2
  close(r.update, [4.2])


def test_coordinate_rules_match_numpy_on_large_tied_inputs():
  # d = 9000 > one CPU tile (exercises the tiled, padded path); small integers -> many ties
  x = np.asarray(jax.random.randint(jax.random.PRNGKey(11), (7, 9000), -3, 4), np.float32)
  mask = np.array([1, 1, 1, 1, 1, 1, 0], bool)
  r = run("median", jnp.asarray(x), mask=jnp.asarray(mask))
  close(r.update, np.median(x[mask], axis=0))
  close(jnp.sum(r.weights), 1.0)
  r = run("trimmed_mean", jnp.asarray(x), num_trimmed=2)
  close(r.update, np.sort(x, axis=0)[2:5].mean(0))
  close(jnp.sum(r.weights), 1.0)
  # Bulyan's coordinate stage against a numpy reference on continuous data
  y = np.asarray(flat_random.normal(jax.random.PRNGKey(12), (7, 9000)))
  r = run("bulyan", jnp.asarray(y), num_byzantine=1)
  sel = y[np.asarray(r.diagnostics["selected"])]
  med = np.median(sel, axis=0)
  idx = np.argsort(np.abs(sel - med), axis=0, kind="stable")[:3]
  close(r.update, np.take_along_axis(sel, idx, axis=0).mean(0))


# ----------------------------------------------------------------------------------------- krum family

# scalars 0, 1, 2, 4, 7, 50 (n = 6, f = 1): each score sums the n - f - 2 = 3 smallest squared distances to others
#   0: 1 + 4 + 16 = 21      1: 1 + 1 + 9 = 11      2: 1 + 4 + 4 = 9
#   4: 4 + 9 + 9 = 22       7: 9 + 25 + 36 = 70    50: 43^2 + 46^2 + 48^2 = 6269
KRUM_X = [4.0, 50.0, 0.0, 2.0, 7.0, 1.0]
KRUM_SCORES = [22.0, 6269.0, 21.0, 9.0, 70.0, 11.0]


def test_krum_by_hand():
  r = run("krum", col(KRUM_X), num_byzantine=1)
  close(r.diagnostics["scores"], KRUM_SCORES)
  close(r.update, [2.0])
  close(r.weights, [0, 0, 0, 1, 0, 0])
  assert r.flagged.tolist() == [True, True, True, False, True, True]
  # count_self (FedCC code): the 3 smallest entries INCLUDING the self 0 -> 2 neighbours:
  #   0: 1 + 4 = 5   1: 1 + 1 = 2   2: 1 + 4 = 5   4: 4 + 9 = 13 ... -> picks 1
  r = run("krum", col(KRUM_X), num_byzantine=1, count_self=True)
  close(r.update, [1.0])


def test_multi_krum_by_hand():
  r = run("multi_krum", col(KRUM_X), num_byzantine=1)  # m = n - f = 5: all but 50
  close(r.update, [14.0 / 5])
  close(r.weights, [0.2, 0, 0.2, 0.2, 0.2, 0.2])
  assert r.flagged.tolist() == [False, True, False, False, False, False]
  r = run("multi_krum", col(KRUM_X), num_byzantine=1, m=3)  # scores 9, 11, 21 -> 2, 1, 0
  close(r.update, [1.0])
  close(r.weights, [0, 0, 1 / 3, 1 / 3, 0, 1 / 3])
  # weighted=True: sample-weighted mean of the same 3
  r = run("multi_krum", col(KRUM_X), jnp.array([1.0, 1, 1, 2, 1, 1]), num_byzantine=1, m=3)
  close(r.update, [1.0])
  r = run("multi_krum", col(KRUM_X), jnp.array([1.0, 1, 1, 2, 1, 1]), num_byzantine=1, m=3, weighted=True)
  close(r.update, [(0 + 4 + 1) / 4.0])


def test_krum_fedcc_distance_matches_reference():
  x = np.array(flat_random.normal(jax.random.PRNGKey(3), (7, 5)))
  x[6] += 4.0
  d = np.sqrt(np.sum((x[:, None] - x[None]) ** 4, axis=-1))  # ||(w_i - w_j)^2||_2
  k = 7 - 1 - 2
  scores = np.array([np.sort(np.delete(d[i], i))[:k].sum() for i in range(7)])
  r = run("krum", jnp.asarray(x), num_byzantine=1, distance="fedcc")
  close(r.diagnostics["scores"], scores, atol=1e-4)
  close(r.update, x[np.argmin(scores)])


def test_bulyan_by_hand():
  # n = 7, f = 1 (n >= 4f + 3): theta = 5 Krum picks, then per coordinate beta = 3 closest to the median.
  # Recursive Krum (k = |R| - 3 neighbours, at least 1), scores by hand:
  #   R = all (k=4):   0:111 1:82 2:63 5:66 9:210 50:8411 -30:4110        -> pick 2
  #   R - {2} (k=3):   0:107 1:81 5:57 9:161 ...                          -> pick 5
  #   (k=2):           0:82 1:65 9:145 ...                                 -> pick 1
  #   (k=1):           0:81 9:81 -30:900 50:1681   (tie -> lowest index)   -> pick 0
  #   (k=1):           9:1521 -30:1521 50:1681                             -> pick 9
  # selected {0, 1, 2, 5, 9}: median 2; |x - 2| = 2, 1, 0, 3, 7 -> closest 3 are 2, 1, 0 -> mean 1.
  # (the ties do not matter: picking -30 instead of 9 gives median 1 and again mean(0, 1, 2) = 1)
  x = [0.0, 1.0, 2.0, 5.0, 9.0, 50.0, -30.0]
  r = run("bulyan", col(x), num_byzantine=1)
  close(r.update, [1.0])
  close(r.weights, [1 / 3, 1 / 3, 1 / 3, 0, 0, 0, 0])
  assert r.flagged.tolist() == [False] * 5 + [True, True]
  assert r.diagnostics["selection_order"].tolist() == [3, 2, 0, 1, 4, -1, -1]
  assert int(r.diagnostics["theta"]) == 5 and int(r.diagnostics["beta"]) == 3


def test_bulyan_coordinate_stage_and_f0():
  # f = 0: theta = beta = n -> plain mean
  u = flat_random.normal(jax.random.PRNGKey(1), (5, 3))
  close(run("bulyan", u, num_byzantine=0).update, jnp.mean(u, 0))
  # 2-D, f = 1: the far point (100, 100) and (-40, 3) are dropped by Krum; the coordinate stage
  # then averages, per coordinate, the 3 values closest to the median of the 5 selected.
  x = jnp.array([[0.0, 0.0], [1.0, 2.0], [2.0, 1.0], [3.0, 3.0], [1.0, 0.5], [100.0, 100.0], [-40.0, 3.0]])
  r = run("bulyan", x, num_byzantine=1)
  sel = np.asarray(r.diagnostics["selected"])
  assert sel.tolist() == [True] * 5 + [False, False]
  # column 0 of the selected: 0,1,2,3,1 -> median 1, closest 3: 1, 1, (0 or 2 tie at 1 -> share) -> (1+1+0.5*0+0.5*2)/3
  # column 1: 0,2,1,3,0.5 -> median 1, |.-1| = 1,1,0,2,0.5 -> 1, 0.5, then 0 and 2 tie -> (1+0.5+0.5*0+0.5*2)/3
  close(r.update, [1.0, 2.5 / 3])


# ----------------------------------------------------------------------------------------- geometric median


def test_rfa_collinear_points_give_the_median():
  # On a line the geometric median is the (1-D) median: 2, while the mean is 22.6.
  r = run("rfa", col([0.0, 100.0, 1.0, 10.0, 2.0]), max_iter=500, tol=0.0)
  close(r.update, [2.0], atol=1e-3)
  close(jnp.sum(r.weights), 1.0)


def test_rfa_symmetric_configuration_and_far_outlier():
  # rectangle centred at (3, -2) + a masked-out garbage row: the geometric median is the centre.
  pts = jnp.array([[4.0, -1.0], [2.0, -3.0], [4.0, -3.0], [2.0, -1.0], [1e6, 1e6]])
  r = run("rfa", pts, mask=jnp.array([1, 1, 1, 1, 0], bool))
  close(r.update, [3.0, -2.0])
  # the 4 points (+-1, 0), (0, +-1), the centre with weight 2 and one far outlier: the centre is optimal
  # (|sum of unit vectors from the centre| = 1 < 2), the mean is ~(167, 0).
  pts = jnp.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [0.0, 0.0], [1000.0, 0.0]])
  w = jnp.array([1.0, 1, 1, 1, 2, 1])
  r = run("rfa", pts, w)
  assert np.linalg.norm(np.asarray(r.update)) < 1e-3
  assert float(run("mean", pts, w).update[0]) > 100
  # optimality of a generic point set: the weighted unit vectors towards the points sum to ~0
  pts = jnp.array([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0], [5.0, 5.0]])
  v = np.asarray(run("rfa", pts, max_iter=500, tol=0.0).update)
  g = sum((v - p) / np.linalg.norm(v - p) for p in np.asarray(pts))
  assert np.linalg.norm(g) < 1e-3


def test_rfa_per_layer_flag_runs_each_leaf_alone():
  u = {"a": col([0.0, 100.0, 1.0, 10.0, 2.0]), "b": flat_random.normal(jax.random.PRNGKey(2), (5, 3))}
  per_layer = run("rfa", u, per_layer=True, max_iter=500, tol=0.0)
  close(per_layer.update["a"], run("rfa", u["a"], max_iter=500, tol=0.0).update, atol=1e-4)
  close(per_layer.update["b"], run("rfa", u["b"], max_iter=500, tol=0.0).update, atol=1e-4)
  whole = run("rfa", u, max_iter=500, tol=0.0)
  assert not np.allclose(np.asarray(whole.update["a"]), np.asarray(per_layer.update["a"]), atol=1e-2)


# ----------------------------------------------------------------------------------------- clipping


def test_norm_clipping_by_hand():
  u = jnp.array([[3.0, 4.0], [0.6, 0.8]])  # norms 5 and 1
  r = run("norm_clipping", u, max_norm=2.0)
  close(r.update, [(1.2 + 0.6) / 2, (1.6 + 0.8) / 2])  # (3,4) -> (1.2, 1.6)
  close(r.weights, [0.2 / 0.7, 0.5 / 0.7])  # coefficients 0.5 * 0.4 and 0.5 * 1 on the raw updates
  assert r.diagnostics["clipped"].tolist() == [True, False]
  r = run("norm_clipping", u, jnp.array([3.0, 1.0]), max_norm=2.0)
  close(r.update, [0.75 * 1.2 + 0.25 * 0.6, 0.75 * 1.6 + 0.25 * 0.8])


def test_centered_clipping_one_iteration_by_hand():
  u = jnp.array([[3.0, 4.0], [0.5, 0.0], [0.0, -0.5]])
  # reference 0, tau 1: (3,4) is clipped to (0.6, 0.8), the others are inside the ball
  r = run("centered_clipping", u, tau=1.0, iters=1)
  close(r.update, [(0.6 + 0.5) / 3, (0.8 - 0.5) / 3])
  # reference (1, 0): diffs (2,4) |.|=sqrt(20) -> *1/sqrt(20); (-0.5, 0) kept; (-1,-0.5) |.|=sqrt(1.25) -> *1/sqrt(1.25)
  d1 = np.array([2.0, 4.0]) / math.sqrt(20)
  d3 = np.array([-1.0, -0.5]) / math.sqrt(1.25)
  expect = np.array([1.0, 0.0]) + (d1 + np.array([-0.5, 0.0]) + d3) / 3
  r = run("centered_clipping", u, tau=1.0, iters=1, context={"reference": jnp.array([1.0, 0.0])})
  close(r.update, expect)
  # 3 iterations = the fixed-point loop in numpy
  v = np.zeros(2)
  for _ in range(3):
    diffs = np.asarray(u) - v
    n = np.linalg.norm(diffs, axis=1)
    v = v + np.mean(diffs * np.minimum(1, 1.0 / n)[:, None], axis=0)
  close(run("centered_clipping", u, tau=1.0, iters=3).update, v)


# ----------------------------------------------------------------------------------------- similarity based


def test_fltrust_by_hand():
  ref = jnp.array([2.0, 0.0])  # |g0| = 2
  u = jnp.array([[3.0, 0.0], [0.0, 5.0], [-1.0, 0.0], [1.0, 1.0]])
  # cos = 1, 0, -1, 1/sqrt2 -> TS = 1, 0, 0, 0.7071; rescaled: (2, 0), -, -, (sqrt2, sqrt2)
  r = run("fltrust", u, context={"reference_update": ref})
  ts = 1 / math.sqrt(2)
  close(r.update, [(2 + ts * math.sqrt(2)) / (1 + ts), ts * math.sqrt(2) / (1 + ts)])
  close(r.weights, [1 / (1 + ts), 0, 0, ts / (1 + ts)])
  assert r.flagged.tolist() == [False, True, True, False]
  close(r.diagnostics["trust"], [1, 0, 0, ts])
  # scaling an update does not change the aggregate (norms are rescaled to |g0|)
  u2 = u.at[0].multiply(100.0)
  close(run("fltrust", u2, context={"reference_update": ref}).update, r.update)
  # all opposite -> zero update, everyone flagged
  r = run("fltrust", -jnp.abs(u) - 0.1, context={"reference_update": ref})
  close(r.update, [0.0, 0.0])
  assert r.flagged.all()


def test_clustered_keeps_the_larger_cluster():
  u = jnp.array([[1.0, 0.1], [-1.0, 0.0], [1.0, -0.1], [1.0, 0.0], [-1.0, 0.2]])
  w = jnp.array([1.0, 1, 2, 1, 1])
  r = run("clustered", u, w)
  close(r.update, [1.0, (0.1 - 0.2 + 0.0) / 4])  # sample-weighted mean of clients 0, 2, 3
  close(r.weights, [0.25, 0, 0.5, 0.25, 0])
  assert r.flagged.tolist() == [False, True, False, False, True]
  assert r.diagnostics["cluster"].tolist() == [0, 1, 0, 0, 1]
  # complete linkage (not single): a chain of small angles is cut where the max intra distance is smallest.
  ang = np.deg2rad([0.0, 10.0, 20.0, 100.0, 110.0, 120.0, 130.0])
  v = jnp.asarray(np.stack([np.cos(ang), np.sin(ang)], 1), jnp.float32)
  r = run("clustered", v, weighted=False)
  assert r.diagnostics["cluster"].tolist() == [1, 1, 1, 0, 0, 0, 0]
  # equal sizes: the tighter cluster is kept
  t = jnp.array([[1.0, 0.0], [1.0, 0.01], [-1.0, 0.5], [-1.0, -0.5]])
  assert run("clustered", t).diagnostics["cluster"].tolist() == [0, 0, 1, 1]


def test_flare_by_hand():
  # features 0, 1, 2, 3, 100 (one vector per client: biased MMD is monotone in the distance);
  # k = floor(0.5 * 5) = 2 nearest others: 0->{1,2} 1->{0,2} 2->{1,3} 3->{2,1} 100->{3,2}
  # counts 1, 3, 4, 2, 0; mean 2; tau = softmax(counts / 2)
  feats = jnp.array([[0.0], [1.0], [2.0], [3.0], [100.0]])
  u = flat_random.normal(jax.random.PRNGKey(4), (5, 3))
  r = run("flare", u, context={"features": feats}, gamma=1e-5)
  close(r.diagnostics["counts"], [1, 3, 4, 2, 0])
  tau = np.exp(np.array([0.5, 1.5, 2.0, 1.0, 0.0]))
  tau /= tau.sum()
  close(r.weights, tau)
  close(r.update, np.asarray(u).T @ tau)
  # sets of PLRs [C, m, d] with the unbiased MMD: the shifted client is named least
  sets = flat_random.normal(jax.random.PRNGKey(5), (6, 8, 4)).at[5].add(5.0)
  r = run("flare", u[:1].repeat(6, 0) + jnp.arange(6.0)[:, None], context={"features": sets})
  assert int(jnp.argmin(r.diagnostics["counts"])) == 5
  with pytest.raises(ValueError, match="features"):
    run("flare", u)


# ----------------------------------------------------------------------------------------- wrappers


def test_bucketing_s1_is_the_inner_rule():
  u = flat_random.normal(jax.random.PRNGKey(6), (7, 3))
  for inner in ({"name": "krum", "num_byzantine": 1}, {"name": "median"}):
    a = run("bucketing", u, s=1, inner=inner)
    b = jax.jit(aggregator_from_config(inner).aggregate)(u, None, None, KEY, None)
    close(a.update, b.update)
    close(a.weights, b.weights)


def test_bucketing_s2_by_reconstruction():
  u = flat_random.normal(jax.random.PRNGKey(7), (7, 2))
  r = run("bucketing", u, s=2, inner={"name": "median"})
  bucket = np.asarray(r.diagnostics["bucket"])
  assert sorted(np.bincount(bucket).tolist()) == [1, 2, 2, 2]  # 7 clients -> buckets of 2, 2, 2, 1
  means = np.stack([np.asarray(u)[bucket == b].mean(0) for b in range(4)])
  close(r.update, np.median(means, axis=0))
  close(jnp.sum(r.weights), 1.0)
  # with a mean inner rule and equal weights, bucketing of 6 clients in pairs is the plain mean
  u6 = u[:6]
  close(run("bucketing", u6, s=2, inner="mean").update, jnp.mean(u6, 0))
  # a different key gives a different permutation; fixed_seed (FedCAP quirk) ignores the key
  b1 = run("bucketing", u, key=jax.random.PRNGKey(1), s=2, inner="median").diagnostics["bucket"]
  b2 = run("bucketing", u, key=jax.random.PRNGKey(2), s=2, inner="median").diagnostics["bucket"]
  assert not np.array_equal(b1, b2)
  f1 = run("bucketing", u, key=jax.random.PRNGKey(1), s=2, inner="median", fixed_seed=3).diagnostics["bucket"]
  f2 = run("bucketing", u, key=jax.random.PRNGKey(2), s=2, inner="median", fixed_seed=3).diagnostics["bucket"]
  assert np.array_equal(f1, f2)


def test_gas_by_hand():
  # p = 1: keep the n - f updates closest to the inner aggregate. Krum(f=1) picks 2 (see KRUM_X);
  # distances to 2: 2, 48, 2, 0, 5, 1 -> GAS f = 2 keeps 4, 0, 2, 1 -> mean 1.75
  r = run("gas", col(KRUM_X), p=1, num_byzantine=2, inner={"name": "krum", "num_byzantine": 1})
  close(r.update, [1.75])
  assert r.flagged.tolist() == [False, True, False, False, True, False]
  close(r.diagnostics["scores"], [2, 48, 2, 0, 5, 1])
  # num_byzantine defaults to the inner config's
  r = run("gas", col(KRUM_X), p=1, inner={"name": "krum", "num_byzantine": 1})
  close(r.update, [14.0 / 5])
  # p = d = 2 (one coordinate per chunk, any permutation): score = L1 distance to the coordinate median (1, 0):
  # (0,0):1 (1,1):1 (2,-1):2 (10,0):9 (0,10):11 -> f = 2 keeps the first three -> mean (1, 0)
  x = jnp.array([[0.0, 0.0], [1.0, 1.0], [2.0, -1.0], [10.0, 0.0], [0.0, 10.0]])
  r = run("gas", x, p=2, num_byzantine=2, inner="median")
  close(r.diagnostics["scores"], [1, 1, 2, 9, 11])
  close(r.update, [1.0, 0.0])


def test_gas_chunks_a_pytree_with_padding_and_passes_the_reference():
  u = {"w": flat_random.normal(jax.random.PRNGKey(8), (6, 3, 2)), "b": jnp.ones((6, 1))}
  ref = {"w": jnp.ones((3, 2)), "b": jnp.ones((1,))}
  r = run("gas", u, p=3, num_byzantine=1, inner="fltrust", context={"reference_update": ref})  # d = 7, pad 2
  assert jax.tree.structure(r.update) == jax.tree.structure(ref)
  assert int(r.flagged.sum()) == 1
  assert bool(jnp.all(jnp.isfinite(r.diagnostics["scores"])))


# ----------------------------------------------------------------------------------------- generic properties

RULES = {  # name -> params, for C = 9 clients
    "mean": {},
    "median": {},
    "trimmed_mean": {"beta": 0.2},
    "krum": {"num_byzantine": 1},
    "multi_krum": {"num_byzantine": 1},
    "bulyan": {"num_byzantine": 1},
    "rfa": {},
    "geometric_median": {"per_layer": True},
    "centered_clipping": {"tau": 0.5, "iters": 2},
    "norm_clipping": {"max_norm": 1.0},
    "fltrust": {},
    "clustered": {},
    "flare": {},
    "fedcc": {"layer": "w"},  # the penultimate kernel is the leaf "w" (C, 2, 3): 3 rows of 2
    "bucketing": {"s": 2, "inner": {"name": "median"}},
    "gas": {"p": 2, "num_byzantine": 1, "inner": {"name": "median"}},
    "dnc": {"num_byzantine": 1, "sub_dim": 5},  # D = 8: a random 5 of them
    "zeno": {"b": 1},  # context["server_losses"] below
}


def test_rules_table_covers_the_registry():
  assert set(RULES) == set(AGGREGATORS)


def _tree(c, seed=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  return {"w": flat_random.normal(k1, (c, 2, 3)) + 0.5, "b": flat_random.normal(k2, (c, 2))}


def _context(c, seed=0):
  ref = jax.tree.map(lambda x: jnp.mean(x, 0), _tree(c, seed))
  return {"reference_update": ref, "features": flat_random.normal(jax.random.PRNGKey(seed + 9), (c, 4)),
          "global_params": ref, "server_losses": flat_random.uniform(jax.random.PRNGKey(seed + 7), (c,)),
          "global_server_loss": jnp.float32(0.5)}


def _take(ctx, idx):
  """The per-client context entries for the clients ``idx`` (in that order)."""
  return dict(ctx, features=ctx["features"][idx], server_losses=ctx["server_losses"][idx])


PERMUTATION_INVARIANT = {"mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "rfa", "geometric_median",
                         "centered_clipping", "norm_clipping", "fltrust", "clustered", "flare", "fedcc", "dnc",
                         "zeno"}


def _leaves_close(a, b, atol=1e-4):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.shape == y.shape
    close(x, y, atol=atol)


def _finite(tree):
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_pytree_jit_mask_nonfinite_permutation(name):
  c = 9
  make_aggregator(name, num_clients=c, **RULES[name])  # the construction-time checks accept C = 9
  f = jitted(name, **RULES[name])  # every call below is jitted
  u = _tree(c)
  w = jnp.arange(1.0, c + 1)
  ones = jnp.ones(c, bool)
  ctx = _context(c)
  full = f(u, w, ones, KEY, ctx)
  assert jax.tree.structure(full.update) == jax.tree.structure(ctx["reference_update"])
  assert _finite(full.update)
  assert full.weights.shape == (c,) and full.flagged.shape == (c,) and full.flagged.dtype == jnp.bool_
  close(jnp.sum(full.weights), 1.0)
  assert not full.flagged[jnp.asarray(full.weights) > 0].any()

  # permuting the clients permutes weights / flags and leaves the aggregate unchanged
  if name in PERMUTATION_INVARIANT:
    perm = np.array([4, 0, 8, 2, 7, 1, 3, 6, 5])
    pu = jax.tree.map(lambda x: x[perm], u)
    permuted = f(pu, w[perm], ones, KEY, _take(ctx, perm))
    _leaves_close(full.update, permuted.update, atol=1e-5)
    close(full.weights[perm], permuted.weights)
    assert full.flagged[perm].tolist() == permuted.flagged.tolist()

  # masked clients are excluded exactly: same result as running on the subset (their rows hold garbage)
  mask = jnp.array([1, 1, 0, 1, 1, 1, 0, 1, 1], bool)
  keep = np.flatnonzero(np.asarray(mask))
  bad = jax.tree.map(lambda x: x.at[2].set(1e30).at[6].set(-7.0), u)
  masked = f(bad, w, mask, KEY, ctx)
  assert _finite(masked.update)
  assert float(jnp.sum(jnp.abs(masked.weights[~mask]))) == 0.0
  assert not masked.flagged[~mask].any()
  if name != "bucketing":  # bucketing's random buckets depend on C, not only on the valid clients
    sub = jax.tree.map(lambda x: x[keep], u)
    small = f(sub, w[keep], jnp.ones(len(keep), bool), KEY, _take(ctx, keep))
    _leaves_close(masked.update, small.update)
    close(masked.weights[keep], small.weights)

  # NaN / Inf uploads: finite aggregate, flagged, reported, and equal to masking them out
  poisoned = jax.tree.map(lambda x: x.at[1].set(jnp.nan), u)
  poisoned["b"] = poisoned["b"].at[4, 0].set(jnp.inf)
  r = f(poisoned, w, ones, KEY, ctx)
  assert _finite(r.update)
  assert bool(r.flagged[1]) and bool(r.flagged[4])
  assert r.diagnostics["nonfinite"].tolist() == [i in (1, 4) for i in range(c)]
  assert float(r.weights[1]) == 0.0 and float(r.weights[4]) == 0.0
  nan_free = f(u, w, jnp.array([i not in (1, 4) for i in range(c)]), KEY, ctx)
  _leaves_close(r.update, nan_free.update, atol=1e-5)


# ----------------------------------------------------------------------------------------- errors / registry


def test_construction_and_trace_time_errors():
  with pytest.raises(ValueError, match="2f \\+ 2"):
    make_aggregator("krum", num_byzantine=2, num_clients=6)  # n = 6 <= 2f + 2
  make_aggregator("krum", num_byzantine=2, num_clients=7)
  with pytest.raises(ValueError, match="2f \\+ 2"):
    make_aggregator("multi_krum", num_byzantine=2).aggregate(col(range(6)))  # caught at trace time
  with pytest.raises(ValueError, match="2f \\+ 2"):
    jax.jit(make_aggregator("krum", num_byzantine=2).aggregate)(col(range(6)))
  with pytest.raises(ValueError, match="4f \\+ 3"):
    make_aggregator("bulyan", num_byzantine=2, num_clients=10)
  with pytest.raises(ValueError, match="4f \\+ 3"):
    make_aggregator("bulyan", num_byzantine=1).aggregate(col(range(6)))
  jax.jit(make_aggregator("bulyan", num_byzantine=3, strict=False).aggregate)(col(range(10)))  # FedCC n=10, f=3: beta clamped
  with pytest.raises(ValueError, match="num_trimmed"):
    make_aggregator("trimmed_mean", num_trimmed=3, num_clients=6)
  with pytest.raises(ValueError, match="num_trimmed"):
    make_aggregator("trimmed_mean", num_trimmed=3).aggregate(col(range(6)))
  for beta in (-0.1, 0.5, 0.7):
    with pytest.raises(ValueError, match="beta"):
      make_aggregator("trimmed_mean", beta=beta)
  with pytest.raises(ValueError, match="exactly one"):
    make_aggregator("trimmed_mean")
  with pytest.raises(ValueError, match="reference_update"):
    make_aggregator("fltrust").aggregate(col(range(3)))
  with pytest.raises(ValueError, match="key"):
    make_aggregator("bucketing", inner="median").aggregate(col(range(4)))
  with pytest.raises(ValueError, match="requires"):
    make_aggregator("krum")
  with pytest.raises(ValueError, match="known"):
    make_aggregator("nope")
  with pytest.raises(ValueError, match="known: .*num_byzantine"):
    make_aggregator("krum", num_byzantine=1, f=2)
  with pytest.raises(ValueError, match="even"):
    make_aggregator("median", even="middle")


def test_runtime_too_few_valid_clients_degrades_gracefully():
  # C = 7 passes the static check for Krum f=1, but only 3 clients are valid: finite result, condition flagged
  u = col([0.0, 1.0, 2.0, 5.0, 9.0, 50.0, -30.0])
  mask = jnp.array([1, 1, 1, 0, 0, 0, 0], bool)
  for name in ("krum", "multi_krum", "bulyan"):
    r = run(name, u, mask=mask, num_byzantine=1)
    assert bool(jnp.isfinite(r.update).all()) and not bool(r.diagnostics["condition_ok"])
    close(jnp.sum(r.weights), 1.0)
  r = run("trimmed_mean", u, mask=mask, num_trimmed=2)  # Q clamped to 1
  close(r.update, [1.0])


def test_config_round_trip():
  cfg = ml_collections.ConfigDict({"name": "bucketing", "s": 2, "inner": {"name": "krum", "num_byzantine": 1}})
  agg = aggregator_from_config(cfg, num_clients=10)
  assert isinstance(agg, Aggregator) and agg.name == "bucketing(krum)"
  r = jax.jit(agg.aggregate)(flat_random.normal(KEY, (10, 3)), None, None, KEY, None)
  assert int(jnp.sum(r.weights > 0)) == 2  # Krum picks one bucket of 2
  with pytest.raises(ValueError, match="2f \\+ 2"):  # 8 clients -> 4 buckets <= 2f + 2
    aggregator_from_config(cfg, num_clients=8)
  assert aggregator_from_config({"name": "geometric_median"}).name == "geometric_median"
  assert aggregator_from_config({"name": "rfa", "per_layer": True}).name == "rfa"
  with pytest.raises(ValueError, match="name"):
    aggregator_from_config({"beta": 0.1})
