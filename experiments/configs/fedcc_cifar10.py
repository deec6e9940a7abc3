"""FedCC on cifar10 (specs/fedcc.md; the setting is experiments/configs/fedcc_setting.py).

    python experiments/run.py --config experiments/configs/fedcc_cifar10.py:fang_median --config.data.data_dir=../shared/data

The argument is ``<scenario>[,iid][,<rule>]``: scenario none | fang_krum | fang_median | targeted; rule fedcc
(default) | fedavg | krum | median | bulyan | flare | fedcc_<similarity>.
"""

from fedjax_robust.config_files import sibling


def get_config(arg: str = "none"):
  return sibling(__file__, "fedcc_setting").get_config("cifar10", arg)
