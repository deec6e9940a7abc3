"""Algorithm names -> builders, like the aggregator and attack registries.

Each entry is an :class:`AlgorithmEntry`: a ``build(ctx) -> FedAlgorithm`` from a
:class:`BuildContext` (the run's model, optimizers, local schedule, aggregation
rule, cohort and attack), its own config block ``config.algorithm.<name>.*``
(``options``: every field with its default; :func:`algorithm_config` puts the
blocks of all registered algorithms into the default config, locked, so a
misspelled or foreign field is refused when it is set), and the declarations
the generic code asks instead of testing names: ``aggregates`` (whether a
server rule applies; algorithms that aggregate nothing refuse a non-default
``aggregator``) and ``full_cohort(config)`` (Local trains every client every
round, FedCAP spec §3).

A new algorithm is one :func:`register_algorithm` call; ``experiment.py`` never
names an algorithm.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import optax

from fedjax_robust.aggregators import Aggregator, make_mean
from fedjax_robust.aggregators.weighting import reweighted, weighting_from_config
from fedjax_robust.algorithms.base import FedAlgorithm
from fedjax_robust.attacks.requests import request_poisoner
from fedjax_robust.algorithms.ditto import make_ditto, resolve_pair_forward
from fedjax_robust.algorithms.fedavg import make_fedavg, make_local
from fedjax_robust.algorithms.fedcap import make_fedcap
from fedjax_robust.algorithms.fedfomo import make_fedfomo
from fedjax_robust.algorithms.fedrod import make_fedrod
from fedjax_robust.algorithms.reported_loss import with_client_weighting
from fedjax_robust.client import LocalTrainSpec
from fedjax_robust.hparams import scalar
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
  hparams: dict = {}  # dotted config key -> value (a tracer inside a grid program) replacing the config's
  client_attack: Any = None  # the attackers' own local procedure (attacks/client_attacks.py), or None
  objective: Any = None  # the local training objective (adversarial/objectives.py); None = plain cross-entropy

  @property
  def alg(self):
    return self.config.algorithm

  @property
  def options(self) -> "Options":
    """This algorithm's own block ``config.algorithm.<name>`` (empty for one without options), with the grid's
    traced values (``hparams``) in place of the config's."""
    name = self.config.algorithm.name
    prefix = f"algorithm.{name}."
    return Options(self.config.algorithm.get(name) or {},
                   {k[len(prefix):]: v for k, v in self.hparams.items() if k.startswith(prefix)})

  @property
  def persist(self) -> bool:
    return bool(self.config.client.persist_optimizer_state)

  @property
  def pair_forward(self) -> str:
    engine = self.config.get("engine")
    return resolve_pair_forward(str(engine.get("pair_forward", "auto")) if engine is not None else "auto")


class Options:
  """Read-only view of an algorithm's config block with some fields replaced (grid values, maybe traced)."""

  def __init__(self, block, replaced: dict):
    self._block, self._replaced = block, replaced

  def __getattr__(self, field):
    if field.startswith("_"):
      raise AttributeError(field)
    return self.get(field)

  def get(self, field, default=None):
    if field in self._replaced:
      return self._replaced[field]
    return self._block.get(field, default)


class AlgorithmEntry(NamedTuple):
  build: Callable[[BuildContext], FedAlgorithm]
  options: dict = {}  # its block config.algorithm.<name>: field -> default
  traced: tuple[str, ...] = ()  # options its factory accepts as traced values (a grid over them is one program)
  aggregates: bool = True
  resets_client_optimizer: bool = False  # refuses client.persist_optimizer_state
  full_cohort: Callable[[Any], bool] = lambda config: False
  supports_client_attack: bool = False  # builds malicious_update from ctx.client_attack
  supports_objective: bool = False  # trains with ctx.objective (adversarial training, FedALC)
  # Whether the run must give the server step server-held data (context.server_data), from the config: FedVSA's
  # Shapley utility, FedLAW's proxy set. Rules declare theirs through Aggregator.needs.
  server_data: Callable[[Any], bool] = lambda config: False
  # The global model a client received, from its broadcast payload, when the weights the algorithm averages its
  # clients with come from the run's rule: then server.weighting may replace them (FedVSA Table 9's plug-in, the
  # clients reporting this model's loss: algorithms/reported_loss.py). None: the weights are the method itself
  # (FedNova, FedDisco, FedLAW, FedVSA) or nothing is averaged, and server.weighting is refused.
  received_model: Optional[Callable[[Any], Any]] = None


