#!/usr/bin/env python
"""Rounds per second of one FedAvg (or FedCAP) round, per execution strategy of the client axis.

For each workload, in one process, this times the engine's strategies
(``vmap``, ``shard_map`` over one or more device counts, ``sequential``) and the
plain sequential baseline :class:`fedjax_robust.reference.ReferenceFedAvg`
(a Python loop over clients and batches, one jitted SGD step per batch — how
today's PyTorch FL code is written).

``--algorithm fedcap`` times FedCAP instead (paper defaults alpha 10, phi 0.3,
lambda 0.1, T_norm 10; every client trains its personalized and its customized
model on each batch) against :class:`fedjax_robust.reference.ReferenceFedCAP`,
the same client loop with two jitted steps per batch and the server's pools as
per-client dictionaries. ``--pair_forward separate|stacked`` picks how the
engine runs the two models (``engine.pair_forward``).

Workloads:
  fedcap_cifar10_e1 / _e5  FedCAP's CIFAR-10 setting: FedAvgCNN (fc 64, 156,810
                           params) on 32x32x3, 20 clients x 225 train samples
                           (2 classes each), batch 10, drop_last, unshuffled,
                           SGD lr 0.01, E=1 / E=5, all clients every round.
                           Synthetic pixels: speed does not depend on values.
  digits_mlp               sklearn digits (8x8x1, real data), MLP, 10 clients
                           (2 label shards each, ~144 train samples), batch 10, E=1.

``--conv_impl xla|patches`` (default ``xla``) sets the conv nets' ``conv_impl``
model field (``fedjax_robust.models.layers.TorchConv``): ``patches`` computes each
convolution as ``conv_general_dilated_patches`` + a matmul (a batched matmul
under ``vmap``, instead of a grouped convolution). Parameters are identical, so
run the script once per impl and compare. The MLP workload ignores it.

Per strategy it reports: compile time (``lower().compile()`` for the traceable
strategies; first round minus the steady median for the Python-loop ones),
steady rounds/s (median over ``--rounds`` timed rounds after one warm-up round,
outputs blocked on), local training samples/s, peak memory (process peak RSS
measured per strategy — the kernel's high-water mark is reset before each
strategy — and the accelerator's ``peak_bytes_in_use`` where available), and
rounds/s relative to the plain sequential baseline. It also checks that all
strategies give the same global params after round 1 (max abs difference).

On CPU, conv-net local steps are unrolled (``lax.scan(unroll=True)``) to avoid
the XLA:CPU conv-in-loop trap (jax-ml/jax#12868, DESIGN.md). ``vmap`` with a
plain scan (unroll=1) is timed once, for E=1 only (E=5 too with
``--include-slow``), in a child process that is stopped if its round takes
longer than ``--slow-cap`` seconds (120 s).

    python benchmarks/rounds_per_second.py                       # everything
    python benchmarks/rounds_per_second.py --workload digits_mlp --out r.json
    python benchmarks/rounds_per_second.py --cpu-devices 20,4,2 --strategies vmap,shard_map
    python benchmarks/rounds_per_second.py --workload fedcap_cifar10 --strategies vmap --conv_impl patches
    python benchmarks/rounds_per_second.py --workload fedcap_cifar10_e5 --algorithm fedcap --pair_forward stacked
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import queue
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

WORKLOAD_GROUPS = {
    "fedcap_cifar10": ("fedcap_cifar10_e1", "fedcap_cifar10_e5"),
    "fedcap_cifar10_e1": ("fedcap_cifar10_e1",),
    "fedcap_cifar10_e5": ("fedcap_cifar10_e5",),
    "digits_mlp": ("digits_mlp",),
}
ALL_WORKLOADS = ("fedcap_cifar10_e1", "fedcap_cifar10_e5", "digits_mlp")
ALL_STRATEGIES = ("vmap", "shard_map", "sequential", "reference")


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  model: str
  model_kwargs: tuple
  num_classes: int
  epochs: int
  batch_size: int
  drop_last: bool
  shuffle: bool
  lr: float
  conv: bool


WORKLOADS = {
    "fedcap_cifar10_e1": Workload("fedcap_cifar10_e1", "fedavg_cnn", (("fc_dim", 64),), 10, 1, 10, True, False,
                                  0.01, True),
    "fedcap_cifar10_e5": Workload("fedcap_cifar10_e5", "fedavg_cnn", (("fc_dim", 64),), 10, 5, 10, True, False,
                                  0.01, True),
    "digits_mlp": Workload("digits_mlp", "mlp", (), 10, 1, 10, False, True, 0.01, False),
}


def make_model(wl: Workload, conv_impl: str = "xla"):
  """The workload's model; conv nets get ``conv_impl`` (the MLP has no convolution and ignores it)."""
  from fedjax_robust.models import get_model
  kwargs = dict(wl.model_kwargs)
  if wl.conv:
    kwargs["conv_impl"] = conv_impl
  return get_model(wl.model, num_classes=wl.num_classes, **kwargs)


