"""FedCAP on EMNIST ByClass "group" non-IID (specs/fedcap.md §1.2, §4.1): Table I / III EMNIST rows.

    python experiments/run.py --config experiments/configs/fedcap_emnist.py:ipm --config.data.data_dir=/path/to/emnist

Needs the official EMNIST ByClass IDX files (``emnist-byclass-train-images-idx3-ubyte.gz`` and the train-labels /
test-images / test-labels files) under ``data_dir``; no copy is available offline in this project. The argument after
``:`` is the scenario (none | label_flip | sign_flip | scaling | lie | min_max | min_sum | ipm) and picks the
artifact's per-scenario (alpha, phi, lambda). Setting: 100 clients, 20% participate each round (N = 20), "group"
partition (digits / uppercase / lowercase, 80% dominant + 20% IID; spec §4.1) of a uniform random 119,000-sample
subset of train + test (``data.pool_size``: ~1,190 samples per client on average, the spec's inference from the
artifact's test sizes; subsampling before partitioning keeps the group sizes imbalanced, as the spec says), 75/25
per-client split, PFLlib's Normalize(0.5, 0.5), EMNISTCNN (86,910 params), SGD lr 0.01,
B = 10, E = 5, unshuffled drop_last loaders, T_norm = 10, 100 rounds, 30% attackers with FedCAP's ids. Under partial
participation clients outside the pool send request updates (spec §1.6).
"""


import ml_collections

from fedjax_robust.config_files import sibling

# scenario -> (alpha, phi, lambda), EMNIST row of the spec's §1.2 table.
HYPERPARAMETERS = {
    "none": (10.0, 0.1, 0.5),
    "label_flip": (10.0, 0.2, 0.1),
    "sign_flip": (10.0, 0.3, 0.1),
    "scaling": (10.0, 0.1, 0.1),
    "lie": (10.0, 0.1, 0.5),
    "min_max": (10.0, 0.3, 0.5),
    "min_sum": (10.0, 0.1, 0.5),
    "ipm": (10.0, 0.1, 0.5),
}


def get_config(scenario: str = "none"):
  if scenario not in HYPERPARAMETERS:
    raise ValueError(f"unknown FedCAP scenario {scenario!r}; choose one of {sorted(HYPERPARAMETERS)}")
  c = sibling(__file__, "fedcap_cifar10").get_config(scenario)
  c.data.name = "emnist"
  c.data.num_clients = 100
  c.data.pool = "all"
  c.data.samples_per_class = None
  c.data.pool_size = 119_000  # 100 clients x ~1,190 (spec §4.1), drawn before the group partition
  c.data.max_samples_per_client = None
  c.data.normalize = "half"  # PFLlib's generate_emnist.py: ToTensor + Normalize([0.5], [0.5]), as for CIFAR-10
  c.data.partition.name = "group"
  c.data.partition.dominant_fraction = 0.8
  c.model = ml_collections.ConfigDict({"name": "emnist_cnn"})
  c.server.participation = 0.2
  c.algorithm.fedcap.alpha, c.algorithm.fedcap.phi, c.algorithm.fedcap.lamda = HYPERPARAMETERS[scenario]
  c.output.name = f"emnist_fedcap_{scenario}"
  c.output.reference = sibling(__file__, "fedcap_paper").table3_reference("emnist", scenario)
  return c
