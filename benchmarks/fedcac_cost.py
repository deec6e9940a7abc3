#!/usr/bin/env python
"""Cost of FedCAC (issue 32): its server step alone for C = 40 and C = 1,000 clients, and whole rounds vs FedAvg.

Part 1, server step (``fedjax_robust.algorithms.fedcac.server_step``, jitted, compile and one warm-up call
excluded, median of ``--repeats`` calls, outputs blocked on) on a stacked parameter tree with ResNet-8's leaf
shapes (``jax.eval_shape`` of the model's init: 1,235,274 trainable parameters in its trainable tensors), random
float32 parameters and random bool masks with exactly ``floor(tau n)`` entries set per tensor at tau = 0.5 (random
masks: every pair of clients overlaps by about half, so the collaborator sets are generic). Next to it, in the same
process and on the same stacked tree: the FedAvg server mean (sample-weighted mean over the client axis), the
pairwise mask-intersection counts alone (``metrics.sensitivity.mask_counts``: the exact int32 ``K`` and ``I``, a
``C x C`` product over every parameter) and the customization product alone (``mix_rows``: ``U = diag(1/(A 1)) A W``
over every parameter), so their shares of the step can be read off.

Memory guard: the step holds the stacked parameters, the masks, the customized models ``U``, the new models and a
float32 copy of the largest mask tensor, about 18 bytes per client-parameter; when ``C x P x 18`` exceeds
``--mem_fraction`` of MemAvailable, every tensor is shortened by the same factor (kept flat, one "layer" per
tensor as before, at least one entry) until it fits; the JSON and the output say the parameter count used.

Part 2, whole rounds: FedCAC against FedAvg on the same reduced FedCAC CIFAR-10 experiment
(``--config``, default ``fedcac_cifar10.py:dir0.1``, ResNet-8, with the ``--set`` reductions below), under each
``--strategies`` value: one warm-up round (compilation) then ``--rounds`` timed rounds; rounds/s and the
FedCAC/FedAvg ratio measured in this process. ``--skip_rounds`` / ``--skip_server`` run one part only.

  python benchmarks/fedcac_cost.py --set data.data_dir=../shared/data --set data.num_clients=8 \\
      --set data.partition.samples_per_client=100 --set data.partition.test_samples_per_client=20 \\
      --set client.epochs=1 --out benchmarks/results/fedcac_cost_cpu2.json
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.adversarial_round import time_rounds  # noqa: E402
from benchmarks.seeds_vmap import load_config  # noqa: E402
from experiments import grid  # noqa: E402

BYTES_PER_CLIENT_PARAM = 18  # params 4 + mask 1 + U 4 + new params 4 + float32 mask copy 4 (+1 slack)


def mem_available() -> int:
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 8 * 2 ** 30


def resnet8_shapes() -> list[tuple[int, ...]]:
  """The trainable tensors' shapes of ResNet-8 for CIFAR-10 (no arrays are built)."""
  from fedjax_robust.models import get_model
  module = get_model("resnet8", 10)
  variables = jax.eval_shape(lambda k: module.init(k, jnp.zeros((1, 32, 32, 3)), train=False)
                             if _accepts_train(module) else module.init(k, jnp.zeros((1, 32, 32, 3))),
                             jax.random.PRNGKey(0))
  return [tuple(x.shape) for x in jax.tree.leaves(variables["params"])]


def _accepts_train(module) -> bool:
  import inspect
  return "train" in inspect.signature(type(module).__call__).parameters


