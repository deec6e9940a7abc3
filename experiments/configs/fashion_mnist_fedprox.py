"""FedProx (mu = 0.01) on Fashion-MNIST, 20 clients, 2 classes each (PFLlib `pat`), PFLlib FedAvgCNN.

Needs the raw IDX files: --config.data.data_dir=../shared/data (or FEDJAX_ROBUST_DATA_DIR).
"""

from fedjax_robust.experiment import default_config


def get_config():
  c = default_config()
  c.rounds = 50
  c.data.name = "fashion_mnist"
  c.data.num_clients = 20
  c.data.partition.name = "pat"
  c.data.partition.classes_per_client = 2
  c.data.max_samples_per_client = 600
  c.model.name = "fedavg_cnn"
  c.model.fc_dim = 512
  c.algorithm.name = "fedprox"
  c.algorithm.fedprox.mu = 0.01
  c.client.epochs = 1
  c.client.batch_size = 10
  c.client.lr = 0.01
  c.output.name = "fashion_mnist_fedprox"
  return c
