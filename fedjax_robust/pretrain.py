"""Pre-training (FedVSA spec §4.6, A9): a short plain-FedAvg warm start shared by every method.

``init.pretrain_rounds = R_pre > 0``: before the run's own algorithm starts, :func:`pretrain` runs R_pre rounds of
plain FedAvg on the same federated data, with the same seed (so the same initial model and run key), the same
client optimizer and local training, and the same cohort size with uniform sampling; the global model it ends
with (and its non-trainable state, e.g. BatchNorm statistics) is the initial model of the run. In other words the
warm start IS the R_pre-round FedAvg run of this config (``tests/test_fedvsa_data.py`` checks that).

"Plain" FedAvg: algorithm ``fedavg``, the sample-weighted ``mean`` rule, server SGD with lr 1 and no momentum, the
CE objective, no attack (pre-training runs on the clean data) and no forced clients. With data dynamics (the α
setting) only the base labels exist: every client holds its base rows only (``n_train = n_base``), i.e. the data
before any reveal.

Round counting starts after it: the run's round 1 is round 1 in the metrics (and #R is counted from there, spec
§4.5). The run's round keys start again from round 0 of the same run key, so its first rounds sample the same
cohorts as the pre-training's did. A resumed run recomputes the warm start (deterministic, then replaced by the
checkpoint).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any

import ml_collections
import numpy as np

logger = logging.getLogger("fedjax_robust")


def pretrain_rounds(config) -> int:
  """``init.pretrain_rounds`` (0 when the config has no ``init`` block); checked."""
  init = config.get("init") if hasattr(config, "get") else None
  rounds = 0 if init is None else init.get("pretrain_rounds", 0)
  rounds = 0 if rounds is None else rounds
  if int(rounds) != rounds or rounds < 0:
    raise ValueError(f"init.pretrain_rounds must be an integer >= 0, got {rounds}")
  return int(rounds)


def pretrain_config(config: ml_collections.ConfigDict, rounds: int) -> ml_collections.ConfigDict:
  """The plain-FedAvg config of the warm start: ``config`` with the algorithm, server rule, weighting and optimizer,
  objective, attack, sampler and evaluation replaced, ``rounds`` rounds and no pre-training of its own."""
  from fedjax_robust.adversarial import adversarial_config
  c = copy.deepcopy(config)
  with c.unlocked():
    c.rounds = int(rounds)
    c.seeds, c.grid = "", ""
    c.algorithm.name = "fedavg"
    c.aggregator = ml_collections.ConfigDict({"name": "mean"})
    c.server.optimizer, c.server.lr, c.server.momentum = "sgd", 1.0, 0.0
    if "weighting" in c.server:
      c.server.weighting.name = "rule"
    c.adversarial = adversarial_config()
    if "attack" in c:
      c.attack.name = "none"
      c.attack.data.kind = "none"
      c.attack.client.name = "none"
    if "sampler" in c:
      c.sampler.name, c.sampler.forced = "uniform", ""
    if "eval" in c:
      c.eval.metrics = "accuracy"
    if "init" in c:
      c.init.pretrain_rounds = 0
  return c


def base_data(data):
  """``data`` as it is before any reveal: with a data-dynamics schedule, every client holds its base rows only."""
  schedule = getattr(data, "train_schedule", None)
  if schedule is None:
    return data
  n_base = np.minimum(np.asarray(schedule.n_base), np.asarray(data.n_train)).astype(data.n_train.dtype)
  return dataclasses.replace(data, n_train=n_base, train_schedule=None)


def pretrain(config: ml_collections.ConfigDict, data, rounds: int | None = None) -> tuple[Any, dict, list[dict]]:
  """Runs the warm start on ``data`` (the clean federated data); returns ``(params, model_state, records)``:
  the FedAvg global model after ``rounds`` (default ``init.pretrain_rounds``) rounds and each round's train loss."""
  from fedjax_robust.execution import to_host
  from fedjax_robust.experiment import build_experiment
  from fedjax_robust.models.interface import split_variables
  rounds = pretrain_rounds(config) if rounds is None else int(rounds)
  if rounds < 1:
    raise ValueError(f"pretrain needs rounds >= 1, got {rounds}")
  exp = build_experiment(pretrain_config(config, rounds), data=base_data(data))
  state = exp.init_state()
  records = []
  for t in range(1, rounds + 1):
    state, metrics = exp.simulator.run_round(state)
    loss = float(to_host(metrics["train_loss"]))  # a global array in a multi-process run
    records.append({"round": t, "train_loss": loss})
    if not math.isfinite(loss):
      logger.warning("pre-training round %d: train loss is %s", t, loss)
  logger.info("pre-training: %d rounds of FedAvg, train loss %.4f -> %.4f", rounds, records[0]["train_loss"],
              records[-1]["train_loss"])
  params, model_state = split_variables(exp.algorithm.global_params(state.server))
  return params, model_state, records
