"""A conv net's SGD steps inside a loop on XLA:CPU: ``model.conv_impl`` xla against canonical, rolled against unrolled.

The conv-in-loop trap (jax-ml/jax#12868): XLA:CPU rewrites convolutions into the dimension order of its Eigen kernels
only in a program's entry computation, so the gradient convolutions JAX writes inside a ``lax.scan`` body run on its
naive path. ``conv_impl='canonical'`` (``models/layers.py``) writes them in Eigen's order itself. For each impl and
loop form this compiles ``--steps`` SGD steps of FedALC's CNN-MNIST (``cnn_mnist``, 28x28x1, batch ``--batch``) as one
scan, once for one client and once vmapped over ``--clients`` (the engine's client axis), and prints the compile
time, the milliseconds per step (best of ``--repeats`` calls) and the convolutions left off Eigen's order; every
variant's parameters are compared with the unrolled ``xla`` one's. ``--out`` stores it with provenance.

  python benchmarks/conv_loop.py --out benchmarks/results/conv_loop_cpu2.json
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import grid  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--clients", type=int, default=4, help="clients of the vmapped variant (0: skip it)")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from fedjax_robust import compilation
  from fedjax_robust.models import get_model, init_params

  key_x, key_y, key_p = jax.random.split(jax.random.key(0), 3)
  xs = jax.random.uniform(key_x, (args.steps, args.batch, 28, 28, 1))
  ys = jax.random.randint(key_y, (args.steps, args.batch), 0, 10)
  params = init_params(get_model("cnn_mnist", 10, conv_impl="xla"), key_p, (28, 28, 1))

  def train(impl, unroll):
    model = get_model("cnn_mnist", 10, conv_impl=impl)

    def step(p, batch):
      x, y = batch
      loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, x), y).mean()
      return jax.tree.map(lambda a, g: a - 0.05 * g, p, jax.grad(loss)(p)), None

    return lambda p, xs, ys: compilation.scan(step, p, (xs, ys), unroll=unroll)[0]

  def measure(fn, *inputs):
    program = compilation.jit(fn)
    t0 = time.perf_counter()
    compiled = program.lower(*inputs).compile()
    compile_s = time.perf_counter() - t0
    labels = re.findall(r"convolution\(.*?dim_labels=([^,\s]+)", compiled.as_text())
    out = jax.block_until_ready(program(*inputs))
    times = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(program(*inputs))
      times.append(time.perf_counter() - t0)
    return out, {"compile_s": compile_s, "ms_per_step": 1000 * min(times) / args.steps,
                 "off_eigen_convolutions": sorted({l for l in labels if l != "b01f_01io->b01f"})}

  result = {"model": "cnn_mnist", "steps": args.steps, "batch": args.batch, "clients": args.clients,
            "variants": {}, **grid.provenance()}
  variants = [(impl, unroll) for impl in ("xla", "canonical") for unroll in (True, 1)]
  shapes = [("one client", 0)] + ([(f"vmap x {args.clients}", args.clients)] if args.clients else [])
  for label, clients in shapes:
    stack = lambda a: jnp.stack([a] * clients) if clients else a
    inputs = (jax.tree.map(stack, params), stack(xs), stack(ys))
    reference = None
    for impl, unroll in variants:
      fn = train(impl, unroll)
      out, row = measure(jax.vmap(fn) if clients else fn, *inputs)
      reference = out if reference is None else reference
      row["max_abs_diff_vs_xla_unrolled"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                                for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(reference)))
      name = f"{label} / {impl} / {'unrolled' if unroll is True else 'rolled'}"
      result["variants"][name] = row
      print(f"{name:34s} compile {row['compile_s']:6.1f} s  {row['ms_per_step']:8.1f} ms/step  "
            f"off Eigen: {row['off_eigen_convolutions'] or '-'}  diff {row['max_abs_diff_vs_xla_unrolled']:.1e}",
            flush=True)
  if args.out:
    grid.store_json(args.out, result)


if __name__ == "__main__":
  main()
