"""FedCC's batched similarity kernels (fedjax_robust/metrics/similarity.py) against fedcc.md §1.3 and §7.

Golden values are the spec's (computed independently and matching the author code); the float64 numpy references
below follow the spec's formulas step by step, independently of the JAX code (no radix select, explicit H K H,
Song et al.'s unbiased HSIC formula instead of U-centring).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust.metrics import similarity as S


pytestmark = pytest.mark.usefixtures("fast_compiles")  # tests/conftest.py


# ----------------------------------------------------------------------------------------- numpy references


def np_sqdist(x):
  x = np.asarray(x, np.float64)
  return np.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1)


def np_rbf(x, sigma=1.0, bandwidth="nonzero_median"):
  d = np_sqdist(x)
  med = np.median(d[d != 0]) if bandwidth == "nonzero_median" else np.median(d)
  return np.exp(-d / (2 * sigma ** 2 * med))


def np_linear(x):
  x = np.asarray(x, np.float64)
  return x @ x.T


def np_hsic(k, l):
  h = k.shape[0]
  hm = np.eye(h) - np.ones((h, h)) / h
  return np.trace(hm @ k @ hm @ hm @ l @ hm)


def np_hsic_unbiased(k, l):
  """Song et al. (2012), eq. 5: diagonals zeroed, n(n-3) normalisation."""
  n = k.shape[0]
  k, l = k.copy(), l.copy()
  np.fill_diagonal(k, 0)
  np.fill_diagonal(l, 0)
  one = np.ones(n)
  return (np.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
          - 2.0 / (n - 2) * (one @ k @ l @ one)) / (n * (n - 3))


def np_cka(k, l, debiased=False):
  f = np_hsic_unbiased if debiased else np_hsic
  return f(k, l) / np.sqrt(f(k, k) * f(l, l))


def np_mmd(x, y, gamma=1.0):
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  k = lambda a, b: np.exp(-gamma * np.sum((a[:, None] - b[None]) ** 2, -1))
  return k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean()


def rand(shape, seed):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


# ----------------------------------------------------------------------------------------- golden values (§7.7)

X3 = np.array([[0, 0], [1, 0], [0, 2]], np.float32)
Y3 = np.array([[0, 0], [1, 1], [2, 0]], np.float32)
X4 = np.array([[1, 2, 0], [0, 1, 1], [2, 0, 1], [1, 1, 1]], np.float32)
Y4 = np.array([[1, 0, 0], [0, 2, 1], [1, 1, 3], [0, 0, 1]], np.float32)


def test_golden_3x2_by_hand():
  d = np.asarray(S.sq_distances(X3))
  # rows (0,0), (1,0), (0,2); float32 after subtracting the mean row (1/3, 2/3): exact to rounding
  np.testing.assert_allclose(d, [[0, 1, 4], [1, 0, 5], [4, 5, 0]], rtol=1e-6)
  assert np.all(np.diag(d) == 0)
  np.testing.assert_allclose(float(S.median_bandwidth(S.sq_distances(X3))), 4.0, rtol=1e-6)  # median{1, 4, 5}
  np.testing.assert_allclose(float(S.median_bandwidth(S.sq_distances(Y3))), 2.0, rtol=1e-6)  # median{2, 2, 4}
  # kernel of X by hand: exp(-D / 8)
  np.testing.assert_allclose(np.asarray(S.rbf_gram(X3)), np.exp(-np.array([[0, 1, 4], [1, 0, 5], [4, 5, 0]]) / 8.0),
                             rtol=1e-6)
  np.testing.assert_allclose(float(S.kernel_cka_pair(X3, Y3)), 0.8503346062965, atol=1e-6)
  np.testing.assert_allclose(float(S.linear_cka_pair(X3, Y3)), 0.7980238751210, atol=1e-6)
  # linear CKA by hand: centred Grams of X and Y, HSIC = sum of their elementwise product
  xc, yc = X3 - X3.mean(0), Y3 - Y3.mean(0)
  kx, ky = xc @ xc.T, yc @ yc.T
  np.testing.assert_allclose(float(S.linear_cka_pair(X3, Y3)),
                             (kx * ky).sum() / np.sqrt((kx * kx).sum() * (ky * ky).sum()), atol=1e-6)


def test_golden_4x3():
  np.testing.assert_allclose(float(S.kernel_cka_pair(X4, Y4)), 0.8931681259898, atol=1e-6)
  np.testing.assert_allclose(float(S.linear_cka_pair(X4, Y4)), 0.8731920031544, atol=1e-6)
  np.testing.assert_allclose(float(S.SIMILARITIES["mmd"].pair(X4, Y4)), 0.4161800945379, atol=1e-6)


def test_golden_invariance_value_of_the_spec():
  """§7.4: cka_rbf(A, B) = cka_rbf(3.7 AQ + 5, B) = 0.852903087381."""
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(16, 40)), rng.normal(size=(16, 40))
  q, _ = np.linalg.qr(rng.normal(size=(40, 40)))
  np.testing.assert_allclose(float(S.kernel_cka_pair(a, b)), 0.852903087381, atol=2e-6)
  np.testing.assert_allclose(float(S.kernel_cka_pair(3.7 * a @ q + 5, b)), 0.852903087381, atol=2e-6)


# ----------------------------------------------------------------------------------------- properties (§7.1-7.6)


@pytest.mark.parametrize("name", ["kernel_cka", "linear_cka"])
def test_cka_properties(name):
  m = S.SIMILARITIES[name]
  x, y = rand((12, 20), 1), rand((12, 20), 2)
  np.testing.assert_allclose(float(m.pair(x, x)), 1.0, atol=1e-6)  # §7.1
  np.testing.assert_allclose(float(m.pair(x, y)), float(m.pair(y, x)), atol=1e-6)  # §7.2 symmetry
  for seed in range(5):  # §7.3 range
    v = float(m.pair(rand((12, 20), 10 + seed), rand((12, 20), 20 + seed) * (seed + 1)))
    assert 0.0 <= v <= 1.0
  base = float(m.pair(x, y))
  q, _ = np.linalg.qr(rand((20, 20), 3).astype(np.float64))
  np.testing.assert_allclose(float(m.pair(x @ q.astype(np.float32), y)), base, atol=2e-6)  # orthogonal
  np.testing.assert_allclose(float(m.pair(0.01 * x, y)), base, atol=2e-6)  # isotropic scaling
  np.testing.assert_allclose(float(m.pair(x, 250.0 * y)), base, atol=2e-6)
  np.testing.assert_allclose(float(m.pair(x + rand((1, 20), 4), y)), base, atol=2e-6)  # translation
  diag = np.linspace(0.1, 5.0, 20).astype(np.float32)  # §7.5: not invariant to a non-isotropic scaling
  assert abs(float(m.pair(x * diag, y)) - base) > 1e-3
  perm = np.random.default_rng(5).permutation(12)  # §7.6: rows permuted together / alone
  np.testing.assert_allclose(float(m.pair(x[perm], y[perm])), base, atol=2e-6)
  assert abs(float(m.pair(x[perm], y)) - base) > 1e-3


@pytest.mark.parametrize("bandwidth", ["nonzero_median", "median"])
@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_kernel_cka_matches_the_float64_reference(bandwidth, sigma):
  x, y = rand((10, 7), 6), rand((10, 7), 7)
  y[3] = y[1]  # a duplicate row: its zero distance is left out of the nonzero median
  want = np_cka(np_rbf(x, sigma, bandwidth), np_rbf(y, sigma, bandwidth))
  got = float(S.kernel_cka_pair(x, y, sigma=sigma, bandwidth=bandwidth))
  np.testing.assert_allclose(got, want, atol=1e-6)
  d = np_sqdist(y)
  np.testing.assert_allclose(float(S.median_bandwidth(S.sq_distances(y))), np.median(d[d != 0]), rtol=1e-5)


@pytest.mark.parametrize("values", [[7.0], [1.0, 3.0], [1.0, 2.0, 2.0, 3.0], [4.0, 1.0, 3.0, 2.0], [5.0] * 4,
                                    [2.0, 9.0, 2.0, 2.0, 9.0, 1.0], [3.0, 1.0, 2.0]])
def test_median_has_numpy_semantics(values):
  """Even counts average the two middle values; ties; masked entries ignored; nothing valid -> NaN."""
  v = np.array(values + [100.0, -100.0], np.float32)
  ok = np.array([True] * len(values) + [False, False])
  np.testing.assert_allclose(float(S._median(jnp.asarray(v), jnp.asarray(ok))), np.median(values), rtol=1e-7)
  assert np.isnan(float(S._median(jnp.asarray(v), jnp.zeros(len(v), bool))))


def test_debiased_cka_is_the_unbiased_hsic_estimator():
  x, y = rand((9, 5), 8), rand((9, 5), 9)
  np.testing.assert_allclose(float(S.kernel_cka_pair(x, y, debiased=True)),
                             np_cka(np_rbf(x), np_rbf(y), debiased=True), atol=2e-6)
  np.testing.assert_allclose(float(S.linear_cka_pair(x, y, debiased=True)),
                             np_cka(np_linear(x), np_linear(y), debiased=True), atol=2e-6)
  np.testing.assert_allclose(float(S.linear_cka_pair(x, x, debiased=True)), 1.0, atol=1e-6)
  with pytest.raises(ValueError, match="4 rows"):
    S.linear_cka_pair(X3, Y3, debiased=True)


def test_other_similarities_by_hand():
  x = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
  ys = np.stack([x, -x, 2 * x, np.array([[1.0, 0.0], [0.0, 0.0]], np.float32)])
  np.testing.assert_allclose(np.asarray(S.cosine(x, ys)), [1.0, -1.0, 1.0, 1.0 / np.sqrt(5.0)], atol=1e-6)
  np.testing.assert_allclose(np.asarray(S.euclidean(x, ys)), [0.0, 2 * np.sqrt(5.0), np.sqrt(5.0), 2.0], atol=1e-6)
  # MMD of a set with itself is 0; with gamma = 1 and two rows at squared distance 5: closed form
  got = np.asarray(S.mmd(x, ys))
  assert abs(got[0]) < 1e-6
  np.testing.assert_allclose(got, [np_mmd(x, y) for y in ys], atol=1e-6)
  np.testing.assert_allclose(float(S.mmd(x, ys[:1] + 1.0, gamma=0.5)[0]), np_mmd(x, ys[0] + 1.0, 0.5), atol=1e-6)
  assert not S.SIMILARITIES["mmd"].higher_is_similar and not S.SIMILARITIES["euclidean"].higher_is_similar
  assert S.SIMILARITIES["kernel_cka"].higher_is_similar and S.SIMILARITIES["cosine"].higher_is_similar


def test_degenerate_inputs_give_nan_not_garbage():
  """§7.8: all rows of Y identical -> no nonzero distance -> NaN (FedCC maps it to 0); the same for zero norms."""
  x = rand((6, 4), 11)
  same = np.tile(rand((1, 4), 12), (6, 1))
  assert np.isnan(float(S.kernel_cka_pair(x, same)))
  assert np.isnan(float(S.linear_cka_pair(x, same)))
  assert np.isnan(float(S.cosine(x, np.zeros((1, 6, 4), np.float32))[0]))
  assert np.isfinite(float(S.mmd(x, same[None])[0]))


# ----------------------------------------------------------------------------------------- batched = per-client loop


@pytest.mark.parametrize("name, params", [
    ("kernel_cka", {}), ("kernel_cka", {"sigma": 2.0, "bandwidth": "median"}), ("kernel_cka", {"debiased": True}),
    ("linear_cka", {}), ("linear_cka", {"debiased": True}), ("mmd", {}), ("mmd", {"gamma": 0.1}),
    ("cosine", {}), ("euclidean", {})])
def test_batched_kernel_equals_a_per_client_loop(name, params):
  m = S.SIMILARITIES[name]
  g = rand((16, 24), 13) * 0.1
  clients = np.stack([g + rand((16, 24), 100 + i) * 0.02 * (i + 1) for i in range(6)])
  clients[5] = rand((16, 24), 99)  # one unrelated model
  batched = np.asarray(m.batched(g, clients, **params))
  assert batched.shape == (6,)
  loop = np.array([float(m.pair(g, clients[i], **params)) for i in range(6)])
  np.testing.assert_allclose(batched, loop, rtol=1e-5, atol=1e-6)
  if name.endswith("cka") and not params.get("debiased"):  # and against the float64 reference
    ref_k = (lambda a: np_rbf(a, params.get("sigma", 1.0), params.get("bandwidth", "nonzero_median"))) \
        if name == "kernel_cka" else np_linear
    np.testing.assert_allclose(batched, [np_cka(ref_k(g), ref_k(c)) for c in clients], atol=2e-5)


def test_float32_care_near_one():
  """Benign clients are W_G plus a small update: scores near 1 must keep their order and 1e-5 accuracy."""
  g = rand((64, 200), 14) * 0.05
  clients = np.stack([g + rand((64, 200), 200 + i) * 1e-3 * (i + 1) for i in range(5)])
  got = np.asarray(S.kernel_cka(g, clients))
  want = np.array([np_cka(np_rbf(g), np_rbf(c)) for c in clients])
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.all(np.diff(got) < 0)  # larger perturbation, lower similarity
  np.testing.assert_allclose(np.asarray(S.linear_cka(g, clients)),
                             [np_cka(np_linear(g), np_linear(c)) for c in clients], atol=1e-5)


def test_rows_of_a_flax_kernel_are_its_output_neurons():
  """§7.9: a Dense kernel (in, out) is compared as (out, in); a conv (kh, kw, in, out) as (out, kh*kw*in)."""
  k = rand((5, 3), 15)
  np.testing.assert_array_equal(np.asarray(S.as_rows(k)), k.T)
  conv = rand((2, 2, 3, 4), 16)
  rows = np.asarray(S.as_rows(conv))
  assert rows.shape == (4, 12)
  np.testing.assert_array_equal(rows[1], conv[..., 1].reshape(-1))
  kg, kc = rand((20, 8), 17), rand((20, 8), 18)
  np.testing.assert_allclose(float(S.kernel_cka_pair(S.as_rows(kg), S.as_rows(kc))),
                             float(S.kernel_cka_pair(kg.T, kc.T)), atol=1e-7)


def test_registry_and_errors():
  assert set(S.SIMILARITIES) == {"kernel_cka", "linear_cka", "mmd", "cosine", "euclidean"}
  with pytest.raises(ValueError, match="known"):
    S.get_similarity("cka")
  with pytest.raises(ValueError, match="bandwidth"):
    S.kernel_cka(X3, Y3[None], bandwidth="mean")
  with pytest.raises(ValueError, match=r"\[C, h, p\]"):
    S.kernel_cka(X3, Y4[None])
