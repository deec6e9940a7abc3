"""FedAvg on MNIST, 20 clients, Dirichlet(0.3) label skew, LeNet-5.

Needs the raw IDX files: --config.data.data_dir=../shared/data (or FEDJAX_ROBUST_DATA_DIR).
"""

from fedjax_robust.experiment import default_config


def get_config():
  c = default_config()
  c.rounds = 50
  c.data.name = "mnist"
  c.data.num_clients = 20
  c.data.partition.name = "dirichlet"
  c.data.partition.alpha = 0.3
  c.data.max_samples_per_client = 600
  c.model.name = "lenet5"
  c.client.epochs = 1
  c.client.batch_size = 10
  c.client.lr = 0.01
  c.client.momentum = 0.9
  c.output.name = "mnist_fedavg"
  return c