ALGORITHMS: dict[str, AlgorithmEntry] = {}


def register_algorithm(name: str, build: Callable[[BuildContext], FedAlgorithm], **kwargs) -> None:
  if name in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is already registered")
  ALGORITHMS[name] = AlgorithmEntry(build, **kwargs)


def algorithm_entry(name: str) -> AlgorithmEntry:
  if name not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {name!r}; choose one of {tuple(ALGORITHMS)}")
  return ALGORITHMS[name]


def algorithm_config():
  """``config.algorithm``: ``name`` plus one block per registered algorithm with options (their defaults)."""
  import ml_collections
  blocks = {name: ml_collections.ConfigDict(dict(entry.options)) for name, entry in ALGORITHMS.items()
            if entry.options}
  config = ml_collections.ConfigDict({"name": "fedavg", **blocks})
  config.lock()  # new fields only through a registered algorithm's options
  return config


def build_algorithm(name: str, ctx: BuildContext) -> FedAlgorithm:
  """Checks what the generic config says against the entry's declarations, then builds."""
  entry = algorithm_entry(name)
  ctx.pair_forward  # checked for every algorithm (only Ditto and FedCAP train a pair)
  if not entry.aggregates and ctx.aggregator is not None:
    raise ValueError(f"algorithm {name!r} aggregates nothing with a server rule; leave aggregator.name='mean' "
                     "with no parameters")
  if ctx.client_attack is not None and not entry.supports_client_attack:
    raise ValueError(f"algorithm {name!r} cannot run a client-side attack ({ctx.client_attack.name}); "
                     "the FedAvg family can")
  if ctx.objective is not None and ctx.objective.name != "ce" and not entry.supports_objective:
    raise ValueError(f"algorithm {name!r} trains with plain cross-entropy only; adversarial.objective="
                     f"{ctx.objective.name!r} needs one of {tuple(n for n, e in ALGORITHMS.items() if e.supports_objective)}")
  if entry.resets_client_optimizer and ctx.persist:
    raise ValueError(f"algorithm {name!r} resets the client optimizer every round; "
                     "leave client.persist_optimizer_state=False")
  weighting = weighting_from_config(ctx.config)
  if weighting is None:
    return entry.build(ctx)
  if entry.received_model is None:
    raise ValueError(f"server.weighting.name={weighting.name!r} replaces the weights an algorithm averages its "
                     f"clients with; algorithm {name!r} has none to replace (its weighting is its method, or it "
                     "averages nothing; FedVSA spec §3: Table 9's plug-in does not apply to FedNova, FedDisco, FedLAW "
                     f"or Median). It applies to {tuple(n for n, e in ALGORITHMS.items() if e.received_model)}")
  ctx = ctx._replace(aggregator=reweighted(make_mean() if ctx.aggregator is None else ctx.aggregator, weighting))
  return with_client_weighting(entry.build(ctx), weighting, ctx.model, entry.received_model, ctx.spec.batch_size)


# ------------------------------------------------------------------------------------------ built-ins
def _fedavg_family(name: str, options: Callable[[Any], dict] = lambda block: {}):
  """A :func:`make_fedavg` variant; ``options(config.algorithm.<name>)`` gives its own keyword arguments."""

  def build(ctx: BuildContext) -> FedAlgorithm:
    return make_fedavg(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt, persist_client_opt_state=ctx.persist,
                       aggregator=ctx.aggregator, name=name, client_attack=ctx.client_attack,
                       objective=ctx.objective, **options(ctx.options))

  return build


register_algorithm("fedavg", _fedavg_family("fedavg"), supports_client_attack=True, supports_objective=True)
register_algorithm("fedprox", _fedavg_family("fedprox", lambda o: {"mu": scalar(o.mu)}),
                   options={"mu": 0.01}, traced=("mu",), supports_client_attack=True,
                   supports_objective=True)  # proximal weight
register_algorithm("fedavg_ft", _fedavg_family(
    "fedavg_ft", lambda o: {"finetune_epochs": int(o.finetune_epochs), "ft_mode": o.ft_mode}),
    # ft_mode: 'last_local' (score each client's model after its local epochs, FedCAP spec §3) or 'finetune'
    # (fine-tune finetune_epochs from the global model at evaluation)
    options={"ft_mode": "last_local", "finetune_epochs": 1}, supports_client_attack=True, supports_objective=True)
