"""FedCAC on tiny_imagenet (specs/fedcac.md; the setting is experiments/configs/fedcac_setting.py).

    python experiments/run.py --config experiments/configs/fedcac_tiny_imagenet.py:pathological --config.data.data_dir=DIR

The argument is ``<partition>[,<method>]``: partition pathological | dir0.01 | dir0.1 | dir0.5 (the paper's grid; any
dir<alpha> works); method fedcac (default) | fedavg | local | fedbn | fedper | fedrep | fedamp | fedcac_as_critical.

Tiny-ImageNet is not in ../shared/data (no offline copy here): the loader is ready (``data.name=tiny_imagenet``:
DIR holds a ``tiny-imagenet-200*.tar.gz`` whose val/ is re-organised into val/<wnid>/ class folders, see
fedjax_robust/data/registry.py), but no cell of it has run. As spec §3.4, Tiny-ImageNet is normalised with
CIFAR-100's statistics and trained with flips and ±15° rotations (``data.augment``, fedcac_setting.py).
"""

from fedjax_robust.config_files import sibling


def get_config(arg: str = "pathological"):
  return sibling(__file__, "fedcac_setting").get_config("tiny_imagenet", arg)
