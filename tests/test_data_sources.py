"""Raw loaders on synthetic files: formats, corruption errors, source order, cache, tfds guard."""

import gzip
import logging
import pickle
import struct
import sys
import tarfile
import time
import types

import numpy as np
import pytest
from PIL import Image

from fedjax_robust.data import (ChecksumError, DatasetFormatError, DatasetNotFoundError, get_spec,
                                load_raw, md5_file, verify_md5, verify_md5sums)
from fedjax_robust.data.checksums import read_md5sums
from fedjax_robust.data.readers.idx import parse_idx
from fedjax_robust.data.sources import DATA_DIR_ENV

RNG = np.random.default_rng(0)


def idx_bytes(arr: np.ndarray) -> bytes:
  code = 0x08
  return struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.astype(np.uint8).tobytes()


def write_idx_set(folder, n_train=30, n_test=10, gz=True, shape=(28, 28)):
  folder.mkdir(parents=True, exist_ok=True)
  data = {}
  for prefix, n in (("train", n_train), ("t10k", n_test)):
    x = RNG.integers(0, 256, (n, *shape), dtype=np.uint8)
    y = RNG.integers(0, 10, n).astype(np.uint8)
    for kind, arr, d in (("images", x, 3), ("labels", y, 1)):
      name = f"{prefix}-{kind}-idx{d}-ubyte"
      blob = idx_bytes(arr)
      if gz:
        (folder / f"{name}.gz").write_bytes(gzip.compress(blob))
      else:
        (folder / name).write_bytes(blob)
    data[prefix] = (x, y)
  return data


@pytest.fixture(autouse=True)
def no_env(monkeypatch, tmp_path):
  monkeypatch.delenv(DATA_DIR_ENV, raising=False)
  monkeypatch.setenv("FEDJAX_ROBUST_CACHE", str(tmp_path / "default_cache"))


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
def test_idx_roundtrip_parent_and_direct_dir(tmp_path, gz):
  data = write_idx_set(tmp_path / "root" / "mnist", gz=gz)
  for d in (tmp_path / "root", tmp_path / "root" / "mnist"):
    raw = load_raw("mnist", data_dir=d, cache_dir=tmp_path / "c")
    assert raw.x_train.shape == (30, 28, 28, 1) and raw.x_train.dtype == np.uint8
    np.testing.assert_array_equal(raw.x_train[..., 0], data["train"][0])
    np.testing.assert_array_equal(raw.y_test, data["t10k"][1])
    assert raw.y_train.dtype == np.int64 and raw.num_classes == 10


def test_idx_truncated_gz_clear_error(tmp_path):
  write_idx_set(tmp_path / "mnist")
  p = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
  p.write_bytes(p.read_bytes()[:-200])
  with pytest.raises(DatasetFormatError, match="train-images-idx3-ubyte.gz: corrupted or truncated gzip"):
    load_raw("mnist", data_dir=tmp_path, use_cache=False)


def test_idx_truncated_content_clear_error(tmp_path):
  write_idx_set(tmp_path / "mnist", gz=False)
  p = tmp_path / "mnist" / "t10k-images-idx3-ubyte"
  p.write_bytes(p.read_bytes()[:-100])
  with pytest.raises(DatasetFormatError, match=r"t10k-images-idx3-ubyte: size mismatch.*truncated"):
    load_raw("mnist", data_dir=tmp_path, use_cache=False)


def test_idx_bad_magic_and_swapped_files(tmp_path):
  with pytest.raises(DatasetFormatError, match="not an IDX file"):
    parse_idx(b"\x12\x34\x08\x03" + b"\x00" * 20, "x.idx")
  write_idx_set(tmp_path / "mnist", gz=False)
  d = tmp_path / "mnist"
  a, b = d / "train-images-idx3-ubyte", d / "train-labels-idx1-ubyte"
  blob_a, blob_b = a.read_bytes(), b.read_bytes()
  a.write_bytes(blob_b)
  b.write_bytes(blob_a)
  with pytest.raises(DatasetFormatError, match="train-images-idx3-ubyte: IDX file has 1 dimensions"):
    load_raw("mnist", data_dir=tmp_path, use_cache=False)


def test_idx_count_mismatch(tmp_path):
  write_idx_set(tmp_path / "mnist", gz=False)
  (tmp_path / "mnist" / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(29, np.uint8)))
  with pytest.raises(DatasetFormatError, match="30 images but .* 29 labels"):
    load_raw("mnist", data_dir=tmp_path, use_cache=False)


