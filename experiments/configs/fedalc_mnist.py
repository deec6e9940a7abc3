"""FedALC on mnist (specs/fedalc.md; the setting is experiments/configs/fedalc_setting.py).

    python experiments/run.py --config experiments/configs/fedalc_mnist.py:fedalc,0.1 --config.data.data_dir=../shared/data

The argument is ``<method>[,<alpha>]``: method fedalc (default) | fedavg (FedAvg-AT) | fedprox (FedProx-AT) |
natural; alpha the Dirichlet concentration (default 0.1).
"""

from fedjax_robust.config_files import sibling


def get_config(arg: str = "fedalc"):
  return sibling(__file__, "fedalc_setting").get_config("mnist", arg)
