"""FedCAC's experiment setup (specs/fedcac.md §3.2, §1.2, §3.5; issue 32 §4): the sampled partitions, the per-split
client train/test rows, and the per-dataset configs."""

import ml_collections
import numpy as np
import pytest

from fedjax_robust.config_files import load_module
from fedjax_robust.data import build_federated_data, default_data_config
from fedjax_robust.data import partition as P
from fedjax_robust.data.builder import partition_from_config
from fedjax_robust.data.sources import RawDataset


def hist(labels, parts, c):
  return P.label_histograms(labels, parts, c)


# ----------------------------------------------------------------------------------------- §3.2 pathological
def test_pathological_two_classes_each_half_of_the_rows():
  y = np.repeat(np.arange(4), 10)  # 4 classes x 10 rows
  parts = P.pathological_sampled(y, 3, seed=7, classes_per_client=2, samples_per_client=6)
  h = hist(y, parts, 4)
  assert (h.sum(1) == 6).all() and ((h > 0).sum(1) == 2).all()
  assert set(h[h > 0].tolist()) == {3}  # int(6 / 2) rows of each of its 2 classes
  # All class choices come first in the RandomState stream (spec §3.2 step 2, the 2023-08-31 order).
  rs = np.random.RandomState(7)
  expected = [set(rs.choice(4, 2, replace=False).tolist()) for _ in range(3)]
  assert [set(np.flatnonzero(r).tolist()) for r in h] == expected
  for p in parts:  # 3 <= 10 rows per class: drawn without replacement
    assert len(np.unique(p)) == len(p) and p.dtype == np.int64 and (np.diff(p) >= 0).all()


def test_pathological_train_and_test_rows_share_the_classes_and_proportions():
  y_train, y_test = np.repeat(np.arange(10), 5000 // 10), np.repeat(np.arange(10), 1000 // 10)
  train = P.pathological_sampled(y_train, 40, 3, samples_per_client=500)
  test = P.pathological_sampled(y_test, 40, 3, samples_per_client=100)
  h_tr, h_te = hist(y_train, train, 10), hist(y_test, test, 10)
  assert (h_tr.sum(1) == 500).all() and (h_te.sum(1) == 100).all()
  assert set(h_tr[h_tr > 0].tolist()) == {250} and set(h_te[h_te > 0].tolist()) == {50}  # spec §6 item 23
  np.testing.assert_array_equal(h_tr, 5 * h_te)  # same classes, same proportions


def test_pathological_small_class_is_drawn_with_replacement():
  y = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])  # class 0 has 3 rows, fewer than the 4 asked
  parts = P.pathological_sampled(y, 2, 0, classes_per_client=2, samples_per_client=8)
  for p in parts:
    assert (np.bincount(y[p], minlength=2) == 4).all()
    assert len(np.unique(p[y[p] == 0])) <= 3  # 4 draws from 3 rows: a repeat
  with pytest.raises(ValueError, match="classes_per_client"):
    P.pathological_sampled(y, 2, 0, classes_per_client=3, samples_per_client=8)


# ----------------------------------------------------------------------------------------- §3.2 Dirichlet
@pytest.mark.parametrize("q,m,expected", [
    ([0.25, 0.25, 0.5], 500, [125, 125, 250]),
    ([0.25, 0.25, 0.5], 100, [25, 25, 50]),
    ([0.125, 0.875], 100, [13, 87]),  # int(12.5 + 0.5) = 13: halves round up
    ([0.125, 0.875], 500, [63, 437]),  # int(62.5 + 0.5) = 63
    ([0.004, 0.996], 100, [0, 100]),  # int(0.4 + 0.5) = 0; the last class takes the rest
    ([0.375, 0.375, 0.125, 0.125], 4, [2, 2, 0, 0]),  # 2 + 2 = m already: the third (int(1.0) = 1) is clipped
])
def test_dirichlet_counts_round_half_up_and_sum_to_m(q, m, expected):
  counts = P.dirichlet_counts(q, m)
  assert counts.tolist() == expected and counts.sum() == m