def test_emnist_transposed_and_strict_checksum(tmp_path, caplog):
  d = tmp_path / "emnist"
  d.mkdir()
  x = RNG.integers(0, 256, (4, 28, 28), dtype=np.uint8)
  y = np.array([0, 61, 5, 9], np.uint8)
  for split in ("train", "test"):
    (d / f"emnist-byclass-{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(x)))
    (d / f"emnist-byclass-{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(y)))
  raw = load_raw("emnist", data_dir=tmp_path, use_cache=False)
  np.testing.assert_array_equal(raw.x_train[..., 0], x.transpose(0, 2, 1))
  assert raw.num_classes == 62 and raw.y_train.tolist() == [0, 61, 5, 9]
  # MNIST's known official md5s: synthetic files mismatch -> warning, or error when strict.
  write_idx_set(tmp_path / "mnist")
  with caplog.at_level(logging.WARNING, logger="fedjax_robust.data"):
    load_raw("mnist", data_dir=tmp_path, use_cache=False)
  assert "not the official" in caplog.text
  with pytest.raises(ChecksumError, match="train-images-idx3-ubyte"):
    load_raw("mnist", data_dir=tmp_path, use_cache=False, strict_checksums=True)


# ----------------------------------------------------------------------------- CIFAR pickles


def cifar_batches(folder, n=6):
  folder.mkdir(parents=True)
  out = {}
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    x = RNG.integers(0, 256, (n, 3072), dtype=np.uint8)
    y = RNG.integers(0, 10, n).tolist()
    (folder / name).write_bytes(pickle.dumps({b"data": x, b"labels": y}))
    out[name] = (x, y)
  (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}))
  return out


