"""From an ml_collections config to a running experiment: data, model, algorithm, engine, run directory.

``default_config()`` lists every field with its default; configs in
``experiments/configs/`` override what they need. ``run_experiment`` writes a
run directory holding the resolved config, per-round metrics (JSONL and CSV),
the partition (client label histograms), a final summary (strict JSON), plots
(``fedjax_robust/plots.py``), and when asked TensorBoard event files and orbax
checkpoints of the run state that a later run resumes from (``output.*``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from fedjax_robust import attacks, client_weights
from fedjax_robust.adversarial import (adversarial_config, default_robust_eval_config, objective_from_config,
                                       robust_eval_from_config, training_attack_unroll)
from fedjax_robust.adversarial.attacks import attack_unroll as eval_attack_unroll
from fedjax_robust.aggregators import aggregator_from_config
from fedjax_robust.aggregators.weighting import weighting_config
from fedjax_robust.attacks.client_attacks import client_attack_from_config
from fedjax_robust.attacks.data_poisoning import backdoor_trigger
from fedjax_robust.algorithms.base import FedAlgorithm
from fedjax_robust.algorithms.registry import ALGORITHMS as ALGORITHM_REGISTRY
from fedjax_robust.algorithms.registry import BuildContext, algorithm_config, algorithm_entry, build_algorithm
from fedjax_robust.checkpoint import RunCheckpointer, remove_checkpoints
from fedjax_robust.client import ClientData, LocalTrainSpec, num_local_steps
from fedjax_robust.compilation import has_conv
from fedjax_robust.data import build_federated_data, default_data_config, with_dataless_clients
from fedjax_robust.data.augment import augmentation_from_config
from fedjax_robust.execution import default_strategy_name, is_primary, make_strategy, to_host
from fedjax_robust.metrics.evaluators import resolve_evaluators
from fedjax_robust.models import as_model, get_model_from_config, make_model
from fedjax_robust.models.interface import with_input_normalization
from fedjax_robust.models.layers import resolve_conv_impl
from fedjax_robust.optim import optimizer_from_config
from fedjax_robust.pretrain import pretrain, pretrain_rounds
from fedjax_robust.round_context import SERVER_DATA_NEEDS
from fedjax_robust.sampling import StratifiedSampler, sampler_from_config
from fedjax_robust.simulation import SimState, Simulator, check_nominal_weight

logger = logging.getLogger("fedjax_robust")

ALGORITHMS = tuple(ALGORITHM_REGISTRY)


def default_config() -> ml_collections.ConfigDict:
  """Every experiment field with its default (FedAvg on digits with a small MLP)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Several seeds as ONE vmapped program (fedjax_robust/run.py): "0,1,2" runs the config once per seed, with each
  # field of seed_fields set to that seed; "" = one run with `seed`.
  c.seeds = ""
  c.seed_fields = "seed,data.seed,attack.seed"
  # A grid over traced hyperparameters in the same one program: "algorithm.fedprox.mu=0,0.01;client.lr=0.01,0.05"
  # (cartesian product; client.lr, server.lr and each algorithm's declared `traced` options).
  c.grid = ""
  c.rounds = 20
  c.eval_every = 1
  c.data = default_data_config()
  c.model = ml_collections.ConfigDict({"name": "mlp"})
  # Warm start (FedVSA spec §4.6, fedjax_robust/pretrain.py): pretrain_rounds > 0 runs that many rounds of plain FedAvg
  # (same data, seed, client optimizer, cohort size; base labels only with data.dynamics) and starts the run from its
  # global model; the run's rounds (and metrics) are counted after it.
  c.init = ml_collections.ConfigDict({"pretrain_rounds": 0})
  # algorithm.name, and each registered algorithm's own block algorithm.<name>.* with its defaults
  # (fedjax_robust/algorithms/registry.py: fedprox.mu, ditto.lamda, fedavg_ft.*, fedrod.*, local.trains_all,
  # fedcap.*, fedfomo.*); fedbn = FedAvg with every BatchNorm layer kept local (needs a BN model)
  c.algorithm = algorithm_config()
  c.client = ml_collections.ConfigDict({
      "epochs": 1,
      "batch_size": 10,
      "drop_last": False,
      "shuffle": True,
      "optimizer": "sgd",
      "lr": 0.05,
      "momentum": 0.0,
      "weight_decay": 0.0,
      "grad_clip_norm": 0.0,  # > 0: clip each step's gradient to this global L2 norm (FedDC code: 10)
      "persist_optimizer_state": False,
  })
  c.server = ml_collections.ConfigDict({
      "optimizer": "sgd",  # sgd(lr=1) = FedAvg averaging; momentum > 0 = FedAvgM; 'adam' = FedAdam
      "lr": 1.0,
      "momentum": 0.0,
      "participation": 1.0,  # fraction of clients sampled per round (cohort = round(fraction * K))
      "cohort_size": 0,  # if > 0, overrides participation
      # Server-held clean data (FLTrust's root set, FLARE's auxiliary set): samples drawn from the pooled
      # training data before poisoning; built when the rule declares it needs it.
      "root_dataset_size": 100,
      # Where the server's rows come from: train (drawn from the clients' pooled training data, FLTrust) | test
      # (drawn from the global test set: FedVSA's evaluation data for Shapley values, spec §1.6).
      "root_source": "train",
      # The weights the rule averages its clients with: rule (its own) | samples | uniform | value_sensitive (FedVSA's
      # softmax of the clients' reported losses: Table 9's plug-in), with value_sensitive's options
      # (fedjax_robust/aggregators/weighting.py).
      "weighting": weighting_config(),
  })
  # What each evaluation measures (fedjax_robust/metrics/evaluators.py): auto = accuracy (+ backdoor with one),
  # or a comma-separated list such as "accuracy,backdoor".
  # robust: the global model's robust accuracy under eval.robust's attacks (fedjax_robust/adversarial/evaluation.py).
  # last_rounds: also evaluate after each of the last N rounds (papers that report the mean of the last 10).
  # stop_at: end the run after the first evaluated round whose global_test_acc reaches it (0 = never): rounds-to-
  # target grids (FedVSA Tables 3-4) stop once the higher target is met. One-seed runs only.
  # global_test_examples: score the global model on this many global test rows, drawn once without replacement
  # with data.seed (0 = all): a cheaper global_test_acc where the metric is the clients' own accuracy (FedCAC).
  c.eval = ml_collections.ConfigDict({"metrics": "auto", "last_rounds": 0, "stop_at": 0.0, "global_test_examples": 0,
                                      "robust": default_robust_eval_config()})
  # Local training objective and training attack (fedjax_robust/adversarial/objectives.py): ce | pgd_at (FedAvg-AT)
  # | fedalc | fat | trades | mart | calfat, with each objective's block adversarial.<name>.*. Attacks perturb
  # [0, 1] pixels: adversarial runs need data.normalize='model' (or False).
  c.adversarial = adversarial_config()
  # Cohort sampler: uniform | forced ("round:id+id,..." forced into those 1-indexed rounds, e.g. "10:3,25:3").
  # stratified: exactly `attackers` attackers per round (-1 = round(attack.fraction * cohort)), FedCC spec §2.6.
  # exclusive: the forced clients take part only in their rounds (FedVSA's adversary, spec §2).
  c.sampler = ml_collections.ConfigDict({"name": "uniform", "forced": "", "exclusive": False, "attackers": -1})
  c.attack = ml_collections.ConfigDict({
      # Model poisoning of the malicious clients' uploads: none | sign_flip | scaling | gaussian | lie | min_max |
      # min_sum | ipm | fang_krum | fang_median | fang_trimmed_mean | boosting (fedjax_robust/attacks/registry.py).
      "name": "none",
      "params": ml_collections.ConfigDict(),  # the attack's parameters, e.g. {"knowledge": "partial"}
      "fraction": 0.3,  # share of clients that are malicious (floor(K * fraction)), fixed for the whole run
      "seed": 0,  # which clients are malicious
      "legacy_numpy_selection": False,  # FedCAP's np.random.seed(seed); choice(K, int(K*p)) ids
      "clients": "",  # explicit attacker ids, e.g. "1,5,8" (overrides fraction/seed); "" = drawn as above
      # f > 0: the attackers are f clients WITHOUT data, appended as ids K..K+f-1 to the K data partitions, which
      # are all benign (FedCC's code, spec §2.6 [R]; overrides fraction/seed/clients). Every round takes all f and
      # round(participation * K) - f benign partitions (the stratified sampler), so no partition's data is lost to
      # an attacker. Their aggregation weight: dataless_weight, 'mean' (the cohort's mean benign sample count) or a
      # positive number (a weight of 0 would mean "must not count" to every rule).
      "dataless": 0,
      "dataless_weight": "mean",
      # Upload fields poisoned, comma-separated: "field" by the attack above, "field=attack" by an attack of its own
      # with its parameters in field_params.<field> (e.g. "delta,loss=exaggerate": FedVSA's boosted model and an
      # exaggerated loss report, spec §2).
      "fields": "delta",
      "field_params": ml_collections.ConfigDict(),
      "data": ml_collections.ConfigDict(attacks.default_poison_config()),  # data poisoning: kind none | label_flip | backdoor | dba
      # Client-side attack: the attackers' own local procedure (attacks/client_attacks.py); 0 = the attack's
      # default. backdoor_training = FedCC's targeted attack (spec §2.4): `epochs` (6) x [an epoch on their data,
      # a pass over D_mal with Adam(lr 5e-3, weight_decay 5e-3)]; D_mal = `samples` (1) test images of one class
      # labelled another (attack.seed). flipped_training = FedVSA's model-replacement adversary (spec §2): `epochs`
      # (E) on `samples` (|D|/K) IID training rows with labels (y+1) mod C, with the clients' optimizer.
      "client": ml_collections.ConfigDict({"name": "none", "epochs": 0, "lr": 0.0, "weight_decay": 0.0,
                                           "samples": 0, "batch_size": 0}),
  })
  c.aggregator = ml_collections.ConfigDict({
      # Server aggregation rule: mean | median | trimmed_mean | krum | multi_krum | bulyan | rfa | norm_clipping |
      # centered_clipping | fltrust | clustered | flare | fedcc | bucketing | gas, plus the rule's own parameters.
      "name": "mean",
  })
  c.engine = ml_collections.ConfigDict({
      "strategy": "auto",  # auto | vmap | shard_map | sequential
      # auto | true | false | int: lax.scan unroll of the local steps. auto: rolled, except for a conv net on the CPU
      # with model.conv_impl xla or patches (unrolled: experiment.conv_loop_trap)
      "unroll": "auto",
      # seeds/grid runs: auto | scan (the whole run one program) | python (one round program called per round;
      # auto's choice on the CPU for conv nets whose convolutions XLA:CPU runs slowly inside a loop: model.conv_impl
      # xla or patches, experiment.conv_loop_trap): run.py
      "rounds_loop": "auto",
      # Ditto / FedCAP: run the pair's two models as two passes ('separate') or one vmapped pass ('stacked');
      # same numbers, speed differs per backend (benchmarks/step_latency.py). auto: separate on the CPU, stacked
      # elsewhere (algorithms/ditto.py resolve_pair_forward)
      "pair_forward": "auto",
      "num_devices": 0,  # shard_map mesh size; 0 = all devices
      "cpu_devices": 0,  # > 0: force this many XLA:CPU host devices (set before JAX starts)
      "eval_batch_size": 1024,
  })
  c.output = ml_collections.ConfigDict({
      "dir": "runs",
      "name": "",  # run sub-directory; default <dataset>_<algorithm>_<timestamp>
      "progress": True,
      # Orbax checkpoints of the run state in <run dir>/checkpoints every N rounds and after the last (0 = none).
      "checkpoint_every": 0,
      # Go on from the run directory's latest checkpoint (e.g. after a crash, or with more rounds); the config may
      # differ only in rounds, eval_every, output.* and engine.*. Without a checkpoint the run starts fresh. A damaged
      # latest checkpoint is skipped for the newest one that restores (one warning line).
      "resume": False,
      # PNG + SVG figures in <run dir>/plots at the end of the run (fedjax_robust/plots.py): accuracy and loss curves,
      # partition heatmap, detection raster, aggregation weights. Needs matplotlib (the `plots` extra); without it
      # the run logs one line and writes none. experiments/plot.py draws (and compares) run directories later.
      "plots": True,
      # Accuracy reference lines on those plots, "VALUE[:LABEL]" items separated by ";" (accuracy in %), e.g. the
      # paper's number for this setting: "85.60:FedCAP paper, Table III". The paper configs set it where the paper
      # has one number for the run; '' = none.
      "reference": "",
      # TensorBoard event files of every per-round scalar in <run dir>/tb (tensorboardX, the `tensorboard` extra;
      # no TensorFlow): tensorboard --logdir runs/
      "tensorboard": False,
  })
  return c


