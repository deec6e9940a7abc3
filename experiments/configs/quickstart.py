"""Quickstart: FedAvg on the embedded `digits` set (no download), 10 clients, Dirichlet(0.5), small MLP.

  python experiments/run.py --config experiments/configs/quickstart.py

About a minute on a laptop CPU; global accuracy climbs from ~10% to >85%.
"""

from fedjax_robust.experiment import default_config


def get_config():
  c = default_config()
  c.rounds = 30
  c.data.name = "digits"
  c.data.num_clients = 10
  c.data.partition.name = "dirichlet"
  c.data.partition.alpha = 0.5
  c.model.name = "mlp"
  c.algorithm.name = "fedavg"
  c.client.epochs = 1
  c.client.batch_size = 10
  c.client.lr = 0.05
  c.output.name = "quickstart"
  return c
