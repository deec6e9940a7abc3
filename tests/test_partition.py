"""Partitioners: exact PFLlib grouping, skew vs alpha, termination, determinism, errors."""

import numpy as np
import pytest

from fedjax_robust.data import partition as P

Y = np.repeat(np.arange(10), 600)  # balanced 10-class pool of 6000
Y_UNBAL = np.random.default_rng(0).integers(0, 10, 3000)


def hist(labels, parts, c=10):
  return P.label_histograms(labels, parts, c)


def check_disjoint(parts, n, cover=True):
  allidx = np.concatenate(parts)
  assert len(np.unique(allidx)) == len(allidx), "clients overlap"
  assert allidx.min() >= 0 and allidx.max() < n
  if cover:
    assert len(allidx) == n, "union is not the pool"
  for p in parts:
    assert p.dtype == np.int64 and np.all(np.diff(p) > 0), "not sorted int64"


ALL = [
    ("iid", {}, True),
    ("shards", {"shards_per_client": 2}, True),
    ("pat", {"classes_per_client": 2}, True),
    ("pat", {"classes_per_client": 3, "balance": False, "min_size": 20}, True),
    ("dirichlet", {"alpha": 0.3}, True),
    ("dirichlet", {"alpha": 0.3, "cap_at_mean": True}, True),
    ("dirichlet_client", {"alpha": 0.5, "form": "prior"}, True),
    ("dirichlet_client", {"alpha": 0.5, "form": "symmetric"}, True),
    ("quantity_skew", {"alpha": 1.0}, True),
    ("quantity_skew", {"dist": "lognormal", "sigma": 1.0}, True),
    ("sigma", {"sigma": 100.0}, False),
]


@pytest.mark.parametrize("name,params,cover", ALL)
@pytest.mark.parametrize("labels", [Y, Y_UNBAL], ids=["balanced", "unbalanced"])
def test_disjoint_sorted_deterministic(name, params, cover, labels):
  parts = P.partition_by_name(name, labels, 20, 3, **params)
  assert len(parts) == 20
  check_disjoint(parts, len(labels), cover)
  again = P.partition_by_name(name, labels, 20, 3, **params)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again)), "not deterministic"
  other = P.partition_by_name(name, labels, 20, 4, **params)
  if name != "pat" or params.get("balance") is False:
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other)), "seed ignored"


def test_pat_reproduces_fedcap_grouping():
  parts = P.pat(Y, 20, 0, classes_per_client=2, balance=True)
  h = hist(Y, parts)
  for k in range(20):
    g = k // 4
    expected = np.zeros(10, int)
    expected[[2 * g, 2 * g + 1]] = 150
    np.testing.assert_array_equal(h[k], expected)
  # shuffle=False takes samples in pool order, exactly as PFLlib does.
  first = P.pat(Y, 20, 0, shuffle=False)[0]
  np.testing.assert_array_equal(first, np.r_[0:150, 600:750])


def test_pat_class_groups_do_not_depend_on_seed():
  for seed in range(3):
    h = hist(Y, P.pat(Y, 20, seed))
    assert [tuple(np.flatnonzero(r)) for r in h[::4]] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def test_pat_unbalanced_keeps_classes_varies_counts():
  h = hist(Y, P.pat(Y, 20, 0, balance=False, min_size=40))
  assert ((h > 0).sum(1) == 2).all()
  assert len(set(h[h > 0].tolist())) > 2


