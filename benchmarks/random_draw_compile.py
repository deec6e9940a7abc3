"""Compile time of ``jax.random`` draws against ``fedjax_robust.flat_random``'s (the same numbers), and of model init.

XLA:CPU compiles a multi-axis draw of JAX's partitionable threefry slowly (a 64-bit iota per axis builds the
counter); ``flat_random`` draws over the flat size and reshapes (fedjax_robust/flat_random.py). Two parts:

* draws: for each kind and shape, the seconds to lower and compile ``jit(draw)`` with ``jax.random`` and with
  ``flat_random`` (and a check that the two arrays are equal);
* model init: the wall time of an eager ``model.init`` of each ``--models`` entry, each in a fresh process (no
  compile cache shared), with the layers' draws going through ``flat_random`` (the code as it is) and through
  ``jax.random`` directly (``flat_random._flat`` replaced by a pass-through: the code before the change).

XLA_FLAGS is whatever the environment holds (the result records it): the tests' flags
(``--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1``) or XLA's defaults.

  python benchmarks/random_draw_compile.py --out benchmarks/results/random_draw_compile_cpu2.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import grid  # noqa: E402

SHAPES = ((84, 10), (5, 5, 3, 6), (3, 3, 64, 64), (400, 120), (840,))
KINDS = ("uniform", "normal", "truncated_normal", "bernoulli")
MODELS = "lenet5,fedcc_cifar_cnn,alexnet28,resnet8,cifar_resnet18"


def draw_fns(kind: str):
  """(jax.random's draw, flat_random's) of ``kind`` as ``f(key, shape)``."""
  import jax
  from fedjax_robust import flat_random
  if kind == "truncated_normal":
    return (lambda k, s: jax.random.truncated_normal(k, -2.0, 2.0, s),
            lambda k, s: flat_random.truncated_normal(k, -2.0, 2.0, s))
  if kind == "bernoulli":
    return lambda k, s: jax.random.bernoulli(k, 0.5, s), lambda k, s: flat_random.bernoulli(k, 0.5, s)
  return (lambda k, s: getattr(jax.random, kind)(k, s)), (lambda k, s: getattr(flat_random, kind)(k, s))


def compile_seconds(fn, key) -> float:
  import jax
  t0 = time.perf_counter()
  jax.jit(fn).lower(key).compile()
  return time.perf_counter() - t0


def time_init(model_name: str, draws: str) -> float:
  """Child process: one eager init of ``model_name`` at its input shape; ``draws='jax'`` bypasses flat_random."""
  import jax
  import jax.numpy as jnp
  from fedjax_robust import flat_random
  from fedjax_robust.models import DEFAULT_INPUT_SHAPES, get_model
  if draws == "jax":
    flat_random._flat = lambda draw, shape: draw(tuple(int(d) for d in shape))
  model = get_model(model_name, 10)
  x = jnp.zeros((1,) + DEFAULT_INPUT_SHAPES[model_name], jnp.float32)
  jax.block_until_ready(jnp.zeros(1) + 1)  # backend up before the clock starts
  t0 = time.perf_counter()
  jax.block_until_ready(model.init(jax.random.key(0), x))
  return time.perf_counter() - t0


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", default=MODELS)
  parser.add_argument("--out", default=None)
  parser.add_argument("--_child", nargs=2, metavar=("MODEL", "DRAWS"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args._child:
    print(json.dumps({"init_s": time_init(*args._child)}))
    return
  import jax
  import numpy as np

  key = jax.random.key(0)
  result = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "draws": {}, "init": {}, **grid.provenance()}
  for kind in KINDS:
    theirs, ours = draw_fns(kind)
    for shape in SHAPES:
      row = {"jax_random_s": compile_seconds(lambda k: theirs(k, shape), key),
             "flat_random_s": compile_seconds(lambda k: ours(k, shape), key),
             "equal": bool(np.array_equal(theirs(key, shape), ours(key, shape)))}
      row["ratio"] = row["jax_random_s"] / row["flat_random_s"]
      result["draws"][f"{kind} {shape}"] = row
      print(f"{kind:17s} {str(shape):15s} jax.random {row['jax_random_s']:5.2f} s  flat {row['flat_random_s']:5.2f} s"
            f"  x{row['ratio']:4.1f}  equal {row['equal']}", flush=True)
  for name in args.models.split(","):
    row = {}
    for draws in ("jax", "flat"):
      out = subprocess.run([sys.executable, __file__, "--_child", name, draws], capture_output=True, text=True,
                           check=True)
      row[f"{draws}_s"] = json.loads(out.stdout.strip().splitlines()[-1])["init_s"]
    row["ratio"] = row["jax_s"] / row["flat_s"]
    result["init"][name] = row
    print(f"init {name:16s} jax.random {row['jax_s']:5.2f} s  flat {row['flat_s']:5.2f} s  x{row['ratio']:4.1f}",
          flush=True)
  if args.out:
    grid.store_json(args.out, result)


if __name__ == "__main__":
  main()
