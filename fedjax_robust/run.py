"""Whole experiments as one compiled program, and several seeds as one vmapped program (PureJaxRL-style).

:func:`make_run` turns a :class:`~fedjax_robust.simulation.Simulator` into a pure function
``run(state, inputs) -> (state, RunTrace)``: every round of the experiment runs inside ``lax.scan``
and the configured evaluators run inside the program every ``eval_every`` rounds (and after the
last), so nothing returns to the host until the run is over. Because the run's data is an argument
(:class:`~fedjax_robust.simulation.RunInputs`: client splits, attackers, server set, triggered
inputs) and so is the state (initial model, run key), ``jax.vmap(run)`` runs N seeds at once, each
with its own partition, attackers and initialization, built on the host and stacked.

:func:`run_seeds` is that for a config: ``--config.seeds=0,1,2`` builds the experiment once per
seed (``seed``, and by default ``data.seed`` and ``attack.seed``, set to the seed: ``seed_fields``),
pads the client splits to common shapes (padding never changes a client's numbers: see
``client.local_sgd``), stacks them, runs one program, and writes one run directory per seed plus a
summary with the mean and standard deviation over seeds. Each seed's metrics equal those of the
separate run with the same three fields (``tests/test_run.py``).

``--config.grid="algorithm.fedprox.mu=0,0.01;client.lr=0.01,0.05"`` adds a grid over traced
hyperparameters (the cartesian product; ``client.lr``, ``server.lr`` and the options an algorithm's
registry entry declares ``traced``, e.g. FedCAP's alpha, phi, lambda, T_norm) to the same program: the
algorithm is built inside it with those values as tracers (``fedjax_robust.hparams``), one lane per
(seed, point), each equal to the separate run with those values.

Under XLA:CPU's conv-in-loop trap (a conv net on the CPU with ``model.conv_impl`` xla or patches) the rounds do NOT
run inside ``lax.scan``: XLA:CPU rewrites convolutions into the layout its Eigen kernels take only in a program's
entry computation, so every gradient convolution JAX writes inside the scan's loop body runs on its naive path (two
seeds of a reduced FedCAC run on ResNet-8: 109.7 s of running in the scan against 13.0 s called from Python,
``benchmarks/README.md`` §4). There ``engine.rounds_loop='auto'`` resolves to ``'python'``
(:func:`resolve_rounds_loop`): the same lanes are vmapped into one compiled ROUND program and one evaluation
program, called from a Python loop over rounds (:func:`run_stepwise`), with the same trace. The default conv impl
(``auto``: ``canonical`` on the CPU) writes its gradient convolutions in Eigen's order, so the scan is used.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_robust import client_weights
from fedjax_robust.client import ClientData
from fedjax_robust.compilation import jit
from fedjax_robust.execution import is_traceable
from fedjax_robust.simulation import RunInputs, SimState, Simulator

logger = logging.getLogger("fedjax_robust")

PyTree = Any


class RunTrace(NamedTuple):
  """What a whole-run program returns besides the final state."""

  rounds: dict  # every round's metrics, each leaf with a leading [rounds] axis
  evaluations: dict  # the evaluators' raw values, each leaf with a leading [len(eval_rounds)] axis
  # {client_weight_matrix: [len(eval_rounds), C, K]}, the evaluated rounds' client x client weights ({} without)
  client_weights: dict = {}


def split_client_weights(metrics: dict) -> tuple[dict, dict]:
  """Scanned rounds' metrics without the ``[length, C, K]`` client x client weights, and ``{key: the last
  round's [C, K]}`` (``{}`` when the algorithm reports none): a run stores them for its evaluated rounds only
  (:mod:`fedjax_robust.client_weights`), so the trace carries one matrix per evaluation, not one per round."""
  rest = {k: v for k, v in metrics.items() if k != client_weights.KEY}
  return rest, ({client_weights.KEY: metrics[client_weights.KEY][-1]} if client_weights.KEY in metrics else {})


def eval_rounds(rounds: int, eval_every: int, last_rounds: int = 0) -> list[int]:
  """The 1-indexed rounds after which a run evaluates: every ``eval_every``-th, the last, and each of the last
  ``last_rounds`` (papers that report the mean over the last 10 rounds, e.g. FedALC §2.4)."""
  if rounds < 1 or eval_every < 1 or not 0 <= last_rounds <= rounds:
    raise ValueError(f"need rounds >= 1, eval_every >= 1 and 0 <= eval.last_rounds <= rounds, got {rounds}, "
                     f"{eval_every}, {last_rounds}")
  head = rounds - last_rounds
  points = list(range(eval_every, head + 1, eval_every))
  if last_rounds == 0 and (not points or points[-1] != rounds):
    points.append(rounds)
  return points + list(range(head + 1, rounds + 1))


def make_run(sim: Simulator, rounds: int, eval_every: int, last_rounds: int = 0):
  """``run(state, inputs) -> (final_state, RunTrace)``: ``rounds`` rounds in ``lax.scan`` with the evaluators
  after the rounds :func:`eval_rounds` names, a pure traceable function (jit it, vmap it over seeds).

  Needs a traceable strategy (``vmap``; ``shard_map`` too, unvmapped): the sequential reference is a Python loop.
  """
  if not is_traceable(sim.strategy):
    raise ValueError("make_run needs a traceable strategy (engine.strategy vmap or shard_map), not sequential")
  eval_rounds(rounds, eval_every, last_rounds)  # checks the arguments
  blocks, tail = divmod(int(rounds) - int(last_rounds), int(eval_every))

  def train(state, inputs: RunInputs, length: int):
    return jax.lax.scan(lambda s, _: sim.round_step(s, inputs), state, None, length=length)

  def rounds_then_evaluate(state, inputs: RunInputs, length: int):
    state, metrics = train(state, inputs, length)
    metrics, weights = split_client_weights(metrics)
    return state, metrics, sim.evaluation_step(state, inputs), weights

  def evaluated_blocks(state, inputs, count: int, length: int, round_parts, eval_parts, weight_parts):
    def block(s, _):
      s, metrics, evaluation, weights = rounds_then_evaluate(s, inputs, length)
      return s, (metrics, evaluation, weights)

    state, (metrics, evaluation, weights) = jax.lax.scan(block, state, None, length=count)
    round_parts.append(jax.tree.map(lambda a: a.reshape((count * length,) + a.shape[2:]), metrics))
    eval_parts.append(evaluation)
    weight_parts.append(weights)
    return state

  def run(state: SimState, inputs: RunInputs):
    round_parts, eval_parts, weight_parts = [], [], []
    if blocks:
      state = evaluated_blocks(state, inputs, blocks, eval_every, round_parts, eval_parts, weight_parts)
    if tail and last_rounds:  # rounds between the last eval_every block and the evaluated last rounds
      state, metrics = train(state, inputs, tail)
      round_parts.append(split_client_weights(metrics)[0])
    elif tail:
      state, metrics, evaluation, weights = rounds_then_evaluate(state, inputs, tail)
      round_parts.append(metrics)
      eval_parts.append(jax.tree.map(lambda a: a[None], evaluation))
      weight_parts.append(jax.tree.map(lambda a: a[None], weights))
    if last_rounds:
      state = evaluated_blocks(state, inputs, last_rounds, 1, round_parts, eval_parts, weight_parts)
    concat = lambda parts: jax.tree.map(lambda *a: jnp.concatenate(a), *parts) if len(parts) > 1 else parts[0]
    return state, RunTrace(concat(round_parts), concat(eval_parts), concat(weight_parts))

  return run


ROUNDS_LOOPS = ("auto", "scan", "python")


def resolve_rounds_loop(value: str, trap: bool) -> str:
  """How a seeds/grid run loops over rounds: ``scan`` (the whole run one program, :func:`make_run`) or ``python``
  (one compiled round program and one evaluation program called per round, :func:`run_stepwise`). ``auto``:
  ``python`` under the conv-in-loop trap (``trap``: ``experiment.conv_loop_trap``, a conv net on the CPU with
  ``model.conv_impl`` xla or patches, whose gradient convolutions XLA:CPU runs off Eigen inside a loop body,
  jax-ml/jax#12868), ``scan`` elsewhere."""
  value = str(value or "auto").strip().lower()
  if value not in ROUNDS_LOOPS:
    raise ValueError(f"engine.rounds_loop must be one of {ROUNDS_LOOPS}, got {value!r}")
  if value == "auto":
    return "python" if trap else "scan"
  return value


def run_stepwise(round_program, eval_program, state, inputs, rounds: int, eval_every: int, last_rounds: int = 0,
                 lane_axes: int = 0):
  """:func:`make_run`'s ``(final_state, RunTrace)`` from a Python loop: ``round_program(state, inputs) -> (state,
  metrics)`` every round and ``eval_program(state, inputs)`` after each round :func:`eval_rounds` names (both
  compiled once, typically vmapped over ``lane_axes`` leading lane axes: seeds, grid points). The per-round
  outputs are stacked on axis ``lane_axes``, where the vmapped :func:`make_run` puts its rounds axis, and the
  client x client weights are kept for the evaluated rounds only, as there."""
  evaluated = set(eval_rounds(rounds, eval_every, last_rounds))
  round_parts, eval_parts, weight_parts = [], [], []
  for t in range(1, int(rounds) + 1):
    state, metrics = round_program(state, inputs)
    round_parts.append({k: v for k, v in metrics.items() if k != client_weights.KEY})
    if t in evaluated:
      eval_parts.append(eval_program(state, inputs))
      weight_parts.append({k: v for k, v in metrics.items() if k == client_weights.KEY})
  stack = lambda parts: jax.tree.map(lambda *a: jnp.stack(a, axis=lane_axes), *parts)
  return state, RunTrace(stack(round_parts), stack(eval_parts), stack(weight_parts))


# ------------------------------------------------------------------------------------------- stacking
def pad_rows(data: ClientData, n_max: int) -> ClientData:
  """``data`` with its per-client row axis zero-padded to ``n_max`` (``n`` unchanged, so the new rows are padding)."""
  extra = n_max - data.x.shape[1]
  if extra < 0:
    raise ValueError(f"cannot pad {data.x.shape[1]} rows down to {n_max}")
  if extra == 0:
    return data
  pad = lambda a: jnp.pad(a, [(0, 0), (0, extra)] + [(0, 0)] * (a.ndim - 2))
  return ClientData(pad(data.x), pad(data.y), data.n)


def stack_trees(trees: Sequence[PyTree], what: str) -> PyTree:
  """Stacks structurally identical trees on a new leading axis; a clear error names what differs."""
  first = jax.tree.structure(trees[0])
  for i, tree in enumerate(trees[1:], 1):
    if jax.tree.structure(tree) != first:
      raise ValueError(f"{what}: seed #{i} has a different structure than seed #0")
    shapes = [np.shape(a) for a in jax.tree.leaves(tree)]
    if shapes != [np.shape(a) for a in jax.tree.leaves(trees[0])]:
      raise ValueError(f"{what}: seed #{i} has shapes {shapes} where seed #0 has "
                       f"{[np.shape(a) for a in jax.tree.leaves(trees[0])]}")
  return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def stack_inputs(inputs: Sequence[RunInputs]) -> RunInputs:
  """The seeds' :class:`RunInputs` padded to common client-split shapes and stacked on a leading seed axis."""
  n_train = max(i.train.x.shape[1] for i in inputs)
  n_test = max(i.test.x.shape[1] for i in inputs)
  padded = [i._replace(train=pad_rows(i.train, n_train), test=pad_rows(i.test, n_test)) for i in inputs]
  return stack_trees(padded, "run inputs")


def unstack(tree: PyTree, index: int) -> PyTree:
  return jax.tree.map(lambda a: a[index], tree)


# ------------------------------------------------------------------------------------------- seeds
DEFAULT_SEED_FIELDS = ("seed", "data.seed", "attack.seed")


def parse_seeds(value) -> list[int]:
  """``"0,1,2"`` / ``[0, 1, 2]`` / ``""`` -> a list of distinct ints (empty: a single run with ``config.seed``)."""
  if value is None or value == "":
    return []
  items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", "").strip("()[]").split(",")
  try:
    seeds = [int(s) for s in items if str(s) != ""]
  except ValueError:
    raise ValueError(f"seeds must be comma-separated integers, got {value!r}") from None
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds must be distinct, got {seeds}")
  return seeds


def seed_config(config, seed: int, fields: Sequence[str] = DEFAULT_SEED_FIELDS):
  """A copy of ``config`` for one seed: each dotted field in ``fields`` set to ``seed``; ``seeds`` cleared."""
  c = copy.deepcopy(config)
  with c.unlocked():
    set_seed_fields(c, seed, fields)
    c.seeds = ""
  return c


def set_seed_fields(config, seed: int, fields: Sequence[str] | None = None):
  """Sets each dotted field in ``fields`` (default: the config's own ``seed_fields``) to ``seed``, in place, and
  returns ``config``: what one seed of a seeds program gets, so a one-seed run of seed N (a grid script's
  ``--seed N``) draws the same partition, attackers and initialization as lane N of ``--seeds 0,...,N``."""
  for dotted in seed_fields_of(config) if fields is None else fields:
    *path, leaf = dotted.split(".")
    node = config
    for part in path:
      if part not in node:
        raise ValueError(f"seed_fields: {dotted!r} is not a config field")
      node = node[part]
    if leaf not in node:
      raise ValueError(f"seed_fields: {dotted!r} is not a config field")
    node[leaf] = int(seed)
  return config


def seed_fields_of(config) -> tuple[str, ...]:
  """The dotted fields a seed sets (``config.seed_fields``; :data:`DEFAULT_SEED_FIELDS` for a config without it)."""
  raw = config.get("seed_fields", ",".join(DEFAULT_SEED_FIELDS))
  fields = tuple(f for f in str(raw).replace(" ", "").split(",") if f)
  if "seed" not in fields:
    raise ValueError(f"seed_fields must include 'seed' (the run key), got {fields}")
  return fields


def parse_grid(value, algorithm_name: str) -> list[dict]:
  """``"algorithm.fedprox.mu=0,0.01;client.lr=0.01,0.05"`` -> the cartesian product as a list of
  ``{dotted key: float}`` points (``[]`` for ``""``). Only traced hyperparameters may vary: ``client.lr``,
  ``server.lr`` and the options the algorithm's registry entry declares ``traced``."""
  import itertools
  from fedjax_robust.algorithms.registry import algorithm_entry
  if not value:
    return []
  allowed = {"client.lr", "server.lr"} | {f"algorithm.{algorithm_name}.{f}"
                                          for f in algorithm_entry(algorithm_name).traced}
  axes = []
  for part in str(value).split(";"):
    if not part.strip():
      continue
    key, sep, values = part.partition("=")
    key = key.strip()
    if not sep:
      raise ValueError(f"grid: expected key=v1,v2,... in {part!r}")
    if key not in allowed:
      raise ValueError(f"grid: {key!r} is not a traced hyperparameter of {algorithm_name!r}; one of {sorted(allowed)}")
    try:
      axis = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
      raise ValueError(f"grid: {key} needs numbers, got {values!r}") from None
    if not axis or len(set(axis)) != len(axis):
      raise ValueError(f"grid: {key} needs distinct values, got {values!r}")
    axes.append([(key, v) for v in axis])
  if len({a[0][0] for a in axes}) != len(axes):
    raise ValueError(f"grid: a key appears twice in {value!r}")
  return [dict(point) for point in itertools.product(*axes)]


def point_label(point: dict) -> str:
  return "__".join(f"{k}={v:g}" for k, v in point.items())


def run_seeds(config, run_dir: Optional[str | Path] = None) -> dict:
  """Runs ``config`` once per seed of ``config.seeds`` and per point of ``config.grid`` as ONE program
  (``jax.vmap`` over seeds of ``jax.vmap`` over grid points of :func:`make_run`).

  Seeds differ in data (partition, attackers, initial model, run key: ``seed_fields``); grid points in traced
  hyperparameters, the algorithm being built inside the program with them as tracers
  (``Experiment.algorithm_with``). Writes ``<run_dir>/seed_<s>/`` per seed (``<run_dir>/<point>/seed_<s>/`` with a
  grid; the same files as a single run, each ``config.json`` holding that run's values) and
  ``<run_dir>/summary.json`` with every final scalar metric's per-seed values, mean and standard deviation
  (``ddof=0``: the spread of these seeds), per grid point. Returns that summary.
  """
  from fedjax_robust.experiment import build_experiment

  seeds = parse_seeds(config.get("seeds", ""))
  points = parse_grid(config.get("grid", ""), config.algorithm.name)
  if not seeds and not points:
    raise ValueError("run_seeds needs config.seeds (e.g. '0,1,2') or config.grid")
  if config.output.checkpoint_every or config.output.resume:
    raise ValueError("a seeds/grid run is one program: output.checkpoint_every and output.resume are not supported")
  fields = seed_fields_of(config)
  configs = [seed_config(config, s, fields) for s in seeds] if seeds else [seed_config(config, config.seed, ())]
  seeds = seeds or [int(config.seed)]
  for c in configs:
    if c.engine.strategy in ("auto", "vmap"):
      c.engine.strategy = "vmap"  # the seed axis is a vmap: the client axis is one too
    else:
      raise ValueError(f"a seeds/grid run vmaps the whole run: engine.strategy must be auto or vmap, got "
                       f"{c.engine.strategy!r}")
    with c.unlocked():
      c.grid = ""
  t_build = time.perf_counter()
  experiments = [build_experiment(c) for c in configs]
  sims = [e.simulator for e in experiments]
  states = stack_trees([e.init_state() for e in experiments], "initial state")
  inputs = stack_inputs([s.inputs for s in sims])
  build_s = time.perf_counter() - t_build
  rounds, eval_every = int(config.rounds), int(config.eval_every)
  last_rounds = int(config.get("eval", {}).get("last_rounds", 0))
  rounds_loop = resolve_rounds_loop(config.engine.get("rounds_loop", "auto"), experiments[0].conv_loop_trap)
  if points:  # every (seed, point) lane carries its own state
    grid = {k: jnp.asarray([p[k] for p in points], jnp.float32) for k in points[0]}
    lane_sim = lambda h: sims[0].with_algorithm(experiments[0].algorithm_with(h))
    states = jax.tree.map(lambda a: jnp.broadcast_to(a[:, None], (a.shape[0], len(points)) + a.shape[1:]), states)
    lanes = lambda f: jax.vmap(lambda st, inp: jax.vmap(lambda s, h: f(lane_sim(h), s, inp))(st, grid))
  else:
    lanes = lambda f: jax.vmap(lambda st, inp: f(sims[0], st, inp))
  logger.info("seeds %s x %d grid points: one program, %d rounds each (rounds loop: %s), on %s", seeds,
              max(len(points), 1), rounds, rounds_loop, jax.devices())
  t0 = time.perf_counter()
  if rounds_loop == "scan":
    program = lanes(lambda sim, s, inp: make_run(sim, rounds, eval_every, last_rounds)(s, inp))
    compiled = jit(program).lower(states, inputs).compile()
    compile_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    final_states, trace = compiled(states, inputs)
  else:
    round_fn = jit(lanes(lambda sim, s, inp: sim.round_step(s, inp)))
    round_program = round_fn.lower(states, inputs).compile()
    next_states = jax.eval_shape(round_fn, states, inputs)[0]
    eval_program = jit(lanes(lambda sim, s, inp: sim.evaluation_step(s, inp))).lower(next_states, inputs).compile()
    compile_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    final_states, trace = run_stepwise(round_program, eval_program, states, inputs, rounds, eval_every, last_rounds,
                                       lane_axes=2 if points else 1)
  trace = jax.device_get(trace)
  run_s = time.perf_counter() - t1
  wall_s = time.perf_counter() - t0
  del final_states

  name = config.output.name or f"{config.data.name}_{config.algorithm.name}_seeds_{time.strftime('%Y%m%d-%H%M%S')}"
  root = Path(run_dir) if run_dir is not None else Path(config.output.dir) / name
  evaluated = eval_rounds(rounds, eval_every, last_rounds)
  summaries, lane_dirs = {}, []
  for g, point in enumerate(points or [{}]):
    finals = []
    for i, (seed, c, exp) in enumerate(zip(seeds, configs, experiments)):
      lane_trace = unstack(trace, i) if not points else unstack(unstack(trace, i), g)
      run_config = json.loads(c.to_json_best_effort())
      for key, value in point.items():  # the values this lane ran with
        *path, leaf = key.split(".")
        node = run_config
        for part in path:
          node = node[part]
        node[leaf] = value
      seed_dir = (root / point_label(point) if point else root) / f"seed_{seed}"
      lane_dirs.append(seed_dir)
      finals.append(_write_lane(seed_dir, run_config, exp, lane_trace, rounds, evaluated,
                                {"seed": seed, "grid_point": point, "seeds_run": str(root),
                                 "wall_time_s_all_lanes": wall_s}))
    summaries[point_label(point) or "all"] = summarize_finals(finals)
  summary = {
      "seeds": seeds,
      "seed_fields": list(fields),
      "grid": points,
      "rounds": rounds,
      "final": summaries["all"] if not points else summaries,
      "build_s": build_s,
      "compile_s": compile_s,
      "run_s": run_s,
      "wall_time_s": wall_s,
      "rounds_per_s": len(seeds) * max(len(points), 1) * rounds / run_s,
      "strategy": "vmap",
      "rounds_loop": rounds_loop,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "run_dir": str(root),
  }
  root.mkdir(parents=True, exist_ok=True)
  from fedjax_robust.experiment import dumps_strict  # experiment imports this module
  (root / "summary.json").write_text(dumps_strict(summary, indent=2))  # strict JSON: NaN as null
  if config.output.get("plots", True):  # every lane's curves in one figure: <run_dir>/plots
    from fedjax_robust.experiment import write_plots
    write_plots(root, compare=lane_dirs)
  return summary


def _write_lane(run_dir: Path, run_config: dict, exp, lane_trace: RunTrace, rounds: int, evaluated: list[int],
                extra: dict) -> dict:
  """One lane's run directory (config, partition, attackers, per-round metrics, summary); returns its final record."""
  from fedjax_robust.experiment import RunWriter, partition_record, round_record  # experiment imports this module
  writer = RunWriter(run_dir, tensorboard=bool(run_config.get("output", {}).get("tensorboard", False)))
  writer.write_json("config.json", run_config)
  writer.write_json("partition.json", partition_record(exp.data))
  if exp.malicious is not None:
    writer.write_json("malicious.json", {"malicious_clients": np.flatnonzero(exp.malicious).tolist(),
                                         "poisoning": exp.data.info.get("poisoning")})
  record: dict[str, Any] = {}
  for t in range(1, rounds + 1):
    record = round_record(t, unstack(lane_trace.rounds, t - 1))
    if t in evaluated:
      record.update(exp.simulator.evaluation_record(unstack(lane_trace.evaluations, evaluated.index(t))))
    writer.log_round(record)
    if t in evaluated and lane_trace.client_weights:
      matrix = unstack(lane_trace.client_weights, evaluated.index(t))[client_weights.KEY]
      writer.log_client_weights(t, record["cohort"], matrix)
  final = {k: v for k, v in record.items() if not k.endswith("client_acc")}
  writer.write_json("summary.json", {"final": final, "final_client_acc": record.get("client_acc"),
                                     "rounds": rounds, **extra})
  writer.close()
  return final


def summarize_finals(finals: Sequence[dict]) -> dict:
  """``{metric: {"values", "mean", "std"}}`` over seeds for every finite scalar metric all seeds report."""
  out = {}
  keys = [k for k in finals[0] if all(k in f for f in finals)]
  for k in keys:
    values = [f[k] for f in finals]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
      arr = np.asarray(values, np.float64)
      out[k] = {"values": values, "mean": float(arr.mean()), "std": float(arr.std())}
  return out
