"""build_federated_data end to end on digits (bundled with sklearn: no files needed)."""

import json

import ml_collections
import numpy as np
import pytest

from fedjax_robust.data import (FederatedData, build_federated_data, default_data_config,
                                load_partition, load_raw, save_federated_partition)
from fedjax_robust.data.builder import partition_from_config


@pytest.fixture(scope="module")
def digits_raw():
  return load_raw("digits")


def cfg(**kw):
  c = default_data_config()
  part = kw.pop("partition", {})
  for k, v in kw.items():
    c[k] = v
  for k, v in part.items():
    c.partition[k] = v
  return c


def test_default_config_fields():
  c = default_data_config()
  assert set(c.keys()) == {"name", "data_dir", "cache_dir", "allow_download", "seed", "num_clients",
                           "pool", "samples_per_class", "pool_size", "max_samples_per_client", "train_ratio",
                           "client_split", "partition", "dynamics", "normalize", "normalize_mean", "normalize_std",
                           "augment"}
  assert c.dynamics.to_dict() == {"fresh_fraction": 0.0, "fresh_delta": 50, "fresh_start_round": 1}  # FedVSA §4.3(d)
  assert set(c.partition.keys()) == {"name", "alpha", "classes_per_client", "min_size", "form",
                                     "balance"}
  assert (c.name, c.pool, c.train_ratio, c.normalize, c.partition.name) == ("digits", "train", 0.75, True, "dirichlet")
  c.normalize = "half"  # the boolean default can become a mode string
  c.samples_per_class = 50


def test_config_command_line_overrides():
  from absl import flags
  from ml_collections import config_flags
  argv = ["prog", "--config.normalize=half", "--config.samples_per_class=600",
          "--config.data_dir=../shared/data", "--config.partition.alpha=0.1", "--config.augment=flip,crop:4",
          "--config.normalize_mean=(0.5, 0.4, 0.3)"]
  fv = flags.FlagValues()
  holder = config_flags.DEFINE_config_dict("config", default_data_config(), flag_values=fv,
                                           lock_config=True, sys_argv=argv)
  fv(argv)
  c = holder.value
  assert (c.normalize, c.samples_per_class, c.data_dir, c.partition.alpha) == (
      "half", 600, "../shared/data", 0.1)
  assert c.max_samples_per_client is None and c.cache_dir is None
  assert (c.augment, c.normalize_mean, c.normalize_std) == ("flip,crop:4", (0.5, 0.4, 0.3), None)


def test_digits_end_to_end(digits_raw):
  fd = build_federated_data(cfg(num_clients=8, seed=1), raw=digits_raw)
  assert isinstance(fd, FederatedData) and fd.num_clients == 8 and fd.num_classes == 10
  assert fd.x_train.dtype == np.float32 and fd.y_train.dtype == np.int32
  assert fd.x_train.shape == (8, fd.n_train.max(), 8, 8, 1) and fd.feature_shape == (8, 8, 1)
  assert fd.n_train.sum() + fd.n_test.sum() == 1438  # the official train pool, all used
  assert fd.x_global_test.shape == (359, 8, 8, 1) and fd.y_global_test.shape == (359,)
  for k in range(8):
    n, m = fd.n_train[k], fd.n_test[k]
    assert n == int(0.75 * (n + m)) and n >= 10 * 0.75
    assert not fd.x_train[k, n:].any() and not fd.y_train[k, n:].any()  # zero padding
    assert not fd.x_test[k, m:].any()
    idx = fd.client_train_indices[k]
    np.testing.assert_array_equal(fd.y_train[k, :n], digits_raw.y_train[idx])
    np.testing.assert_allclose(fd.x_train[k, :n], (digits_raw.x_train[idx] / 16 - 0.30526) / 0.37605, rtol=1e-5)
  allidx = np.concatenate(fd.client_train_indices + fd.client_test_indices)
  assert len(np.unique(allidx)) == len(allidx) == 1438
  real = np.concatenate([fd.x_train[k, :fd.n_train[k]] for k in range(8)])
  assert abs(real.mean()) < 0.1 and abs(real.std() - 1) < 0.1
  assert abs(fd.x_global_test.mean()) < 0.1
  info = fd.info
  json.dumps(info)  # the run directory writes it as JSON
  assert info["source"] == "sklearn.datasets.load_digits"
  assert info["partition"] == {"name": "dirichlet", "alpha": 0.5, "min_size": 10, "form": "per_class"}
  assert info["stats"]["n_train"]["total"] == fd.n_train.sum()
  assert info["normalize"]["mode"] == "standard"


