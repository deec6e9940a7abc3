"""The round engine: sample a cohort, gather, run the client kernel on the client axis, aggregate, scatter.

State is one :class:`SimState` whose ``clients`` field stacks every client's
persistent state along a leading axis of size K. A round samples a fixed-size
cohort (static shapes), gathers its states and padded data, maps the
algorithm's one-client ``client_update`` over the cohort with the chosen
execution strategy, lets an optional upload transform (attacks) act on the
stacked uploads, and calls ``server_update``. With a traceable strategy
(``vmap``/``shard_map``) the whole round is ONE jitted program; the sequential
reference jits the prepare and finish phases around a Python loop.

Randomness (DESIGN invariant 4): the run key splits into a training key and an
evaluation key; round ``t`` uses ``fold_in(train_key, t)``, split into cohort,
client and server keys; client ``k`` uses ``fold_in(client_key, k)``, so its
randomness does not depend on the strategy or on which other clients were
sampled.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.client import ClientData
from fedjax_robust.compilation import jit
from fedjax_robust.data.dynamics import TrainSchedule, revealed_counts
from fedjax_robust.execution import VmapStrategy, is_traceable, to_host
from fedjax_robust.metrics import count_correct
from fedjax_robust.metrics.evaluation import score_models
from fedjax_robust.metrics.evaluators import EVALUATORS, PURE_EVALUATORS, accuracy_record, resolve_evaluators
from fedjax_robust.metrics.security import attack_success_rate, backdoor_confidence, detection_rates
from fedjax_robust.models.interface import Model, as_model
from fedjax_robust.round_context import RoundContext
from fedjax_robust.sampling import CohortSampler, UniformSampler, sample_cohort  # noqa: F401 (re-export)

PyTree = Any
# transform(uploads, cohort, key, context: RoundContext) -> uploads: the hook where attacks act on the stacked
# uploads (any of their fields).
UploadTransform = Callable[[PyTree, jax.Array, jax.Array, RoundContext], PyTree]


class SimState(NamedTuple):
  round: jax.Array  # int32 scalar: number of completed rounds
  server: PyTree
  clients: PyTree  # leading axis K on every leaf
  key: jax.Array  # the run key (constant): see round_keys / eval_key


class RunInputs(NamedTuple):
  """Everything a run reads that is data rather than program: an argument of every compiled round and
  evaluation, never a closure, so the same program serves several seeds' partitions, attackers and server
  sets stacked on a leading axis (:mod:`fedjax_robust.run`)."""

  train: ClientData  # [K, n_max, ...]
  test: ClientData  # [K, n_test_max, ...]
  global_test: tuple  # (x [N, ...], y [N])
  malicious: jax.Array  # [K] bool (all False without an attack)
  server_data: Optional[ClientData] = None  # FLTrust's root set, FLARE's auxiliary set, FedVSA's validation set
  backdoor_x: Optional[jax.Array] = None  # the triggered global test inputs (backdoor / DBA runs)
  backdoor_target: Optional[jax.Array] = None  # int32 scalar: the backdoor's target label
  attack_data: Optional[ClientData] = None  # a client-side attack's own data (FedCC's D_mal)
  # Data dynamics (FedVSA Table 5): how many of each client's training rows exist at each round; None = all.
  train_schedule: Optional[TrainSchedule] = None


class _Prepared(NamedTuple):
  cohort: jax.Array
  payload: PyTree
  client_states: PyTree
  data: ClientData
  client_keys: jax.Array
  weights: jax.Array
  aux_key: jax.Array
  server_key: jax.Array


TRAIN_STREAM, EVAL_STREAM = 0, 1
# Folded into a round's client and server keys for the review phase (``client_report`` / ``server_review``).
REVIEW_STREAM = 1


def round_keys(run_key: jax.Array, round_index) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """``(cohort, client, aux, server)`` keys of round ``round_index``; client k uses ``fold_in(client, k)``."""
  round_key = jax.random.fold_in(jax.random.fold_in(run_key, TRAIN_STREAM), round_index)
  return tuple(jax.random.split(round_key, 4))


def eval_key(run_key: jax.Array, round_index) -> jax.Array:
  """Key of the evaluation after ``round_index`` rounds (used e.g. by FedAvg-FT's fine-tuning shuffles)."""
  return jax.random.fold_in(jax.random.fold_in(run_key, EVAL_STREAM), round_index)


def _gather(tree: PyTree, idx: jax.Array) -> PyTree:
  return jax.tree.map(lambda a: a[idx], tree)


def _scatter(tree: PyTree, idx: jax.Array, values: PyTree) -> PyTree:
  return jax.tree.map(lambda a, v: a.at[idx].set(v), tree, values)


def stack_clients(tree: PyTree, num_clients: int) -> PyTree:
  """Broadcasts one client's state to a ``[K, ...]`` stack."""
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + jnp.shape(a)), tree)