def shrink(shapes, factor: int):
  """Every tensor flattened and shortened by ``factor`` (at least one entry)."""
  if factor <= 1:
    return shapes
  return [(max(1, math.prod(s) // factor),) for s in shapes]


def make_inputs(shapes, c: int, tau: float, seed: int):
  """Random params [C, *shape] and random masks with exactly floor(tau n) entries per tensor and client."""
  key = jax.random.PRNGKey(seed)
  params, masks = {}, {}
  for i, s in enumerate(shapes):
    kp, km = jax.random.split(jax.random.fold_in(key, i))
    n = math.prod(s)
    k = int(math.floor(tau * n))
    params[f"t{i:02d}"] = jax.jit(lambda kk, s=s: 0.05 * jax.random.normal(kk, (c,) + s, jnp.float32))(kp)

    def one_mask(kk, n=n, k=k, s=s):
      ranks = jnp.argsort(jnp.argsort(jax.random.uniform(kk, (c, n)), axis=1), axis=1)
      return (ranks < k).reshape((c,) + s)
    masks[f"t{i:02d}"] = jax.jit(one_mask)(km)
  weights = jnp.asarray(np.random.default_rng(seed).integers(50, 500, size=c), jnp.float32)
  return params, masks, weights


def _block(tree):
  for leaf in jax.tree.leaves(tree):
    leaf.block_until_ready()


def time_fn(fn, args, repeats: int):
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  _block(compiled(*args))  # warm-up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    _block(compiled(*args))
    times.append(time.perf_counter() - t)
  return {"compile_s": compile_s, "s_per_call": statistics.median(times), "times_s": times}


def server_part(c: int, tau: float, repeats: int, mem_fraction: float, seed: int, min_shrink: int = 1) -> dict:
  from fedjax_robust.algorithms.fedcac import server_step
  from fedjax_robust.metrics.sensitivity import mask_counts, mix_rows

  full = resnet8_shapes()
  full_p = sum(math.prod(s) for s in full)
  budget = mem_fraction * mem_available()
  mem_factor = max(1, math.ceil(c * full_p * BYTES_PER_CLIENT_PARAM / budget))
  factor = max(mem_factor, min_shrink)
  shapes = shrink(full, factor)
  p = sum(math.prod(s) for s in shapes)
  note = ("ResNet-8 trainable tensors" if factor == 1 else
          f"ResNet-8's {len(full)} tensors each shortened {factor}x (flat): {c} x {full_p:,} x "
          f"{BYTES_PER_CLIENT_PARAM} B = {c * full_p * BYTES_PER_CLIENT_PARAM / 2 ** 30:.1f} GiB > "
          f"{mem_fraction:.2f} x MemAvailable ({budget / 2 ** 30:.1f} GiB) needs {mem_factor}x"
          + (f"; --shrink asked {min_shrink}x (time: the C x C products scale as C^2 P)" if min_shrink > mem_factor
             else ""))
  print(f"C={c}: {p:,} params in {len(shapes)} tensors ({note})", flush=True)
  params, masks, weights = make_inputs(shapes, c, tau, seed)
  row = {"clients": c, "params": p, "tensors": len(shapes), "shrink_factor": factor, "tree": note, "tau": tau}

  def fedcac(pp, mm, ww):
    step = server_step(pp, mm, ww, jnp.int32(10), 100.0)
    return step.params, step.global_params, step.collaborators

  def fedavg(pp, ww):
    w = ww / jnp.sum(ww)
    return jax.tree.map(lambda a: jnp.tensordot(w, a, axes=1), pp)

  def counts(mm):
    return mask_counts(mm)

  mix = jax.random.bernoulli(jax.random.PRNGKey(seed + 1), 0.5, (c, c)) | jnp.eye(c, dtype=bool)
  mix = mix.astype(jnp.float32) / jnp.sum(mix, axis=1, keepdims=True)

  def customize(mx, pp):
    return mix_rows(mx, pp)

  for name, fn, args in (("fedcac_server_step", fedcac, (params, masks, weights)),
                         ("fedavg_mean", fedavg, (params, weights)),
                         ("mask_counts", counts, (masks,)),
                         ("mix_rows", customize, (mix, params))):
    r = time_fn(fn, args, repeats)
    row[name] = r
    print(f"  {name:20s} compile {r['compile_s']:6.2f} s   {r['s_per_call']:9.4f} s/call", flush=True)
  step_s = row["fedcac_server_step"]["s_per_call"]
  row["fedcac_over_fedavg"] = step_s / row["fedavg_mean"]["s_per_call"]
  row["mask_counts_share"] = row["mask_counts"]["s_per_call"] / step_s
  row["mix_rows_share"] = row["mix_rows"]["s_per_call"] / step_s
  print(f"  FedCAC step = {row['fedcac_over_fedavg']:.1f}x the FedAvg mean; mask counts "
        f"{100 * row['mask_counts_share']:.0f}% of it, customization product {100 * row['mix_rows_share']:.0f}%",
        flush=True)
  del params, masks
  return row


def rounds_part(config_spec: str, strategies, rounds: int, overrides) -> dict:
  from fedjax_robust.experiment import build_experiment
  out = {}
  for method in ("fedcac", "fedavg"):
    for strategy in strategies:
      config = load_config(f"{config_spec},{method}")
      config.output.progress = False
      config.engine.strategy = strategy
      grid.apply_overrides(config, overrides)
      exp = build_experiment(config)
      first, per_round, _, _ = time_rounds(exp, rounds)
      out[f"{method}/{strategy}"] = {"first_round_s": first, "round_s": per_round, "rounds_per_s": 1.0 / per_round}
      print(f"{method:>7s} {strategy:>10s}: first round {first:7.1f} s, then {per_round:7.2f} s/round "
            f"({1.0 / per_round:.3f} rounds/s)", flush=True)
      del exp
  for strategy in strategies:
    out[f"fedcac_over_fedavg_{strategy}"] = out[f"fedcac/{strategy}"]["round_s"] / out[f"fedavg/{strategy}"]["round_s"]
    print(f"{strategy}: a FedCAC round costs {out[f'fedcac_over_fedavg_{strategy}']:.2f}x a FedAvg round")
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--clients", default="40,1000", help="server-step cohort sizes")
  parser.add_argument("--tau", type=float, default=0.5)
  parser.add_argument("--repeats", type=int, default=3, help="timed server-step calls (median) after a warm-up")
  parser.add_argument("--shrink", default="1000:25",
                      help="C:F,... shorten every tensor at least F-fold for cohort C (CPU time); '' = none")
  parser.add_argument("--mem_fraction", type=float, default=0.5, help="share of MemAvailable the stack may take")
  parser.add_argument("--config", default="experiments/configs/fedcac_cifar10.py:dir0.1",
                      help="FedCAC config[:partition]; ',fedcac' / ',fedavg' is appended")
  parser.add_argument("--strategies", default="sequential,vmap")
  parser.add_argument("--rounds", type=int, default=2, help="timed rounds per (method, strategy), after a warm-up")
  parser.add_argument("--skip_server", action="store_true")
  parser.add_argument("--skip_rounds", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  logging.basicConfig(level=logging.WARNING)

  result = {"machine": platform.platform(), "cpu_count": os.cpu_count(), "backend": jax.default_backend(),
            "date": time.strftime("%Y-%m-%d"), **grid.provenance()}
  if not args.skip_server:
    shrink_at = {int(k): int(v) for k, v in (x.split(":") for x in args.shrink.split(",") if x)}
    result["server_step"] = [server_part(int(c), args.tau, args.repeats, args.mem_fraction, args.seed,
                                         shrink_at.get(int(c), 1))
                             for c in args.clients.split(",") if c]
  if not args.skip_rounds:
    result["rounds"] = {"config": args.config, "overrides": args.set, "timed_rounds": args.rounds,
                        "warmup_rounds": 1,
                        **rounds_part(args.config, [s for s in args.strategies.split(",") if s], args.rounds,
                                      args.set)}
  if args.out:
    grid.store_json(args.out, result)


if __name__ == "__main__":
  main()