# --------------------------------------------------------------------------------------------- data
def synthetic_cifar_fedcap(seed: int = 0):
  """FedCAP's CIFAR-10 shapes: 20 clients x 300 images (225 train / 75 test), 2 classes per client."""
  from fedjax_robust.data.federated import FederatedData
  rng = np.random.default_rng(seed)
  k, n_train, n_test, shape = 20, 225, 75, (32, 32, 3)
  xs_tr, ys_tr, xs_te, ys_te = [], [], [], []
  for c in range(k):
    classes = np.array([(2 * c) % 10, (2 * c + 1) % 10])
    xs_tr.append(rng.standard_normal((n_train,) + shape, dtype=np.float32))
    ys_tr.append(rng.choice(classes, n_train).astype(np.int32))
    xs_te.append(rng.standard_normal((n_test,) + shape, dtype=np.float32))
    ys_te.append(rng.choice(classes, n_test).astype(np.int32))
  return FederatedData(
      name="synthetic_cifar10_fedcap", num_classes=10,
      x_train=np.stack(xs_tr), y_train=np.stack(ys_tr), n_train=np.full(k, n_train, np.int32),
      x_test=np.stack(xs_te), y_test=np.stack(ys_te), n_test=np.full(k, n_test, np.int32),
      x_global_test=rng.standard_normal((100,) + shape, dtype=np.float32),
      y_global_test=rng.integers(0, 10, 100).astype(np.int32),
      info={"source": "synthetic (random normal pixels)"})


def digits_two_shards(seed: int = 0, num_clients: int = 10, train_ratio: float = 0.8):
  """sklearn digits, pathological split: each class cut in 2 shards, each client gets 2 shards of 2 classes."""
  from sklearn.datasets import load_digits
  from fedjax_robust.data.federated import FederatedData, stack_padded
  d = load_digits()
  x = (d.images.astype(np.float32) / 16.0)[..., None]  # [1797, 8, 8, 1]
  y = d.target.astype(np.int32)
  rng = np.random.default_rng(seed)
  shards = []
  for c in range(10):
    idx = rng.permutation(np.flatnonzero(y == c))
    shards += list(np.array_split(idx, 2))
  shard_order = [2 * c for c in range(10)] + [2 * c + 1 for c in range(10)]  # shard s of class c
  tr_idx, te_idx = [], []
  for k in range(num_clients):
    a, b = shard_order[k], shard_order[(k + 1) % 10 + 10]
    idx = rng.permutation(np.concatenate([shards[a], shards[b]]))
    cut = int(round(train_ratio * len(idx)))
    tr_idx.append(idx[:cut])
    te_idx.append(idx[cut:])
  x_tr, n_tr = stack_padded([x[i] for i in tr_idx], np.float32)
  y_tr, _ = stack_padded([y[i] for i in tr_idx], np.int32)
  x_te, n_te = stack_padded([x[i] for i in te_idx], np.float32)
  y_te, _ = stack_padded([y[i] for i in te_idx], np.int32)
  all_te = np.concatenate(te_idx)
  return FederatedData(name="digits", num_classes=10, x_train=x_tr, y_train=y_tr, n_train=n_tr, x_test=x_te,
                       y_test=y_te, n_test=n_te, x_global_test=x[all_te], y_global_test=y[all_te],
                       client_train_indices=tr_idx, client_test_indices=te_idx, info={"source": "sklearn digits"})


def make_data(wl: Workload):
  return synthetic_cifar_fedcap() if wl.model == "fedavg_cnn" else digits_two_shards()