@dataclasses.dataclass
class Experiment:
  config: ml_collections.ConfigDict
  data: Any
  model: Any
  params: Any
  algorithm: FedAlgorithm
  simulator: Simulator
  strategy: str
  unroll: bool | int
  malicious: np.ndarray | None = None
  model_state: dict = dataclasses.field(default_factory=dict)  # BatchNorm statistics etc. ({} if none)
  # hparams -> the algorithm rebuilt with those config values replaced (tracers in a grid program)
  algorithm_with: Any = None
  pretrain: Any = None  # the warm start's per-round records (init.pretrain_rounds > 0), else None
  local_steps: int = 0  # local steps in one (padded) client program
  attack_unroll: bool | int | None = None  # the training attack's loop unroll (adversarial objectives), else None
  conv_loop_trap: bool = False  # conv_loop_trap(): loops holding this model's gradient convolutions run slowly

  def init_state(self) -> SimState:
    return self.simulator.init(self.params, self.config.seed, self.model_state or None)


def _draw_rows(total: int, size: int, seed: int) -> np.ndarray:
  """``size`` distinct row indices of ``total``, uniform with ``seed``, sorted (the server's test rows, the evaluated
  global test rows)."""
  return np.sort(np.random.default_rng(seed).choice(total, size, replace=False))