@pytest.mark.parametrize("as_tar", [False, True])
def test_cifar_pickles(tmp_path, as_tar):
  src = cifar_batches(tmp_path / "build" / "cifar-10-batches-py")
  root = tmp_path / "data"
  (root / "cifar10").mkdir(parents=True)
  if as_tar:
    with tarfile.open(root / "cifar10" / "cifar-10-python.tar.gz", "w:gz") as tf:
      tf.add(tmp_path / "build" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
  else:
    (tmp_path / "build" / "cifar-10-batches-py").rename(root / "cifar10" / "cifar-10-batches-py")
  raw = load_raw("cifar10", data_dir=root, use_cache=False)
  assert raw.x_train.shape == (30, 32, 32, 3) and raw.x_test.shape == (6, 32, 32, 3)
  x0, y0 = src["data_batch_1"]
  np.testing.assert_array_equal(raw.x_train[0, :, :, 0].ravel(), x0[0, :1024])  # R plane
  np.testing.assert_array_equal(raw.x_train[0, 0, 0], x0[0, [0, 1024, 2048]])
  assert raw.y_train[:6].tolist() == y0 and raw.class_names[3] == "c3"


def test_cifar_pickle_corrupt(tmp_path):
  cifar_batches(tmp_path / "cifar10" / "cifar-10-batches-py")
  (tmp_path / "cifar10" / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"garbage")
  with pytest.raises(DatasetFormatError, match="data_batch_3: not a readable CIFAR pickle"):
    load_raw("cifar10", data_dir=tmp_path, use_cache=False)


# ----------------------------------------------------------------------------- image folders


def image_tree(root, classes=10, per=(3, 2), ext="png", size=32, mode="RGB"):
  arrays = {}
  for split, n in zip(("train", "test"), per):
    for c in range(classes):
      d = root / split / f"class_{c:02d}"
      d.mkdir(parents=True)
      for i in range(n):
        shape = (size, size, 3) if mode == "RGB" else (size, size)
        a = RNG.integers(0, 256, shape, dtype=np.uint8)
        Image.fromarray(a, mode).save(d / f"{i:04d}.{ext}")
        arrays[(split, c, i)] = a
  return arrays


@pytest.mark.parametrize("packed", [False, True])
def test_image_folders_png_dir_and_tar(tmp_path, packed):
  arrays = image_tree(tmp_path / "tree")
  root = tmp_path / "data" / "cifar10_png"
  root.mkdir(parents=True)
  if packed:
    with tarfile.open(root / "cifar10_png.tar.gz", "w:gz") as tf:
      tf.add(tmp_path / "tree" / "test", arcname="test")  # member order must not matter
      tf.add(tmp_path / "tree" / "train", arcname="train")
  else:
    for s in ("train", "test"):
      (tmp_path / "tree" / s).rename(root / s)
  raw = load_raw("cifar10", data_dir=tmp_path / "data", use_cache=False)
  assert raw.x_train.shape == (30, 32, 32, 3) and raw.x_test.shape == (20, 32, 32, 3)
  assert raw.y_train.tolist() == np.repeat(np.arange(10), 3).tolist()
  np.testing.assert_array_equal(raw.x_train[4], arrays[("train", 1, 1)])  # lossless PNG
  np.testing.assert_array_equal(raw.x_test[19], arrays[("test", 9, 1)])
  assert raw.class_names[0] == "class_00"


def test_image_folder_errors(tmp_path):
  image_tree(tmp_path / "cifar10", classes=9)
  with pytest.raises(DatasetFormatError, match="found 9 class folders .* expected 10"):
    load_raw("cifar10", data_dir=tmp_path, use_cache=False)
  bad = tmp_path / "b" / "cifar10"
  image_tree(bad, size=16)
  with pytest.raises(DatasetFormatError, match="is 16x16, expected 32x32"):
    load_raw("cifar10", data_dir=tmp_path / "b", use_cache=False)
  broken = tmp_path / "c" / "cifar10"
  image_tree(broken)
  (broken / "test" / "class_03" / "0001.png").write_bytes(b"not a png")
  with pytest.raises(DatasetFormatError, match="cannot decode test/class_03/0001.png"):
    load_raw("cifar10", data_dir=tmp_path / "c", use_cache=False)


def test_truncated_tar_clear_error(tmp_path):
  image_tree(tmp_path / "tree")
  d = tmp_path / "cifar10_jpeg"
  d.mkdir()
  with tarfile.open(d / "cifar10_jpeg.tar.gz", "w:gz") as tf:
    tf.add(tmp_path / "tree" / "train", arcname="train")
    tf.add(tmp_path / "tree" / "test", arcname="test")
  blob = (d / "cifar10_jpeg.tar.gz").read_bytes()
  (d / "cifar10_jpeg.tar.gz").write_bytes(blob[: len(blob) // 2])
  with pytest.raises(DatasetFormatError, match="cifar10_jpeg.tar.gz: corrupted or truncated archive"):
    load_raw("cifar10", data_dir=tmp_path, use_cache=False)


# ----------------------------------------------------------------------------- LEAF


def test_leaf_json_natural_groups(tmp_path):
  import json
  d = tmp_path / "femnist" / "data"
  for split, users in (("train", {"w2": 3, "w1": 2}), ("test", {"w1": 1, "w3": 2})):
    (d / split).mkdir(parents=True)
    shard = {"users": list(users), "num_samples": list(users.values()),
             "user_data": {u: {"x": (np.full((n, 784), 128 / 255)).tolist(), "y": [n] * n}
                           for u, n in users.items()}}
    (d / split / "shard.json").write_text(json.dumps(shard))
  raw = load_raw("femnist", data_dir=tmp_path, use_cache=False)
  assert raw.group_names == ("w1", "w2", "w3")
  assert raw.train_groups.tolist() == [0, 0, 1, 1, 1] and raw.test_groups.tolist() == [0, 2, 2]
  assert raw.x_train.dtype == np.uint8 and (raw.x_train == 128).all()


# ----------------------------------------------------------------------------- sources


def test_not_found_is_fast_and_lists_sources(tmp_path, monkeypatch):
  monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
  t0 = time.perf_counter()
  with pytest.raises(DatasetNotFoundError) as e:
    load_raw("fashion_mnist", data_dir=tmp_path, allow_download=False)
  assert time.perf_counter() - t0 < 5
  msg = str(e.value)
  assert "data_dir argument" in msg and f"${DATA_DIR_ENV} = {tmp_path / 'nowhere'}: not a directory" in msg
  assert "tensorflow_datasets" in msg
  assert "train-images-idx3-ubyte.gz" in msg and "<DATA_DIR>/fashion_mnist/" in msg
  assert isinstance(e.value, FileNotFoundError)


def test_unknown_dataset_lists_known():
  with pytest.raises(ValueError, match=r"unknown dataset 'svhn'.*'cifar10'.*'mnist'"):
    load_raw("svhn")


def test_env_var_source_and_logging(tmp_path, monkeypatch, caplog):
  write_idx_set(tmp_path / "fashion", n_train=5, n_test=3)
  monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
  with caplog.at_level(logging.INFO, logger="fedjax_robust.data"):
    raw = load_raw("fashion_mnist", data_dir=tmp_path / "empty", use_cache=False)
  assert raw.x_train.shape[0] == 5 and str(tmp_path / "fashion") in raw.source
  assert "data_dir argument = " in caplog.text and f"${DATA_DIR_ENV}: found idx files" in caplog.text


def test_cache_hit_and_invalidation(tmp_path):
  write_idx_set(tmp_path / "mnist", n_train=20, n_test=5)
  cache = tmp_path / "cache"
  first = load_raw("mnist", data_dir=tmp_path, cache_dir=cache)
  files = list(cache.glob("mnist-*.npz"))
  assert len(files) == 1 and not list(cache.glob("*.tmp"))
  second = load_raw("mnist", data_dir=tmp_path, cache_dir=cache)
  assert "cached" in second.source and "cached" not in first.source
  np.testing.assert_array_equal(first.x_train, second.x_train)
  # A changed source file is a different key: decoded again, not served stale.
  new = write_idx_set(tmp_path / "mnist", n_train=21, n_test=5)
  third = load_raw("mnist", data_dir=tmp_path, cache_dir=cache)
  assert "cached" not in third.source and third.x_train.shape[0] == 21
  np.testing.assert_array_equal(third.x_train[..., 0], new["train"][0])
  # A broken cache entry is rebuilt, not fatal.
  for f in cache.glob("mnist-*.npz"):
    f.write_bytes(b"junk")
  assert load_raw("mnist", data_dir=tmp_path, cache_dir=cache).x_train.shape[0] == 21


def test_default_cache_dir_from_env(tmp_path):
  write_idx_set(tmp_path / "mnist", n_train=4, n_test=2)
  load_raw("mnist", data_dir=tmp_path)
  assert list((tmp_path / "default_cache").glob("mnist-*.npz"))


def test_digits_builtin_split():
  raw = load_raw("digits")
  assert raw.x_train.shape == (1438, 8, 8, 1) and raw.x_test.shape == (359, 8, 8, 1)
  assert raw.x_train.max() == 16 and raw.source == "sklearn.datasets.load_digits"
  assert np.abs(np.bincount(raw.y_test) - 36).max() <= 1  # stratified 20%
  np.testing.assert_array_equal(raw.y_train, load_raw("digits").y_train)


# ----------------------------------------------------------------------------- tfds guard


def fake_tfds(records, calls):
  mod = types.ModuleType("tensorflow_datasets")

  class Builder:
    def as_data_source(self, split):
      return records[split]

  def builder_from_directory(path):
    calls.append(("builder_from_directory", path))
    return Builder()

  def load(*a, **k):
    calls.append(("load", a, k))
    raise ConnectionError("offline")

  mod.builder_from_directory, mod.load = builder_from_directory, load
  return mod


def test_tfds_prepared_copy_without_network(tmp_path, monkeypatch):
  recs = {s: [{"image": np.full((28, 28, 1), i, np.uint8), "label": i % 10} for i in range(n)]
          for s, n in (("train", 7), ("test", 3))}
  calls = []
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake_tfds(recs, calls))
  vdir = tmp_path / "tfds" / "mnist" / "3.0.1"
  vdir.mkdir(parents=True)
  (vdir / "dataset_info.json").write_text("{}")
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  raw = load_raw("mnist", cache_dir=tmp_path / "c")
  assert raw.source.startswith("tfds:mnist") and raw.x_train.shape == (7, 28, 28, 1)
  assert raw.y_train.tolist() == list(range(7)) and not any(c[0] == "load" for c in calls)


def test_tfds_download_only_when_allowed(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake_tfds({}, calls))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  monkeypatch.setenv("HOME", str(tmp_path))
  with pytest.raises(DatasetNotFoundError, match="download not attempted"):
    load_raw("mnist")
  assert calls == []
  with pytest.raises(DatasetNotFoundError, match="download of mnist failed: ConnectionError"):
    load_raw("mnist", allow_download=True)
  assert [c[0] for c in calls] == ["load"]


# ----------------------------------------------------------------------------- checksums


def test_md5_helpers(tmp_path):
  f = tmp_path / "a.bin"
  f.write_bytes(b"hello")
  g = tmp_path / "a.bin.gz"
  g.write_bytes(gzip.compress(b"hello"))
  assert md5_file(f) == "5d41402abc4b2a76b9719d911017c592" == md5_file(g, decompress=True)
  verify_md5(f, "5D41402ABC4B2A76B9719D911017C592\n")
  with pytest.raises(ChecksumError, match=r"md5 mismatch for .*a\.bin: expected 0+, got 5d41"):
    verify_md5(f, "0" * 32)
  g.write_bytes(g.read_bytes()[:-4])
  with pytest.raises(DatasetFormatError, match="cannot read"):
    md5_file(g, decompress=True)
  (tmp_path / "MD5SUMS").write_text("5d41402abc4b2a76b9719d911017c592  a.bin\n" + "0" * 32 + "  sub/x\n")
  assert verify_md5sums(tmp_path / "MD5SUMS", names=["a."]) == ["a.bin"]
  with pytest.raises(FileNotFoundError, match="sub/x"):
    verify_md5sums(tmp_path / "MD5SUMS")
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "x").write_bytes(b"truncated")
  with pytest.raises(ChecksumError, match="sub/x"):
    verify_md5sums(tmp_path / "MD5SUMS")
  (tmp_path / "BAD").write_text("xyz file\n")
  with pytest.raises(DatasetFormatError, match="not an md5sum line"):
    read_md5sums(tmp_path / "BAD")


def test_registry_specs_consistent():
  for name in ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "tiny_imagenet", "femnist",
               "wisdm"):
    s = get_spec(name)
    assert len(s.mean) == len(s.std) == s.image_shape[-1] and s.readers


