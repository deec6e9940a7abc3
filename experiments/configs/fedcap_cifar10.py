"""FedCAP on CIFAR-10 pathological non-IID (specs/fedcap.md §1.2, §4): Table I / III, one scenario per config.

    python experiments/run.py --config experiments/configs/fedcap_cifar10.py:ipm --config.data.data_dir=../shared/data

The argument after ``:`` is the scenario: none (benign) | label_flip | sign_flip | scaling | lie | min_max |
min_sum | ipm. It picks the attack and the artifact's per-scenario (alpha, phi, lambda) from
``experiments/*.sh`` (spec §1.2 table); everything else is FedCAP's CIFAR-10 setting (20 clients, 2 classes each,
all participate, 225/75 samples, FedAvgCNN fc 64, SGD lr 0.01, B = 10, E = 5, unshuffled drop_last loaders,
T_norm = 10, 100 rounds, attackers = ids {1, 8, 10, 17, 18, 19}).
"""

from fedjax_robust.config_files import sibling


# scenario -> (alpha, phi, lambda), CIFAR-10 row of the spec's §1.2 table.
HYPERPARAMETERS = {
    "none": (10.0, 0.3, 1.0),
    "label_flip": (10.0, 0.3, 0.1),
    "sign_flip": (10.0, 0.1, 1.0),
    "scaling": (10.0, 0.3, 10.0),
    "lie": (10.0, 0.2, 0.1),
    "min_max": (10.0, 0.3, 0.1),
    "min_sum": (10.0, 0.3, 0.1),
    "ipm": (10.0, 0.3, 0.1),
}


def get_config(scenario: str = "none"):
  if scenario not in HYPERPARAMETERS:
    raise ValueError(f"unknown FedCAP scenario {scenario!r}; choose one of {sorted(HYPERPARAMETERS)}")
  c = sibling(__file__, "cifar10_fedcap_setting").get_config()
  c.algorithm.name = "fedcap"
  c.algorithm.fedcap.alpha, c.algorithm.fedcap.phi, c.algorithm.fedcap.lamda = HYPERPARAMETERS[scenario]
  c.attack.fraction = 0.3
  c.attack.legacy_numpy_selection = True
  if scenario == "label_flip":
    c.attack.data.kind = "label_flip"
    c.attack.data.flip_mode = "reverse"  # the artifact's C - 1 - y (spec §2.2 A1)
  elif scenario != "none":
    c.attack.name = scenario
  c.output.name = f"cifar10_fedcap_{scenario}"
  c.output.reference = sibling(__file__, "fedcap_paper").table3_reference("cifar10", scenario)
  return c
