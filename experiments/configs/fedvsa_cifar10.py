"""FedVSA on cifar10 (specs/fedvsa.md; the setting is experiments/configs/fedvsa_setting.py).

    python experiments/run.py --config experiments/configs/fedvsa_cifar10.py:sigma900 --config.data.data_dir=../shared/data

The argument is ``<partition>[,<method>][,fresh<α>][,attack]``: partition sigma300 | sigma600 | sigma900 | dir0.1 |
dir0.3 | dir0.5; method fedvsa (default) or a baseline of fedvsa_setting.METHODS; fresh<α> = data dynamics (Table 5);
attack = model replacement at rounds 10, 25, 50 (Fig. 3).
"""

from fedjax_robust.config_files import sibling


def get_config(arg: str = "sigma900"):
  return sibling(__file__, "fedvsa_setting").get_config("cifar10", arg)