# ----------------------------------------------------------------------------- WISDM raw (FedCAP spec 4.1)

from fedjax_robust.data.readers.wisdm import WISDM_ACTIVITIES, parse_wisdm_lines  # noqa: E402

MALFORMED = [
    "5,Walking,100,1.0,2.0,3.0;5,Walking,101,1.0,2.0,3.0;",  # two records on one line (11 fields)
    "5,Walking,102,1.0,2.0",  # missing z
    "5,Walking,103,1.0,abc,3.0;",  # not a number
    "5,Dancing,104,1.0,2.0,3.0;",  # unknown activity
    "5,Walking,,1.0,2.0,3.0;",  # empty timestamp (pandas: NaN, dropped)
    "5,Walking,105,1.0,2.0,;",  # empty z
]


def wisdm_rows(user, activities):
  """Raw lines of one user; x = running row number of the user, y = user id, z = activity index."""
  return [f"{user},{a},{1000 + i},{float(i)},{float(user)},{float(WISDM_ACTIVITIES.index(a))};"
          for i, a in enumerate(activities)]


def write_wisdm(folder, users, interleave_malformed=True):
  """Writes WISDM_ar_v1.1_raw.txt; users: {id: list of activity names} (rows interleaved across users)."""
  folder.mkdir(parents=True, exist_ok=True)
  per_user = {u: wisdm_rows(u, acts) for u, acts in users.items()}
  lines, step = [], 0
  while any(per_user.values()):
    for u in list(per_user):
      if per_user[u]:
        lines.append(per_user[u].pop(0))
    if interleave_malformed and step < len(MALFORMED):
      lines.append(MALFORMED[step])
    step += 1
  lines.insert(3, "")  # blank lines are ignored, not counted
  (folder / "WISDM_ar_v1.1_raw.txt").write_text("\n".join(lines) + "\n")
  return folder / "WISDM_ar_v1.1_raw.txt"


