"""Data layer: raw dataset loading, partitioning among clients, padded federated arrays.

* :func:`load_raw` finds and decodes a dataset (local files / cache / optional tfds);
* the partitioners split a labelled pool among clients;
* :func:`build_federated_data` turns a data config into a :class:`FederatedData`.
"""

from fedjax_robust.data.builder import (build_federated_data, default_data_config,
                                        partition_from_config, save_federated_partition)
from fedjax_robust.data.checksums import md5_file, verify_md5, verify_md5sums
from fedjax_robust.data.errors import ChecksumError, DatasetFormatError, DatasetNotFoundError
from fedjax_robust.data.federated import FederatedData, stack_padded, with_dataless_clients
from fedjax_robust.data.partition import (PARTITIONERS, cap_samples_per_client, dirichlet,
                                          dirichlet_client, iid, label_histograms, load_partition,
                                          natural, partition_by_name, pat, quantity_skew, save_partition,
                                          shards, sigma_label_skew, subsample_per_class,
                                          train_test_split_per_client)
from fedjax_robust.data.registry import DATASETS, DatasetSpec, get_spec, register_dataset
from fedjax_robust.data.sources import RawDataset, load_raw
from fedjax_robust.data.transforms import normalize_images

__all__ = [
    "build_federated_data", "default_data_config", "partition_from_config",
    "save_federated_partition", "md5_file", "verify_md5", "verify_md5sums", "ChecksumError",
    "DatasetFormatError", "DatasetNotFoundError", "FederatedData", "stack_padded", "with_dataless_clients",
    "PARTITIONERS",
    "cap_samples_per_client", "dirichlet", "dirichlet_client", "iid", "label_histograms",
    "load_partition", "natural", "partition_by_name", "pat", "quantity_skew", "save_partition", "shards",
    "sigma_label_skew", "subsample_per_class", "train_test_split_per_client", "DATASETS",
    "DatasetSpec", "get_spec", "register_dataset", "RawDataset", "load_raw", "normalize_images",
]
