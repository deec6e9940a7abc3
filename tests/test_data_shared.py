"""Loaders on the offline dataset copies (../shared/data or $FEDJAX_ROBUST_SHARED_DATA).

Missing copies fail the test on CI (env CI set) and skip it elsewhere (conftest
``shared_data``). Each dataset is decoded once per session into a temporary cache.
"""

import numpy as np
import pytest

from fedjax_robust.data import build_federated_data, default_data_config, load_raw, verify_md5sums
from fedjax_robust.data.readers.cifar_pickle import CifarPickleReader
from fedjax_robust.data.readers.image_folder import ImageFolderReader


@pytest.fixture(scope="module")
def mnist(shared_data, data_cache_dir):
  root = shared_data("mnist/train-images-idx3-ubyte.gz")
  return load_raw("mnist", data_dir=root, cache_dir=data_cache_dir, strict_checksums=True)


@pytest.fixture(scope="module")
def cifar10(shared_data, data_cache_dir):
  root = shared_data("cifar10_jpeg/cifar10_jpeg.tar.gz")
  return load_raw("cifar10", data_dir=root, cache_dir=data_cache_dir)


def test_md5sums_of_shared_copies(shared_data):
  root = shared_data("MD5SUMS")
  checked = verify_md5sums(root / "MD5SUMS")
  assert "mnist/train-images-idx3-ubyte.gz" in checked and len(checked) >= 10


def test_mnist(mnist):
  assert mnist.x_train.shape == (60000, 28, 28, 1) and mnist.x_test.shape == (10000, 28, 28, 1)
  assert mnist.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
  assert mnist.y_test[:5].tolist() == [7, 2, 1, 0, 4]
  assert abs(mnist.x_train.mean() / 255 - 0.1307) < 1e-3


def test_fashion_mnist(shared_data, data_cache_dir):
  root = shared_data("fashion_mnist/train-images-idx3-ubyte.gz")
  raw = load_raw("fashion_mnist", data_dir=root, cache_dir=data_cache_dir, strict_checksums=True)
  assert raw.x_train.shape == (60000, 28, 28, 1) and raw.x_test.shape == (10000, 28, 28, 1)
  assert raw.y_train[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
  assert (np.bincount(raw.y_train) == 6000).all() and (np.bincount(raw.y_test) == 1000).all()
  assert str(root / "fashion_mnist") in raw.source


def test_cifar10_jpeg_tarball(cifar10, shared_data, data_cache_dir, monkeypatch):
  assert cifar10.x_train.shape == (50000, 32, 32, 3) and cifar10.x_test.shape == (10000, 32, 32, 3)
  assert (np.bincount(cifar10.y_train) == 5000).all() and (np.bincount(cifar10.y_test) == 1000).all()
  assert cifar10.class_names == ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                 "horse", "ship", "truck")
  np.testing.assert_allclose(cifar10.x_train.reshape(-1, 3).mean(0) / 255, (0.4914, 0.4822, 0.4465), atol=0.01)
  # The second load hits the cache: same arrays, and no reader decodes anything (a decode would raise here).
  def no_decoding(*args, **kwargs):
    raise AssertionError("the second load decoded the tarball instead of reading the cache")

  monkeypatch.setattr(ImageFolderReader, "read", no_decoding)
  monkeypatch.setattr(CifarPickleReader, "read", no_decoding)
  again = load_raw("cifar10", data_dir=shared_data(), cache_dir=data_cache_dir)
  assert "cached" in again.source
  np.testing.assert_array_equal(again.x_test, cifar10.x_test)


def test_cifar10_fedcap_setting(cifar10):
  c = default_data_config()
  c.name, c.num_clients, c.pool, c.samples_per_class, c.normalize = "cifar10", 20, "all", 600, "half"
  c.partition.name = "pat"
  fd = build_federated_data(c, raw=cifar10)
  h = fd.label_histograms("train") + fd.label_histograms("test")
  assert (h.sum(1) == 300).all() and (fd.n_train == 225).all() and (fd.n_test == 75).all()
  assert [np.flatnonzero(r).tolist() for r in h[::4]] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
  assert fd.x_global_test.shape == (1500, 32, 32, 3)


def test_cifar100_png_tarball(shared_data, data_cache_dir):
  root = shared_data("cifar100_png/cifar100_png.tar.gz")
  raw = load_raw("cifar100", data_dir=root, cache_dir=data_cache_dir)
  assert raw.x_train.shape == (50000, 32, 32, 3) and raw.x_test.shape == (10000, 32, 32, 3)
  assert (np.bincount(raw.y_train) == 500).all() and (np.bincount(raw.y_test) == 100).all()
  assert raw.class_names[:4] == ("apple", "aquarium_fish", "baby", "bear")
  assert raw.class_names[-1] == "worm" and len(raw.class_names) == 100


def test_femnist_natural_partition(shared_data, data_cache_dir):
  root = shared_data("femnist_leaf_partial/femnist_leaf_niid05_partial.tar.gz")
  raw = load_raw("femnist", data_dir=root, cache_dir=data_cache_dir)
  assert raw.x_train.shape == (14708, 28, 28, 1) and len(np.unique(raw.train_groups)) == 105
  c = default_data_config()
  c.name, c.num_clients, c.partition.name, c.partition.min_size = "femnist", 0, "natural", 1
  fd = build_federated_data(c, raw=raw)
  assert fd.num_clients == 105 and fd.n_train.sum() + fd.n_test.sum() == 14708
  for k in (0, 50, 104):
    assert len(np.unique(raw.train_groups[fd.client_train_indices[k]])) == 1


def test_builder_finds_data_via_env(shared_data, data_cache_dir, monkeypatch):
  root = shared_data("mnist/train-images-idx3-ubyte.gz")
  monkeypatch.setenv("FEDJAX_ROBUST_DATA_DIR", str(root))
  c = default_data_config()
  c.name, c.cache_dir, c.num_clients, c.max_samples_per_client = "mnist", str(data_cache_dir), 20, 100
  fd = build_federated_data(c)
  assert fd.x_train.shape[1:] == (75, 28, 28, 1) and fd.x_global_test.shape == (10000, 28, 28, 1)
  assert str(root / "mnist") in fd.info["source"]
  assert abs(fd.x_global_test.mean()) < 0.05 and abs(fd.x_global_test.std() - 1) < 0.05