def test_dirichlet_clients_have_the_counts_of_their_q_in_train_and_test():
  y_train, y_test = np.repeat(np.arange(10), 600), np.repeat(np.arange(10), 100)
  for alpha in (0.1, 1.0):
    train = P.dirichlet_sampled(y_train, 40, 11, alpha=alpha, samples_per_client=500)
    test = P.dirichlet_sampled(y_test, 40, 11, alpha=alpha, samples_per_client=100)
    q = np.random.RandomState(11).dirichlet([alpha] * 10, size=40)  # drawn first in the stream (spec §3.2 step 1)
    h_tr, h_te = hist(y_train, train, 10), hist(y_test, test, 10)
    assert (h_tr.sum(1) == 500).all() and (h_te.sum(1) == 100).all()  # spec §6 item 22
    for i in range(40):
      assert h_tr[i].tolist() == P.dirichlet_counts(q[i], 500).tolist()
      assert h_te[i].tolist() == P.dirichlet_counts(q[i], 100).tolist()
    # Same q: the proportions agree up to the rounding of each class's count (and the last class's remainder).
    assert np.abs(h_tr / 500 - h_te / 100).max() <= 0.5 / 100 * 10 + 1e-12


def test_sampled_partitions_are_seeded_and_deterministic():
  y = np.repeat(np.arange(10), 200)
  for name, params in (("pathological_sampled", {}), ("dirichlet_sampled", {"alpha": 0.5})):
    a = P.partition_by_name(name, y, 8, 5, samples_per_client=50, **params)
    b = P.partition_by_name(name, y, 8, 5, samples_per_client=50, **params)
    c = P.partition_by_name(name, y, 8, 6, samples_per_client=50, **params)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))
    assert [len(p) for p in a] == [50] * 8
  # Independent per-client draws, not a disjoint partition: with 40 clients x 500 of 2,000 rows, rows repeat.
  parts = P.dirichlet_sampled(y, 40, 0, alpha=1.0, samples_per_client=500)
  assert len(np.unique(np.concatenate(parts))) < 40 * 500


# ----------------------------------------------------------------------------------------- builder: per_split
def _raw(n_train=60, n_test=20, c=10, seed=0):
  rng = np.random.default_rng(seed)
  y_tr, y_te = np.repeat(np.arange(c), n_train), np.repeat(np.arange(c), n_test)
  return RawDataset("cifar10", rng.integers(0, 256, (len(y_tr), 32, 32, 3)).astype(np.uint8), y_tr,
                    rng.integers(0, 256, (len(y_te), 32, 32, 3)).astype(np.uint8), y_te, c, "synthetic")


def _cfg(partition, **kw):
  c = default_data_config()
  c.name, c.num_clients, c.pool, c.client_split, c.normalize, c.train_ratio = "cifar10", 4, "train", "per_split", \
      False, 1.0
  for k, v in {"samples_per_client": 50, "test_samples_per_client": 10, **partition}.items():
    c.partition[k] = v
  for k, v in kw.items():
    c[k] = v
  return c


