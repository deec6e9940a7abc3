"""FedCAC on cifar100 (specs/fedcac.md; the setting is experiments/configs/fedcac_setting.py).

    python experiments/run.py --config experiments/configs/fedcac_cifar100.py:pathological --config.data.data_dir=../shared/data

The argument is ``<partition>[,<method>]``: partition pathological | dir0.01 | dir0.1 | dir0.5 (the paper's grid; any
dir<alpha> works); method fedcac (default) | fedavg | local | fedbn | fedper | fedrep | fedamp | fedcac_as_critical.
"""

from fedjax_robust.config_files import sibling


def get_config(arg: str = "pathological"):
  return sibling(__file__, "fedcac_setting").get_config("cifar100", arg)
