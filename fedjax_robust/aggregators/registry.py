"""Rule names -> factories: ``make_aggregator(name, **params)`` and ``aggregator_from_config(cfg)``.

    make_aggregator("multi_krum", num_byzantine=6)
    aggregator_from_config({"name": "bucketing", "s": 2, "inner": {"name": "krum", "num_byzantine": 6}})

Every factory takes an optional ``num_clients`` (the cohort size C) so that
impossible settings (Krum with n <= 2f + 2, ...) fail at construction; the same
checks run again at trace time against the static C. Unknown names or
parameters raise ``ValueError`` listing the known ones.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from fedjax_robust.aggregators.base import Aggregator
from fedjax_robust.aggregators.clipping import make_centered_clipping, make_norm_clipping
from fedjax_robust.aggregators.clustered import make_clustered
from fedjax_robust.aggregators.coordinate import make_median, make_trimmed_mean
from fedjax_robust.aggregators.fedcc import make_fedcc
from fedjax_robust.aggregators.flare import make_flare
from fedjax_robust.aggregators.fltrust import make_fltrust
from fedjax_robust.aggregators.geometric_median import make_rfa
from fedjax_robust.aggregators.krum import make_bulyan, make_krum, make_multi_krum
from fedjax_robust.aggregators.mean import make_mean
from fedjax_robust.aggregators.wrappers import make_bucketing, make_gas


def _rename(factory: Callable, name: str) -> Callable:
  def build(**params):
    return factory(**params)._replace(name=name)

  build.__signature__ = inspect.signature(factory)  # type: ignore[attr-defined]
  return build


AGGREGATORS: dict[str, Callable[..., Aggregator]] = {
    "mean": make_mean,
    "median": make_median,
    "trimmed_mean": make_trimmed_mean,
    "krum": make_krum,
    "multi_krum": make_multi_krum,
    "bulyan": make_bulyan,
    "rfa": make_rfa,
    "geometric_median": _rename(make_rfa, "geometric_median"),
    "centered_clipping": make_centered_clipping,
    "norm_clipping": make_norm_clipping,
    "fltrust": make_fltrust,
    "clustered": make_clustered,
    "flare": make_flare,
    "fedcc": make_fedcc,
    "bucketing": make_bucketing,
    "gas": make_gas,
}

_HIDDEN = {"name"}  # internal factory arguments, not user parameters


def known_params(name: str) -> list[str]:
  sig = inspect.signature(AGGREGATORS[name])
  return [p for p in sig.parameters if p not in _HIDDEN and p != "num_clients"]


def make_aggregator(name: str, num_clients: Optional[int] = None, **params) -> Aggregator:
  """Builds rule ``name`` with ``params`` (see each factory's docstring); ``num_clients`` enables early checks."""
  if name not in AGGREGATORS:
    raise ValueError(f"unknown aggregator {name!r}; known: {sorted(AGGREGATORS)}")
  allowed = known_params(name)
  unknown = sorted(set(params) - set(allowed))
  if unknown:
    raise ValueError(f"unknown parameter(s) {unknown} for aggregator {name!r}; known: {allowed}")
  sig = inspect.signature(AGGREGATORS[name])
  missing = [p.name for p in sig.parameters.values()
             if p.default is inspect.Parameter.empty and p.name not in params and p.name not in _HIDDEN]
  if missing:
    raise ValueError(f"aggregator {name!r} requires parameter(s) {missing}; known: {allowed}")
  return AGGREGATORS[name](num_clients=num_clients, **params)


def _to_dict(cfg: Any) -> dict:
  if hasattr(cfg, "to_dict"):
    return cfg.to_dict()
  if isinstance(cfg, dict):
    return dict(cfg)
  raise ValueError(f"aggregator config must be a dict or ConfigDict with a 'name', got {type(cfg).__name__}")


def aggregator_from_config(cfg: Any, num_clients: Optional[int] = None) -> Aggregator:
  """``cfg``: ConfigDict / dict with ``name`` and the rule's parameters (``inner`` nested for wrappers)."""
  params = _to_dict(cfg)
  if "name" not in params:
    raise ValueError(f"aggregator config needs a 'name'; known: {sorted(AGGREGATORS)}")
  name = params.pop("name")
  cfg_num_clients = params.pop("num_clients", None)
  num_clients = cfg_num_clients if num_clients is None else num_clients
  return make_aggregator(name, num_clients=num_clients, **params)


# FedVSA's robust baselines (spec fedvsa.md §3): DnC (aggregators/dnc.py) and synchronous Zeno++
# (aggregators/zeno.py, needs the server losses computed on server-held data).
from fedjax_robust.aggregators.dnc import make_dnc  # noqa: E402
from fedjax_robust.aggregators.zeno import make_zeno  # noqa: E402

AGGREGATORS.update({"dnc": make_dnc, "zeno": make_zeno})