def samples_per_round(wl: Workload, n_train: np.ndarray) -> int:
  """Real local training samples one round processes: sum_k E * (real steps * B, capped at n_k)."""
  from fedjax_robust.client.local_sgd import steps_per_epoch
  total = 0
  for n in np.asarray(n_train).tolist():
    total += wl.epochs * min(steps_per_epoch(int(n), wl.batch_size, wl.drop_last) * wl.batch_size, int(n))
  return total


# --------------------------------------------------------------------------------------------- memory
def reset_peak_rss() -> bool:
  """Resets the kernel's RSS high-water mark (Linux >= 4.0), so the next peak is per strategy."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def current_rss_mib() -> float:
  try:
    for line in open("/proc/self/status"):
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024.0
  except OSError:
    pass
  return float("nan")


def peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def device_peak_mib():
  import jax
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # CPU devices may not implement memory_stats
    return None
  if not stats or "peak_bytes_in_use" not in stats:
    return None
  return stats["peak_bytes_in_use"] / 2**20


# --------------------------------------------------------------------------------------------- timing
def _block(tree):
  import jax
  return jax.block_until_ready(tree)


def _time_rounds(step, state, rounds: int, min_time: float, max_time: float = float("inf")):
  """One warm-up round (returned separately), then timed rounds.

  Times at least one round; then keeps going until ``rounds`` rounds AND ``min_time`` seconds are timed
  (fast workloads get more rounds), but stops once ``max_time`` seconds are timed (slow workloads get fewer).
  """
  t = time.perf_counter()
  state = _block(step(state))
  first = time.perf_counter() - t
  after_first = state
  times = []
  while not times or ((len(times) < rounds or (sum(times) < min_time and len(times) < 1000))
                      and sum(times) < max_time):
    t = time.perf_counter()
    state = _block(step(state))
    times.append(time.perf_counter() - t)
  return first, times, after_first


ALGORITHMS = ("fedavg", "fedcap")


def build_engine(wl: Workload, data, apply_fn, strategy_name: str, num_devices, unroll, algorithm: str = "fedavg",
                 pair_forward: str = "separate"):
  import optax
  from fedjax_robust.algorithms.fedavg import make_fedavg
  from fedjax_robust.algorithms.fedcap import make_fedcap
  from fedjax_robust.client.local_sgd import LocalTrainSpec
  from fedjax_robust.execution import make_strategy
  from fedjax_robust.simulation import Simulator
  spec = LocalTrainSpec(epochs=wl.epochs, batch_size=wl.batch_size, drop_last=wl.drop_last, shuffle=wl.shuffle,
                        unroll=unroll)
  if algorithm == "fedcap":  # the paper's defaults (specs/fedcap.md §1.2)
    alg = make_fedcap(apply_fn, optax.sgd(wl.lr), spec, data.num_clients, pair_forward=pair_forward)
  else:
    alg = make_fedavg(apply_fn, optax.sgd(wl.lr), spec)
  strategy = make_strategy(strategy_name, num_devices if strategy_name == "shard_map" else None)
  return alg, Simulator(alg, data, apply_fn, strategy)


def bench_engine(wl, data, apply_fn, params, strategy_name, num_devices, unroll, rounds, seed, min_time, max_time,
                 algorithm="fedavg", pair_forward="separate"):
  from fedjax_robust.execution import is_traceable
  alg, sim = build_engine(wl, data, apply_fn, strategy_name, num_devices, unroll, algorithm, pair_forward)
  state = sim.init(params, seed)
  compile_s = None
  if is_traceable(sim.strategy):
    t = time.perf_counter()
    compiled = sim.lower_round(state).compile()
    compile_s = time.perf_counter() - t
    step = lambda s: compiled(s, sim.inputs)[0]
  else:
    step = lambda s: sim.run_round(s)[0]
  first, times, after_first = _time_rounds(step, state, rounds, min_time, max_time)
  params1 = np.concatenate([np.ravel(np.asarray(a)) for a in
                            __import__("jax").tree.leaves(alg.global_params(after_first.server))])
  return first, times, compile_s, params1


def bench_reference(wl, data, apply_fn, params, rounds, seed, min_time, max_time, algorithm="fedavg"):
  import jax
  import optax
  from fedjax_robust.client.local_sgd import LocalTrainSpec
  from fedjax_robust.reference import ReferenceFedAvg, ReferenceFedCAP
  spec = LocalTrainSpec(epochs=wl.epochs, batch_size=wl.batch_size, drop_last=wl.drop_last, shuffle=wl.shuffle)
  key = jax.random.key(seed)
  if algorithm == "fedcap":
    ref_cap = ReferenceFedCAP(apply_fn, optax.sgd(wl.lr), spec, data)
    first, times, after_first = _time_rounds(lambda st: ref_cap.run_round(st, key), ref_cap.init(params), rounds,
                                             min_time, max_time)
    return first, times, None, np.asarray(after_first["global"], np.float32)
  ref = ReferenceFedAvg(apply_fn, optax.sgd(wl.lr), spec, data)
  counter = {"r": 0}

  def step(p):
    out = ref.run_round(p, key, counter["r"])
    counter["r"] += 1
    return out

  first, times, after_first = _time_rounds(step, params, rounds, min_time, max_time)
  params1 = np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(after_first)])
  return first, times, None, params1


# --------------------------------------------------------------------------------------------- the scan trap (child)
def trap_child(args) -> None:
  """Child process: vmap with a plain lax.scan (unroll=1); prints JSON lines as it goes."""
  import jax
  wl = WORKLOADS[args.trap_child]
  from fedjax_robust.models import init_params
  data = make_data(wl)
  model = make_model(wl, args.conv_impl)
  params = init_params(model, jax.random.key(args.seed), data.feature_shape)
  apply_fn = lambda p, x: model.apply({"params": p}, x)
  _, sim = build_engine(wl, data, apply_fn, "vmap", None, 1, args.algorithm, args.pair_forward)
  state = sim.init(params, args.seed)
  t = time.perf_counter()
  compiled = sim.lower_round(state).compile()
  print(json.dumps({"compile_s": time.perf_counter() - t}), flush=True)
  for _ in range(1):  # one round: it is the slow path
    t = time.perf_counter()
    state = _block(compiled(state, sim.inputs)[0])
    print(json.dumps({"round_s": time.perf_counter() - t}), flush=True)


def run_trap(wl: Workload, cap_s: float, seed: int, conv_impl: str = "xla", algorithm: str = "fedavg",
             pair_forward: str = "separate") -> dict:
  """Runs :func:`trap_child` in a subprocess; stops it when a round passes ``cap_s`` seconds."""
  env = dict(os.environ)
  cmd = [sys.executable, os.path.abspath(__file__), "--trap-child", wl.name, "--seed", str(seed),
         "--conv_impl", conv_impl, "--algorithm", algorithm, "--pair_forward", pair_forward]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
  lines: queue.Queue = queue.Queue()
  threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
  result: dict[str, Any] = {"compile_s": None, "round_s": [], "capped": False}
  deadline = time.monotonic() + 600  # start-up + compile
  try:
    while True:
      try:
        line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
      except queue.Empty:
        result["capped"] = True
        break
      if line is None:
        break
      rec = json.loads(line)
      if "compile_s" in rec:
        result["compile_s"] = rec["compile_s"]
      if "round_s" in rec:
        result["round_s"].append(rec["round_s"])
      deadline = time.monotonic() + cap_s
  finally:
    if proc.poll() is None:
      proc.kill()  # our own child, by its handle
    proc.wait()
  return result


# --------------------------------------------------------------------------------------------- driver
def run_workload(wl: Workload, args, backend: str) -> dict:
  import jax
  from fedjax_robust.models import count_params, init_params

  data = make_data(wl)
  model = make_model(wl, args.conv_impl)
  conv_impl = args.conv_impl if wl.conv else None
  params = init_params(model, jax.random.key(args.seed), data.feature_shape)
  apply_fn = lambda p, x: model.apply({"params": p}, x)
  samples = samples_per_round(wl, data.n_train)
  if args.unroll == "auto":  # the engine's rule (its --conv_impl choices, xla and patches, are both under the trap)
    from fedjax_robust.experiment import conv_loop_trap
    unroll = True if conv_loop_trap(params, {"conv_impl": args.conv_impl}, backend) else 1
  else:
    unroll = True if args.unroll == "true" else int(args.unroll)
  info = {"workload": wl.name, "model": wl.model, "params": count_params(params), "clients": data.num_clients,
          "n_train": [int(n) for n in data.n_train], "epochs": wl.epochs, "batch_size": wl.batch_size,
          "drop_last": wl.drop_last, "shuffle": wl.shuffle, "samples_per_round": samples, "unroll": unroll,
          "conv_impl": conv_impl, "data": data.info.get("source"), "algorithm": args.algorithm,
          "pair_forward": args.pair_forward if args.algorithm == "fedcap" else None}
  print(f"\n### {wl.name} ({args.algorithm}): {info['params']:,} params, {data.num_clients} clients, n_train="
        f"{min(info['n_train'])}..{max(info['n_train'])}, E={wl.epochs}, B={wl.batch_size}, "
        f"drop_last={wl.drop_last}, {samples} samples/round, engine unroll={unroll}"
        + (f", conv_impl={conv_impl}" if conv_impl else ""), flush=True)

  plan = []
  for s in args.strategies:
    if s == "shard_map":
      plan += [("shard_map", n) for n in args.cpu_devices_list]
    else:
      plan.append((s, None))
  rows, finals, skipped = [], {}, []
  for name, ndev in plan:
    label = f"shard_map({ndev} dev)" if name == "shard_map" else name
    if name == "vmap" and backend == "cpu" and wl.conv and wl.epochs > 1 and not args.include_slow:
      # Measured once (benchmarks/README.md): ~88 s/round and ~19 GB peak RSS on the 2-core/23 GB machine,
      # the grouped-conv program of 20 clients x 110 unrolled steps. Opt in with --include-slow.
      print(f"  {label:22s} skipped on CPU for E>1 (slow, ~19 GB RSS); pass --include-slow", flush=True)
      skipped.append(label)
      continue
    gc.collect()
    jax.clear_caches()  # drop the previous strategy's executables before measuring this one's peak
    rss_before = current_rss_mib()
    reset_ok = reset_peak_rss()
    t0, cpu0, load0 = time.perf_counter(), _cpu_seconds(), os.getloadavg()[0]
    if name == "reference":
      first, times, compile_s, p1 = bench_reference(wl, data, apply_fn, params, args.rounds, args.seed,
                                                    args.min_time, args.max_time, args.algorithm)
    else:
      first, times, compile_s, p1 = bench_engine(wl, data, apply_fn, params, name, ndev, unroll, args.rounds,
                                                 args.seed, args.min_time, args.max_time, args.algorithm,
                                                 args.pair_forward)
    wall = time.perf_counter() - t0
    cpu_cores = (_cpu_seconds() - cpu0) / wall  # cores this process kept busy (2 = both, on this machine)
    steady = statistics.median(times)
    if compile_s is None:
      compile_s = max(first - steady, 0.0)
    row = {"strategy": label, "unroll": None if name == "reference" else unroll, "compile_s": compile_s,
           "first_round_s": first, "round_s": times, "round_s_median": steady, "rounds_per_s": 1.0 / steady,
           "samples_per_s": samples / steady, "peak_rss_mib": peak_rss_mib(), "peak_rss_is_per_strategy": reset_ok,
           "rss_before_mib": rss_before,
           "device_peak_mib": device_peak_mib(), "wall_s": wall, "process_cpu_cores": cpu_cores,
           "loadavg_1min": [load0, os.getloadavg()[0]]}
    rows.append(row)
    finals[label] = p1
    print(f"  {label:22s} compile {compile_s:7.2f} s  first {first:7.2f} s  {len(times)} rounds, min/median/max "
          f"{min(times):.4f}/{statistics.median(times):.4f}/{max(times):.4f} s"
          f"  -> {row['rounds_per_s']:.3f} rounds/s  peak RSS {row['peak_rss_mib']:.0f} MiB "
          f"(before {rss_before:.0f}); process used {cpu_cores:.2f} cores, load {load0:.1f}->{os.getloadavg()[0]:.1f}",
          flush=True)

  trap = None
  if wl.conv and backend == "cpu" and "vmap" in args.strategies and (wl.epochs == 1 or args.include_slow):
    print(f"  vmap with plain lax.scan (unroll=1), capped at {args.slow_cap:.0f} s per round ...", flush=True)
    t0 = time.perf_counter()
    trap = run_trap(wl, args.slow_cap, args.seed, args.conv_impl, args.algorithm, args.pair_forward)
    trap["wall_s"] = time.perf_counter() - t0
    print(f"  vmap (scan, unroll=1)  compile {trap['compile_s']}  rounds {trap['round_s']}  "
          f"capped={trap['capped']}", flush=True)

  base = next((r for r in rows if r["strategy"] == "reference"), None)
  for r in rows:
    r["speedup_vs_reference"] = (r["rounds_per_s"] / base["rounds_per_s"]) if base else None

  agreement = {}
  ref_label = "reference" if "reference" in finals else (next(iter(finals)) if finals else None)
  if ref_label:
    for label, p1 in finals.items():
      agreement[label] = float(np.max(np.abs(p1 - finals[ref_label])))
    print(f"  round-1 global params, max |diff| vs {ref_label}: "
          + ", ".join(f"{k} {v:.2e}" for k, v in agreement.items()), flush=True)
  return {"info": info, "rows": rows, "skipped": skipped, "trap_vmap_scan": trap, "agreement_vs": ref_label,
          "max_abs_diff": agreement}


def markdown(result: dict, cap_s: float) -> str:
  info = result["info"]
  algorithm = info.get("algorithm", "fedavg")
  pair = f", pair_forward={info['pair_forward']}" if info.get("pair_forward") else ""
  out = [f"**{info['workload']}** ({algorithm}{pair}) — {info['model']} ({info['params']:,} params), {info['clients']} clients, "
         f"E={info['epochs']}, B={info['batch_size']}, {info['samples_per_round']:,} samples/round, "
         f"engine unroll={info['unroll']}" + (f", conv_impl={info['conv_impl']}" if info.get("conv_impl") else ""),
         "",
         "| strategy | compile (s) | first round (s) | steady s/round (n) | rounds/s | samples/s | peak RSS MiB (at start) "
         "| vs plain sequential | cores used |",
         "|---|---|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    dev = f" (dev {r['device_peak_mib']:.0f})" if r["device_peak_mib"] is not None else ""
    sp = f"{r['speedup_vs_reference']:.2f}x" if r["speedup_vs_reference"] is not None else "–"
    reference = "ReferenceFedCAP" if algorithm == "fedcap" else "ReferenceFedAvg"
    name = f"plain sequential ({reference})" if r["strategy"] == "reference" else r["strategy"]
    out.append(f"| {name} | {r['compile_s']:.2f} | {r['first_round_s']:.2f} | {r['round_s_median']:.3f} ({len(r['round_s'])}) | "
               f"{r['rounds_per_s']:.3f} | {r['samples_per_s']:,.0f} | {r['peak_rss_mib']:,.0f} "
               f"({r['rss_before_mib']:,.0f}){dev} | {sp} | {r['process_cpu_cores']:.2f} |")
  for label in result.get("skipped", []):
    out.append(f"| {label} | skipped (pass --include-slow) | | | | | | | |")
  trap = result.get("trap_vmap_scan")
  if trap:
    base = next((r for r in result["rows"] if r["strategy"] == "reference"), None)
    comp = f"{trap['compile_s']:.2f}" if trap["compile_s"] is not None else "?"
    if trap["round_s"]:
      s = trap["round_s"][-1]
      rps = 1.0 / s
      sp = f"{rps / base['rounds_per_s']:.3f}x" if base else "–"
      out.append(f"| vmap, plain scan (unroll=1) | {comp} | – | {s:.2f} | {rps:.4f} | "
                 f"{info['samples_per_round'] / s:,.0f} | – | {sp} | – |")
    else:
      out.append(f"| vmap, plain scan (unroll=1) | {comp} | – | > {cap_s:.0f} (stopped) | < {1 / cap_s:.4f} | – | – "
                 f"| – | – |")
  diffs = result.get("max_abs_diff") or {}
  if diffs:
    out += ["", f"Round-1 global params, max abs difference vs {result['agreement_vs']}: "
            + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()) + "."]
  return "\n".join(out)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workload", default="all", help="all | fedcap_cifar10 | fedcap_cifar10_e1 | fedcap_cifar10_e5 "
                 "| digits_mlp (comma-separated)")
  p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round (median reported); see --min-time")
  p.add_argument("--min-time", type=float, default=2.0,
                 help="keep timing rounds (beyond --rounds) until this many seconds have been timed")
  p.add_argument("--max-time", type=float, default=60.0,
                 help="stop timing further rounds of a strategy once this many seconds are timed (>= 1 round)")
  p.add_argument("--cpu-devices", default=None,
                 help="shard_map device counts, comma-separated (e.g. 20,4,2). Default on CPU: 20 (one client "
                      "per device); on GPU/TPU: all devices")
  p.add_argument("--strategies", default=",".join(ALL_STRATEGIES),
                 help="comma-separated subset of vmap,shard_map,sequential,reference")
  p.add_argument("--unroll", default="auto", help="local-step scan unroll for the engine: auto (True for conv "
                 "nets on CPU, else 1) | true | an integer")
  p.add_argument("--conv_impl", "--conv-impl", dest="conv_impl", default="xla", choices=("xla", "patches"),
                 help="how the conv nets compute each convolution (model field conv_impl): xla = "
                      "lax.conv_general_dilated (grouped conv under vmap), patches = conv_general_dilated_patches "
                      "+ matmul; same params. Ignored by the MLP workload")
  p.add_argument("--algorithm", default="fedavg", choices=ALGORITHMS,
                 help="fedavg, or fedcap (two models per client step; baseline ReferenceFedCAP)")
  p.add_argument("--pair_forward", "--pair-forward", dest="pair_forward", default="separate",
                 choices=("separate", "stacked"), help="fedcap: engine.pair_forward (how the two models run)")
  p.add_argument("--include-slow", action="store_true", help="also time vmap with a plain scan for E=5")
  p.add_argument("--slow-cap", type=float, default=120.0, help="stop the plain-scan vmap round after this long")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None, help="write all results as JSON here")
  p.add_argument("--trap-child", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
  bad = [s for s in args.strategies if s not in ALL_STRATEGIES]
  if bad:
    p.error(f"unknown strategies {bad}; choose from {ALL_STRATEGIES}")
  names = []
  for w in (ALL_WORKLOADS if args.workload == "all" else args.workload.split(",")):
    if w not in WORKLOAD_GROUPS and w not in ALL_WORKLOADS:
      p.error(f"unknown workload {w!r}; choose from all, {', '.join(WORKLOAD_GROUPS)}")
    names += [n for n in WORKLOAD_GROUPS.get(w, (w,)) if n not in names]
  args.workloads = names
  return args


def _cpu_seconds() -> float:
  t = os.times()
  return t.user + t.system


def _cpu_info() -> str:
  try:
    for line in open("/proc/cpuinfo"):
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def main(argv=None) -> None:
  args = parse_args(argv)
  from fedjax_robust.execution import configure_cpu_devices
  if args.trap_child:
    configure_cpu_devices(1)
    return trap_child(args)
  requested = [int(n) for n in args.cpu_devices.split(",")] if args.cpu_devices else [20]
  # Must precede any JAX computation. It only affects the CPU platform, so it is harmless on a GPU/TPU host.
  configure_cpu_devices(max(requested))
  import jax
  backend = jax.default_backend()
  if backend == "cpu":
    args.cpu_devices_list = requested
  else:  # accelerators: the mesh is the real devices
    args.cpu_devices_list = ([n for n in requested if n <= jax.device_count()] if args.cpu_devices
                             else [jax.device_count()])
  load = os.getloadavg()
  machine = {"backend": backend, "devices": [str(d) for d in jax.devices()[:4]] + (
      ["..."] if jax.device_count() > 4 else []), "device_count": jax.device_count(), "nproc": os.cpu_count(),
             "cpu": _cpu_info(), "jax": jax.__version__, "python": platform.python_version(),
             "loadavg_start": load, "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
  print(f"backend={backend} devices={jax.device_count()} nproc={os.cpu_count()} cpu={machine['cpu']} "
        f"jax={jax.__version__} loadavg={load}", flush=True)
  t0 = time.perf_counter()
  results = [run_workload(WORKLOADS[w], args, backend) for w in args.workloads]
  machine["loadavg_end"] = os.getloadavg()
  machine["total_wall_s"] = time.perf_counter() - t0
  print("\n" + "\n\n".join(markdown(r, args.slow_cap) for r in results))
  print(f"\ntotal {machine['total_wall_s']:.0f} s; load average start {load}, end {machine['loadavg_end']}")
  if args.out:
    from experiments.grid import provenance, store_json
    machine.update({k: v for k, v in provenance().items() if k in ("commit", "dirty", "device_kind")})
    store_json(args.out, {"machine": machine, "args": {k: v for k, v in vars(args).items() if k != "trap_child"},
                          "results": results})


if __name__ == "__main__":
  main()
