#!/usr/bin/env python
"""Cost of the server step: each aggregation rule and each model-poisoning attack on a [C, D] upload stack.

Issue 3 asks that the aggregation + attack step of a 100-client round of a
1M-parameter model must not dominate the round. This script times, for every
rule of :mod:`fedjax_robust.aggregators` and every attack of
:mod:`fedjax_robust.attacks`, one jitted call on ``C`` uploads of ``D`` float32
parameters (default 100 x 1,000,000; a pytree of four leaves, like a small CNN),
30% of them malicious, and reports compile time and the steady median per call
(outputs blocked on). Compare with the local-training part of a round from
``rounds_per_second.py`` on the same machine.

FedCC also reads every client's penultimate Dense kernel from the round context: ``--penultimate IN x OUT``
(default 1600x512, FedCAP's CIFAR CNN fc1: 512 output neurons = the rows kernel CKA compares, so each client costs
one 512 x 512 Gram matrix over 1600 features, a median of its 130,816 pairwise distances and the centring); the
``similarity <name>`` rows time the batched similarity kernels alone (``metrics/similarity.py``) on those kernels.

    python benchmarks/aggregation_cost.py                       # 100 x 1M, every rule and attack
    python benchmarks/aggregation_cost.py --clients 20 --params 156810 --out agg.json
    python benchmarks/aggregation_cost.py --rules fedcc --attacks "" --similarities kernel_cka,linear_cka
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_robust.aggregators import registry as agg_registry  # noqa: E402
from fedjax_robust.attacks import registry as attack_registry  # noqa: E402
from fedjax_robust.metrics import similarity as similarity_kernels  # noqa: E402

# Rule parameters for a cohort of C clients with f = 30% expected attackers.
def rule_params(name: str, c: int) -> dict:
  f = int(0.3 * c)
  bulyan_f = max(1, (c - 3) // 4)
  return {
      "krum": {"num_byzantine": min(f, (c - 3) // 2)},
      "multi_krum": {"num_byzantine": min(f, (c - 3) // 2)},
      "bulyan": {"num_byzantine": bulyan_f},
      "trimmed_mean": {"num_trimmed": f},
      "norm_clipping": {"max_norm": 1.0},
      "bucketing": {"s": 2, "inner": {"name": "median"}},
      "gas": {"p": 1000, "inner": {"name": "krum", "num_byzantine": min(f, (c - 3) // 2)}},
  }.get(name, {})


def make_stack(c: int, d: int, seed: int):
  """A pytree of four leaves, [C, ...] each, about ``d`` float32 parameters per client in all."""
  sizes = [d // 2, d // 4, d // 8, d - d // 2 - d // 4 - d // 8]
  rng = np.random.default_rng(seed)
  return {f"w{i}": jnp.asarray(rng.normal(size=(c, s)).astype(np.float32) * 0.01) for i, s in enumerate(sizes)}


def _block(tree):
  for leaf in jax.tree.leaves(tree):
    leaf.block_until_ready()


def time_fn(fn, args, repeats: int, min_time: float):
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  _block(compiled(*args))  # warm-up
  times, start = [], time.perf_counter()
  while len(times) < repeats or (time.perf_counter() - start < min_time and len(times) < 50):
    t = time.perf_counter()
    _block(compiled(*args))
    times.append(time.perf_counter() - t)
  return compile_s, statistics.median(times), len(times)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--clients", type=int, default=100)
  p.add_argument("--params", type=int, default=1_000_000)
  p.add_argument("--rules", default=",".join(sorted(agg_registry.AGGREGATORS)))
  p.add_argument("--attacks", default=",".join(sorted(attack_registry.ATTACKS)))
  p.add_argument("--similarities", default=",".join(similarity_kernels.SIMILARITIES),
                 help="FedCC similarity kernels timed alone on the penultimate kernels ('' = none)")
  p.add_argument("--penultimate", default="1600x512", help="IN x OUT of the penultimate Dense kernel (FedCC)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--min-time", type=float, default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)

  c, d = args.clients, args.params
  updates = make_stack(c, d, args.seed)
  weights = jnp.ones((c,), jnp.float32)
  mask = jnp.ones((c,), bool)
  malicious = jnp.arange(c) < int(0.3 * c)
  key = jax.random.PRNGKey(args.seed)
  reference = jax.tree.map(lambda x: x[0] * 0.5, updates)
  # FLARE scores clients by their penultimate features on a server set: 64 samples x 64 features each.
  features = jax.random.normal(key, (c, 64, 64))
  # FedCC compares penultimate Dense kernels [in, out]: benign-like clients = global + a small update.
  d_in, d_out = (int(v) for v in args.penultimate.lower().split("x"))
  k1, k2 = jax.random.split(jax.random.fold_in(key, 1))
  global_kernel = jax.random.normal(k1, (d_in, d_out)) * (1.0 / d_in) ** 0.5
  client_kernels = global_kernel[None] + 0.01 * jax.random.normal(k2, (c, d_in, d_out)) * (1.0 / d_in) ** 0.5
  print(f"backend={jax.default_backend()} devices={jax.devices()} C={c} D={d} penultimate={d_in}x{d_out}",
        flush=True)

  rows = []
  for name in [r for r in args.rules.split(",") if r]:
    def run_rule(u, w, m, k, ref, feats, pen, gpen, name=name):
      agg = agg_registry.make_aggregator(name, num_clients=c, **rule_params(name, c))
      res = agg(u, w, m, k, {"reference_update": ref, "global_params": ref, "features": feats,
                             "penultimate_weights": pen, "global_penultimate_weights": gpen})
      return res.update, res.weights

    try:
      compile_s, step_s, n = time_fn(run_rule, (updates, weights, mask, key, reference, features, client_kernels,
                                                global_kernel), args.repeats, args.min_time)
    except Exception as e:  # noqa: BLE001 - report and go on with the next rule
      print(f"rule {name}: FAILED {type(e).__name__}: {e}", flush=True)
      rows.append({"kind": "rule", "name": name, "error": str(e)})
      continue
    rows.append({"kind": "rule", "name": name, "params": rule_params(name, c), "compile_s": compile_s,
                 "ms_per_call": step_s * 1e3, "calls": n})
    print(f"rule   {name:18s} compile {compile_s:6.2f} s   {step_s * 1e3:9.2f} ms/call", flush=True)

  for name in [x for x in args.similarities.split(",") if x]:
    measure = similarity_kernels.get_similarity(name)

    def run_similarity(gk, ck, measure=measure):
      return measure.batched(similarity_kernels.as_rows(gk), jax.vmap(similarity_kernels.as_rows)(ck))

    try:
      compile_s, step_s, n = time_fn(run_similarity, (global_kernel, client_kernels), args.repeats, args.min_time)
    except Exception as e:  # noqa: BLE001
      print(f"similarity {name}: FAILED {type(e).__name__}: {e}", flush=True)
      rows.append({"kind": "similarity", "name": name, "error": str(e)})
      continue
    rows.append({"kind": "similarity", "name": name, "shape": [c, d_out, d_in], "compile_s": compile_s,
                 "ms_per_call": step_s * 1e3, "calls": n})
    print(f"similarity {name:14s} compile {compile_s:6.2f} s   {step_s * 1e3:9.2f} ms/call", flush=True)

  for name in [a for a in args.attacks.split(",") if a]:
    attack = attack_registry.make_attack(name)

    def run_attack(u, mal, k, ref, w, m, attack=attack):
      return attack.apply(u, mal, k, {"global_params": ref, "weights": w, "mask": m})

    try:
      compile_s, step_s, n = time_fn(run_attack, (updates, malicious, key, reference, weights, mask),
                                     args.repeats, args.min_time)
    except Exception as e:  # noqa: BLE001
      print(f"attack {name}: FAILED {type(e).__name__}: {e}", flush=True)
      rows.append({"kind": "attack", "name": name, "error": str(e)})
      continue
    rows.append({"kind": "attack", "name": name, "compile_s": compile_s, "ms_per_call": step_s * 1e3, "calls": n})
    print(f"attack {name:18s} compile {compile_s:6.2f} s   {step_s * 1e3:9.2f} ms/call", flush=True)

  result = {"backend": jax.default_backend(), "devices": [str(x) for x in jax.devices()],
            "machine": platform.platform(), "cpu_count": os.cpu_count(), "clients": c, "params": d,
            "penultimate": [d_in, d_out], "command": " ".join(sys.argv),
            "jax": jax.__version__, "rows": rows}
  print("\n| kind | name | compile s | ms / call |\n|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['kind']} | {r['name']} | failed | {r['error'][:60]} |")
    else:
      print(f"| {r['kind']} | {r['name']} | {r['compile_s']:.2f} | {r['ms_per_call']:.2f} |")
  if args.out:
    from experiments.grid import provenance, store_json
    result.update({k: v for k, v in provenance().items() if k in ("commit", "dirty", "device_kind")})
    store_json(args.out, result)


if __name__ == "__main__":
  main()
