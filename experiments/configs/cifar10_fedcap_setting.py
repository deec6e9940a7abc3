"""FedCAP's CIFAR-10 setting (specs/fedcap.md §4): 20 clients, PFLlib `pat` 2 classes each, all participate.

Train+test merged, 600 images per class (6,000 in all, 300 per client), 75/25 per-client split,
Normalize(0.5, 0.5), the artifact's FedAvgCNN (fc 64, 156,810 params), SGD lr 0.01, batch 10,
5 local epochs, unshuffled drop_last training loaders, 100 rounds. Algorithm: FedAvg-FT (a FedCAP baseline,
each client scored with its locally updated model);
switch with --config.algorithm.name=fedavg|fedprox|local.

Needs the CIFAR-10 files: --config.data.data_dir=../shared/data (or FEDJAX_ROBUST_DATA_DIR).
"""

from fedjax_robust.experiment import default_config


def get_config():
  c = default_config()
  c.rounds = 100
  c.data.name = "cifar10"
  c.data.num_clients = 20
  c.data.pool = "all"
  c.data.samples_per_class = 600
  c.data.train_ratio = 0.75
  c.data.normalize = "half"
  c.data.partition.name = "pat"
  c.data.partition.classes_per_client = 2
  c.data.partition.balance = True
  c.model.name = "fedavg_cnn"
  c.model.fc_dim = 64
  c.algorithm.name = "fedavg_ft"
  c.algorithm.fedavg_ft.ft_mode = "last_local"
  c.client.epochs = 5
  c.client.batch_size = 10
  c.client.drop_last = True
  c.client.shuffle = False
  c.client.lr = 0.01
  c.output.name = "cifar10_fedcap_setting"
  return c
