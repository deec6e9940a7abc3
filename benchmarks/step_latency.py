#!/usr/bin/env python
"""Per-step latency of the vmapped client SGD step, per formulation (FedCAP CIFAR-10 FedAvgCNN).

Why: on an H100 one FedCAP CIFAR-10 round (20 clients, E = 5, B = 10, 225 samples per client, drop_last ->
22 steps per epoch, 110 local steps per model per round) spends ~1.6 ms in each vmapped SGD step of 20 clients
at batch 10. That is ~8 GFLOP per step, i.e. ~5 TFLOP/s: latency bound, not FLOP bound. This script times
several ways of writing the same step, each run ``--steps`` times inside one jitted ``lax.scan`` (the engine's
shape), so a GPU session can see where the time goes.

Formulations (``name[@unroll]``; ``unroll`` is the ``lax.scan`` unroll factor, an int or ``full``):

  engine       (a) the engine's own path: ``jax.vmap`` of ``fedjax_robust.client.local_sgd.local_train`` with
               FedAvg's masked loss and ``optax.sgd`` (index gather, padding masks, no-op selects, loss sum);
               the scan sits inside the vmap, so ``vmap`` turns each conv into a grouped convolution. The model's
               default conv (``model.conv_impl=auto``: ``canonical`` on the CPU, ``folded`` on a GPU since
               2026-11-28, so there ``engine`` is ``engine_folded``).
  engine_xla   (a) with ``model.conv_impl=xla``: JAX's own gradients, i.e. ``vmap`` of each client's kernel
               gradient (the GPU default before 2026-11-28; on the CPU the conv-in-loop trap).
  engine_folded  (a) with ``model.conv_impl=folded``: each conv's kernel gradient under ``vmap`` is the gradient
               of one grouped conv of all clients (``batch_group_count = C``, as in ``grouped``), not JAX's
               ``vmap`` of the per-client one (``fedjax_robust.models.layers.conv_folded``).
  vmap         ``lax.scan`` over steps of ``jax.vmap`` of a minimal one-client step (flax apply, mean CE,
               plain SGD): the same grouped convs without the engine's bookkeeping.
  grouped      (b) client axis folded into the conv channels by hand: activations ``[B, H, W, C*ch]``,
               kernels ``[kh, kw, cin, C*cout]``, ``feature_group_count=C``; dense layers as batched einsums.
  lax_map      (b) a sequential client loop inside the step: ``lax.map`` of the one-client step (a nested
               ``while``; each client's convs are ordinary, ungrouped convs).
  client_loop  (b) a Python loop over clients inside the step: C independent ungrouped step graphs in one
               program, no inner ``while`` (XLA may schedule them freely).
  patches      (c) each conv as ``lax.conv_general_dilated_patches`` (clients folded into the batch: patch
               extraction has no weights) + a batched matmul ``einsum('cnk,cko->cno')``.
  pair_separate, pair_stacked, pair_stacked_xla, pair_stacked_folded
               FedCAP's / Ditto's client step: ``jax.vmap(local_train)`` of the pair loss
               ``CE(w) + CE(v) + lamda/2 ||v - anchor||^2`` on ``{w, v}`` (``fedjax_robust.algorithms.ditto``),
               with the two models' passes run separately or as one vmapped pass over the stacked pair
               (``engine.pair_forward``; the model's default conv, ``_xla`` / ``_folded``: that ``conv_impl``).
               Two models per step, so they are checked against ``pair_separate@1`` (not ``engine@1``) and their
               TFLOP/s count both models; their rounds/s is FedCAP's local training.
  loop_floor   not a training step: per step, one batch slice and an elementwise update of every parameter.
               The floor of a scan step on this backend (loop + launch overhead); excluded from the check.

Per formulation: compile seconds (``lower().compile()`` of the ``--steps``-step program), steady ms per step
(median of ``--repeats`` timed calls after one warm-up call, outputs blocked on, divided by ``--steps``), the
rounds/s that ms/step means for ``--steps_per_round`` steps (default 110, one model's FedCAP round; FedCAP itself
trains two models per round, so halve it for FedCAP), speedup vs (a) ``engine@1``, XLA's FLOP count for one step
(``cost_analysis()`` of a one-step program) and the achieved TFLOP/s (analytic model FLOPs / time), with % of
the device's peak when known (``--peak_tflops`` or a small datasheet table).

Numerical check: every formulation is also built for ``--check_steps`` steps (default 3) and run from the same
stacked per-client parameters; the parameters must match ``engine`` within ``--atol`` (max abs difference) and
``--rtol_update`` (max abs difference of the parameter *change*, relative to the largest change). By default
the check programs are traced under ``jax.default_matmul_precision('highest')`` (``--check_precision``), so
TF32 on Hopper does not blur a layout bug; the timed programs use the default precision.

    python benchmarks/step_latency.py                                      # GPU: the full setting
    python benchmarks/step_latency.py --clients 4 --steps 20 --repeats 2   # small CPU smoke run
    python benchmarks/step_latency.py --formulations engine@1,grouped@5,patches@full --profile_dir /tmp/prof
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import sys
import time
from typing import Callable, NamedTuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax import lax  # noqa: E402

DEFAULT_FORMULATIONS = ("engine@1,engine@5,engine@25,engine_xla,engine_folded,vmap,grouped,lax_map,client_loop,"
                        "patches,pair_separate,pair_stacked,pair_stacked_xla,pair_stacked_folded,loop_floor")
NOT_CHECKED = ("loop_floor",)
REFERENCE = "engine@1"
PAIR_REFERENCE = "pair_separate@1"  # reference of the two-model (FedCAP / Ditto) formulations
DN = ("NHWC", "HWIO", "NHWC")

# Datasheet peaks, dense (no sparsity), TFLOP/s: (FP32 non-tensor, TF32 tensor core). Matched on device_kind.
PEAKS = (
    ("H100 PCIe", 51.0, 378.0),
    ("H100", 67.0, 494.7),  # SXM
    ("H200", 67.0, 494.7),
    ("A100", 19.5, 156.0),
)


# ----------------------------------------------------------------------------------------------- setting
class Setting(NamedTuple):
  """Static shape of the benchmark: C clients, batch B, one epoch of ``per_epoch`` batches per client."""

  clients: int
  batch: int
  per_epoch: int  # batches in the client's data; step i reads batch i % per_epoch
  image: tuple  # (H, W, Cin)
  num_classes: int = 10
  fc_dim: int = 64
  lr: float = 0.01
  lamda: float = 0.1  # pair formulations: prox weight of v toward the frozen anchor (FedCAP's CIFAR-10 lambda)


def per_epoch_for(steps: int, samples: int, batch: int) -> int:
  """Largest divisor of ``steps`` that is <= samples // batch, so ``engine`` runs exactly ``steps`` steps.

  110 steps over 225 samples at B = 10 gives 22 (FedCAP: 5 epochs of 22 drop_last batches).
  """
  cap = max(samples // batch, 1)
  return max(d for d in range(1, min(steps, cap) + 1) if steps % d == 0)


def make_model(s: Setting, conv_impl: str = "auto"):
  from fedjax_robust.models import get_model
  return get_model("fedavg_cnn", num_classes=s.num_classes, fc_dim=s.fc_dim, conv_impl=conv_impl)


def make_inputs(s: Setting, seed: int = 0):
  """Stacked per-client params (a different draw per client) and synthetic data ``[C, n, H, W, Cin]``.

  Drawn with numpy (PyTorch's default init: U(+-1/sqrt(fan_in)) for kernel and bias), not with flax's
  ``init``, whose jitted random-bit programs take seconds to compile on a CPU. Shapes come from
  ``jax.eval_shape`` of the model's init, so they are the engine's.
  """
  from fedjax_robust.models import init_params
  model = make_model(s)
  shapes = jax.eval_shape(lambda k: init_params(model, k, s.image), jax.random.key(0))
  rng = np.random.default_rng(seed)
  params = {}
  for layer, leaves in shapes.items():
    bound = 1.0 / math.sqrt(math.prod(leaves["kernel"].shape[:-1]))
    params[layer] = {k: jnp.asarray(rng.uniform(-bound, bound, (s.clients,) + v.shape).astype(np.float32))
                     for k, v in leaves.items()}
  n = s.per_epoch * s.batch
  x = jnp.asarray(rng.standard_normal((s.clients, n) + tuple(s.image), dtype=np.float32))
  y = jnp.asarray(rng.integers(0, s.num_classes, (s.clients, n)).astype(np.int32))
  return params, x, y


def analytic_flops_per_step(s: Setting) -> dict:
  """Multiply-add FLOPs (x2) of one training step of all clients: forward, weight grads, input grads.

  Input grads of the first conv are not needed (the data has no gradient). Elementwise ops not counted.
  """
  h, w, cin = s.image
  layers = []  # (forward flops per sample, needs input grad)
  h1, w1 = h - 4, w - 4
  layers.append((2 * h1 * w1 * 32 * 25 * cin, False))
  h2, w2 = h1 // 2 - 4, w1 // 2 - 4
  layers.append((2 * h2 * w2 * 64 * 25 * 32, True))
  flat = (h2 // 2) * (w2 // 2) * 64
  layers.append((2 * flat * s.fc_dim, True))
  layers.append((2 * s.fc_dim * s.num_classes, True))
  fwd = sum(f for f, _ in layers)
  train = fwd + fwd + sum(f for f, g in layers if g)
  samples = s.clients * s.batch
  return {"forward_per_sample": fwd, "train_per_sample": train, "train_per_step": train * samples}


# ----------------------------------------------------------------------------------------------- pieces
def _batch(x, y, i, s: Setting):
  """Batch ``i % per_epoch`` of every client: ``[C, B, ...]`` (a dynamic slice, no gather)."""
  start = (i % s.per_epoch) * s.batch
  return (lax.dynamic_slice_in_dim(x, start, s.batch, axis=1), lax.dynamic_slice_in_dim(y, start, s.batch, axis=1))


def _ce(logits, labels):
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def _sgd(p, g, lr):
  return jax.tree.map(lambda a, b: a - lr * b, p, g)


def _scan_steps(step: Callable, params, x, y, steps: int, unroll, s: Setting):
  def body(p, i):
    xb, yb = _batch(x, y, i, s)
    return step(p, xb, yb), None
  out, _ = lax.scan(body, params, jnp.arange(steps, dtype=jnp.int32), unroll=unroll)
  return out


def _one_client_step(s: Setting):
  model = make_model(s)

  def step(p, xb, yb):  # p: one client's params; xb [B, H, W, Cin]
    g = jax.grad(lambda q: _ce(model.apply({"params": q}, xb), yb))(p)
    return _sgd(p, g, s.lr)
  return step


def _pool(h):
  return lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _grouped_forward(P, xb, s: Setting):
  """All clients' logits with the client axis folded into the conv channels. xb [C, B, H, W, Cin]."""
  C, B = xb.shape[:2]
  h = jnp.transpose(xb, (1, 2, 3, 0, 4)).reshape(B, xb.shape[2], xb.shape[3], C * xb.shape[4])
  for name in ("conv1", "conv2"):
    k, b = P[name]["kernel"], P[name]["bias"]  # [C, kh, kw, cin, cout], [C, cout]
    _, kh, kw, ci, co = k.shape
    kg = jnp.transpose(k, (1, 2, 3, 0, 4)).reshape(kh, kw, ci, C * co)
    h = lax.conv_general_dilated(h, kg, (1, 1), "VALID", dimension_numbers=DN, feature_group_count=C)
    h = _pool(jax.nn.relu(h + b.reshape(C * co)))
  Bh, hh, ww, cc = h.shape
  h = jnp.transpose(h.reshape(Bh, hh, ww, C, cc // C), (3, 0, 1, 2, 4)).reshape(C, Bh, -1)  # (H, W, ch) flatten
  h = jax.nn.relu(jnp.einsum("cbi,cio->cbo", h, P["fc1"]["kernel"]) + P["fc1"]["bias"][:, None, :])
  return jnp.einsum("cbi,cio->cbo", h, P["head"]["kernel"]) + P["head"]["bias"][:, None, :]


def _patches_forward(P, xb, s: Setting):
  """All clients' logits with each conv as patches (clients folded into the batch) + a batched matmul."""
  C, B = xb.shape[:2]
  h = xb.reshape((C * B,) + xb.shape[2:])
  for name in ("conv1", "conv2"):
    k, b = P[name]["kernel"], P[name]["bias"]  # [C, kh, kw, cin, cout]
    _, kh, kw, ci, co = k.shape
    pt = lax.conv_general_dilated_patches(h, (kh, kw), (1, 1), "VALID", dimension_numbers=DN)
    _, ho, wo, kk = pt.shape  # patch features ordered (cin, kh, kw)
    km = jnp.transpose(k, (0, 3, 1, 2, 4)).reshape(C, ci * kh * kw, co)
    out = jnp.einsum("cnk,cko->cno", pt.reshape(C, B * ho * wo, kk), km) + b[:, None, :]
    h = _pool(jax.nn.relu(out.reshape(C * B, ho, wo, co)))
  h = h.reshape(C, B, -1)
  h = jax.nn.relu(jnp.einsum("cbi,cio->cbo", h, P["fc1"]["kernel"]) + P["fc1"]["bias"][:, None, :])
  return jnp.einsum("cbi,cio->cbo", h, P["head"]["kernel"]) + P["head"]["bias"][:, None, :]


def _stacked_step(forward, s: Setting):
  """SGD step of all clients from a forward over stacked params: grad of the sum of per-client mean losses."""
  def loss(P, xb, yb):
    logits = forward(P, xb, s)
    return jnp.sum(jax.vmap(_ce)(logits, yb))

  def step(P, xb, yb):
    return _sgd(P, jax.grad(loss)(P, xb, yb), s.lr)
  return step


# ----------------------------------------------------------------------------------------------- builders
def _vmapped_local_train(label: str, loss_for: Callable, start: Callable = lambda p: p, conv_impl: str = "auto"):
  """Builder of ``jax.vmap(local_train)`` as the engine calls it (unshuffled, drop_last, plain SGD).

  ``loss_for(apply_fn, p)``: the loss of the client whose params are ``p``; ``start(p)``: what it trains;
  ``conv_impl``: the model's ``conv_impl`` (``folded``: the kernel gradient of all clients as one grouped conv).
  """
  def builder(s: Setting, steps: int, unroll):
    from fedjax_robust.client.local_sgd import ClientData, LocalTrainSpec, local_train
    model = make_model(s, conv_impl)
    apply_fn = lambda p, x: model.apply({"params": p}, x)
    opt = optax.sgd(s.lr)
    if steps % s.per_epoch:
      raise ValueError(f"{label} needs steps ({steps}) to be a multiple of per_epoch ({s.per_epoch})")
    spec = LocalTrainSpec(epochs=steps // s.per_epoch, batch_size=s.batch, drop_last=True, shuffle=False,
                          unroll=unroll)

    def one(p, x, y, n):
      trained = start(p)
      out = local_train(loss_for(apply_fn, p, s), opt, trained, opt.init(trained), ClientData(x, y, n),
                        jax.random.key(0), spec)
      return out.params

    def fn(params, x, y):
      n = jnp.full((x.shape[0],), x.shape[1], jnp.int32)
      return jax.vmap(one)(params, x, y, n)
    return fn
  return builder


def _fedavg_loss(apply_fn, p, s: Setting):
  from fedjax_robust.algorithms.fedavg import classification_loss
  return classification_loss(apply_fn)


# (a) ``jax.vmap(local_train)`` exactly as the FedAvg client update calls it; and with ``model.conv_impl=folded``.
build_engine = _vmapped_local_train("engine", _fedavg_loss)
build_engine_xla = _vmapped_local_train("engine_xla", _fedavg_loss, conv_impl="xla")
build_engine_folded = _vmapped_local_train("engine_folded", _fedavg_loss, conv_impl="folded")


def is_pair(name_or_label: str) -> bool:
  return name_or_label.startswith("pair_")


def pair_start(p):
  """Start of the pair step: ``w`` = the client's params, ``v`` = half of them (v != w, so the passes differ)."""
  return {"w": p, "v": jax.tree.map(lambda a: 0.5 * a, p)}


def _build_pair(pair_forward: str, conv_impl: str = "auto"):
  """FedCAP's / Ditto's client step on ``{w, v}``, the prox term anchored at the client's params (spec §1.5)."""
  def loss_for(apply_fn, p, s: Setting):
    from fedjax_robust.algorithms.ditto import ditto_pair_loss
    return ditto_pair_loss(apply_fn, p, s.lamda, pair_forward)
  return _vmapped_local_train(f"{pair_forward} pair", loss_for, pair_start, conv_impl)


def build_vmap(s: Setting, steps: int, unroll):
  step = jax.vmap(_one_client_step(s))
  return lambda params, x, y: _scan_steps(step, params, x, y, steps, unroll, s)


def build_grouped(s: Setting, steps: int, unroll):
  step = _stacked_step(_grouped_forward, s)
  return lambda params, x, y: _scan_steps(step, params, x, y, steps, unroll, s)


def build_patches(s: Setting, steps: int, unroll):
  step = _stacked_step(_patches_forward, s)
  return lambda params, x, y: _scan_steps(step, params, x, y, steps, unroll, s)


def build_lax_map(s: Setting, steps: int, unroll):
  one = _one_client_step(s)
  step = lambda P, xb, yb: lax.map(lambda a: one(*a), (P, xb, yb))
  return lambda params, x, y: _scan_steps(step, params, x, y, steps, unroll, s)


def build_client_loop(s: Setting, steps: int, unroll):
  one = _one_client_step(s)

  def step(P, xb, yb):
    outs = [one(jax.tree.map(lambda a: a[c], P), xb[c], yb[c]) for c in range(xb.shape[0])]
    return jax.tree.map(lambda *a: jnp.stack(a), *outs)
  return lambda params, x, y: _scan_steps(step, params, x, y, steps, unroll, s)


def build_loop_floor(s: Setting, steps: int, unroll):
  def step(P, xb, yb):
    m = jnp.mean(xb, axis=(1, 2, 3, 4))  # [C]
    return jax.tree.map(lambda a: a - 1e-6 * m.reshape((-1,) + (1,) * (a.ndim - 1)), P)
  return lambda params, x, y: _scan_steps(step, params, x, y, steps, unroll, s)


BUILDERS = {"engine": build_engine, "engine_xla": build_engine_xla, "engine_folded": build_engine_folded,
            "vmap": build_vmap, "grouped": build_grouped, "lax_map": build_lax_map, "client_loop": build_client_loop,
            "patches": build_patches, "pair_separate": _build_pair("separate"), "pair_stacked": _build_pair("stacked"),
            "pair_stacked_xla": _build_pair("stacked", "xla"), "pair_stacked_folded": _build_pair("stacked", "folded"),
            "loop_floor": build_loop_floor}
NAMES = tuple(BUILDERS)  # every formulation, in the order above


def parse_formulation(text: str, default_unrolls=("1",)):
  """``name`` or ``name@unroll`` -> list of (label, name, unroll); unroll int or True (``full``)."""
  name, _, u = text.strip().partition("@")
  if name not in BUILDERS:
    raise ValueError(f"unknown formulation {name!r}; choose from {', '.join(NAMES)}")
  out = []
  for uu in ([u] if u else list(default_unrolls)):
    unroll = True if uu in ("full", "true", "True") else int(uu)
    out.append((f"{name}@{'full' if unroll is True else unroll}", name, unroll))
  return out


def build(label_or_name: str, s: Setting, steps: int, unroll=None):
  """The jittable ``fn(params, x, y) -> params`` of a formulation (``name`` or ``name@unroll``)."""
  (_, name, u), = parse_formulation(label_or_name) if unroll is None else [(None, label_or_name, unroll)]
  return BUILDERS[name](s, steps, u)


# ----------------------------------------------------------------------------------------------- check / cost
def _flat(tree) -> np.ndarray:
  return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(tree)])


def _precision(value: str):
  """``jax.default_matmul_precision`` (also governs convs), or the config flag where that helper is gone."""
  if hasattr(jax, "default_matmul_precision"):
    return jax.default_matmul_precision(value)

  @contextlib.contextmanager
  def ctx():
    old = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", value)
    try:
      yield
    finally:
      jax.config.update("jax_default_matmul_precision", old)
  return ctx()


def run_check(labels, s: Setting, params, x, y, check_steps: int, precision: str | None, combined: bool = False):
  """Params after ``check_steps`` steps per label (each at its own unroll, capped), vs the first label.

  ``combined``: all formulations in ONE jitted program (one compile instead of one each; used by the test).
  """
  ctx = _precision(precision) if precision and precision != "default" else contextlib.nullcontext()
  p0 = _flat(jax.vmap(pair_start)(params) if is_pair(labels[0]) else params)
  fns = []
  for label in labels:
    (_, name, unroll), = parse_formulation(label)
    if unroll is not True:
      unroll = min(unroll, check_steps)
    fns.append(BUILDERS[name](s, check_steps, unroll))
  with ctx:
    if combined:
      outs = jax.block_until_ready(jax.jit(lambda p, a, b: [f(p, a, b) for f in fns])(params, x, y))
    else:
      outs = [jax.block_until_ready(jax.jit(f)(params, x, y)) for f in fns]
  results = {label: _flat(o) for label, o in zip(labels, outs)}
  ref = results[labels[0]]
  upd = np.max(np.abs(ref - p0))
  report = {}
  for label, p in results.items():
    d = float(np.max(np.abs(p - ref)))
    report[label] = {"max_abs_diff": d, "rel_update_diff": float(np.max(np.abs((p - p0) - (ref - p0))) / upd),
                     "max_abs_update": float(np.max(np.abs(p - p0)))}
  return report


def cost_flops(compiled) -> float | None:
  try:
    ca = compiled.cost_analysis()
  except Exception:  # not every backend implements it
    return None
  if isinstance(ca, (list, tuple)):
    ca = ca[0] if ca else None
  if not ca or "flops" not in ca:
    return None
  return float(ca["flops"])


def device_peaks(kind: str):
  for key, fp32, tf32 in PEAKS:
    if key in kind:
      return fp32, tf32
  return None


# ----------------------------------------------------------------------------------------------- timing
def time_formulation(label, s: Setting, params, x, y, steps: int, repeats: int):
  (_, name, unroll), = parse_formulation(label)
  fn = jax.jit(BUILDERS[name](s, steps, unroll))
  t = time.perf_counter()
  compiled = fn.lower(params, x, y).compile()
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  jax.block_until_ready(compiled(params, x, y))
  first_s = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(compiled(params, x, y))
    times.append(time.perf_counter() - t)
  # XLA's FLOPs of ONE step (a one-step program; a while loop's body would otherwise be counted once or not).
  flops_xla = None
  try:
    s1 = s._replace(per_epoch=1)
    one = jax.jit(BUILDERS[name](s1, 1, 1))
    flops_xla = cost_flops(one.lower(params, x[:, : s.batch], y[:, : s.batch]).compile())
    if flops_xla is not None and name == "lax_map":
      flops_xla *= s.clients  # XLA's cost analysis counts a while body once: lax.map's body is one client
  except Exception as err:  # cost analysis is best effort
    print(f"  [{label}] cost_analysis failed: {err}", flush=True)
  return {"label": label, "name": name, "unroll": "full" if unroll is True else unroll, "compile_s": compile_s,
          "first_call_s": first_s, "call_s": times, "call_s_median": statistics.median(times),
          "ms_per_step": 1e3 * statistics.median(times) / steps, "xla_flops_per_step": flops_xla}, compiled


def profile(compiled, params, x, y, path: str, calls: int = 2) -> None:
  os.makedirs(path, exist_ok=True)
  jax.block_until_ready(compiled(params, x, y))
  with jax.profiler.trace(path, create_perfetto_trace=True):
    for i in range(calls):
      with jax.profiler.TraceAnnotation(f"call{i}"):
        jax.block_until_ready(compiled(params, x, y))


# ----------------------------------------------------------------------------------------------- driver
def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--clients", type=int, default=20)
  p.add_argument("--batch", type=int, default=10)
  p.add_argument("--steps", type=int, default=110, help="local steps per timed call (one lax.scan)")
  p.add_argument("--samples", type=int, default=225,
                 help="samples per client; step i reads batch i %% per_epoch, per_epoch = the largest divisor "
                      "of --steps <= samples // batch")
  p.add_argument("--formulations", default=DEFAULT_FORMULATIONS,
                 help=f"comma-separated name[@unroll] (unroll: int or full), or 'all'; names: {', '.join(NAMES)}")
  p.add_argument("--unrolls", default="1", help="unroll factors for names given without @ (comma-separated)")
  p.add_argument("--repeats", type=int, default=5, help="timed calls after one warm-up call (median reported)")
  p.add_argument("--steps_per_round", type=int, default=110,
                 help="steps in one round for the rounds/s column (FedCAP CIFAR-10: 5 x 22 per model)")
  p.add_argument("--check_steps", type=int, default=3)
  p.add_argument("--check_precision", default="highest", help="highest | high | default (matmul/conv precision "
                 "of the check programs only)")
  p.add_argument("--atol", type=float, default=1e-5, help="max abs param difference allowed vs engine")
  p.add_argument("--rtol_update", type=float, default=1e-3,
                 help="max abs difference of the param change, relative to the largest change, allowed")
  p.add_argument("--no_check", action="store_true")
  p.add_argument("--peak_tflops", type=float, default=None, help="device peak for the %% column "
                 "(default: FP32 and TF32 datasheet peaks for known GPUs)")
  p.add_argument("--profile_dir", default=None,
                 help="capture jax.profiler traces of the fastest formulation and of engine@1 here")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None, help="write the results as JSON here")
  args = p.parse_args(argv)
  unrolls = [u for u in args.unrolls.split(",") if u]
  items = NAMES if args.formulations == "all" else [f for f in args.formulations.split(",") if f.strip()]
  labels, seen = [], set()
  for item in items:
    for label, _, _ in parse_formulation(item, unrolls):
      if label not in seen:
        seen.add(label)
        labels.append(label)
  args.labels = labels
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  per_epoch = per_epoch_for(args.steps, args.samples, args.batch)
  s = Setting(clients=args.clients, batch=args.batch, per_epoch=per_epoch, image=(32, 32, 3))
  load_start = os.getloadavg()
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", str(dev))
  print(f"backend={jax.default_backend()} device={kind} jax={jax.__version__} nproc={os.cpu_count()} "
        f"loadavg={load_start}", flush=True)
  flops = analytic_flops_per_step(s)
  print(f"FedAvgCNN fc {s.fc_dim}, {s.clients} clients x batch {s.batch}, {args.steps} steps per call "
        f"(per_epoch {per_epoch}); analytic {flops['train_per_step'] / 1e9:.2f} GFLOP per step "
        f"({flops['train_per_sample'] / 1e6:.1f} MFLOP per sample)", flush=True)
  params, x, y = make_inputs(s, args.seed)

  check = None
  if not args.no_check:
    checked = [l for l in args.labels if parse_formulation(l)[0][1] not in NOT_CHECKED]
    sc = s._replace(per_epoch=per_epoch_for(args.check_steps, args.samples, args.batch))
    pc, xc, yc = params, x[:, : sc.per_epoch * s.batch], y[:, : sc.per_epoch * s.batch]
    check = {}
    for reference, group in ((REFERENCE, [l for l in checked if not is_pair(l)]),
                             (PAIR_REFERENCE, [l for l in checked if is_pair(l)])):
      if not group:
        continue
      group = group if reference in group else [reference] + group
      t = time.perf_counter()
      report = run_check(group, sc, pc, xc, yc, args.check_steps, args.check_precision)
      print(f"check ({args.check_steps} steps, precision {args.check_precision}, {time.perf_counter() - t:.1f} s): "
            f"max |update| {report[reference]['max_abs_update']:.2e}", flush=True)
      for label, r in report.items():
        r["reference"] = reference
        print(f"  {label:16s} max abs diff vs {reference} {r['max_abs_diff']:.2e}  "
              f"(relative to the update {r['rel_update_diff']:.2e})", flush=True)
      check.update(report)
    bad = {l: r for l, r in check.items() if r["max_abs_diff"] > args.atol or r["rel_update_diff"] > args.rtol_update}
    assert not bad, f"formulations disagree with their reference: {bad}"

  peaks = (args.peak_tflops, None) if args.peak_tflops else device_peaks(kind)
  rows, compiled = [], {}
  for label in args.labels:
    row, comp = time_formulation(label, s, params, x, y, args.steps, args.repeats)
    compiled[label] = comp
    row["rounds_per_s"] = 1e3 / (row["ms_per_step"] * args.steps_per_round)
    models = 2 if is_pair(label) else 1  # a pair step trains two models
    row["achieved_tflops"] = models * flops["train_per_step"] / (row["ms_per_step"] * 1e-3) / 1e12
    rows.append(row)
    xf = f"{row['xla_flops_per_step'] / 1e9:.2f}" if row["xla_flops_per_step"] else "n/a"
    print(f"  {label:16s} compile {row['compile_s']:6.2f} s  {row['ms_per_step']:9.3f} ms/step  "
          f"XLA {xf} GFLOP/step", flush=True)
  ref = next((r for r in rows if r["label"] == REFERENCE), rows[0])
  for r in rows:
    r["speedup_vs_ref"] = ref["ms_per_step"] / r["ms_per_step"]

  lines = [f"| formulation | compile s | ms/step | rounds/s ({args.steps_per_round} steps) | vs {ref['label']} "
           f"| XLA GFLOP/step | TFLOP/s |" + (" % peak FP32 / TF32 |" if peaks else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if peaks else "")]
  for r in rows:
    xf = f"{r['xla_flops_per_step'] / 1e9:.2f}" if r["xla_flops_per_step"] else "n/a"
    line = (f"| {r['label']} | {r['compile_s']:.2f} | {r['ms_per_step']:.3f} | {r['rounds_per_s']:.3g} | "
            f"{r['speedup_vs_ref']:.2f}x | {xf} | {r['achieved_tflops']:.3g} |")
    if peaks:
      pk = [f"{100 * r['achieved_tflops'] / p:.1f}%" if p else "–" for p in peaks]
      line += f" {' / '.join(pk)} |"
    lines.append(line)
  print("\n" + "\n".join(lines), flush=True)
  print(f"(TFLOP/s = analytic {flops['train_per_step'] / 1e9:.2f} GFLOP/step per model / time; pair_* steps train "
        f"two models (FedCAP / Ditto: their rounds/s is the local training of one such round); loop_floor is not a "
        f"training step; its TFLOP/s is meaningless)", flush=True)

  traces = {}
  if args.profile_dir:
    trained = [r for r in rows if r["name"] not in NOT_CHECKED]
    fastest = min(trained, key=lambda r: r["ms_per_step"])["label"]
    for label in dict.fromkeys([fastest, ref["label"]]):
      path = os.path.join(args.profile_dir, label.replace("@", "_u"))
      profile(compiled[label], params, x, y, path)
      traces[label] = path
      print(f"profile of {label}: {path} (tensorboard --logdir {args.profile_dir} with tensorboard-plugin-profile, "
            f"or plugins/profile/*/perfetto_trace.json.gz at ui.perfetto.dev)", flush=True)

  result = {"machine": {"backend": jax.default_backend(), "device_kind": kind, "jax": jax.__version__,
                        "nproc": os.cpu_count(), "python": platform.python_version(),
                        "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
                        "command": " ".join(["python"] + [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])},
            "setting": s._asdict(), "steps": args.steps, "steps_per_round": args.steps_per_round,
            "analytic_flops": flops, "peaks_tflops_fp32_tf32": peaks, "check": check, "rows": rows,
            "traces": traces, "table": "\n".join(lines)}
  if args.out:
    from experiments.grid import provenance, store_json
    result["machine"].update({k: v for k, v in provenance().items() if k in ("commit", "dirty")})
    store_json(args.out, result)
  return result


if __name__ == "__main__":
  main()
