"""FedCAP on WISDM v1.1, natural users (specs/fedcap.md §1.2, §4.1): Table I / III WISDM rows.

    python experiments/run.py --config experiments/configs/fedcap_wisdm.py:ipm --config.data.data_dir=/path/to/wisdm

Needs the raw file ``WISDM_ar_v1.1_raw.txt`` (or the official ``WISDM_ar_latest.tar.gz`` that holds it) under
``data_dir``; no copy is available offline in this project. The argument after ``:`` is the scenario (none |
label_flip | sign_flip | scaling | lie | min_max | min_sum | ipm) and picks the artifact's per-scenario
(alpha, phi, lambda), including alpha = 4 (LF) and alpha = 1 (LIE) outside the paper's grid. Setting: the 36 users
sorted by id are the clients and all participate (N = 36); windows of 200 rows (step 200, label = mode, raw
values: ``normalize=False`` is the identity for this dataset) as FedCHAR's generator builds them, with its per-user
shuffle (seed 1) and 75/25 split kept as the clients' train/test (``data.client_split = "source"``; spec §4.1);
HARCNN (203,782 params), SGD lr 0.01, B = 10, E = 5, unshuffled drop_last loaders, T_norm = 10, 100 rounds,
30% attackers with FedCAP's ids {2, 10, 11, 15, 16, 20, 22, 29, 30, 31} (spec §2.1).
"""


import ml_collections

from fedjax_robust.config_files import sibling

# scenario -> (alpha, phi, lambda), WISDM row of the spec's §1.2 table.
HYPERPARAMETERS = {
    "none": (2.0, 0.1, 0.1),
    "label_flip": (4.0, 0.2, 0.1),
    "sign_flip": (2.0, 0.2, 0.1),
    "scaling": (2.0, 0.1, 0.1),
    "lie": (1.0, 0.2, 0.1),
    "min_max": (2.0, 0.2, 0.5),
    "min_sum": (2.0, 0.3, 0.5),
    "ipm": (2.0, 0.1, 0.1),
}


def get_config(scenario: str = "none"):
  if scenario not in HYPERPARAMETERS:
    raise ValueError(f"unknown FedCAP scenario {scenario!r}; choose one of {sorted(HYPERPARAMETERS)}")
  c = sibling(__file__, "fedcap_cifar10").get_config(scenario)
  c.data.name = "wisdm"
  c.data.num_clients = 36  # every natural user; also the K of the attacker ids
  c.data.pool = "all"
  c.data.client_split = "source"  # FedCHAR's per-user shuffle (seed 1) and 75/25 split, done by the reader
  c.data.samples_per_class = None
  c.data.pool_size = None
  c.data.max_samples_per_client = None
  c.data.normalize = False  # raw accelerometer values (spec §4.1)
  c.data.partition.name = "natural"
  c.data.partition.min_size = 1
  c.model = ml_collections.ConfigDict({"name": "har_cnn"})
  c.server.participation = 1.0
  c.algorithm.fedcap.alpha, c.algorithm.fedcap.phi, c.algorithm.fedcap.lamda = HYPERPARAMETERS[scenario]
  c.output.name = f"wisdm_fedcap_{scenario}"
  c.output.reference = sibling(__file__, "fedcap_paper").table3_reference("wisdm", scenario)
  return c