def _to_client_data(x: np.ndarray, y: np.ndarray, n: np.ndarray) -> ClientData:
  return ClientData(jnp.asarray(x), jnp.asarray(y, jnp.int32), jnp.asarray(n, jnp.int32))


class Simulator:
  """Runs an :class:`FedAlgorithm` on a :class:`~fedjax_robust.data.FederatedData`.

  Args:
    algorithm: the FL algorithm.
    data: the federated dataset (numpy arrays; moved to device once here). With a ``train_schedule`` (data
      dynamics), round t trains on each client's first ``n_t`` rows (:meth:`train_at`); test sets are unchanged.
    model: the :class:`~fedjax_robust.models.Model` scored at evaluation (a plain
      ``(params, x) -> logits`` function is accepted too).
    strategy: execution strategy of the client axis (default ``vmap``).
    cohort_size: clients per round (fixed, so shapes are static); default all.
    upload_transform: optional ``(uploads, cohort, key, context) -> uploads`` (attacks).
    malicious: optional ``[K]`` bool, the attacker-controlled clients: evaluation
      then also reports accuracy over benign clients only, and rounds whose
      aggregator flags clients report detection rates against it.
    backdoor: optional ``(triggered_inputs, target_label)``: evaluation then
      reports the global model's attack success rate (share classified as the
      target) and backdoor confidence (mean softmax probability of the target).
    attack_data: optional :class:`ClientData` of a client-side attack (FedCC's mislabelled D_mal), handed to the
      algorithm's ``malicious_update``, which the cohort's attackers run instead of ``client_update``.
    eval_batch_size: rows scored per batch during evaluation.
    server_data: optional :class:`ClientData` held by the server (FLTrust's root set, FLARE's auxiliary set,
      FedVSA's validation set): an argument of every round (``RoundContext.server_data``), not a constant.
    sampler: the :class:`~fedjax_robust.sampling.CohortSampler` (default uniform; eligibility from the
      algorithm's ``sampling_mask``; forced clients at given rounds).
    evaluators: names from :mod:`fedjax_robust.metrics.evaluators` (default ``"auto"``: accuracy, plus
      backdoor with a backdoor).
    eval_options: per-evaluator settings, e.g. ``{"robust": RobustEvalSpec}`` (the attacks of the ``robust``
      evaluator; default FGSM, BIM, PGD, CW at ε = 8/255).
    global_test_rows: optional indices of the global test rows the evaluators score the global model on (default
      all): a cheaper ``global_test_acc`` for long CPU runs whose metric is the clients' own accuracy.
    dataless_weight: the aggregation weight of cohort attackers that hold no data (``n = 0``: the dataless attackers
      of FedCC's code, :func:`~fedjax_robust.data.federated.with_dataless_clients`): ``"mean"`` = the mean weight of
      the cohort's benign members with data, or a positive number; ``None`` (default) = their sample count, 0,
      which every rule reads as "must not count" (:func:`nominal_weights`).
  """

  def __init__(self, algorithm: FedAlgorithm, data, apply_fn, strategy=None, cohort_size: Optional[int] = None,
               upload_transform: Optional[UploadTransform] = None, eval_batch_size: int = 1024,
               malicious: Optional[np.ndarray] = None, backdoor: Optional[tuple[np.ndarray, int]] = None,
               server_data: Optional[ClientData] = None, sampler: Optional[CohortSampler] = None,
               evaluators=None, attack_data: Optional[ClientData] = None, eval_options: Optional[dict] = None,
               global_test_rows: Optional[np.ndarray] = None, dataless_weight: Optional[str | float] = None):
    self.algorithm = algorithm
    self.dataless_weight = check_nominal_weight(dataless_weight)
    self.eval_options = dict(eval_options or {})
    self.model: Model = as_model(apply_fn)
    self.apply_fn = self.model.logits  # (params or variables, x) -> eval-mode logits
    self.strategy = strategy or VmapStrategy()
    self.sampler = sampler or UniformSampler()
    self.num_clients = int(data.x_train.shape[0])
    self.cohort_size = self.num_clients if cohort_size is None else int(cohort_size)
    if not 1 <= self.cohort_size <= self.num_clients:
      raise ValueError(f"cohort_size must be in [1, {self.num_clients}], got {self.cohort_size}")
    self.upload_transform = upload_transform
    self.malicious = None if malicious is None else np.asarray(malicious, bool)
    if self.malicious is not None and self.malicious.shape != (self.num_clients,):
      raise ValueError(f"malicious must be a [{self.num_clients}] bool mask, got shape {self.malicious.shape}")
    self.eval_batch_size = int(eval_batch_size)
    self.train = _to_client_data(data.x_train, data.y_train, data.n_train)
    self.test = _to_client_data(data.x_test, data.y_test, data.n_test)
    rows = slice(None) if global_test_rows is None else np.asarray(global_test_rows)
    self.global_test = (jnp.asarray(data.x_global_test[rows]), jnp.asarray(data.y_global_test[rows], jnp.int32))
    self.backdoor = None if backdoor is None else (jnp.asarray(backdoor[0]), int(backdoor[1]))
    self.evaluators = resolve_evaluators(evaluators, self.backdoor is not None)
    self.server_data = None if server_data is None else ClientData(
        jnp.asarray(server_data.x), jnp.asarray(server_data.y, jnp.int32), jnp.asarray(server_data.n, jnp.int32))
    self.attack_data = None if attack_data is None else ClientData(
        jnp.asarray(attack_data.x), jnp.asarray(attack_data.y, jnp.int32), jnp.asarray(attack_data.n, jnp.int32))
    schedule = getattr(data, "train_schedule", None)
    self.train_schedule = None if schedule is None else TrainSchedule(
        jnp.asarray(schedule.n_base, jnp.int32), jnp.asarray(schedule.delta, jnp.int32),
        jnp.asarray(schedule.start_round, jnp.int32))
    # Slots of the malicious kernel: attackers in a cohort, at most (static, so the same for every seed).
    self.attack_slots = 0
    if algorithm.malicious_update is not None:
      if self.malicious is None or self.attack_data is None:
        raise ValueError("the algorithm has a client-side attack: give the simulator malicious and attack_data")
      if algorithm.uses_client_ids:
        raise ValueError("client-side attacks run on algorithms with one broadcast payload (the FedAvg family)")
      self.attack_slots = min(int(self.malicious.sum()), self.cohort_size)
    if (algorithm.client_report is None) != (algorithm.server_review is None):
      raise ValueError("a review phase needs both client_report and server_review (algorithms/base.py)")
    if algorithm.server_review is not None and algorithm.uses_client_ids:
      raise ValueError("a review phase runs on algorithms with one broadcast payload (the FedAvg family)")
    place = getattr(self.strategy, "place_clients", None)
    if place is not None:  # shard the per-client data over the mesh under shard_map (identity otherwise)
      self.train, self.test = place(self.train), place(self.test)
    self._malicious_dev = jnp.zeros((self.num_clients,), bool) if self.malicious is None else jnp.asarray(
        self.malicious)
    self._build()

  def with_algorithm(self, algorithm: FedAlgorithm) -> "Simulator":
    """This simulator running another build of the same algorithm (same state structure), e.g. one whose
    hyperparameters are tracers inside a grid program (``fedjax_robust.run``)."""
    import copy
    other = copy.copy(self)
    other.algorithm = algorithm
    other._build()
    return other

  @property
  def inputs(self) -> RunInputs:
    """This simulator's data as the :class:`RunInputs` argument of its compiled functions."""
    return RunInputs(self.train, self.test, self.global_test, self._malicious_dev, self.server_data,
                     None if self.backdoor is None else self.backdoor[0],
                     None if self.backdoor is None else jnp.asarray(self.backdoor[1], jnp.int32), self.attack_data,
                     self.train_schedule)

  # ----------------------------------------------------------------------------------- state
  def init(self, params: PyTree, seed: int | jax.Array = 0, model_state: Optional[dict] = None) -> SimState:
    """The initial state: every client starts from ``params`` (and the server too).

    ``model_state``: the model's non-trainable collections (BatchNorm statistics) from ``model.init``;
    ``params`` may also be the whole variable dict ``{"params", "batch_stats"}``.
    """
    if isinstance(params, dict) and "params" in params:
      params, model_state = params["params"], {k: v for k, v in params.items() if k != "params"}
    key = jax.random.key(seed) if isinstance(seed, int) else seed
    extra = (model_state,) if model_state else ()
    if self.model.stateful and not extra:
      raise ValueError(f"the model has state {self.model.state_collections}: pass model_state to init")
    clients = stack_clients(self.algorithm.init_client(params, *extra), self.num_clients)
    server = self.algorithm.init_server(params, *extra)
    round_index = jnp.zeros((), jnp.int32)
    if hasattr(self.strategy, "place_clients"):  # shard_map: clients sharded over the mesh, the server replicated
      clients = self.strategy.place_clients(clients)
      # The round counter and run key too: placed as a round's outputs are, round 2 reuses round 1's program.
      server, round_index, key = self.strategy.place_replicated((server, round_index, key))
    return SimState(round_index, server, clients, key)

  # ----------------------------------------------------------------------------------- rounds
  @staticmethod
  def train_at(inputs: RunInputs, fl_round) -> ClientData:
    """The training data as of FL round ``fl_round`` (1-indexed; 0 = before round 1): with a data-dynamics
    schedule, client k's ``n`` is the length of the prefix of its rows revealed by then
    (:func:`~fedjax_robust.data.dynamics.revealed_counts`), the rest being padding to the local loop."""
    if inputs.train_schedule is None:
      return inputs.train
    return inputs.train._replace(n=revealed_counts(inputs.train.n, inputs.train_schedule, fl_round))

  def _prepare(self, state: SimState, train: ClientData, malicious: Optional[jax.Array] = None,
               attack_data: Optional[ClientData] = None) -> _Prepared:
    """The round's cohort, payload, data, keys and aggregation weights (sample counts). With a client-side attack
    whose data replaces the attacker's own (``malicious_weight``, given ``attack_data``), the cohort's attackers
    weigh what that data holds, not their partition slot's count."""
    cohort_key, client_key, aux_key, server_key = round_keys(state.key, state.round)
    malicious = self._malicious_dev if malicious is None else malicious
    mask_fn = self.algorithm.sampling_mask
    cohort = self.sampler.sample(cohort_key, state.round, self.num_clients, self.cohort_size,
                                 None if mask_fn is None else mask_fn(state.server),
                                 malicious=None if self.malicious is None else malicious)
    data = _gather(train, cohort)
    client_keys = jax.vmap(lambda c: jax.random.fold_in(client_key, c))(cohort)
    payload = self._broadcast(state.server, cohort, malicious)
    weights = data.n.astype(jnp.float32)
    weigh = self.algorithm.malicious_weight
    if self.attack_slots and weigh is not None and attack_data is not None:
      weights = jnp.where(malicious[cohort], jnp.asarray(weigh(attack_data), weights.dtype), weights)
    if self.dataless_weight is not None:
      weights = nominal_weights(weights, malicious[cohort], self.dataless_weight)
    return _Prepared(cohort, payload, _gather(state.clients, cohort), data, client_keys, weights, aux_key,
                     server_key)

  def _broadcast(self, server: PyTree, client_ids: jax.Array, malicious: jax.Array) -> PyTree:
    """The payload: one tree for everyone, or ``(shared, per_client [C, ...])`` for ``uses_client_ids``
    (given the run's ``[K]`` malicious mask too with ``uses_malicious``)."""
    if self.algorithm.uses_malicious:  # without a run mask, the algorithm's own (given when it was built)
      return self.algorithm.broadcast(server, client_ids, None if self.malicious is None else malicious)
    if self.algorithm.uses_client_ids:
      return self.algorithm.broadcast(server, client_ids)
    return self.algorithm.broadcast(server)

  def _map_clients(self, prep: _Prepared) -> ClientOutput:
    if self.algorithm.uses_client_ids:
      shared, per_client = prep.payload
      return self.strategy.map(self._addressed_update, (None, 0, 0, 0, 0), shared, per_client, prep.client_states,
                               prep.data, prep.client_keys)
    return self.strategy.map(self.algorithm.client_update, (None, 0, 0, 0), prep.payload, prep.client_states,
                             prep.data, prep.client_keys)

  def _addressed_update(self, shared, own, client_state, data, key) -> ClientOutput:
    return self.algorithm.client_update((shared, own), client_state, data, key)

  def round_context(self, state: SimState, prep: _Prepared, inputs: RunInputs) -> RoundContext:
    """The typed context of this round (``fedjax_robust.round_context``)."""
    global_params = self.algorithm.global_params(state.server)
    if isinstance(global_params, dict) and "params" in global_params:
      global_params = global_params["params"]  # rules and attacks see trainable parameters only
    malicious = None if self.malicious is None else inputs.malicious[prep.cohort]
    return RoundContext(state.round, prep.cohort, malicious, prep.weights, global_params, inputs.server_data)

  def _client_reports(self, prep: _Prepared, inputs: RunInputs) -> PyTree:
    """Every cohort client's ``client_report`` on the payload it received (the review phase); the cohort's
    attackers report ``malicious_report`` instead, in the attack slots as in :meth:`_client_outputs`. Each client's
    key is its training key folded with :data:`REVIEW_STREAM`, so reporting draws nothing from training's keys."""
    alg = self.algorithm
    keys = jax.vmap(lambda k: jax.random.fold_in(k, REVIEW_STREAM))(prep.client_keys)
    reports = self.strategy.map(alg.client_report, (None, 0, 0, 0), prep.payload, prep.client_states, prep.data,
                                keys)
    if not self.attack_slots:
      return reports
    return self._in_attack_slots(reports, self._attacker_report, prep, inputs, keys)

  def _review(self, state: SimState, prep: _Prepared, reports: PyTree, inputs: RunInputs):
    """The server's review of the cohort's reports (``server_review``): the reviewed state, the round's payload
    broadcast again from it (the cohort trains from what the review left), and the review's diagnostics."""
    fields = getattr(self.upload_transform, "fields", ())
    if isinstance(reports, dict) and set(fields) & set(reports):
      raise ValueError(f"the upload attack poisons {sorted(set(fields) & set(reports))}, which clients report in "
                       "the review phase, where upload attacks do not act; attack the training phase's fields only")
    context = self.round_context(state, prep, inputs)
    server, diagnostics = self.algorithm.server_review(state.server, reports, prep.weights,
                                                       jax.random.fold_in(prep.server_key, REVIEW_STREAM), context)
    payload = self._broadcast(server, prep.cohort, inputs.malicious)
    return state._replace(server=server), prep._replace(payload=payload), diagnostics

  def _finish(self, state: SimState, prep: _Prepared, out: ClientOutput, inputs: RunInputs,
              review: Optional[dict] = None):
    uploads = out.upload
    context = self.round_context(state, prep, inputs)
    if self.upload_transform is not None:
      uploads = self.upload_transform(uploads, prep.cohort, prep.aux_key, context)
    extra = (prep.cohort,) if self.algorithm.uses_client_ids else ()
    kwargs = {"context": context} if self.algorithm.uses_context else {}
    server, diagnostics = self.algorithm.server_update(state.server, uploads, prep.weights, prep.server_key, *extra,
                                                       **kwargs)
    clients = _scatter(state.clients, prep.cohort, out.state)
    if hasattr(self.strategy, "keep_placement"):  # shard_map: leave the round as init placed the state
      server, clients = self.strategy.keep_placement(server, clients)
    steps = out.metrics["steps"]
    metrics = {
        "train_loss": _step_weighted_mean(out.metrics["loss"], steps),
        "local_steps": jnp.sum(steps),
        "cohort": prep.cohort,
        **(review or {}),
        **diagnostics,
    }
    if self.malicious is not None:
      # The attackers' own training is discarded by the attack, and may diverge (e.g. a drifting customized model
      # under FedCAP without detection), so the benign clients' loss is the one to watch.
      benign_steps = jnp.where(context.malicious, 0, steps)
      metrics["benign_train_loss"] = _step_weighted_mean(out.metrics["loss"], benign_steps)
    if self.malicious is not None and "flagged" in diagnostics:
      rates = detection_rates(diagnostics["flagged"], context.malicious)
      metrics.update({f"detection_{k}": v for k, v in rates.items()})
    return SimState(state.round + 1, server, clients, state.key), metrics

  def _build(self):
    # What an attacker reports in the review phase: its own malicious_report, else client_report on the attack's
    # data. Built once, so the sequential strategy's per-function cache compiles it once.
    alg = self.algorithm
    self._attacker_report = alg.malicious_report or (
        None if alg.client_report is None else functools.partial(_report_on_attack_data, alg.client_report))
    if is_traceable(self.strategy):
      self._round = jit(self.round_step)
    else:
      # The same phases, each its own program; the client maps between them run client by client.
      self._round = functools.partial(self._play_round, prepare=jit(self._prepare), review=jit(self._review),
                                      finish=jit(self._finish))
    self._eval_clients = self._build_client_eval()
    self._eval_global = jit(functools.partial(count_correct, self.apply_fn, batch_size=self.eval_batch_size))

    def backdoor_metrics(params, x, target):
      logits = jax.lax.map(lambda xb: self.apply_fn(params, xb[None])[0], x, batch_size=self.eval_batch_size)
      return (attack_success_rate(jnp.argmax(logits, -1), target), backdoor_confidence(logits, target))

    self._eval_backdoor = jit(backdoor_metrics)

    # The global model on every client's test split: one model, K datasets (the many-model kernel with the
    # model broadcast; a plain vmap over data, no grouped conv).
    def global_on_clients(params, test):
      models = jax.tree.map(lambda a: a[None], params)
      scores = jax.vmap(lambda x, y, n: score_models(self.apply_fn, models, x, y, n,
                                                    batch_size=self.eval_batch_size))(test.x, test.y, test.n)
      return scores.correct[:, 0], scores.count[:, 0]

    self._eval_global_on_clients = jit(global_on_clients)
    evaluators = {name: functools.partial(EVALUATORS[name], self) for name in self.evaluators}
    if not is_traceable(self.strategy):  # no whole evaluation program: each pure evaluator is one, compiled once
      evaluators = {name: jit(fn) if name in PURE_EVALUATORS else fn for name, fn in evaluators.items()}
    self._evaluators = evaluators
    self._evaluate_raw = jit(self.evaluation_step) if is_traceable(self.strategy) else self.evaluation_step

  def round_step(self, state: SimState, inputs: RunInputs) -> tuple[SimState, dict]:
    """One round as a pure traceable function of ``(state, inputs)`` (traceable strategies only): what
    :meth:`run_round` compiles and :func:`fedjax_robust.run.make_run` scans."""
    return self._play_round(state, inputs, self._prepare, self._review, self._finish)

  def _play_round(self, state: SimState, inputs: RunInputs, prepare, review, finish) -> tuple[SimState, dict]:
    """A round's phases in order: prepare, the review phase when the algorithm has one, the clients, finish.
    ``round_step`` passes the phases themselves (one traced program); the sequential strategy their jitted
    versions."""
    prep = prepare(state, self.train_at(inputs, state.round + 1), inputs.malicious, inputs.attack_data)
    reviewed = None
    if self.algorithm.server_review is not None:
      state, prep, reviewed = review(state, prep, self._client_reports(prep, inputs), inputs)
    return finish(state, prep, self._client_outputs(prep, inputs), inputs, reviewed)

  def _client_outputs(self, prep: _Prepared, inputs: RunInputs) -> ClientOutput:
    """Every cohort client's ``client_update``; with a client-side attack, the cohort's attackers' outputs come
    from ``malicious_update`` instead, run in ``attack_slots`` fixed slots (unused slots change nothing)."""
    out = self._map_clients(prep)
    if not self.attack_slots:
      return out
    return self._in_attack_slots(out, self.algorithm.malicious_update, prep, inputs, prep.client_keys)

  def _in_attack_slots(self, honest: PyTree, attacker_fn: Callable, prep: _Prepared, inputs: RunInputs,
                       keys: jax.Array) -> PyTree:
    """``honest`` (stacked over the cohort) with the cohort's attackers' rows replaced by ``attacker_fn(payload,
    client_state, data, attack_data, key)``, run in ``attack_slots`` fixed slots (unused slots change nothing)."""
    mal = inputs.malicious[prep.cohort]
    pos = jnp.nonzero(mal, size=self.attack_slots, fill_value=0)[0]
    used = jnp.arange(self.attack_slots) < jnp.sum(mal)
    bad = self.strategy.map(attacker_fn, (None, 0, 0, None, 0), prep.payload, _gather(prep.client_states, pos),
                            _gather(prep.data, pos), inputs.attack_data, keys[pos])
    target = jnp.where(used, pos, prep.cohort.shape[0])  # unused slots point past the cohort: dropped
    return jax.tree.map(lambda h, attacked: h.at[target].set(attacked, mode="drop"), honest, bad)

  def run_round(self, state: SimState) -> tuple[SimState, dict]:
    """One federated round; returns the new state and device-side scalar metrics."""
    return self._round(state, self.inputs)

  def lower_round(self, state: SimState):
    """The lowered round program (traceable strategies only), for compile-time measurement."""
    return self._round.lower(state, self.inputs)

  # ----------------------------------------------------------------------------------- evaluation
  def _build_client_eval(self):
    alg, apply_fn, batch = self.algorithm, self.apply_fn, self.eval_batch_size

    def score(params, test: ClientData):
      if alg.eval_models:
        return {name: count_correct(apply_fn, params[name], test.x, test.y, test.n, batch) for name in alg.eval_models}
      return count_correct(apply_fn, params, test.x, test.y, test.n, batch)

    def one_client(payload, client_state, train: ClientData, test: ClientData, key):
      return score(alg.personal_params(payload, client_state, train, key), test)

    def addressed_client(shared, own, client_state, train: ClientData, test: ClientData, key):
      return score(alg.personal_params((shared, own), client_state, train, key), test)

    def all_clients(server, clients, train, test, key, malicious):
      ids = jnp.arange(self.num_clients)
      keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(ids)
      if alg.uses_client_ids:
        shared, per_client = self._broadcast(server, ids, malicious)
        return self.strategy.map(addressed_client, (None, 0, 0, 0, 0, 0), shared, per_client, clients, train, test,
                                 keys)
      return self.strategy.map(one_client, (None, 0, 0, 0, 0), alg.broadcast(server), clients, train, test, keys)

    return all_clients

  def score_clients(self, state: SimState, inputs: Optional[RunInputs] = None):
    """``(correct, count)`` per client of each client's own evaluation model (a dict over ``eval_models``)."""
    inputs = self.inputs if inputs is None else inputs
    return self._eval_clients(state.server, state.clients, self.train_at(inputs, state.round), inputs.test,
                              eval_key(state.key, state.round), inputs.malicious)

  def evaluation_step(self, state: SimState, inputs: RunInputs) -> dict:
    """The configured evaluators' device values, a pure function of ``(state, inputs)`` (traced inside
    :func:`fedjax_robust.run.make_run`); :meth:`evaluation_record` turns them into the logged metrics. Under a
    strategy that is not traceable each pure evaluator (``register_evaluator(..., pure=True)``) runs as its own
    program, compiled at the first evaluation and reused after."""
    global_model = self.algorithm.global_params(state.server)
    return {name: fn(state, global_model, inputs) for name, fn in self._evaluators.items()}

  def evaluation_record(self, raw: dict, malicious: Optional[np.ndarray] = None) -> dict[str, Any]:
    """Host-side metrics from :meth:`evaluation_step`'s values (``malicious``: this run's attackers)."""
    malicious = self.malicious if malicious is None else np.asarray(malicious, bool)
    benign = None if self.malicious is None else ~malicious
    metrics: dict[str, Any] = {}
    if "accuracy" in raw:
      metrics.update(accuracy_record(raw["accuracy"], benign, self.algorithm.eval_models, _client_metrics))
    if raw.get("backdoor", {}).get("backdoor") is not None:
      asr, confidence = raw["backdoor"]["backdoor"]
      metrics["backdoor_asr"], metrics["backdoor_confidence"] = float(asr), float(confidence)
    for name, values in raw.items():  # evaluators registered later report their own scalars as they are
      if name not in ("accuracy", "backdoor"):
        metrics.update({k: np.asarray(v).tolist() for k, v in values.items()})
    return metrics

  def evaluate(self, state: SimState) -> dict[str, Any]:
    """The configured evaluators (``metrics/evaluators.py``; default ``accuracy``, plus ``backdoor`` with one).

    ``client_acc_*`` score each client's own evaluation model (``personal_params``);
    ``global_client_acc_weighted`` scores the global model on the same splits.
    ``*_mean`` is the plain mean over clients; ``*_weighted`` weights by
    test-split size (= total correct / total scored). With a malicious mask,
    ``benign_acc_*`` and ``global_benign_acc_weighted`` count benign clients only
    (FedCAP's TAcc, spec §4.4). Every evaluator's device values come to the host in one transfer (on every
    process of a multi-process run: :func:`~fedjax_robust.execution.to_host`).
    """
    return self.evaluation_record(to_host(self._evaluate_raw(state, self.inputs)))


