"""The dataset registry: what each dataset is and where its local files may live.

Why a registry: adding a dataset (EMNIST, Tiny-ImageNet, a natural-user set) is one
:class:`DatasetSpec` entry listing its shape, normalisation statistics and the file
layouts (readers) it can be read from, instead of new branches in the loader.
Readers are tried in order, so lossless originals come before re-encoded copies.
"""

from __future__ import annotations

import dataclasses

from fedjax_robust.data.readers.base import Reader
from fedjax_robust.data.readers.cifar_pickle import CifarPickleReader
from fedjax_robust.data.readers.idx import IdxReader
from fedjax_robust.data.readers.image_folder import ImageFolderReader
from fedjax_robust.data.readers.leaf import LeafJsonReader
from fedjax_robust.data.readers.sklearn_digits import SklearnDigitsReader
from fedjax_robust.data.readers.wisdm import WISDM_ACTIVITIES, WisdmRawReader


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """Static description of one dataset.

  Attributes:
    name: registry key.
    num_classes: number of labels.
    image_shape: (H, W, C) of one example.
    max_value: raw pixel maximum (255, or 16 for digits); ``x / max_value`` is in [0, 1].
    mean, std: per-channel statistics of ``x / max_value`` used by ``normalize=True``.
    readers: local file layouts, tried in order.
    dir_names: sub-folder names of a data root that may hold this dataset.
    tfds_name: tensorflow-datasets name, or None when tfds has no equivalent.
    cacheable: whether decoded arrays are worth caching (not for tiny built-ins).
    natural_clients: whether the data carries a natural client id per sample.
  """

  name: str
  num_classes: int
  image_shape: tuple[int, int, int]
  max_value: float
  mean: tuple[float, ...]
  std: tuple[float, ...]
  readers: tuple[Reader, ...]
  dir_names: tuple[str, ...] = ()
  tfds_name: str | None = None
  cacheable: bool = True
  natural_clients: bool = False


_MNIST_RAW_MD5 = {  # md5 of the decompressed official files.
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
_FASHION_RAW_MD5 = {
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}
_EMNIST_BYCLASS = tuple(f"emnist-byclass-{s}-idx{d}-ubyte" for s, d in
                        (("train-images", 3), ("train-labels", 1), ("test-images", 3),
                         ("test-labels", 1)))

_EMNIST_SOURCE = ("the official EMNIST gzip.zip (https://www.nist.gov/itl/products-and-services/emnist-dataset), "
                  "folder gzip/")

DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
  """Adds (or replaces) a dataset in :data:`DATASETS`."""
  DATASETS[spec.name] = spec
  return spec


def get_spec(name: str) -> DatasetSpec:
  """The spec of ``name``; ValueError listing the known datasets otherwise."""
  try:
    return DATASETS[name]
  except KeyError:
    raise ValueError(f"unknown dataset {name!r}; known datasets: {sorted(DATASETS)}") from None


for _spec in (
    DatasetSpec("digits", 10, (8, 8, 1), 16.0, (0.30526,), (0.37605,),
                (SklearnDigitsReader(),), cacheable=False),
    DatasetSpec("mnist", 10, (28, 28, 1), 255.0, (0.1307,), (0.3081,),
                (IdxReader(raw_md5=_MNIST_RAW_MD5),), ("mnist", "MNIST", "MNIST/raw"), "mnist"),
    DatasetSpec("fashion_mnist", 10, (28, 28, 1), 255.0, (0.2860,), (0.3530,),
                (IdxReader(raw_md5=_FASHION_RAW_MD5),),
                ("fashion_mnist", "fashion-mnist", "fashion", "FashionMNIST",
                 "FashionMNIST/raw"), "fashion_mnist"),
    DatasetSpec("cifar10", 10, (32, 32, 3), 255.0, (0.4914, 0.4822, 0.4465),
                (0.2470, 0.2435, 0.2616),
                (CifarPickleReader("cifar10"),
                 ImageFolderReader(("cifar10_jpeg.tar.gz", "cifar10_png.tar.gz",
                                    "cifar10_images.tar.gz"))),
                ("cifar10", "cifar10_jpeg", "cifar10_png", "cifar-10", "CIFAR10"), "cifar10"),
    DatasetSpec("cifar100", 100, (32, 32, 3), 255.0, (0.5071, 0.4865, 0.4409),
                (0.2673, 0.2564, 0.2762),
                (CifarPickleReader("cifar100"),
                 ImageFolderReader(("cifar100_png.tar.gz", "cifar100_jpeg.tar.gz",
                                    "cifar100_images.tar.gz"))),
                ("cifar100", "cifar100_png", "cifar100_jpeg", "cifar-100", "CIFAR100"), "cifar100"),
    # EMNIST ByClass (62 classes: digits 0-9, uppercase 10-35, lowercase 36-61), the four
    # IDX files of the official distribution's gzip.zip (folder gzip/); images are stored
    # transposed. Statistics are the commonly used approximate ones.
    DatasetSpec("emnist", 62, (28, 28, 1), 255.0, (0.1736,), (0.3317,),
                (IdxReader(_EMNIST_BYCLASS, transpose=True, source=_EMNIST_SOURCE),),
                ("emnist", "EMNIST", "emnist/gzip", "gzip", "EMNIST/raw"), "emnist/byclass"),
    # Tiny-ImageNet: val/ must be re-organised into val/<wnid>/ class folders.
    DatasetSpec("tiny_imagenet", 200, (64, 64, 3), 255.0, (0.4802, 0.4481, 0.3975),
                (0.2302, 0.2265, 0.2262),
                (ImageFolderReader(("tiny-imagenet-200*.tar.gz", "tiny_imagenet*.tar.gz"),
                                   test_dirs=("val",)),),
                ("tiny_imagenet", "tiny-imagenet-200", "tiny-imagenet")),
    # FEMNIST (LEAF): 62 classes, the writer is the natural client; white background,
    # so the mean is high (statistics of the LEAF 5% sample).
    DatasetSpec("femnist", 62, (28, 28, 1), 255.0, (0.9612,), (0.1656,),
                (LeafJsonReader(("femnist*.tar.gz", "*femnist*.tar.gz")),),
                ("femnist", "femnist_leaf", "femnist_leaf_partial", "leaf/femnist"),
                natural_clients=True),
    # WISDM v1.1 raw accelerometer data (FedCAP spec 4.1): 6 activities, the 36 users are the
    # natural clients, windows [1, 200, 3] of raw values (max_value 1, mean 0, std 1: every
    # normalize mode but 'half' leaves them unchanged), FedCHAR's per-user 75/25 split.
    DatasetSpec("wisdm", len(WISDM_ACTIVITIES), (1, 200, 3), 1.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
                (WisdmRawReader(),), ("wisdm", "WISDM", "WISDM_ar_v1.1", "WISDM_ar_latest"),
                natural_clients=True),
):
  register_dataset(_spec)
