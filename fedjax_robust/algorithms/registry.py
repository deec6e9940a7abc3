"""Algorithm names -> builders, like the aggregator and attack registries.

Each entry is an :class:`AlgorithmEntry`: a ``build(ctx) -> FedAlgorithm`` from a
:class:`BuildContext` (the run's model, optimizers, local schedule, aggregation
rule, cohort and attack), the config fields it reads (``config.algorithm.<field>``
or its own block ``config.algorithm.<name>.*``), and two declarations the generic
code asks instead of testing names: ``aggregates`` (whether a server rule applies;
algorithms that aggregate nothing refuse a non-default ``aggregator``) and
``full_cohort(config)`` (Local trains every client every round, FedCAP spec §3).

A new algorithm is one :func:`register_algorithm` call; ``experiment.py`` never
names an algorithm.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import optax

from fedjax_robust.aggregators import Aggregator
from fedjax_robust.algorithms.base import FedAlgorithm
from fedjax_robust.attacks.requests import request_poisoner
from fedjax_robust.algorithms.ditto import check_pair_forward, make_ditto
from fedjax_robust.algorithms.fedavg import make_fedavg, make_local
from fedjax_robust.algorithms.fedcap import make_fedcap
from fedjax_robust.algorithms.fedfomo import make_fedfomo
from fedjax_robust.algorithms.fedrod import make_fedrod
from fedjax_robust.client import LocalTrainSpec
from fedjax_robust.models.interface import Model


class BuildContext(NamedTuple):
  config: Any  # the whole experiment config (algorithm fields under config.algorithm)
  model: Model
  client_opt: optax.GradientTransformation
  server_opt: optax.GradientTransformation
  spec: LocalTrainSpec
  aggregator: Optional[Aggregator]  # None: the algorithm's own default (mean)
  num_clients: int
  cohort: int
  attack: Any = None  # the run's model attack (FedCAP's poisoned requests, spec §2.3)
  malicious: Optional[np.ndarray] = None  # [K] bool

  @property
  def alg(self):
    return self.config.algorithm

  @property
  def persist(self) -> bool:
    return bool(self.config.client.persist_optimizer_state)

  @property
  def pair_forward(self) -> str:
    engine = self.config.get("engine")
    return check_pair_forward(str(engine.get("pair_forward", "separate")) if engine is not None else "separate")


class AlgorithmEntry(NamedTuple):
  build: Callable[[BuildContext], FedAlgorithm]
  fields: tuple[str, ...] = ()  # config.algorithm fields (or sub-blocks) it reads, for the docs and checks
  aggregates: bool = True
  resets_client_optimizer: bool = False  # refuses client.persist_optimizer_state
  full_cohort: Callable[[Any], bool] = lambda config: False


ALGORITHMS: dict[str, AlgorithmEntry] = {}


def register_algorithm(name: str, build: Callable[[BuildContext], FedAlgorithm], **kwargs) -> None:
  if name in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is already registered")
  ALGORITHMS[name] = AlgorithmEntry(build, **kwargs)


def algorithm_entry(name: str) -> AlgorithmEntry:
  if name not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {name!r}; choose one of {tuple(ALGORITHMS)}")
  return ALGORITHMS[name]


def build_algorithm(name: str, ctx: BuildContext) -> FedAlgorithm:
  """Checks what the generic config says against the entry's declarations, then builds."""
  entry = algorithm_entry(name)
  ctx.pair_forward  # checked for every algorithm (only Ditto and FedCAP train a pair)
  if not entry.aggregates and ctx.aggregator is not None:
    raise ValueError(f"algorithm {name!r} aggregates nothing with a server rule; leave aggregator.name='mean' "
                     "with no parameters")
  if entry.resets_client_optimizer and ctx.persist:
    raise ValueError(f"algorithm {name!r} resets the client optimizer every round; "
                     "leave client.persist_optimizer_state=False")
  return entry.build(ctx)