def _report_on_attack_data(client_report: Callable, payload, client_state, data, attack_data, key):
  """The default ``malicious_report``: the attacker's ``client_report`` on the data its attack trains on."""
  return client_report(payload, client_state, attack_data, key)


def check_nominal_weight(nominal):
  """``None``, ``"mean"`` or a positive finite number (``Simulator(dataless_weight=...)``)."""
  if nominal is None or nominal == "mean":
    return nominal
  try:
    value = float(nominal)
  except (TypeError, ValueError):
    raise ValueError(f"dataless_weight must be 'mean' or a positive number, got {nominal!r}") from None
  if not (np.isfinite(value) and value > 0):
    raise ValueError(f"dataless_weight must be 'mean' or a positive number, got {nominal!r}")
  return value


def nominal_weights(weights: jax.Array, malicious: jax.Array, nominal: str | float) -> jax.Array:
  """The cohort's aggregation weights with every attacker of weight 0 (one without data) given ``nominal``.

  A rule reads weight 0 as "must not count" (padding, a client with no data), so a crafted model from an attacker
  that holds no data would never reach it. FedCC's code sends such models (specs/fedcc.md §2.6 [R]) and weighs
  every model alike; ``"mean"`` claims the mean weight of the cohort's benign members with data (1 when there is
  none), what a sample-weighted rule would expect of a typical client, and changes nothing for a uniform rule.
  Benign clients and attackers with data keep their weights.
  """
  malicious = jnp.asarray(malicious, bool)
  if nominal == "mean":
    honest = ~malicious & (weights > 0)
    count = jnp.sum(honest)
    value = jnp.where(count > 0, jnp.sum(jnp.where(honest, weights, 0.0)) / jnp.maximum(count, 1), 1.0)
  else:
    value = jnp.asarray(float(nominal), weights.dtype)
  return jnp.where(malicious & (weights <= 0), value.astype(weights.dtype), weights)