def test_per_split_draws_test_rows_from_the_official_test_split_with_the_same_seed():
  raw = _raw()
  fd = build_federated_data(_cfg({"name": "pathological_sampled", "classes_per_client": 2}), raw=raw)
  assert fd.n_train.tolist() == [50] * 4 and fd.n_test.tolist() == [10] * 4
  h_tr, h_te = fd.label_histograms("train"), fd.label_histograms("test")
  np.testing.assert_array_equal(h_tr, 5 * h_te)  # 25 / 5 rows of the same 2 classes
  for k in range(4):  # test rows are official test rows (unit normalisation: pixels / 255)
    idx = fd.client_test_indices[k]
    np.testing.assert_allclose(fd.x_test[k, :10], raw.x_test[idx] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(fd.y_test[k, :10], raw.y_test[idx])
  assert fd.info["partition"]["test_samples_per_client"] == 10 and fd.info["client_split"] == "per_split"
  assert fd.x_global_test.shape[0] == 200  # the whole official test split stays the global test set
  fd2 = build_federated_data(_cfg({"name": "dirichlet_sampled", "alpha": 0.3}), raw=raw)
  assert fd2.n_train.tolist() == [50] * 4 and fd2.n_test.tolist() == [10] * 4
  again = build_federated_data(_cfg({"name": "dirichlet_sampled", "alpha": 0.3}), raw=raw)
  assert all(np.array_equal(a, b) for a, b in zip(fd2.client_test_indices, again.client_test_indices))
  other = build_federated_data(_cfg({"name": "dirichlet_sampled", "alpha": 0.3}, seed=1), raw=raw)
  assert not all(np.array_equal(a, b) for a, b in zip(fd2.client_train_indices, other.client_train_indices))


def test_per_split_and_the_partition_config():
  raw = _raw()
  with pytest.raises(ValueError, match="per_split"):
    build_federated_data(_cfg({"name": "dirichlet"}), raw=raw)
  with pytest.raises(ValueError, match="per_split"):
    build_federated_data(_cfg({"name": "dirichlet_sampled"}, pool="all"), raw=raw)
  y = np.repeat(np.arange(10), 20)
  pcfg = ml_collections.ConfigDict({"name": "dirichlet_sampled", "alpha": 0.5, "samples_per_client": 30})
  parts, used = partition_from_config(pcfg, y, 5, 0, num_classes=10)
  assert [len(p) for p in parts] == [30] * 5
  assert used == {"name": "dirichlet_sampled", "alpha": 0.5, "samples_per_client": 30, "num_classes": 10}
  parts, used = partition_from_config(pcfg, y, 5, 0, num_classes=10, samples_per_client=6)
  assert [len(p) for p in parts] == [6] * 5 and used["samples_per_client"] == 6


# ----------------------------------------------------------------------------------------- configs (§1.2, §3)
def config(dataset, arg):
  return load_module(f"experiments/configs/fedcac_{dataset}.py").get_config(arg)


def test_configs_follow_the_spec_setting():
  c = config("cifar10", "pathological")
  assert (c.rounds, c.eval_every, c.data.num_clients, c.server.participation) == (500, 1, 40, 1.0)
  assert (c.client.optimizer, c.client.lr, c.client.momentum, c.client.weight_decay) == ("sgd", 0.1, 0.9, 0.0)
  assert (c.client.epochs, c.client.batch_size, c.client.drop_last, c.client.persist_optimizer_state) == (
      5, 100, False, False)
  assert (c.data.pool, c.data.client_split, c.data.normalize) == ("train", "per_split", False)
  assert (c.data.partition.name, c.data.partition.classes_per_client) == ("pathological_sampled", 2)
  assert (c.data.partition.samples_per_client, c.data.partition.test_samples_per_client) == (500, 100)
  assert (c.model.name, c.algorithm.name, c.algorithm.fedcac.tau, c.algorithm.fedcac.beta) == (
      "resnet8", "fedcac", 0.5, 100)
  assert c.algorithm.fedcac.non_critical == "all" and c.algorithm.fedcac.eval_before_aggregation
  c = config("cifar100", "dir0.01,fedbn")
  assert (c.model.name, c.algorithm.name, c.algorithm.fedcac.tau, c.algorithm.fedcac.beta) == (
      "resnet10", "fedbn", 0.4, 170)
  assert (c.data.partition.name, c.data.partition.alpha, c.data.normalize) == ("dirichlet_sampled", 0.01, True)
  c = config("tiny_imagenet", "dir0.1,fedcac_as_critical")
  assert (c.data.name, c.algorithm.name, c.algorithm.fedcac.non_critical) == ("tiny_imagenet", "fedcac",
                                                                              "as_critical")
  assert (c.algorithm.fedcac.tau, c.algorithm.fedcac.beta) == (0.5, 170)
  assert config("cifar10", "dir1.0,local").output.name == "fedcac_cifar10_dir1_local"
  for method in ("fedavg", "local", "fedbn", "fedper", "fedrep", "fedamp"):
    assert config("cifar10", f"dir0.5,{method}").algorithm.name == method
  with pytest.raises(ValueError, match="partition"):
    config("cifar10", "dir,fedavg")
  with pytest.raises(ValueError, match="method"):
    config("cifar10", "pathological,ditto")


def test_client_averaged_accuracy_is_the_unweighted_mean_of_per_client_accuracies():
  """Spec §6 item 26: the reported client-averaged accuracy is the plain mean of each client's accuracy on its own
  test rows, not the pooled (test-size-weighted) accuracy; the table's value is the best round of that series
  (tests/test_fedcac_tables.py::test_record_takes_the_best_round_from_the_series)."""
  from fedjax_robust.simulation import _client_metrics
  m = _client_metrics(correct=np.array([50, 90, 30]), count=np.array([100, 100, 50]), benign=None)
  np.testing.assert_allclose(m["client_acc"], [0.5, 0.9, 0.6])
  np.testing.assert_allclose(m["client_acc_mean"], (0.5 + 0.9 + 0.6) / 3)
  np.testing.assert_allclose(m["client_acc_weighted"], 170 / 250)