register_algorithm("fedbn", _fedavg_family("fedbn", lambda o: {"keep_norm_local": True}), supports_client_attack=True,
                   supports_objective=True)
register_algorithm(
    "local", lambda ctx: make_local(ctx.model, ctx.client_opt, ctx.spec, ctx.objective, ctx.persist),
    supports_objective=True,
    # trains_all: all K clients train every round (FedCAP spec §3); False: the sampled cohort only
    options={"trains_all": True}, aggregates=False,
    full_cohort=lambda config: bool(config.algorithm.local.get("trains_all", True)))
register_algorithm(
    "ditto", lambda ctx: make_ditto(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt,
                                    lamda=scalar(ctx.options.lamda), aggregator=ctx.aggregator,
                                    pair_forward=ctx.pair_forward),
    # lamda: prox weight of the personalized model toward the received global one (FedCAP spec §3)
    options={"lamda": 1.0}, traced=("lamda",), resets_client_optimizer=True)


def _build_fedrod(ctx: BuildContext) -> FedAlgorithm:
  model = ctx.model
  features_fn = None
  if model.features is not None:
    features_fn = lambda p, x: model.features({"params": p}, x)
  return make_fedrod(model, ctx.client_opt, ctx.spec, ctx.server_opt, features_fn=features_fn,
                     count_floor=float(ctx.options.count_floor), aggregator=ctx.aggregator,
                     personal_generic=str(ctx.options.personal_generic))


register_algorithm("fedrod", _build_fedrod, resets_client_optimizer=True, options={
    "count_floor": 1e-8,  # class counts clamped below before the balanced-softmax log
    "personal_generic": "local",  # personal head on the client's local generic model | global
})


def _build_fedcap(ctx: BuildContext) -> FedAlgorithm:
  f = ctx.options
  request = f.request_updates
  if request == "auto":
    request = ctx.cohort < ctx.num_clients
  elif not isinstance(request, bool):
    raise ValueError(f"algorithm.fedcap.request_updates must be 'auto', True or False, got {request!r}")
  return make_fedcap(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, alpha=scalar(f.alpha), phi=scalar(f.phi),
                     lamda=scalar(f.lamda), norm_threshold=scalar(f.norm_threshold), calibrate=bool(f.calibrate),
                     personalize=bool(f.personalize), request_updates=bool(request),
                     request_poisoner=request_poisoner(ctx.attack) if bool(f.get("poison_requests", True)) else None,
                     malicious=ctx.malicious, pair_forward=ctx.pair_forward,
                     sample_removed=bool(f.get("sample_removed", True)),
                     eval_customized=str(f.get("eval_customized", "fresh")))


# FedCAP (specs/fedcap.md §1.2; per-attack values in experiments/configs/fedcap_cifar10.py). Defaults off the
# per-cell table: spec §6 item 12 (alpha 10 for label skew, 2 for feature skew; phi 0.1).
register_algorithm("fedcap", _build_fedcap, aggregates=False, traced=("alpha", "phi", "lamda", "norm_threshold"),
                   options={
    "alpha": 10.0,  # softmax scale of the cosine similarities (Eq. 5)
    "phi": 0.1,  # self-weight of a pooled client (Eq. 5); the per-cell configs set 0.1-0.3
    "lamda": 0.1,  # prox weight of the personalized model toward the customized one (Eq. 7)
    "norm_threshold": 10.0,  # T_norm: a calibrated update with a larger norm (or NaN) removes the client
    "calibrate": True,  # False: Table IV variants 1 and 4 (raw uploads, no detection)
    "personalize": True,  # False: Table IV variants 1 and 3 (no personalized model)
    "request_updates": "auto",  # clients outside the pool send a request update; auto = partial participation
    "poison_requests": True,  # attackers poison their request updates too (the artifact, spec §2.3)
    "sample_removed": True,  # removed clients stay in the cohort draw (the artifact); False: spec §6 item 9
    "eval_customized": "fresh",  # customized model scored: fresh customization | last_received (§6 item 8)
})


