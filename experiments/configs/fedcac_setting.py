"""FedCAC's setting (specs/fedcac.md §1.2, §3; issue 32 §4): 40 clients, 500 train / 100 test rows each, ResNets.

Not a config file to run by itself: ``fedcac_cifar10.py``, ``fedcac_cifar100.py`` and ``fedcac_tiny_imagenet.py``
call :func:`get_config` with their dataset. Their argument is ``<partition>[,<method>]``:

* partition: ``pathological`` (2 random classes per client, 250 train / 50 test rows of each; Table 1) or
  ``dir<alpha>`` (symmetric Dirichlet ``q_i ~ Dir(alpha 1_C)``, spec A14; Table 2: CIFAR-10 ``dir0.1``, ``dir0.5``,
  ``dir1.0``; CIFAR-100 / Tiny-ImageNet ``dir0.01``, ``dir0.1``, ``dir0.5``). Both are FedCAC's sampled partitions
  (``data.partition.name`` = ``pathological_sampled`` / ``dirichlet_sampled``, fedjax_robust/data/partition.py):
  each client's rows are drawn independently (clients may share rows), and with ``data.client_split='per_split'``
  the same procedure with the same seed draws its 500 train rows from the official train split and its 100 test
  rows from the official test split, so both have the same class mix (spec §3.2);
* method: ``fedcac`` (default) | ``fedavg`` | ``local`` (Separate) | ``fedbn`` | ``fedper`` | ``fedrep`` |
  ``fedamp`` (spec §2), or ``fedcac_as_critical`` (Table 3's "As Critical": every parameter takes the customized
  model ``u_i``, ``algorithm.fedcac.non_critical='as_critical'``).

What every method shares (spec §1.2, §3.5): all 40 clients every round, 500 rounds, E = 5 local epochs of batches
of 100 (shuffled each epoch, the last partial batch kept: 25 steps a round), SGD(0.1, momentum 0.9, no weight
decay) re-created every round (no optimizer state is carried), identical initial model, cross-entropy. FedCAC's
τ / β per dataset (§1.2, A8): CIFAR-10 0.5 / 100, CIFAR-100 0.4 / 170, Tiny-ImageNet 0.5 / 170. Models (§3.3):
ResNet-8 (CIFAR-10), ResNet-10 (CIFAR-100, Tiny-ImageNet). Preprocessing (§3.4, A17; :data:`PREPROCESSING`):
CIFAR-10 raw [0, 1] pixels, no normalisation, no augmentation; CIFAR-100 and Tiny-ImageNet normalised with the
code's literal CIFAR-100 statistics (mean (0.507, 0.487, 0.441), std (0.267, 0.256, 0.276), Tiny-ImageNet too) and
trained with ``data.augment`` (fedjax_robust/data/augment.py, in the compiled round; evaluation un-augmented):
CIFAR-100 ``flip,rotate:15,crop:4:fill=normalized`` (RandomHorizontalFlip(0.5) -> RandomRotation(±15°, nearest,
fill 0 in pixels) -> Normalize -> RandomCrop(32, padding 4, zero fill in normalised space)), Tiny-ImageNet
``flip,rotate:15`` (no crop).

Metric (§3.6, A9): every round each client's accuracy on its own 100 test rows; ``client_acc_mean`` is the uniform
mean over the 40 clients of each method's evaluated model "after aggregation" (FedCAC: the Eq. 11 model
``w_i^{t+1,0}`` with the client's own BatchNorm statistics; FedAvg: the global model; FedBN / FedPer / FedRep: the
new shared part with the client's local part; FedAMP / Separate: the client's model). FedCAC also logs the model
before aggregation (``before_aggregation_client_acc_mean``). The reported number is the best round's value (max
over the evaluated rounds), computed from the per-round series by experiments/fedcac_tables.py; ``eval_every = 1``
evaluates every round, as the spec recommends.
"""

import ml_collections

from fedjax_robust.experiment import default_config

