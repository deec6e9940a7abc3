"""FedALC's setting (specs/fedalc.md §1.7, §4): federated adversarial training on a Dirichlet-split subset.

Not a config file to run by itself: ``fedalc_mnist.py``, ``fedalc_fmnist.py`` and ``fedalc_cifar10.py`` call
:func:`get_config` with their dataset. Their argument is ``<method>[,<alpha>]``:

* method: ``fedalc`` (FedAvg + PGD-AT with logits calibration, the default) | ``fedavg`` (FedAvg-AT: the same PGD
  adversarial training, no calibration; spec A14) | ``fedprox`` (FedProx-AT, mu = 0.001) | ``natural`` (FedAvg on
  clean data, a reference row the paper does not have);
* alpha: the Dirichlet concentration (default 0.1; Table I uses 0.05, 0.1, 0.5, 1.0).

What every method shares: a random subset of the training split (5,000 images; CIFAR-10 1,000) drawn before the
per-class Dirichlet split over 10 clients with the balance cap and at least 10 samples each (§4.2); all clients
train every round with Adam 1e-3 (fresh state each round) on batches of 32; PGD L∞ with ε = 8/255, step 2/255,
10 steps, uniform random start for training (A4-A5), attacking the model in eval mode (A8); pixels in [0, 1] with
the dataset's mean/std inside the model (``data.normalize='model'``, A10). The global model is evaluated on the
official test set every 10 rounds and after each of the last 10 (the paper reports their mean, §2.4); MNIST and
Fashion-MNIST also under FGSM, BIM, PGD-10 and CW-L2 (``eval.metrics=accuracy,robust``).
"""

from fedjax_robust.experiment import default_config

DATASETS = {  # ours, model, subset size, local epochs, rounds, robust evaluation (Table I) or not (Table II)
    "mnist": ("mnist", "cnn_mnist", 5000, 1, 100, True),
    "fmnist": ("fashion_mnist", "cnn_mnist", 5000, 5, 100, True),
    "cifar10": ("cifar10", "resnet18", 1000, 5, 60, False),
}
METHODS = ("fedalc", "fedavg", "fedprox", "natural")


def parse_argument(arg: str) -> tuple[str, float]:
  parts = [p for p in (arg or "fedalc").replace(" ", "").split(",") if p]
  method, alpha = parts[0], 0.1
  if method not in METHODS:
    raise ValueError(f"unknown FedALC method {method!r}; choose one of {METHODS}")
  if len(parts) > 2:
    raise ValueError(f"FedALC config argument is '<method>[,<alpha>]', got {arg!r}")
  if len(parts) == 2:
    alpha = float(parts[1])
  return method, alpha


def get_config(dataset: str, arg: str = "fedalc"):
  method, alpha = parse_argument(arg)
  name, model, subset, epochs, rounds, robust = DATASETS[dataset]
  c = default_config()
  c.rounds = rounds
  c.eval_every = 10
  c.eval.last_rounds = 10
  c.data.name = name
  c.data.num_clients = 10
  c.data.pool_size = subset
  c.data.train_ratio = 1.0  # the whole subset trains; the official test split scores the global model
  c.data.normalize = "model"
  c.data.partition.name = "dirichlet"
  c.data.partition.alpha = alpha
  c.data.partition.min_size = 10
  c.data.partition.cap_at_mean = True
  c.model.name = model
  if dataset == "cifar10":  # the ResNet-18 is ImageNet-pretrained in the paper: ImageNet's mean/std inside the model
    c.model.input_stats = "imagenet"
  c.client.epochs = epochs
  c.client.batch_size = 32
  c.client.optimizer = "adam"
  c.client.lr = 1e-3
  c.server.participation = 1.0
  c.algorithm.name = "fedprox" if method == "fedprox" else "fedavg"
  c.algorithm.fedprox.mu = 0.001
  c.adversarial.objective = {"fedalc": "fedalc", "fedavg": "pgd_at", "fedprox": "pgd_at", "natural": "ce"}[method]
  c.eval.metrics = "accuracy,robust" if robust else "accuracy"
  c.output.name = f"fedalc_{dataset}_{method}_a{alpha:g}"
  return c