def global_test_rows(config, data) -> np.ndarray | None:
  """The global test rows evaluation scores (``eval.global_test_examples``; ``None`` = all): a uniform draw without
  replacement seeded by ``data.seed``, sorted, so every method and lane of a grid sees the same rows."""
  size = int(config.eval.get("global_test_examples", 0) or 0)
  total = int(len(data.y_global_test))
  if size == 0 or size == total:
    return None
  if not 0 < size <= total:
    raise ValueError(f"eval.global_test_examples must be in [0, {total}] (0 = all), got {size}")
  return _draw_rows(total, size, int(config.data.seed))


# model.input_stats: the mean/std a model applies to [0, 1] pixels under data.normalize='model'. "dataset": the
# dataset's own; "imagenet": torchvision's, for ImageNet-pretrained weights (FedALC spec §4.1, Table II's ResNet-18).
INPUT_STATS = {"dataset": None, "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


def input_normalization(norm: dict, input_stats: str, channels: int):
  """``(mean, std)`` the model applies first under ``data.normalize='model'`` (``norm``: the data's
  ``info["normalize"]``), or ``None`` when the data arrive normalised; checks ``model.input_stats``."""
  if input_stats not in INPUT_STATS:
    raise ValueError(f"model.input_stats must be one of {tuple(INPUT_STATS)}, got {input_stats!r}")
  if norm.get("mode") != "model":
    if input_stats != "dataset":
      raise ValueError(f"model.input_stats={input_stats!r} needs data.normalize='model' (the model normalises)")
    return None
  mean, std = INPUT_STATS[input_stats] or (norm["mean"], norm["std"])
  if len(mean) != channels:
    raise ValueError(f"model.input_stats={input_stats!r} has {len(mean)} channel statistics, the data {channels}")
  return mean, std


def conv_loop_trap(params, model_cfg, backend: str) -> bool:
  """Whether XLA:CPU's conv-in-loop trap (jax-ml/jax#12868) applies: a conv net on the CPU whose convolutions are
  differentiated by JAX (``model.conv_impl`` xla or patches), whose gradient convolutions run on XLA:CPU's naive
  path inside a loop body. The default ``auto`` computes them in Eigen's order there (``canonical``,
  ``models/layers.py``), so a rolled loop is as fast as an unrolled one and nothing needs unrolling."""
  if backend != "cpu" or not has_conv(params):
    return False
  return resolve_conv_impl(str((model_cfg or {}).get("conv_impl", "auto")), backend) != "canonical"


def resolve_unroll(value, trap: bool) -> bool | int:
  """``auto``: fully unroll the local steps only under the conv-in-loop trap (:func:`conv_loop_trap`), else a
  rolled ``lax.scan``; ``true`` / ``false`` / an int: that unroll."""
  if value == "auto":
    return True if trap else 1
  if isinstance(value, str):
    return {"true": True, "false": 1}.get(value.lower(), None) or int(value)
  return 1 if value is False else value


# Past this many fully unrolled local steps in one client program, XLA:CPU's compile time and memory become the cost
# of a run (they grow faster than the step count; benchmarks/README.md §5, FedALC's CNN-MNIST at batch 32: 90 clean
# steps took 170 s to compile at 4.5 GB peak; 180 had not finished after 8 min at 17 GB).
LONG_UNROLL_STEPS = 64


def long_unroll_warning(unroll, local_steps: int) -> str | None:
  """The warning a run logs when ``engine.unroll`` puts more than :data:`LONG_UNROLL_STEPS` unrolled local steps in
  one client program (``engine.unroll=true``, or auto under the conv-in-loop trap), else None."""
  if unroll is not True or local_steps <= LONG_UNROLL_STEPS:
    return None
  return (f"engine.unroll unrolls {local_steps} local steps into one client program: on the CPU its compile time and "
          f"memory grow faster than the step count (90 steps of a small CNN: ~3 min and 4.5 GB; 180: over 8 min and "
          f"17 GB, benchmarks/README.md §5). model.conv_impl=auto (canonical on the CPU) with engine.unroll=auto "
          f"rolls the loop at full speed; fewer steps per round or a GPU also avoid it")


def cohort_size(config, num_clients: int) -> int:
  """Clients per round. An algorithm may declare that every client trains every round (Local: FedCAP spec §3,
  "all K clients every round"), whatever ``server.participation`` says."""
  frac = float(config.server.participation)
  if not 0 < frac <= 1:
    raise ValueError(f"server.participation must be in (0, 1], got {frac}")
  if algorithm_entry(config.algorithm.name).full_cohort(config):
    return num_clients
  if config.server.cohort_size:
    return int(config.server.cohort_size)
  return max(1, int(round(frac * num_clients)))


def server_dataset(data, server_cfg, seed: int) -> ClientData:
  """The server-held rows of ``config.server``: ``root_dataset_size`` rows from ``root_source``."""
  source = str(server_cfg.get("root_source", "train"))
  size = int(server_cfg.root_dataset_size)
  if source == "train":
    return root_dataset(data, size, seed)
  if source != "test":
    raise ValueError(f"server.root_source must be 'train' or 'test', got {source!r}")
  total = int(len(data.y_global_test))
  if not 0 < size <= total:
    raise ValueError(f"server.root_dataset_size must be in [1, {total}] with root_source='test', got {size}")
  pick = _draw_rows(total, size, seed)
  return ClientData(jnp.asarray(data.x_global_test[pick]), jnp.asarray(data.y_global_test[pick], jnp.int32),
                    jnp.int32(size))


def root_dataset(data, size: int, seed: int) -> ClientData:
  """FLTrust's clean server dataset: ``size`` rows drawn uniformly from all clients' (unpoisoned) training data."""
  n = data.n_train if getattr(data, "train_schedule", None) is None else np.minimum(data.n_train,
                                                                                    data.train_schedule.n_base)
  rows = [(k, i) for k in range(data.num_clients) for i in range(int(n[k]))]  # data dynamics: base rows only
  if not 0 < size <= len(rows):
    raise ValueError(f"server.root_dataset_size must be in [1, {len(rows)}], got {size}")
  pick = np.random.default_rng(seed).choice(len(rows), size, replace=False)
  k, i = np.asarray(rows)[pick].T
  return ClientData(jnp.asarray(data.x_train[k, i]), jnp.asarray(data.y_train[k, i], jnp.int32), jnp.int32(size))


def make_algorithm(config, model, spec: LocalTrainSpec, aggregator=None, num_clients=None, cohort=None, attack=None,
                   malicious=None, hparams=None, client_attack=None, objective=None) -> FedAlgorithm:
  """The algorithm ``config.algorithm.name`` names, from the registry (``algorithms/registry.py``).
  ``aggregator=None`` is the algorithm's default rule (the sample-weighted ``mean``). ``hparams``: dotted config
  keys whose values (tracers, in a grid program: ``fedjax_robust.run``) replace the config's."""
  hparams = dict(hparams or {})
  ctx = BuildContext(config, as_model(model), optimizer_from_config(config.client, hparams.get("client.lr")),
                     optimizer_from_config(config.server, hparams.get("server.lr")), spec, aggregator,
                     int(num_clients), int(cohort or num_clients), attack, malicious, hparams, client_attack,
                     objective)
  return build_algorithm(config.algorithm.name, ctx)


def _is_default_mean(agg_cfg) -> bool:
  """``aggregator`` left at ``{name: mean}`` with no parameters (algorithms that aggregate nothing accept only it)."""
  return agg_cfg is None or (agg_cfg.get("name") == "mean" and set(agg_cfg.keys()) <= {"name"})


OPEN_GROUPS = ("aggregator", "attack.params", "attack.field_params", "model")  # fields depend on the chosen rule


def parse_override_value(text: str):
  """A command-line value: int, float (``inf``, ``nan``), bool, ``none``, a list/dict literal, else the string."""
  import ast
  low = text.strip().lower()
  if low in ("true", "false"):
    return low == "true"
  if low in ("none", "null"):
    return None
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    try:
      return float(text)  # inf, nan, 1e-3
    except ValueError:
      return text


def split_open_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """Takes ``--config.<group>.<field>=value`` for the :data:`OPEN_GROUPS` out of ``argv``.

  Those groups hold the chosen rule's / attack's / model's own parameters, which the default config cannot list,
  so ``config_flags`` (which only overrides existing fields) would refuse them with an ``AttributeError``.
  Returns the remaining argv and the ``(dotted key, raw value)`` pairs, in order.
  """
  rest, taken = [], []
  for arg in argv:
    if arg.startswith("--config.") and "=" in arg:
      key, value = arg[len("--config."):].split("=", 1)
      if any(key.startswith(g + ".") for g in OPEN_GROUPS):
        taken.append((key, value))
        continue
    rest.append(arg)
  return rest, taken


def apply_open_overrides(config: ml_collections.ConfigDict, overrides) -> ml_collections.ConfigDict:
  """Sets each ``(dotted key, raw value)`` on ``config``, creating fields in the open groups as needed."""
  for key, raw in overrides:
    value = parse_override_value(raw) if isinstance(raw, str) else raw
    *path, leaf = key.split(".")
    with config.unlocked():
      node = config
      for part in path:
        if part not in node or node[part] is None:
          node[part] = ml_collections.ConfigDict()
        node = node[part]
      old = node.get(leaf)
      if old is not None and value is not None and not isinstance(old, type(value)):
        try:  # keep the field's type (e.g. an int override of a float field)
          value = type(old)(value)
        except (TypeError, ValueError):
          raise ValueError(f"--config.{key}={raw}: expected a {type(old).__name__}") from None
      node[leaf] = value
  return config


def malicious_from_config(attack_cfg, num_clients: int) -> np.ndarray:
  """``[K]`` attacker mask: the last ``attack.dataless`` clients (the dataless attackers), else the explicit ids of
  ``attack.clients`` ("1,5,8") if given, else drawn by fraction/seed."""
  dataless = int(attack_cfg.get("dataless", 0) or 0)
  if dataless:
    mask = np.zeros(num_clients, bool)
    mask[num_clients - dataless:] = True
    return mask
  ids = str(attack_cfg.get("clients", "") or "").replace(" ", "")
  if not ids:
    return attacks.choose_malicious(num_clients, float(attack_cfg.fraction), int(attack_cfg.seed),
                                    legacy_numpy=bool(attack_cfg.legacy_numpy_selection))
  try:
    chosen = sorted({int(i) for i in ids.strip("()[]").split(",") if i})
  except ValueError:
    raise ValueError(f"attack.clients must be comma-separated client ids, got {attack_cfg.clients!r}") from None
  bad = [i for i in chosen if not 0 <= i < num_clients]
  if bad:
    raise ValueError(f"attack.clients {bad} are not client ids of a {num_clients}-client federation")
  mask = np.zeros(num_clients, bool)
  mask[chosen] = True
  return mask


def check_dataless_attack(config, dataless: int, partitions: int) -> None:
  """Refuses what dataless attackers (``attack.dataless``) cannot mean: no attack to craft their models, data of
  theirs to poison, explicit attacker ids, a cohort with no room for benign clients, a sampler that may leave them
  out."""
  a = config.attack
  if dataless < 0:
    raise ValueError(f"attack.dataless must be >= 0, got {dataless}")
  if a.name == "none":
    raise ValueError("attack.dataless attackers have no data to train on: they need an upload attack that crafts "
                     "their models (attack.name, e.g. fang_krum)")
  if a.data.kind != "none":
    raise ValueError(f"attack.dataless attackers hold no data for attack.data.kind={a.data.kind!r} to poison")
  if str(a.get("clients", "") or "").strip():
    raise ValueError("attack.dataless and attack.clients both name the attackers: set one")
  check_nominal_weight(a.get("dataless_weight", "mean"))
  cohort = cohort_size(config, partitions)
  if not 1 <= cohort - dataless <= partitions:
    raise ValueError(f"attack.dataless={dataless} attackers in a cohort of {cohort} (round(server.participation x "
                     f"{partitions} partitions)) leave {cohort - dataless} benign slots: need 1..{partitions}")
  sampler = config.get("sampler")
  if sampler is not None and sampler.name not in ("uniform", "stratified"):
    raise ValueError(f"attack.dataless attackers take part in every round (stratified sampler); "
                     f"sampler.name={sampler.name!r} cannot say so")
  if sampler is not None and sampler.name == "stratified" and int(sampler.get("attackers", -1)) not in (-1, dataless):
    raise ValueError(f"attack.dataless={dataless} attackers are all in every round, but sampler.attackers="
                     f"{sampler.attackers}")


def build_experiment(config: ml_collections.ConfigDict, data=None) -> Experiment:
  """Loads data, builds the model, the algorithm and the simulator described by ``config``."""
  data = data if data is not None else build_federated_data(config.data)
  attack_cfg = config.get("attack")
  partitions = data.num_clients  # before any dataless attacker is added: the cohort is a share of these
  dataless = int(attack_cfg.get("dataless", 0) or 0) if attack_cfg is not None else 0
  if dataless:
    check_dataless_attack(config, dataless, partitions)
    data = with_dataless_clients(data, dataless)
  malicious, attack, backdoor, attack_data = None, None, None, None
  client_attack = client_attack_from_config(attack_cfg.get("client")) if attack_cfg is not None else None
  attack_fields, field_attacks = ((), {}) if attack_cfg is None else attacks.upload_fields_from_config(
      attack_cfg.get("fields", "delta"), attack_cfg.get("field_params"))
  if attack_cfg is not None and (attack_cfg.name != "none" or attack_cfg.data.kind != "none"
                                 or client_attack is not None or field_attacks):
    malicious = malicious_from_config(attack_cfg, data.num_clients)
    if not malicious.any():
      raise ValueError(f"attack {attack_cfg.name!r} / data poisoning {attack_cfg.data.kind!r} is set but no client "
                       f"is malicious (attack.fraction={attack_cfg.fraction} of {data.num_clients} clients rounds "
                       "down to 0): raise attack.fraction or name attack.clients")
    if malicious.all():
      logger.warning("every client is malicious (attack.fraction=%s): benign-client metrics are undefined (NaN)",
                     attack_cfg.fraction)
    logger.info("malicious clients (%d of %d): %s", malicious.sum(), data.num_clients, np.flatnonzero(malicious))
    clean = data
    data = attacks.poison_federated_data(data, malicious, attack_cfg.data)
    if attack_cfg.name != "none":
      attack = attacks.attack_from_config({"name": attack_cfg.name, **attack_cfg.params.to_dict()})
    if attack_cfg.data.kind in ("backdoor", "dba"):
      trigger, value = backdoor_trigger(clean, attack_cfg.data)
      x_bd, y_bd = attacks.triggered_test_set(data.x_global_test, data.y_global_test, trigger,
                                              attack_cfg.data.target_label, value)
      backdoor = (x_bd, int(attack_cfg.data.target_label))
    if client_attack is not None:  # the attack's own data (FedCC: D_mal), and its backdoor metrics' inputs
      attack_data, attack_backdoor = client_attack.make_data(data, int(attack_cfg.seed))
      backdoor = backdoor or attack_backdoor
  else:
    clean = data
  model_cfg = config.model.to_dict()
  pretrained = model_cfg.pop("pretrained", None)  # a converted checkpoint (fedjax_robust/models/resnet.py)
  input_stats = model_cfg.pop("input_stats", "dataset")  # data.normalize='model': whose mean/std the model applies
  module = get_model_from_config(model_cfg, data.num_classes)
  model = make_model(module)
  norm = data.info.get("normalize") or {}
  stats = input_normalization(norm, input_stats, int(data.feature_shape[-1]))
  if stats is not None:  # pixels stay in [0, 1]; the dataset's (or ImageNet's) mean/std is the model's first layer
    model = with_input_normalization(model, *stats)
  adversarial_cfg = config.get("adversarial")
  objective = objective_from_config(adversarial_cfg)  # rebuilt below with its attack loop's unroll
  eval_cfg = config.get("eval", {})
  evaluators = resolve_evaluators(eval_cfg.get("metrics", "auto"), backdoor is not None)
  robust_eval = robust_eval_from_config(eval_cfg.get("robust")) if "robust" in evaluators else None
  if (objective.adversarial or robust_eval is not None) and norm.get("mode") in ("standard", "half"):
    raise ValueError(f"adversarial training / robust evaluation perturb [0, 1] pixels (eps in pixel units), but "
                     f"data.normalize={config.data.normalize!r} normalises the inputs: set data.normalize='model' "
                     "(normalisation inside the model) or False")
  variables = model.init(jax.random.key(config.seed), jnp.zeros((1,) + tuple(data.feature_shape), jnp.float32))
  if pretrained:  # every layer but the new task's head from the file (FedALC Table II: ImageNet ResNet-18)
    from fedjax_robust.models.resnet import load_pretrained
    variables = load_pretrained(pretrained, module, variables)
    logger.info("model weights (all but the head) loaded from %s", pretrained)
  params = variables["params"]
  model_state = {k: v for k, v in variables.items() if k != "params"}
  pretrain_records = None
  if pretrain_rounds(config):  # FedVSA §4.6: every method starts from the same FedAvg warm start (on clean data)
    params, model_state, pretrain_records = pretrain(config, clean)
  backend = jax.default_backend()
  conv = has_conv(params)
  trap = conv_loop_trap(params, config.model, backend)
  unroll = resolve_unroll(config.engine.unroll, trap)
  augment = augmentation_from_config(config.data.get("augment", ""), data.feature_shape, norm, stats)  # training only
  spec = LocalTrainSpec(int(config.client.epochs), int(config.client.batch_size), bool(config.client.drop_last),
                        bool(config.client.shuffle), unroll, augment)
  if spec.epochs < 1 or spec.batch_size < 1:
    raise ValueError(f"client.epochs and client.batch_size must be >= 1, got {spec.epochs}, {spec.batch_size}")
  local_steps = num_local_steps(int(data.x_train.shape[1]), spec)  # one client program, padded to the largest
  warning = long_unroll_warning(unroll, local_steps)
  if warning:
    logger.warning(warning)
  attack_unroll = None
  if robust_eval is not None:  # the evaluation attacks' loops: unrolled only under the trap (or the env override)
    robust_eval = robust_eval_from_config(eval_cfg.get("robust"), unroll=eval_attack_unroll(trap))
  if objective.adversarial:  # one attack loop per local step: keep the unrolled client program compilable
    attack_steps = int(adversarial_cfg.steps)
    attack_unroll = training_attack_unroll(adversarial_cfg.get("unroll", "auto"), trap, local_steps, attack_steps)
    objective = objective_from_config(adversarial_cfg, attack_unroll)
    logger.info("training attack: %d local steps x %d attack steps per client program, attack loop unroll %s",
                local_steps, attack_steps, attack_unroll)
  strategy_name = config.engine.strategy
  if jax.process_count() > 1:  # jax.distributed: only a mesh over every process's devices shares the clients out
    if strategy_name not in ("auto", "shard_map"):
      raise ValueError(f"engine.strategy={strategy_name!r} in a run of {jax.process_count()} processes: every "
                       "process would run every client on its own devices; use shard_map (or auto)")
    strategy_name = "shard_map"
  elif strategy_name == "auto":
    strategy_name = default_strategy_name(backend, conv, jax.device_count())
  strategy = make_strategy(strategy_name, config.engine.num_devices or None)
  cohort = cohort_size(config, partitions)  # dataless attackers come on top of the benign partitions' share
  agg_cfg = config.get("aggregator")
  entry = algorithm_entry(config.algorithm.name)
  aggregator, server_data = None, None
  if entry.aggregates:  # always through a rule: the default `mean` rule also screens non-finite uploads
    aggregator = aggregator_from_config(agg_cfg if agg_cfg is not None else {"name": "mean"}, num_clients=cohort)
  elif not _is_default_mean(agg_cfg):
    raise ValueError(f"algorithm {config.algorithm.name!r} aggregates nothing with a server rule; leave "
                     "aggregator.name='mean' with no parameters")
  rule_needs = set(aggregator.needs) if aggregator is not None else set()
  if rule_needs & set(SERVER_DATA_NEEDS) or entry.server_data(config):
    server_data = server_dataset(clean, config.server, int(config.seed))

  def algorithm_with(hparams=None) -> FedAlgorithm:
    return make_algorithm(config, model, spec, aggregator, num_clients=data.num_clients, cohort=cohort,
                          attack=attack, malicious=malicious, hparams=hparams, client_attack=client_attack,
                          objective=objective)

  algorithm = algorithm_with()
  transform = None
  if attack is not None or field_attacks:
    transform = attacks.as_upload_transform(attack, malicious, fields=attack_fields, field_attacks=field_attacks)
  if dataless:  # all of them in every round, the rest of the cohort drawn from the benign partitions
    sampler = StratifiedSampler(dataless, cohort)
  else:
    sampler = sampler_from_config(config.get("sampler"), data.num_clients, cohort,
                                  attack_fraction=0.0 if malicious is None else float(malicious.mean()))
  simulator = Simulator(algorithm, data, model, strategy, cohort, upload_transform=transform,
                        eval_batch_size=int(config.engine.eval_batch_size), malicious=malicious, backdoor=backdoor,
                        server_data=server_data, sampler=sampler,
                        evaluators=evaluators, attack_data=attack_data,
                        eval_options={} if robust_eval is None else {"robust": robust_eval},
                        global_test_rows=global_test_rows(config, data),
                        dataless_weight=attack_cfg.get("dataless_weight", "mean") if dataless else None)
  return Experiment(config, data, module, params, algorithm, simulator, strategy_name, unroll, malicious, model_state,
                    algorithm_with, pretrain_records, local_steps, attack_unroll, trap)


# ------------------------------------------------------------------------------------------ run directory
def _jsonable(value):
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, (np.generic, jax.Array)):
    return np.asarray(value).tolist()
  return value