# ours -> (data.name, model, tau, beta, normalize, the paper's Dirichlet alphas)
DATASETS = {
    "cifar10": ("cifar10", "resnet8", 0.5, 100, False, (0.1, 0.5, 1.0)),
    "cifar100": ("cifar100", "resnet10", 0.4, 170, True, (0.01, 0.1, 0.5)),
    "tiny_imagenet": ("tiny_imagenet", "resnet10", 0.5, 170, True, (0.01, 0.1, 0.5)),
}
# §3.4: (data.normalize_mean, data.normalize_std, data.augment) per dataset; None = the registry's statistics.
CIFAR100_STATS = ((0.507, 0.487, 0.441), (0.267, 0.256, 0.276))
PREPROCESSING = {
    "cifar10": (None, None, ""),
    "cifar100": (*CIFAR100_STATS, "flip,rotate:15,crop:4:fill=normalized"),
    "tiny_imagenet": (*CIFAR100_STATS, "flip,rotate:15"),
}
METHODS = ("fedcac", "fedavg", "local", "fedbn", "fedper", "fedrep", "fedamp", "fedcac_as_critical")
NUM_CLIENTS, ROUNDS, EPOCHS, BATCH = 40, 500, 5, 100
TRAIN_PER_CLIENT, TEST_PER_CLIENT = 500, 100


def parse_argument(arg: str) -> tuple[str, float | None, str]:
  """``"dir0.1,fedavg"`` -> ``("dir0.1", 0.1, "fedavg")``; ``"pathological"`` -> ``("pathological", None,
  "fedcac")``."""
  parts = [p for p in (arg or "pathological").replace(" ", "").split(",") if p]
  if not parts or len(parts) > 2:
    raise ValueError(f"FedCAC config argument is '<partition>[,<method>]', got {arg!r}")
  partition, method = parts[0], parts[1] if len(parts) == 2 else "fedcac"
  if method not in METHODS:
    raise ValueError(f"unknown FedCAC method {method!r}; choose one of {METHODS}")
  if partition == "pathological":
    return partition, None, method
  if partition.startswith("dir"):
    try:
      alpha = float(partition[3:])
    except ValueError:
      alpha = -1.0
    if alpha > 0:
      return f"dir{alpha:g}", alpha, method
  raise ValueError(f"unknown FedCAC partition {partition!r}: 'pathological' or 'dir<alpha>' (e.g. dir0.1)")


def get_config(dataset: str, arg: str = "pathological"):
  partition, alpha, method = parse_argument(arg)
  name, model, tau, beta, normalize, _ = DATASETS[dataset]
  c = default_config()
  c.rounds, c.eval_every = ROUNDS, 1
  c.data.name = name
  c.data.num_clients = NUM_CLIENTS
  c.data.pool = "train"
  c.data.client_split = "per_split"
  c.data.train_ratio = 1.0  # unused by per_split: the client test rows come from the official test split
  c.data.normalize = normalize
  c.data.normalize_mean, c.data.normalize_std, c.data.augment = PREPROCESSING[dataset]
  if alpha is None:
    c.data.partition.name, c.data.partition.classes_per_client = "pathological_sampled", 2
  else:
    c.data.partition.name, c.data.partition.alpha = "dirichlet_sampled", alpha
  c.data.partition.samples_per_client = TRAIN_PER_CLIENT
  c.data.partition.test_samples_per_client = TEST_PER_CLIENT
  c.model = ml_collections.ConfigDict({"name": model})
  c.client.optimizer, c.client.lr, c.client.momentum, c.client.weight_decay = "sgd", 0.1, 0.9, 0.0
  c.client.batch_size, c.client.epochs, c.client.drop_last, c.client.shuffle = BATCH, EPOCHS, False, True
  c.client.persist_optimizer_state = False  # a fresh SGD every round (spec §1.2, A6)
  c.server.participation = 1.0
  c.algorithm.name = "fedcac" if method.startswith("fedcac") else method
  c.algorithm.fedcac.tau, c.algorithm.fedcac.beta = tau, beta
  c.algorithm.fedcac.eval_before_aggregation = True
  if method == "fedcac_as_critical":
    c.algorithm.fedcac.non_critical = "as_critical"
  c.output.name = f"fedcac_{dataset}_{partition}_{method}"
  return c