def test_wisdm_parse_skips_and_counts_malformed_lines():
  users, acts, xyz, bad = parse_wisdm_lines(wisdm_rows(3, ["Jogging", "Sitting"]) + MALFORMED + ["", "  "])
  assert bad == len(MALFORMED) and users.tolist() == [3, 3] and acts.tolist() == [1, 2]
  np.testing.assert_array_equal(xyz, [[0.0, 3.0, 1.0], [1.0, 3.0, 2.0]])


def test_wisdm_windows_labels_and_natural_users(tmp_path, caplog):
  users = {
      # 650 rows -> windows at 0, 200, 400 (range(0, 450, 200)); labels: majority, tie, pure
      12: ["Walking"] * 120 + ["Jogging"] * 80 + ["Sitting"] * 100 + ["Downstairs"] * 100 + ["Upstairs"] * 250,
      3: ["Standing"] * 600,  # exactly 3 x 200 rows -> 2 windows: the generator's range(0, n - 200, 200)
      7: ["Jogging"] * 1001,  # 5 windows
  }
  write_wisdm(tmp_path / "wisdm", users)
  with caplog.at_level(logging.WARNING, logger="fedjax_robust.data"):
    raw = load_raw("wisdm", data_dir=tmp_path, use_cache=False)
  assert f"skipped {len(MALFORMED)} malformed line(s)" in caplog.text
  assert raw.group_names == ("3", "7", "12")  # users sorted by id (numerically)
  assert raw.x_train.shape[1:] == (1, 200, 3) and raw.x_train.dtype == np.float32
  assert raw.class_names == WISDM_ACTIVITIES and raw.num_classes == 6
  x = np.concatenate([raw.x_train, raw.x_test])
  y = np.concatenate([raw.y_train, raw.y_test])
  g = np.concatenate([raw.train_groups, raw.test_groups])
  # raw values, one window = 200 consecutive rows of one user (x channel = row number, y channel = user id)
  assert (x[..., 1] == np.array([3, 7, 12])[g][:, None, None]).all()
  assert (np.diff(x[..., 0], axis=-1) == 1).all() and (x[..., 0][:, 0, 0] % 200 == 0).all()
  labels = {(int(gk), int(xk[0, 0, 0])): int(yk) for gk, xk, yk in zip(g, x, y)}
  W, J, Si, St, U, D = range(6)
  assert labels == {(0, 0): St, (0, 200): St, (1, 0): J, (1, 200): J, (1, 400): J, (1, 600): J, (1, 800): J,
                    (2, 0): W, (2, 200): D, (2, 400): U}  # tie Sitting/Downstairs -> alphabetically first
  # per-user 75/25 split: n_train = floor(0.75 n)
  assert np.bincount(raw.train_groups).tolist() == [1, 3, 2] and np.bincount(raw.test_groups).tolist() == [1, 2, 1]