def _step_weighted_mean(loss: jax.Array, steps: jax.Array) -> jax.Array:
  """The cohort's loss per local step: ``Σ loss_c steps_c / Σ steps_c``. Clients with zero weight are not read
  (``0 * nan = nan``), so a left-out client whose training diverged cannot turn the mean NaN."""
  return jnp.sum(jnp.where(steps > 0, loss, 0.0) * steps) / jnp.maximum(jnp.sum(steps), 1)


def _client_metrics(correct, count, benign: Optional[np.ndarray], prefix: str = "") -> dict[str, Any]:
  """Per-client accuracy (``client_acc``), its mean, the test-size-weighted mean, and both over benign clients.

  A client without a test split (a dataless attacker) has no accuracy: ``client_acc`` lists 0 for it and the means
  leave it out (the mean over no client is NaN)."""
  correct, count = np.asarray(correct), np.asarray(count)
  acc = correct / np.maximum(count, 1)
  scored = count > 0

  def mean_over(rows) -> float:
    return float(acc[rows].mean()) if rows.any() else float("nan")

  metrics = {f"{prefix}client_acc_mean": mean_over(scored),
             f"{prefix}client_acc_weighted": float(correct.sum() / max(count.sum(), 1)),
             f"{prefix}client_acc": acc.tolist()}
  if benign is not None:
    benign = np.asarray(benign, bool)
    metrics[f"{prefix}benign_acc_weighted"] = float(correct[benign].sum() / max(count[benign].sum(), 1))
    metrics[f"{prefix}benign_acc_mean"] = mean_over(benign & scored)
  return metrics