def test_shards_at_most_k_classes():
  for k in (1, 2, 3):
    h = hist(Y, P.shards(Y, 20, 0, shards_per_client=k))  # shard size 300 or 150 or 100
    assert ((h > 0).sum(1) <= k).all()
    assert (h.sum(1) == 6000 // 20).all()


def mean_classes(alpha, seed=0):
  return (hist(Y, P.dirichlet(Y, 20, seed, alpha=alpha, min_size=10)) > 0).sum(1).mean()


def test_dirichlet_skew_increases_as_alpha_decreases():
  m = [np.mean([mean_classes(a, s) for s in range(3)]) for a in (100.0, 1.0, 0.1, 0.01)]
  assert m[0] > m[1] > m[2] > m[3], m
  assert m[0] == 10 and m[3] < 2.5


def test_dirichlet_per_class_proportions_follow_alpha():
  # Large alpha: every client gets ~1/K of every class.
  h = hist(Y, P.dirichlet(Y, 10, 0, alpha=1000.0))
  assert np.abs(h - 60).max() <= 12


@pytest.mark.parametrize("alpha", [0.001, 0.01])
def test_dirichlet_min_size_terminates_with_many_clients(alpha):
  parts = P.dirichlet(Y, 300, 0, alpha=alpha, min_size=15, max_tries=20)
  check_disjoint(parts, len(Y))
  assert min(len(p) for p in parts) >= 15


def test_repair_min_size_moves_from_largest():
  buckets = [np.arange(0, 50), np.arange(50, 52), np.arange(52, 60)]
  out, moved = P.repair_min_size(buckets, np.zeros(60, np.int64), 5)
  assert [len(b) for b in out] == [47, 5, 8]
  assert set(np.concatenate(out)) == set(range(60))
  assert moved == 3 and sum(len(b) for b in out) == 60


def test_dirichlet_client_forms():
  sizes = [len(p) for p in P.dirichlet_client(Y, 20, 0, alpha=1.0)]
  assert set(sizes) == {300}
  # Dir(alpha p) with p uniform is Dir(alpha/C): 'prior' at alpha=10 ~ 'symmetric' at alpha=1.
  def ncls(form, a):
    return np.mean([(hist(Y, P.dirichlet_client(Y, 20, s, alpha=a, form=form)) > 0).sum(1).mean()
                    for s in range(3)])
  assert ncls("symmetric", 100.0) > ncls("symmetric", 1.0) > ncls("symmetric", 0.05)
  assert abs(ncls("prior", 10.0) - ncls("symmetric", 1.0)) < 1.0
  parts = P.dirichlet_client(Y, 10, 0, alpha=0.5, client_sizes=[100] * 10)
  assert [len(p) for p in parts] == [100] * 10
  check_disjoint(parts, len(Y), cover=False)


def test_quantity_skew_sizes():
  a = sorted(len(p) for p in P.quantity_skew(Y, 20, 0, alpha=0.1, min_size=5))
  b = sorted(len(p) for p in P.quantity_skew(Y, 20, 0, alpha=100.0, min_size=5))
  assert a[0] >= 5 and np.std(a) > 5 * np.std(b)
  # Labels stay IID: the biggest client sees every class.
  parts = P.quantity_skew(Y, 5, 0, alpha=10.0)
  assert (hist(Y, parts)[np.argmax([len(p) for p in parts])] > 0).all()


def test_sigma_partition_two_distinct_labels_and_spread():
  parts = P.sigma_label_skew(Y, 40, 0, sigma=0.0)
  h = hist(Y, parts)
  assert ((h > 0).sum(1) == 2).all()
  assert set(h[h > 0].tolist()) == {75}  # mu = 6000 // 80
  h2 = hist(Y, P.sigma_label_skew(Y, 40, 0, sigma=40.0))
  assert h2[h2 > 0].std() > 20


def test_natural_groups():
  groups = np.repeat(np.arange(6), [5, 1, 7, 3, 9, 2])
  labels = np.zeros(len(groups), np.int64)
  parts = P.natural(labels, None, 0, groups=groups, min_size=3)
  assert [len(p) for p in parts] == [5, 7, 3, 9]
  sub = P.natural(labels, 2, 0, groups=groups, min_size=3)
  assert len(sub) == 2 and all(np.unique(groups[p]).size == 1 for p in sub)
  with pytest.raises(ValueError, match="natural groups"):
    P.natural(labels, 5, 0, groups=groups, min_size=3)
  with pytest.raises(ValueError, match="group ids"):
    P.natural(labels, 2, 0)


def test_train_test_split_per_client():
  parts = P.iid(Y, 7, 0) + [np.array([5]), np.array([8, 9])]
  tr, te = P.train_test_split_per_client(parts, 0.75, 1)
  for p, a, b in zip(parts, tr, te):
    assert len(a) >= 1 and len(a) + len(b) == len(p)
    assert set(a) | set(b) == set(p) and not set(a) & set(b)
  assert len(tr[0]) == int(0.75 * len(parts[0]))
  assert not np.all(np.diff(tr[0]) > 0), "train split should be shuffled"
  tr2, _ = P.train_test_split_per_client(parts, 0.75, 1)
  assert all(np.array_equal(a, b) for a, b in zip(tr, tr2))
  assert len(P.train_test_split_per_client([np.arange(100)], 0.29, 0)[0][0]) == 29


def test_cap_and_subsample():
  parts = P.quantity_skew(Y, 10, 0, alpha=0.5)
  capped = P.cap_samples_per_client(parts, 100, 0)
  for p, c in zip(parts, capped):
    assert len(c) == min(len(p), 100) and set(c) <= set(p) and np.all(np.diff(c) > 0)
  idx = P.subsample_per_class(Y, 50, 0)
  assert (np.bincount(Y[idx]) == 50).all() and np.all(np.diff(idx) > 0)
  assert not np.array_equal(idx, P.subsample_per_class(Y, 50, 1))
  small = np.array([0, 0, 0, 1, 1, 1, 1, 1])
  assert np.bincount(small[P.subsample_per_class(small, 4, 0)]).tolist() == [3, 4]
  with pytest.raises(ValueError, match="fewer than per_class"):
    P.subsample_per_class(small, 4, 0, strict=True)


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_save_load_roundtrip(tmp_path, suffix):
  parts = P.dirichlet(Y, 8, 0, alpha=0.2)
  tr, te = P.train_test_split_per_client(parts, 0.8, 0)
  h = hist(Y, tr)
  path = P.save_partition(tmp_path / f"part{suffix}", tr, te, label_histograms=h,
                          meta={"alpha": np.float32(0.2), "name": "dirichlet", "k": np.int64(8)})
  rec = P.load_partition(path)
  assert rec["num_clients"] == 8
  assert all(np.array_equal(a, b) for a, b in zip(rec["train_indices"], tr))
  assert all(np.array_equal(a, b) for a, b in zip(rec["test_indices"], te))
  np.testing.assert_array_equal(rec["label_histograms"], h)
  assert rec["test_label_histograms"] is None
  assert rec["meta"]["name"] == "dirichlet" and rec["meta"]["k"] == 8
  rec2 = P.load_partition(P.save_partition(tmp_path / f"only{suffix}", parts))
  assert rec2["test_indices"] is None and len(rec2["train_indices"]) == 8
  with pytest.raises(ValueError, match=r"\.json or \.npz"):
    P.save_partition(tmp_path / "p.txt", parts)


@pytest.mark.parametrize("call,match", [
    (lambda: P.iid(np.zeros(5, int), 6, 0), "more than the 5 samples"),
    (lambda: P.dirichlet(Y, 0, 0), "positive integer"),
    (lambda: P.pat(Y, 20, 0, classes_per_client=11), "exceeds num_classes"),
    (lambda: P.pat(Y, 3, 0, classes_per_client=4), "no client has a free class slot"),
    (lambda: P.dirichlet(Y, 10, 0, alpha=0.0), "alpha must be > 0"),
    (lambda: P.dirichlet(Y, 10, 0, alpha=-1.0), "alpha must be > 0"),
    (lambda: P.dirichlet_client(Y, 10, 0, alpha=0.0), "alpha must be > 0"),
    (lambda: P.quantity_skew(Y, 10, 0, alpha=0.0), "alpha must be > 0"),
    (lambda: P.dirichlet(Y, 10, 0, min_size=700), "exceeds the 6000 samples"),
    (lambda: P.dirichlet_client(Y, 10, 0, form="paper"), "form must be"),
    (lambda: P.quantity_skew(Y, 10, 0, dist="zipf"), "dist must be"),
    (lambda: P.shards(Y, 10, 0, shards_per_client=0), "shards_per_client"),
    (lambda: P.shards(np.zeros(10, int), 6, 0, shards_per_client=2), "exceed the 10 samples"),
    (lambda: P.train_test_split_per_client([np.arange(4)], 1.0, 0), r"in \(0, 1\)"),
    (lambda: P.train_test_split_per_client([np.arange(4)], 0.0, 0), r"in \(0, 1\)"),
    (lambda: P.cap_samples_per_client([np.arange(4)], 0, 0), "positive integer"),
    (lambda: P.partition_by_name("label_flip", Y, 10, 0), "unknown partition 'label_flip'"),
    (lambda: P.iid(np.zeros((4, 2), int), 2, 0), "1-D"),
    (lambda: P.iid(np.zeros(4), 2, 0), "integers"),
])
def test_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()


# ----------------------------------------------------------------------------- group (FedCAP EMNIST)
def test_group_partition_dominant_share_assigns_everything_once_and_is_seeded():
  from fedjax_robust.data.partition import group
  y = np.repeat(np.arange(6), 100)
  groups = [[0, 1], [2, 3], [4, 5]]
  parts = group(y, 6, seed=3, class_groups=groups, dominant_fraction=0.8)
  assert sorted(np.concatenate(parts).tolist()) == list(range(600))  # every sample exactly once
  # 80 of each class go to the 2 clients of its group (40 each), the other 20 x 6 = 120 are spread 20 per client
  for client, idx in enumerate(parts):
    hist = np.bincount(y[idx], minlength=6)
    own = groups[client // 2]
    assert len(idx) == 100
    assert hist[own].sum() >= 80  # 2 x 40 dominant + whatever of the IID part is from its own classes
    assert hist.sum() - hist[own].sum() <= 20
  again = group(y, 6, seed=3, class_groups=groups)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  other = group(y, 6, seed=4, class_groups=groups)
  assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_group_partition_defaults_and_errors():
  from fedjax_robust.data.partition import default_class_groups, group
  assert [len(g) for g in default_class_groups(62)] == [10, 26, 26]  # EMNIST ByClass: digits / upper / lower
  y = np.repeat(np.arange(62), 20)
  parts = group(y, 100, seed=0)
  assert [len(b) for b in np.array_split(np.arange(100), 3)] == [34, 33, 33]
  assert sum(len(p) for p in parts) == len(y)
  digits_in_block0 = sum(int(np.isin(y[parts[k]], range(10)).sum()) for k in range(34))
  assert digits_in_block0 >= 0.8 * 200  # the 80% dominant part of the 10 digit classes (200 samples) stays in block 0
  with pytest.raises(ValueError, match="exactly once"):
    group(np.repeat(np.arange(4), 5), 3, 0, class_groups=[[0, 1], [1, 2, 3]])
  with pytest.raises(ValueError, match="dominant_fraction"):
    group(np.repeat(np.arange(4), 5), 3, 0, dominant_fraction=1.5)
  with pytest.raises(ValueError, match="one client per group"):
    group(np.repeat(np.arange(6), 5), 2, 0)


def test_group_partition_emnist_shaped_class_shares():
  """EMNIST-like imbalanced ByClass labels, 100 clients (spec 4.1): >= 80% of every class stays in its group's
  block, the rest is spread over all clients; a client's share of its own group is 80% + its IID part of it."""
  from fedjax_robust.data.partition import default_class_groups, group
  rng = np.random.default_rng(0)
  y = np.repeat(np.arange(62), rng.integers(50, 400, 62))
  parts = group(y, 100, seed=1)
  groups = default_class_groups(62)
  blocks = np.array_split(np.arange(100), 3)
  assert sorted(np.concatenate(parts).tolist()) == list(range(len(y)))
  hist = np.stack([np.bincount(y[p], minlength=62) for p in parts])
  n_class = np.bincount(y, minlength=62)
  for block, classes in zip(blocks, groups):
    inside = hist[block][:, classes].sum(0)
    assert (inside >= np.round(0.8 * n_class[classes])).all()
    # the dominant part is split evenly inside the block (sizes differ by at most 1 per class + the IID part)
    dominant = np.round(0.8 * n_class[classes])
    assert (hist[block][:, classes] >= np.floor(dominant / len(block))).all()
    outside = np.setdiff1d(np.arange(100), block)
    expected_out = 0.2 * n_class[classes].sum() * len(outside) / 100
    assert abs(hist[outside][:, classes].sum() - expected_out) < 0.1 * expected_out + 20