def test_deterministic_and_seed_dependent(digits_raw):
  a = build_federated_data(cfg(seed=3), raw=digits_raw)
  b = build_federated_data(cfg(seed=3), raw=digits_raw)
  c = build_federated_data(cfg(seed=4), raw=digits_raw)
  np.testing.assert_array_equal(a.x_train, b.x_train)
  assert not np.array_equal(a.label_histograms(), c.label_histograms())


def test_pool_all_pat_subsample_half(digits_raw):
  c = cfg(num_clients=10, pool="all", samples_per_class=150, normalize="half",
          partition={"name": "pat", "classes_per_client": 2})
  fd = build_federated_data(c, raw=digits_raw)
  h = fd.label_histograms("train") + fd.label_histograms("test")
  for k in range(10):
    assert np.flatnonzero(h[k]).tolist() == [2 * (k // 2), 2 * (k // 2) + 1]
  assert (h.sum(1) == 150).all()
  assert fd.x_global_test.shape[0] == fd.n_test.sum()  # global test = union of client tests
  assert fd.x_train.min() >= -1 and fd.x_train.max() <= 1 and fd.x_train.min() == -1
  assert max(np.concatenate(fd.client_train_indices)) >= 1438 or max(np.concatenate(fd.client_test_indices)) >= 1438
  assert "concat(train, test)" in fd.info["pool_indexing"]


def test_cap_ratio_one_and_unit_normalisation(digits_raw):
  fd = build_federated_data(cfg(num_clients=5, max_samples_per_client=40, train_ratio=1.0,
                                normalize=False, partition={"name": "iid"}), raw=digits_raw)
  assert (fd.n_train == 40).all() and (fd.n_test == 0).all()
  assert fd.x_train.min() == 0 and fd.x_train.max() == 1
  assert fd.x_global_test.shape[0] == 359


@pytest.mark.parametrize("part", [
    {"name": "shards", "classes_per_client": 2},
    {"name": "dirichlet", "form": "client_prior", "alpha": 1.0},
    {"name": "dirichlet", "form": "client_symmetric", "alpha": 0.3},
    {"name": "dirichlet_client", "alpha": 0.3},
    {"name": "quantity_skew", "alpha": 1.0},
    {"name": "sigma", "sigma": 5.0, "min_size": 2},
])
def test_every_partition_via_config(digits_raw, part):
  fd = build_federated_data(cfg(num_clients=6, partition=part), raw=digits_raw)
  assert fd.num_clients == 6 and (fd.n_train > 0).all()
  assert fd.info["partition"]["name"] in ("shards", "dirichlet_client", "quantity_skew", "sigma")


def test_natural_partition_from_groups():
  y = np.repeat(np.arange(4), 10)
  groups = np.repeat(np.arange(8), 5)
  parts, used = partition_from_config(ml_collections.ConfigDict({"name": "natural", "min_size": 1}),
                                      y, None, 0, groups=groups)
  assert len(parts) == 8 and used == {"name": "natural", "min_size": 1}


def test_attribute_and_dict_configs(digits_raw):
  d = {"name": "digits", "num_clients": 4, "partition": {"name": "iid"}}
  fd = build_federated_data(d, raw=digits_raw)
  assert fd.num_clients == 4 and fd.info["partition"] == {"name": "iid"}


def test_partition_export_roundtrip(tmp_path, digits_raw):
  fd = build_federated_data(cfg(num_clients=5), raw=digits_raw)
  for suffix in (".json", ".npz"):
    rec = load_partition(save_federated_partition(tmp_path / f"partition{suffix}", fd))
    np.testing.assert_array_equal(rec["label_histograms"], fd.label_histograms("train"))
    np.testing.assert_array_equal(rec["test_label_histograms"], fd.label_histograms("test"))
    assert all(np.array_equal(a, b) for a, b in zip(rec["train_indices"], fd.client_train_indices))
    assert rec["meta"]["info"]["partition"]["name"] == "dirichlet"


@pytest.mark.parametrize("kw,match", [
    ({"name": "imagenet21k"}, r"unknown dataset 'imagenet21k'; known datasets: \[.*'digits'"),
    ({"pool": "both"}, "unknown pool 'both'"),
    ({"train_ratio": 1.5}, r"train_ratio must be in \(0, 1\)"),
    ({"train_ratio": 0.0}, r"train_ratio must be in \(0, 1\)"),
    ({"train_ratio": 1.0, "pool": "all"}, "no global test set"),
    ({"normalize": "zca"}, "normalize must be"),
    ({"num_clients": 5000}, "more than the 1438 samples"),
    ({"partition": {"name": "label_flip"}}, r"unknown partition 'label_flip'; known partitions: \[.*'dirichlet'"),
    ({"partition": {"name": "dirichlet", "form": "paper"}}, "unknown dirichlet form 'paper'"),
    ({"partition": {"name": "dirichlet", "alpha": 0.0}}, "alpha must be > 0"),
    ({"partition": {"name": "pat", "classes_per_client": 11}}, "exceeds num_classes"),
    ({"partition": {"name": "sigma"}}, "needs a partition.sigma"),
    ({"partition": {"name": "natural"}}, "needs per-sample group ids"),
    ({"pool_size": 0}, r"pool_size must be in \[1, 1438\]"),
    ({"pool_size": 5000}, r"pool_size must be in \[1, 1438\]"),
    ({"client_split": "writer"}, "unknown client_split 'writer'"),
    ({"client_split": "source"}, "needs pool='all'"),
    ({"partition": {"name": "group", "dominant_fraction": 1.2}}, "dominant_fraction must be in"),
])
def test_builder_errors(digits_raw, kw, match):
  with pytest.raises(ValueError, match=match):
    build_federated_data(cfg(**kw), raw=None if "name" in kw else digits_raw)


def test_pool_size_subsamples_before_the_partition(digits_raw):
  fd = build_federated_data(cfg(num_clients=5, pool="all", pool_size=500, partition={"name": "iid"}), raw=digits_raw)
  assert int(fd.n_train.sum() + fd.n_test.sum()) == 500 and fd.info["pool_size"] == 500
  again = build_federated_data(cfg(num_clients=5, pool="all", pool_size=500, partition={"name": "iid"}),
                               raw=digits_raw)
  assert all(np.array_equal(a, b) for a, b in zip(fd.client_train_indices, again.client_train_indices))


def test_group_partition_via_config_keeps_the_dominant_share(digits_raw):
  """FedCAP's EMNIST partition (spec 4.1) through the builder: 3 class groups, 80% of each class in its group."""
  groups = [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
  fd = build_federated_data(cfg(num_clients=9, pool="all", partition={"name": "group", "class_groups": groups,
                                                                      "dominant_fraction": 0.8}), raw=digits_raw)
  assert fd.info["partition"] == {"name": "group", "dominant_fraction": 0.8, "class_groups": groups}
  hist = fd.label_histograms("train") + fd.label_histograms("test")
  blocks = np.array_split(np.arange(9), 3)
  for block, classes in zip(blocks, groups):
    own = hist[block][:, classes].sum()
    # the block holds the 80% dominant part of its classes plus ~3/9 of the 20% IID rest of them
    assert own >= 0.8 * hist[:, classes].sum() - len(classes)
    share = hist[block][:, classes].sum(1) / hist[block].sum(1)
    assert (share > 0.7).all()


def test_client_split_source_keeps_the_datasets_own_rows():
  """``client_split='source'``: client k trains on its rows of the dataset's train split, tests on its test rows."""
  from fedjax_robust.data.sources import RawDataset
  rng = np.random.default_rng(0)
  gtr, gte = np.repeat(np.arange(4), [6, 5, 4, 3]), np.repeat(np.arange(4), [2, 2, 1, 1])
  raw = RawDataset("wisdm", rng.normal(size=(18, 1, 200, 3)).astype(np.float32), rng.integers(0, 6, 18),
                   rng.normal(size=(6, 1, 200, 3)).astype(np.float32), rng.integers(0, 6, 6), 6, "synthetic",
                   train_groups=gtr, test_groups=gte)
  fd = build_federated_data(cfg(name="wisdm", num_clients=4, pool="all", client_split="source", normalize=False,
                                partition={"name": "natural", "min_size": 1}), raw=raw)
  assert fd.n_train.tolist() == [6, 5, 4, 3] and fd.n_test.tolist() == [2, 2, 1, 1]
  np.testing.assert_array_equal(fd.x_train[0, :6], raw.x_train[:6])  # raw values, the reader's order
  np.testing.assert_array_equal(fd.x_test[3, :1], raw.x_test[5:])
  assert fd.info["client_split"] == "source" and fd.x_global_test.shape[0] == 6