# ------------------------------------------------------------------------------------------ built-ins
def _fedavg_family(name: str, options: Callable[[Any], dict] = lambda alg: {}):
  """A :func:`make_fedavg` variant; ``options(config.algorithm)`` gives its own keyword arguments."""

  def build(ctx: BuildContext) -> FedAlgorithm:
    return make_fedavg(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt, persist_client_opt_state=ctx.persist,
                       aggregator=ctx.aggregator, name=name, **options(ctx.alg))

  return build


register_algorithm("fedavg", _fedavg_family("fedavg"))
register_algorithm("fedprox", _fedavg_family("fedprox", lambda a: {"mu": float(a.mu)}), fields=("mu",))
register_algorithm("fedavg_ft", _fedavg_family(
    "fedavg_ft", lambda a: {"finetune_epochs": int(a.finetune_epochs), "ft_mode": a.ft_mode}),
    fields=("ft_mode", "finetune_epochs"))
register_algorithm("fedbn", _fedavg_family("fedbn", lambda a: {"keep_norm_local": True}))
register_algorithm(
    "local", lambda ctx: make_local(ctx.model, ctx.client_opt, ctx.spec), fields=("local_trains_all",),
    aggregates=False, full_cohort=lambda config: bool(config.algorithm.get("local_trains_all", True)))
register_algorithm(
    "ditto", lambda ctx: make_ditto(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt,
                                    lamda=float(ctx.alg.lamda), aggregator=ctx.aggregator,
                                    pair_forward=ctx.pair_forward),
    fields=("lamda",), resets_client_optimizer=True)


def _build_fedrod(ctx: BuildContext) -> FedAlgorithm:
  model = ctx.model
  features_fn = None
  if model.features is not None:
    features_fn = lambda p, x: model.features({"params": p}, x)
  return make_fedrod(model, ctx.client_opt, ctx.spec, ctx.server_opt, features_fn=features_fn,
                     count_floor=float(ctx.alg.fedrod_count_floor), aggregator=ctx.aggregator,
                     personal_generic=str(ctx.alg.get("fedrod_personal_generic", "local")))


register_algorithm("fedrod", _build_fedrod, fields=("fedrod_count_floor", "fedrod_personal_generic"),
                   resets_client_optimizer=True)


def _build_fedcap(ctx: BuildContext) -> FedAlgorithm:
  f = ctx.alg.fedcap
  request = f.request_updates
  if request == "auto":
    request = ctx.cohort < ctx.num_clients
  elif not isinstance(request, bool):
    raise ValueError(f"algorithm.fedcap.request_updates must be 'auto', True or False, got {request!r}")
  return make_fedcap(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, alpha=float(f.alpha), phi=float(f.phi),
                     lamda=float(f.lamda), norm_threshold=float(f.norm_threshold), calibrate=bool(f.calibrate),
                     personalize=bool(f.personalize), request_updates=bool(request),
                     request_poisoner=request_poisoner(ctx.attack) if bool(f.get("poison_requests", True)) else None,
                     malicious=ctx.malicious, pair_forward=ctx.pair_forward,
                     sample_removed=bool(f.get("sample_removed", True)),
                     eval_customized=str(f.get("eval_customized", "fresh")))


register_algorithm("fedcap", _build_fedcap, fields=("fedcap",), aggregates=False)


def _build_fedfomo(ctx: BuildContext) -> FedAlgorithm:
  f = ctx.alg.fedfomo
  num_models = int(f.num_models) or max(1, ctx.cohort // 2)
  return make_fedfomo(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, num_models=num_models,
                      val_fraction=float(f.val_fraction), epsilon=float(f.epsilon),
                      epsilon_decay=float(f.epsilon_decay))


register_algorithm("fedfomo", _build_fedfomo, fields=("fedfomo",), aggregates=False, resets_client_optimizer=True)