def strict_json(value):
  """``value`` with every non-finite float (NaN, ±inf) replaced by ``None``: strict JSON (RFC 8259 has no NaN), which
  ``json.dumps(..., allow_nan=False)`` then writes and every JSON reader parses. ``null`` in a summary or config
  thus means "not a number" (a diverged loss, a detection rate with no attacker in the cohort)."""
  if isinstance(value, dict):
    return {k: strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def dumps_strict(obj, **kwargs) -> str:
  """``obj`` as strict JSON (:func:`strict_json`; numpy and JAX values as lists and numbers)."""
  return json.dumps(strict_json(_jsonable(obj)), allow_nan=False, default=str, **kwargs)


def csv_row(record: dict) -> dict:
  """A per-round record's flat form for ``metrics.csv``: every scalar (numbers and booleans), plus
  ``flagged_clients`` as space-separated ids and their count ``num_flagged``. Per-client vectors (``client_acc``,
  ``cohort``, ``aggregation_weights``, ...) stay in ``metrics.jsonl`` only."""
  row = {k: v for k, v in record.items() if isinstance(v, (int, float, bool)) or v is None}
  if isinstance(record.get("flagged_clients"), list):
    row["flagged_clients"] = " ".join(str(i) for i in record["flagged_clients"])
    row["num_flagged"] = len(record["flagged_clients"])
  return row


class RunWriter:
  """Writes the run directory: config.json, partition.json, metrics.jsonl, metrics.csv, summary.json, and
  client_weights.npz for an algorithm that reports client x client weights (:meth:`log_client_weights`).

  ``metrics.jsonl`` holds each round's whole record (per-client vectors included); ``metrics.csv`` one row per round
  with every scalar any round logged (:func:`csv_row`): the header is the union of the rounds' keys, in the order they
  first appear, and the file is rewritten whole when a round brings a new one (an evaluated round after unevaluated
  ones, a detection field), so it is complete after every round. JSON files are strict (:func:`dumps_strict`: NaN and
  infinities as ``null``); ``metrics.jsonl`` keeps Python's ``NaN`` (each line a record ``json.loads`` reads back,
  which a resumed run does).

  ``records``: per-round records already logged (a resumed run's history), written first. ``weights_through``: the
  rounds of an existing ``client_weights.npz`` to keep (a resumed run's checkpoint round; 0 deletes an earlier
  run's file).
  """

  LEAD_FIELDS = ("round", "elapsed_s", "train_loss")  # first columns of metrics.csv; the rest in order of appearance

  def __init__(self, run_dir: Path, records: Iterable[dict] = (), tensorboard: bool = False, weights_through: int = 0):
    self.dir = Path(run_dir)
    self.dir.mkdir(parents=True, exist_ok=True)
    self._weights = client_weights.Log(self.dir / client_weights.FILE, weights_through)
    self._tb = None
    if tensorboard:  # before any file is opened: a missing tensorboardX fails the run at its start, with the fix
      from fedjax_robust.tensorboard_log import ScalarWriter
      self._tb = ScalarWriter(self.dir / "tb")
    self._jsonl = open(self.dir / "metrics.jsonl", "w")
    self._rows: list[dict] = []
    self._fields: list[str] = []
    self._csv_file = None
    self._csv = None
    for record in records:
      self.log_round(record)

  def write_json(self, name: str, obj) -> None:
    (self.dir / name).write_text(dumps_strict(obj, indent=2))

  def _open_csv(self) -> None:
    if self._csv_file is not None:
      self._csv_file.close()
    self._csv_file = open(self.dir / "metrics.csv", "w", newline="")
    self._csv = csv.DictWriter(self._csv_file, self._fields)
    self._csv.writeheader()

  def log_round(self, record: dict) -> None:
    record = _jsonable(record)
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    row = csv_row(record)
    self._rows.append(row)
    new = [k for k in row if k not in self._fields]
    if new or self._csv is None:
      self._fields = [k for k in self.LEAD_FIELDS if k in self._fields or k in row] + [
          k for k in (*self._fields, *new) if k not in self.LEAD_FIELDS]
      self._open_csv()
      self._csv.writerows(self._rows)
    else:
      self._csv.writerow(row)
    self._csv_file.flush()
    if self._tb is not None:
      self._tb.log(record)

  def log_client_weights(self, round_index: int, cohort, matrix) -> None:
    """Stores a round's ``[C, K]`` client x client weights in ``client_weights.npz``
    (:mod:`fedjax_robust.client_weights`)."""
    self._weights.add(round_index, cohort, matrix)

  def flush_client_weights(self) -> None:
    """Writes the client x client weights not on disk yet (after a checkpoint: a resumed run keeps them)."""
    self._weights.flush()

  def close(self) -> None:
    self._weights.flush()
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
    if self._csv_file is None:
      self._open_csv()  # a run directory always has a metrics.csv, even before its first round
    self._csv_file.close()


class SilentRunWriter(RunWriter):
  """What a process other than process 0 of a multi-process run writes: nothing (process 0 writes the run
  directory; every process computes the same records)."""

  def __init__(self, run_dir: Path, records: Iterable[dict] = (), tensorboard: bool = False, weights_through: int = 0):
    del records, tensorboard, weights_through
    self.dir = Path(run_dir)

  def write_json(self, name: str, obj) -> None:
    pass

  def log_round(self, record: dict) -> None:
    pass

  def log_client_weights(self, round_index: int, cohort, matrix) -> None:
    pass

  def flush_client_weights(self) -> None:
    pass

  def close(self) -> None:
    pass


def partition_record(data) -> dict:
  return {
      "dataset": data.name,
      "num_clients": data.num_clients,
      "num_classes": data.num_classes,
      "n_train": data.n_train.tolist(),
      "n_test": data.n_test.tolist(),
      "train_label_histograms": data.label_histograms("train").tolist(),
      "test_label_histograms": data.label_histograms("test").tolist(),
      "info": data.info,
  }


def round_record(round_index: int, metrics: dict) -> dict:
  """Host-side record of a round: every scalar metric, every per-client vector in cohort order (``cohort``,
  ``aggregation_weights``, FedCAP's ``calibrated_norms``, FedVSA's ``reported_loss`` and ``shapley_values``), and
  the ids of the clients the aggregator flagged.

  Per-client detector inputs are kept so thresholds can be recalibrated offline (FedCAP spec §6 item 13: T_norm =
  10 assumes the paper's models, data sizes and optimizer). Metrics of two or more dimensions are left out: the
  client x client ``client_weight_matrix`` goes to ``client_weights.npz`` (:meth:`RunWriter.log_client_weights`).
  """
  record: dict[str, Any] = {"round": round_index}
  for key, value in metrics.items():
    value = np.asarray(value)
    if value.ndim == 0:
      record[key] = value.item()
    elif value.ndim == 1:
      record[key] = (value.astype(np.float64) if value.dtype.kind == "f" else value).tolist()
  if "flagged" in metrics:
    record["flagged_clients"] = np.asarray(metrics["cohort"])[np.asarray(metrics["flagged"])].tolist()
  return record


# Config fields a resumed run may change: how long it runs and is evaluated, where and how it writes, and the
# engine (strategies compute the same rounds). Anything else would make the resumed run a different experiment.
RESUMABLE_CHANGES = ("rounds", "eval_every", "eval.", "output.", "engine.")


def resume_mismatches(stored: dict, current: dict) -> list[str]:
  """Dotted config keys on which a checkpointed run (``stored``) and the one resuming it (``current``) differ,
  other than those in :data:`RESUMABLE_CHANGES`."""
  a, b = traverse_util.flatten_dict(stored, sep="."), traverse_util.flatten_dict(current, sep=".")
  # A field added to the config after the run was stored, left at its default, is the behaviour the run had.
  defaults = traverse_util.flatten_dict(json.loads(default_config().to_json_best_effort()), sep=".")
  keys = sorted(set(a) | set(b))
  return [k for k in keys if a.get(k) != b.get(k) and not any(
      k == c or (c.endswith(".") and k.startswith(c)) for c in RESUMABLE_CHANGES)
      and not (k not in a and k in defaults and b.get(k) == defaults[k])]


def _resume_point(config, run_dir: Path, checkpointer, config_json: dict,
                  template: SimState) -> tuple[int, list[dict], SimState | None]:
  """``(completed rounds, their logged records, the restored state)`` to go on from; ``(0, [], None)`` when there
  is no checkpoint. A damaged newest checkpoint is skipped for the newest one that restores
  (:meth:`RunCheckpointer.restore_newest`: one warning line each; ``CheckpointError`` when none restores)."""
  latest = checkpointer.latest_round
  if latest is None:
    logger.info("resume: no checkpoint in %s, starting fresh", checkpointer.directory)
    return 0, [], None
  stored = json.loads((run_dir / "config.json").read_text())
  mismatched = resume_mismatches(stored, config_json)
  if mismatched:
    raise ValueError(f"cannot resume {run_dir}: its config differs on {mismatched} (only rounds, eval_every, "
                     "output.* and engine.* may change); use another run directory or resume=False")
  if latest > config.rounds:
    raise ValueError(f"cannot resume {run_dir} with rounds={config.rounds}: its checkpoint is after {latest} rounds")
  state = checkpointer.restore_newest(template)
  latest = int(state.round)
  metrics_path = run_dir / "metrics.jsonl"
  records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
  records = [r for r in records if r["round"] <= latest]  # rounds logged after the checkpoint are redone
  if [r["round"] for r in records] != list(range(1, latest + 1)):
    raise ValueError(f"cannot resume {run_dir}: {metrics_path} does not hold rounds 1..{latest}")
  logger.info("resuming %s after round %d of %d", run_dir, latest, config.rounds)
  return latest, records, state


def run_experiment(config: ml_collections.ConfigDict, run_dir: str | os.PathLike | None = None) -> dict:
  """Runs ``config.rounds`` rounds, evaluating every ``config.eval_every`` rounds and after the last one.

  With ``config.output.checkpoint_every`` > 0 the state is saved to ``<run_dir>/checkpoints`` every that many
  rounds and after the last; with ``config.output.resume`` a run directory holding a checkpoint goes on from it
  (its metrics files keep the rounds up to the checkpoint), which also extends a finished run to more rounds.
  ``wall_time_s`` in the summary then adds up every session; ``rounds_per_s`` is this session's rounds over its
  time. Returns the summary (also written to ``summary.json``).
  """
  if config.rounds < 1 or config.eval_every < 1:
    raise ValueError(f"rounds and eval_every must be >= 1, got {config.rounds}, {config.eval_every}")
  if config.output.checkpoint_every < 0:
    raise ValueError(f"output.checkpoint_every must be >= 0, got {config.output.checkpoint_every}")
  from fedjax_robust.plots import parse_references
  try:
    parse_references(config.output.get("reference", ""))
  except ValueError as e:
    raise ValueError(f"output.reference: {e}") from None
  from fedjax_robust.run import eval_rounds
  evaluated = set(eval_rounds(int(config.rounds), int(config.eval_every),
                              int(config.get("eval", {}).get("last_rounds", 0))))
  stop_at = float(config.get("eval", {}).get("stop_at", 0.0))
  if jax.process_count() > 1:  # jax.distributed (experiments/run.py --distributed): see README "More than one host"
    if config.get("seeds") or config.get("grid"):
      raise ValueError("seeds/grid programs vmap the whole run on one process's devices; a multi-process run takes "
                       "one seed (unset seeds and grid, or run them one process group each)")
    if config.output.checkpoint_every > 0 or config.output.resume:
      raise ValueError("output.checkpoint_every and output.resume are single-process only: a multi-process run "
                       "writes no checkpoints (set output.checkpoint_every=0 and output.resume=False)")
  if config.get("seeds") or config.get("grid"):
    if stop_at:
      raise ValueError("eval.stop_at stops a one-seed run; a seeds/grid program runs every round (unset one)")
    from fedjax_robust.run import run_seeds  # several seeds / grid points: one vmapped program
    return run_seeds(config, run_dir)
  exp = build_experiment(config)
  if run_dir is None:
    name = config.output.name or f"{config.data.name}_{config.algorithm.name}_{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(config.output.dir) / name
  run_dir = Path(run_dir)
  config_json = json.loads(config.to_json_best_effort())
  checkpoint_dir = run_dir / "checkpoints"
  primary = is_primary()  # process 0 writes the run directory; the others compute the same rounds and write nothing
  if not config.output.resume and primary:
    remove_checkpoints(checkpoint_dir)  # a fresh run must never be resumed from an earlier run's state
  checkpointer = None
  if config.output.checkpoint_every > 0 or config.output.resume:
    checkpointer = RunCheckpointer(checkpoint_dir, config.output.checkpoint_every)
  start, history, restored = (_resume_point(config, run_dir, checkpointer, config_json, exp.init_state())
                               if config.output.resume else (0, [], None))
  # Resumed at its last round, a run has nothing left to run but re-logs that round with an evaluation (below).
  writer_cls = RunWriter if primary else SilentRunWriter
  writer = writer_cls(run_dir, history[:-1] if start == config.rounds else history,
                      tensorboard=bool(config.output.get("tensorboard", False)), weights_through=start)
  writer.write_json("config.json", config_json)
  writer.write_json("partition.json", partition_record(exp.data))
  if exp.malicious is not None:
    writer.write_json("malicious.json", {"malicious_clients": np.flatnonzero(exp.malicious).tolist(),
                                         "poisoning": exp.data.info.get("poisoning")})
  if exp.pretrain is not None:
    writer.write_json("pretrain.json", {"rounds": len(exp.pretrain), "algorithm": "fedavg", "records": exp.pretrain})
  sim = exp.simulator
  logger.info("devices: %s | backend %s | strategy %s | unroll %s | cohort %d of %d clients",
              jax.devices(), jax.default_backend(), exp.strategy, exp.unroll, sim.cohort_size, sim.num_clients)
  logger.info("run directory: %s", writer.dir)

  state = exp.init_state() if restored is None else restored
  earlier_s = history[-1]["elapsed_s"] if history else 0.0  # wall time of the sessions before this one
  t0 = time.perf_counter()
  bar = None
  if config.output.progress and primary:
    from tqdm.auto import tqdm
    bar = tqdm(total=config.rounds, initial=start, unit="round", dynamic_ncols=True)
  record: dict[str, Any] = history[-1] if history else {}
  stopped_at = None
  for t in range(start + 1, config.rounds + 1):
    state, metrics = sim.run_round(state)
    if t not in evaluated:  # the client x client weights are stored for evaluated rounds: no transfer otherwise
      metrics = {k: v for k, v in metrics.items() if k != client_weights.KEY}
    metrics = to_host(metrics)
    record = round_record(t, metrics)
    if t in evaluated:
      record.update(sim.evaluate(state))
    record["elapsed_s"] = earlier_s + time.perf_counter() - t0
    if not math.isfinite(record["train_loss"]):
      logger.warning("round %d: train loss is %s", t, record["train_loss"])
    writer.log_round(record)  # logged before the checkpoint: a checkpoint's rounds are always in the metrics
    if client_weights.KEY in metrics:
      writer.log_client_weights(t, metrics["cohort"], metrics[client_weights.KEY])
    history.append(record)
    if stop_at and record.get("global_test_acc", -1.0) >= stop_at:
      stopped_at = t
    if config.output.checkpoint_every > 0:
      if checkpointer.save(state, force=t == config.rounds or stopped_at is not None):
        writer.flush_client_weights()  # what a run resumed from this checkpoint keeps
    if bar is not None:
      bar.update(1)
      postfix = {"loss": f"{record['train_loss']:.3f}"}
      for key in ("global_test_acc", "client_acc_mean"):
        if key in record:
          postfix[key.replace("_test", "").replace("client_acc_mean", "client_acc")] = f"{record[key]:.3f}"
      bar.set_postfix(postfix)
    if stopped_at is not None:
      logger.info("round %d: global_test_acc %.4f >= eval.stop_at %.4f, stopping", t, record["global_test_acc"],
                  stop_at)
      break
  if start == config.rounds:  # that round may not have been an evaluated one
    record.update(sim.evaluate(state))
    writer.log_round(record)
  if bar is not None:
    bar.close()
  if checkpointer is not None:
    checkpointer.close()
  session_s = time.perf_counter() - t0
  final = {k: v for k, v in record.items() if not k.endswith("client_acc")}
  summary = {
      "final": final,
      "final_client_acc": record.get("client_acc"),
      "rounds": config.rounds if stopped_at is None else stopped_at,
      "stopped_at_round": stopped_at,  # eval.stop_at reached (None: ran every round)
      "resumed_from_round": start,
      "wall_time_s": earlier_s + session_s,
      "rounds_per_s": ((stopped_at or config.rounds) - start) / session_s if config.rounds > start else None,
      "strategy": exp.strategy,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "run_dir": str(writer.dir),
  }
  if jax.process_count() > 1:
    summary["processes"] = jax.process_count()
  writer.write_json("summary.json", summary)
  writer.close()
  if config.output.get("plots", True) and primary:
    write_plots(writer.dir)
  return summary


def write_plots(run_dir: Path, compare: Iterable[Path] = ()) -> list[Path]:
  """The run's figures in ``<run_dir>/plots`` (``output.plots``; with ``compare``, those runs' curves overlaid
  instead). Without matplotlib: one log line, no figures. A figure that fails to draw costs the run nothing (its
  metrics and summary are written already): one warning line, and ``experiments/plot.py`` can redraw it."""
  from fedjax_robust import plots
  if not plots.matplotlib_available():
    logger.info("output.plots: matplotlib is not installed (pip install -e \".[plots]\"), so no plots were written")
    return []
  try:
    compare = list(compare)
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else None
    paths = (plots.write_comparison_plots(compare, run_dir / "plots", references=plots.config_references(config))
             if compare else plots.write_run_plots(run_dir))
  except Exception as e:  # noqa: BLE001
    logger.warning("output.plots: drawing the plots of %s failed (%s: %s); experiments/plot.py %s retries",
                   run_dir, type(e).__name__, e, run_dir)
    return []
  logger.info("plots: %s (%d files)", run_dir / "plots", len(paths))
  return paths