def test_wisdm_shuffle_and_split_match_the_fedchar_generator(tmp_path):
  """np.random.seed(1); per user choice(n, n, replace=False); then sklearn train_test_split(train_size=0.75)."""
  sklearn_split = pytest.importorskip("sklearn.model_selection").train_test_split
  users = {u: ["Walking", "Jogging", "Upstairs"][u % 3:] * 1 + ["Walking"] * (200 * (u + 3) + 1) for u in (1, 2, 4, 9)}
  write_wisdm(tmp_path, users, interleave_malformed=False)
  raw = load_raw("wisdm", data_dir=tmp_path, use_cache=False)
  starts = {u: np.arange(0, len(a) - 200, 200) for u, a in users.items()}
  state = np.random.get_state()
  try:
    np.random.seed(1)
    shuffled = [starts[u][np.random.choice(np.arange(len(starts[u])), len(starts[u]), replace=False)]
                for u in sorted(users)]
    splits = [sklearn_split(s, train_size=0.75, shuffle=True) for s in shuffled]
  finally:
    np.random.set_state(state)
  assert raw.x_train[:, 0, 0, 0].tolist() == np.concatenate([tr for tr, _ in splits]).tolist()
  assert raw.x_test[:, 0, 0, 0].tolist() == np.concatenate([te for _, te in splits]).tolist()


def test_wisdm_archive_layout_cache_and_errors(tmp_path):
  src = write_wisdm(tmp_path / "src" / "WISDM_ar_v1.1", {1: ["Walking"] * 700, 2: ["Sitting"] * 500})
  d = tmp_path / "data" / "wisdm"
  d.mkdir(parents=True)
  with tarfile.open(d / "WISDM_ar_latest.tar.gz", "w:gz") as tf:
    tf.add(src, arcname="WISDM_ar_v1.1/WISDM_ar_v1.1_raw.txt")
  first = load_raw("wisdm", data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
  again = load_raw("wisdm", data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
  assert "cached" in again.source and again.group_names == first.group_names == ("1", "2")
  np.testing.assert_array_equal(first.x_train, again.x_train)
  np.testing.assert_array_equal(first.test_groups, again.test_groups)
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "WISDM_ar_v1.1_raw.txt").write_text("a,b,c\n" * 5)
  with pytest.raises(DatasetFormatError, match="no valid"):
    load_raw("wisdm", data_dir=tmp_path / "bad", use_cache=False)
  t0 = time.perf_counter()
  with pytest.raises(DatasetNotFoundError) as e:
    load_raw("wisdm", data_dir=tmp_path / "src" / "nothing_here", use_cache=False)
  assert time.perf_counter() - t0 < 5
  assert "WISDM_ar_v1.1_raw.txt" in str(e.value) and "<DATA_DIR>/wisdm/" in str(e.value)