def _build_fedfomo(ctx: BuildContext) -> FedAlgorithm:
  f = ctx.options
  num_models = int(f.num_models) or max(1, ctx.cohort // 2)
  return make_fedfomo(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, num_models=num_models,
                      val_fraction=float(f.val_fraction), epsilon=float(f.epsilon),
                      epsilon_decay=float(f.epsilon_decay))


# FedFomo (specs/fedcap.md §3; Zhang et al. ICLR 2021; fedjax_robust/algorithms/fedfomo.py)
register_algorithm("fedfomo", _build_fedfomo, aggregates=False, resets_client_optimizer=True, options={
    "num_models": 0,  # O models sent per client; 0 = half the cohort (FedCAP: 10 of 20)
    "val_fraction": 0.2,  # last floor(0.2 n_k) real training rows of each client are its validation set
    "epsilon": 0.3,  # epsilon-greedy exploration (official FedFomo default)
    "epsilon_decay": 0.05,  # epsilon_t = max(epsilon - decay * t, 0)
})


def _build_fedcac(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.fedcac import make_fedcac
  if ctx.attack is not None:
    raise ValueError(f"algorithm 'fedcac' uploads whole models and masks, not the 'delta' a model attack "
                     f"({getattr(ctx.attack, 'name', ctx.attack)}) poisons; leave attack.name='none' "
                     "(data poisoning works)")
  f = ctx.options
  return make_fedcac(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, tau=float(f.tau), beta=scalar(f.beta),
                     selection=str(f.selection), collaboration=str(f.collaboration),
                     num_collaborators=int(f.num_collaborators), non_critical=str(f.non_critical),
                     bn_mode=str(f.bn_mode), eval_before_aggregation=bool(f.eval_before_aggregation))


# FedCAC (specs/fedcac.md §1; Wu et al. ICCV 2023; fedjax_robust/algorithms/fedcac.py). Defaults: CIFAR-10 (§1.2);
# CIFAR-100 uses tau 0.4, beta 170; Tiny-ImageNet tau 0.5, beta 170. The client optimizer (SGD 0.1, momentum 0.9)
# is the config's; it is re-created every round.
register_algorithm("fedcac", _build_fedcac, aggregates=False, resets_client_optimizer=True, traced=("beta",),
                   options={
    "tau": 0.5,  # fraction of critical parameters per tensor, k = floor(tau * n) (static: sets shapes)
    "beta": 100,  # collaboration horizon of Eq. 7: Thr^t reaches O_max at round t = beta
    "selection": "sensitivity",  # critical entries: sensitivity | random | sensitivity_reverse (Fig. 3)
    "collaboration": "time_varying",  # time_varying (Eq. 7-8) | none | number (Fig. 4)
    "num_collaborators": 1,  # collaboration='number': the k other clients of highest overlap
    "non_critical": "all",  # all: non-critical params take the FedAvg model | as_critical (Table 3)
    "bn_mode": "local",  # BatchNorm running stats: local (code) | critical (averaged over C_i, the paper's words)
    "eval_before_aggregation": True,  # also score each client's trained w^{t,E} (before_aggregation_client_acc_*)
})


# FedCAC's personalized baselines (specs/fedcac.md §2; issue 32 §3): FedPer and FedRep
# (fedjax_robust/algorithms/partial_sharing.py: the body averaged by the server rule, the local layers kept on each
# client), FedAMP (fedjax_robust/algorithms/fedamp.py: attention-weighted cloud models and the prox term). Each
# re-creates the client optimizer every round (FedCAC's protocol). FedAvg, Separate (local) and FedBN are above.
def _local_layers(value) -> tuple:
  """``("head",)``; a string is a comma-separated list (``"fc1,head"``)."""
  if isinstance(value, str):
    return tuple(v for v in value.replace(" ", "").split(",") if v)
  return tuple(value)


def _build_fedper(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.partial_sharing import make_fedper
  return make_fedper(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt,
                     local_layers=_local_layers(ctx.options.local_layers), aggregator=ctx.aggregator)


def _build_fedrep(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.partial_sharing import make_fedrep
  f = ctx.options
  return make_fedrep(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt, head_epochs=int(f.head_epochs),
                     body_epochs=int(f.body_epochs), local_layers=_local_layers(f.local_layers),
                     aggregator=ctx.aggregator)


def _build_fedamp(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.fedamp import make_fedamp
  if ctx.attack is not None:
    raise ValueError("algorithm 'fedamp' uploads whole personalized models, not the 'delta' a model attack "
                     f"({getattr(ctx.attack, 'name', ctx.attack)}) poisons; leave attack.name='none'")
  f = ctx.options
  return make_fedamp(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, alpha_k=scalar(f.alpha_k),
                     lamda=scalar(f.lamda), sigma=scalar(f.sigma), alpha_decay=scalar(f.alpha_decay),
                     alpha_decay_every=int(f.alpha_decay_every), start=str(f.start))


register_algorithm("fedper", _build_fedper, resets_client_optimizer=True, options={
    "local_layers": ("head",),  # top-level layers kept on each client (head = the last layer, Fling's fc)
})
register_algorithm("fedrep", _build_fedrep, resets_client_optimizer=True, options={
    "head_epochs": 10,  # epochs on the local layers with the body frozen (FedRep paper: 10)
    "body_epochs": 0,  # then epochs on the body with the head frozen; 0 = client.epochs (FedCAC's E = 5)
    "local_layers": ("head",),
})
# FedAMP defaults: the FedCAC authors' configuration (Fling cifar10_fedamp_resnet_config).
register_algorithm("fedamp", _build_fedamp, aggregates=False, resets_client_optimizer=True,
                   traced=("alpha_k", "lamda", "sigma", "alpha_decay"), options={
    "alpha_k": 1e4,  # attention step alpha: xi_ij = alpha exp(-|w_i - w_j|^2 / sigma) / sigma; prox weight lamda/alpha
    "lamda": 1.0,  # prox weight lambda of (lambda / 2 alpha) |w - u_i|^2
    "sigma": 100.0,  # scale of the attention-inducing function A(x) = 1 - exp(-x / sigma)
    "alpha_decay": 0.1,  # alpha multiplied by this every alpha_decay_every rounds (Fling's schedule)
    "alpha_decay_every": 30,  # 0 = constant alpha
    "start": "personal",  # local training starts from the client's own model (Fling, PFLlib) | cloud (u_i)
})


def _build_fedvsa(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.fedvsa import make_fedvsa
  f = ctx.options
  return make_fedvsa(
      ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt, num_clients=ctx.num_clients, cohort_size=ctx.cohort,
      inference_loss_kind=str(f.inference_loss), inference_reduction=str(f.inference_reduction),
      inference_batch_size=int(f.inference_batch_size), clip_mode=str(f.clip_mode), clip_value=float(f.clip_value),
      temperature=float(f.temperature), detection=str(f.detection), audit_reference=str(f.audit_reference),
      audit_quorum=float(f.audit_quorum), shapley_exact_max=int(f.shapley_exact_max),
      shapley_permutations=int(f.shapley_permutations), shapley_tol=float(f.shapley_tol),
      shapley_chunk=int(f.shapley_chunk), flag_rule=str(f.flag_rule), flag_eps=float(f.flag_eps),
      hotfix=str(f.hotfix), tau=float(f.tau), blacklist=bool(f.blacklist), repaired_round=str(f.repaired_round),
      mu=float(f.mu),
      persist_client_opt_state=ctx.persist, client_attack=ctx.client_attack,
      eval_batch_size=int(ctx.config.engine.eval_batch_size))


# FedVSA (spec fedvsa.md §1.3-1.9): defaults are the spec's [R] resolutions.
register_algorithm("fedvsa", _build_fedvsa, aggregates=False, supports_client_attack=True,
                   server_data=lambda config: config.algorithm.fedvsa.detection in ("full", "no_audit"), options={
    "inference_loss": "ce",  # ce | mse | l1 (softmax vs one-hot; Table 8)
    "inference_reduction": "mean",  # mean | sum (Eq. 1) | sum_batch_means (ICPP code), spec A1
    "inference_batch_size": 256,  # rows per forward pass of the inference-loss scoring
    "clip_mode": "mean",  # mean | median | fixed (clip_value) | none (Fig. 4 ablation)
    "clip_value": 0.0,
    "temperature": 1.0,  # softmax temperature T_s (1 in the paper)
    "detection": "full",  # full | off (aggregation only) | no_audit (Shapley every round) | no_shapley (Fig. 5)
    "audit_reference": "prev_round_max",  # prev_round_max | running_max_all_history | per_client_last
    "audit_quorum": 0.5,  # Dr = 1 when >= quorum of the reporters exceed the reference
    "shapley_exact_max": 10,  # exact 2^C enumeration up to this cohort size, TMC beyond
    "shapley_permutations": 50,  # TMC permutations P
    "shapley_tol": 0.0,  # TMC truncation tolerance (accuracy units)
    "shapley_chunk": 64,  # coalition models built and scored at once
    "flag_rule": "lt0",  # lt0: phi < -flag_eps | le0: phi <= flag_eps
    "flag_eps": 0.0,
    "hotfix": "subtract",  # subtract tau * flagged weighted updates | reaggregate (recon of the kept clients)
    "tau": 1.0,
    "blacklist": False,  # flagged clients are left out for the rest of the run
    # aggregate (paper) | skip: drop the repairing round's updates | retrain: repair before training (fedvsa.py)
    "repaired_round": "aggregate",
    "mu": 0.0,  # FedProx's proximal term in the local rule (Table 9's plug-in)
})


# Heterogeneity-tolerant baselines of FedVSA (spec fedvsa.md §3): SCAFFOLD, FedDyn, FedNova, FedDC
# (fedjax_robust/algorithms/{scaffold,feddyn,fednova,feddc}.py). Each re-creates the client optimizer every round;
# SCAFFOLD, FedDyn and FedDC average through the run's aggregation rule (default: the sample-weighted mean; the
# papers' uniform means are aggregator.weighted=False) and apply their own server step, so the run's server optimizer
# must stay plain averaging (SCAFFOLD's global step is algorithm.scaffold.server_lr); FedNova is its own rule.
def _hetero_client_lr(ctx: BuildContext, name: str):
  """The client SGD learning rate η of a control-variate update (a traced value inside a grid over client.lr)."""
  optimizer = str(ctx.config.client.optimizer)
  if optimizer != "sgd":
    raise ValueError(f"algorithm {name!r} estimates gradients from SGD steps (c_i = (w - theta)/(K lr)); set "
                     f"client.optimizer='sgd', got {optimizer!r}")
  return scalar(ctx.hparams.get("client.lr", ctx.config.client.lr))


def _hetero_plain_server(ctx: BuildContext, name: str, hint: str = "") -> None:
  s = ctx.config.server
  if (str(s.optimizer) != "sgd" or float(s.lr) != 1.0 or float(s.get("momentum", 0.0)) != 0.0
      or "server.lr" in ctx.hparams):
    raise ValueError(f"algorithm {name!r} applies its own server update; leave server.optimizer='sgd', "
                     f"server.lr=1, server.momentum=0{hint}")


def _build_scaffold(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.scaffold import make_scaffold
  _hetero_plain_server(ctx, "scaffold", " (SCAFFOLD's global step size is algorithm.scaffold.server_lr)")
  return make_scaffold(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, lr=_hetero_client_lr(ctx, "scaffold"),
                       server_lr=scalar(ctx.options.server_lr), aggregator=ctx.aggregator)


def _build_feddyn(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.feddyn import make_feddyn
  _hetero_plain_server(ctx, "feddyn")
  return make_feddyn(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, alpha=scalar(ctx.options.alpha),
                     aggregator=ctx.aggregator)


def _build_fednova(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.fednova import make_fednova
  agg_cfg = ctx.config.get("aggregator")
  if agg_cfg is not None and (agg_cfg.get("name") != "mean" or set(agg_cfg.keys()) - {"name", "weighted"}):
    raise ValueError("algorithm 'fednova' is its own aggregation rule (normalized averaging, p_k = n_k/n); leave "
                     "aggregator.name='mean' (aggregator.weighted=False for uniform p_k)")
  client = ctx.config.client
  if str(client.optimizer) != "sgd" or bool(client.get("nesterov", False)):
    raise ValueError("algorithm 'fednova' normalizes by the local steps of SGD (plain or heavy-ball momentum); set "
                     f"client.optimizer='sgd' without nesterov, got {client.optimizer!r}")
  weighted = True if agg_cfg is None else bool(agg_cfg.get("weighted", True))
  return make_fednova(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt, momentum=float(client.momentum),
                      weighted=weighted)


def _build_feddc(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.feddc import make_feddc
  _hetero_plain_server(ctx, "feddc")
  f = ctx.options
  return make_feddc(ctx.model, ctx.client_opt, ctx.spec, ctx.num_clients, lr=_hetero_client_lr(ctx, "feddc"),
                    alpha=scalar(f.alpha), drift_mean=str(f.drift_mean), aggregator=ctx.aggregator)


register_algorithm("scaffold", _build_scaffold, resets_client_optimizer=True, traced=("server_lr",), options={
    "server_lr": 1.0,  # global step size eta_g: x <- x + eta_g * mean(dy) (Karimireddy et al. 2020, Alg. 1)
})
register_algorithm("feddyn", _build_feddyn, resets_client_optimizer=True, traced=("alpha",), options={
    "alpha": 0.01,  # dynamic-regularization weight (Acar et al. 2021, Alg. 1; official code 1e-2)
})
# FedNova (Wang et al. 2020): a_k from each client's real step count (and client.momentum); no options
register_algorithm("fednova", _build_fednova, resets_client_optimizer=True)
register_algorithm("feddc", _build_feddc, resets_client_optimizer=True, traced=("alpha",), options={
    "alpha": 0.01,  # drift-penalty weight (alpha/2)||theta + h_i - w||^2 (Gao et al. 2022; official code 1e-2)
    "drift_mean": "cohort",  # w = mean over the cohort of theta_i + h_i | all: mean_S theta_i + mean_all h_i (code)
})


# FedVSA's weighting baselines (spec fedvsa.md §3): FedDisco (algorithms/feddisco.py, Ye et al. ICML 2023) and
# FedLAW (algorithms/fedlaw.py, Li et al. ICML 2023), both the FedAvg family's clients.
def _build_feddisco(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.feddisco import make_feddisco
  f = ctx.options
  return make_feddisco(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt, a=scalar(f.a), b=scalar(f.b),
                       distance=str(f.distance), reference=str(f.reference), aggregator=ctx.aggregator,
                       persist_client_opt_state=ctx.persist, client_attack=ctx.client_attack,
                       objective=ctx.objective)


def _build_fedlaw(ctx: BuildContext) -> FedAlgorithm:
  from fedjax_robust.algorithms.fedlaw import NO_SERVER_DATA, make_fedlaw
  if int(ctx.config.server.root_dataset_size) <= 0:
    raise ValueError(NO_SERVER_DATA)
  f = ctx.options
  return make_fedlaw(ctx.model, ctx.client_opt, ctx.spec, ctx.server_opt, server_epochs=int(f.server_epochs),
                     server_lr=float(f.server_lr), server_batch_size=int(f.server_batch_size),
                     lr_decay_every=int(f.lr_decay_every), persist_client_opt_state=ctx.persist,
                     client_attack=ctx.client_attack, objective=ctx.objective)


register_algorithm("feddisco", _build_feddisco, traced=("a", "b"), supports_client_attack=True,
                   supports_objective=True, options={
    "a": 0.5,  # p_k ∝ ReLU(n_k - a d_k + b) (Eq. 5; official code defaults a 0.5, b 0.1)
    "b": 0.1,
    "distance": "l2",  # d_k: l2 | l1 | kl (KL(q_k || r) normalised over the cohort, the official code's)
    "reference": "uniform",  # the global label distribution r: uniform | cohort (the round's pooled labels)
})
register_algorithm("fedlaw", _build_fedlaw, aggregates=False, supports_client_attack=True, supports_objective=True,
                   server_data=lambda config: True, options={
    "server_epochs": 20,  # epochs over the proxy set (server.root_dataset_size rows) per round (official code)
    "server_lr": 0.01,  # Adam(betas 0.5, 0.999) on (theta, log gamma); the code's CIFAR-10 value
    "server_batch_size": 128,
    "lr_decay_every": 20,  # halve the lr every this many epochs (StepLR); 0 = constant
})


# FedVSA's Table 9 plug-in (server.weighting; spec fedvsa.md §3): the algorithms whose client average comes from the
# run's rule declare the model their clients received, so another client weighting (value_sensitive: the softmax of
# the clients' reported losses of it) can replace the rule's weights while their local rule and server state stay.
# Not FedNova (normalised averaging is its rule), FedDisco (its p_k), FedLAW (learned weights) or FedVSA (its own).
def _as_received(payload):
  return payload


def _model_field(payload):  # SCAFFOLD and FedDC broadcast {"model", "c"}
  return payload["model"]


for _name, _received in (("fedavg", _as_received), ("fedprox", _as_received), ("fedavg_ft", _as_received),
                         ("feddyn", _as_received), ("scaffold", _model_field), ("feddc", _model_field)):
  ALGORITHMS[_name] = ALGORITHMS[_name]._replace(received_model=_received)
