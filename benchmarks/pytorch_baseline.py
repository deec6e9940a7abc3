#!/usr/bin/env python
"""Rounds per second of FedAvg on the CPU: a PyTorch baseline written the PFLlib way against our JAX engine.

One process times both sides on the same setting, interleaved (PyTorch, then each JAX strategy, then again,
``--repeats`` times), so that other load on the machine hits both alike and the ratio stays fair.

Setting: FedCAP's CIFAR-10 FedAvgCNN (PFLlib ``FedAvgCNN``, fc 64, 156,810 params), 32x32x3 inputs, 20 clients x
225 training samples (synthetic pixels: speed does not depend on values), batch 10, E = 1 local epoch,
``drop_last`` (22 steps per client per round), shuffled batches, plain SGD (``--lr``, default 0.005), every client
in every round, sample-weighted FedAvg.

(a) PyTorch, "the PFLlib way" (``clientAVG.train`` / ``serverAVG``): a Python loop over clients; per client a
    ``copy.deepcopy`` of the global ``nn.Module``, a ``torch.optim.SGD`` on it and a
    ``torch.utils.data.DataLoader(batch_size=10, drop_last=True, shuffle=True)`` over its in-memory tensors
    (NCHW, ``num_workers=0``, PFLlib's default); per batch ``forward -> CrossEntropyLoss -> zero_grad -> backward
    -> step``; then the server zeroes a deep copy of the first upload and adds ``w_k * params_k`` of every client.
    ``--torch_threads`` sets ``torch.set_num_threads`` (several values: one PyTorch row each).
(b) Our engine on the same workload through ``benchmarks/rounds_per_second.py``'s own code path
    (``make_data``/``make_model``/``build_engine``: one compiled round per strategy, ``lower().compile()``, steps
    unrolled on CPU), strategies ``vmap``, ``shard_map`` (over ``--cpu-devices`` forced host devices),
    ``sequential`` and ``reference`` (``ReferenceFedAvg``: the same Python client loop as (a) with one jitted SGD
    step per batch).

Per side and repeat: ``--warmup`` untimed rounds, then ``--rounds`` timed rounds (each blocked on); reported are
the median s/round over all repeats, rounds/s, the ratio ours / PyTorch (rounds/s, per repeat, then the median),
the CPU cores the side kept busy (process CPU time / wall time over its timed rounds: 2.0 = both cores of a
2-core machine) and the cores the *other* processes of the machine took meanwhile (``/proc/stat`` busy time minus
ours), with the load average around each block (it counts our own threads too).

``--workload digits_mlp`` times the MLP workload of ``rounds_per_second.py`` instead (sklearn digits, 8x8x1
flattened to 64, our ``MLP`` 64-200-200-10 = 55,050 params, 10 clients x ~144 samples, B = 10, E = 1, no
``drop_last``: the last batch of a client is partial on both sides, shuffled) against the same PyTorch loop with a
matching ``nn.Module`` (``Linear`` layers, flat inputs, no NCHW transpose). ``--variants`` and ``--breakdown`` are
FedAvgCNN-only.

Check (``--no_check`` skips it): from the same initial parameters (the JAX init copied into the ``nn.Module``), one
*unshuffled* round of (a) and of ``ReferenceFedAvg`` must give the same global model (max abs difference printed),
so both sides compute the same thing.

``--variants model,reshape_pool,reshape_pool_im2col1`` also times every JAX strategy with hand-written
FedAvgCNN forwards on the same params (see ``variant_apply``; checked against the flax model on one batch): what
the engine would gain from a cheaper max-pool gradient and a matmul conv1 on XLA:CPU.

``--breakdown`` adds per-op timings of one client step at B = 10 on both sides (each conv's forward and
backward, a max-pool's forward + backward, the model's forward and forward + backward) and one client's 22 local
steps per model variant, to see where the CPU time goes. ``--repeats 0`` skips the rounds (breakdown only).

XLA flags: ``--xla_flags "..."`` is appended to ``XLA_FLAGS`` before JAX starts (e.g.
``--xla_cpu_multi_thread_eigen=false``), so flag experiments still time PyTorch in the same process.

Needs PyTorch (not a test dependency): ``pip install -e ".[bench]"``.

    python benchmarks/pytorch_baseline.py                                   # 3 repeats, default strategies
    python benchmarks/pytorch_baseline.py --torch_threads 2,1 --strategies shard_map,sequential,reference,vmap
    python benchmarks/pytorch_baseline.py --strategies shard_map --variants model,reshape_pool,reshape_pool_im2col1
    python benchmarks/pytorch_baseline.py --repeats 0 --breakdown --torch_threads 1
    python benchmarks/pytorch_baseline.py --workload digits_mlp --torch_threads 2 --strategies vmap,shard_map,sequential
    python benchmarks/pytorch_baseline.py --xla_flags=--xla_cpu_experimental_ynn_fusion_type= --strategies shard_map
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (ROOT, HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)

import rounds_per_second as rps  # noqa: E402  (numpy only at import; JAX comes later)

JAX_STRATEGIES = ("vmap", "shard_map", "sequential", "reference")
DEFAULT_STRATEGIES = "shard_map,sequential,reference"
BASE_WORKLOAD = "fedcap_cifar10_e1"
TORCH_WORKLOADS = ("fedcap_cifar10_e1", "digits_mlp")  # the workloads of rounds_per_second.py with a torch twin


# --------------------------------------------------------------------------------------------- setup
def require_torch():
  try:
    import torch  # noqa: F401
  except ImportError as err:
    sys.exit("benchmarks/pytorch_baseline.py needs PyTorch, which is not installed (%s).\n"
             "Install the benchmark extra from the repository root:  pip install -e \".[bench]\"\n"
             "(a CPU build of torch>=2.1 is enough; the tests never need it)." % err)
  return torch


def machine_busy_seconds() -> float:
  """CPU seconds all processes of the machine have been busy (``/proc/stat``, all cores); NaN if unreadable."""
  try:
    with open("/proc/stat") as f:
      fields = [int(v) for v in f.readline().split()[1:]]
  except (OSError, ValueError):
    return float("nan")
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workload", default=BASE_WORKLOAD, choices=TORCH_WORKLOADS,
                 help="rounds_per_second.py workload: FedAvgCNN on synthetic CIFAR-10 shapes, or the digits MLP")
  p.add_argument("--rounds", type=int, default=3, help="timed rounds per side and repeat")
  p.add_argument("--warmup", type=int, default=1, help="untimed rounds per side and repeat, before the timed ones "
                 "(the JAX strategies are compiled once, before the first repeat, and not counted)")
  p.add_argument("--repeats", type=int, default=3, help="interleaved repeats: PyTorch, then each JAX strategy "
                 "(0: time no rounds, e.g. with --breakdown)")
  p.add_argument("--torch_threads", "--torch-threads", default="0",
                 help="comma-separated torch.set_num_threads values, one PyTorch row each; 0 = PyTorch's default "
                      "(the first value is the baseline of the ratio column)")
  p.add_argument("--strategies", default=DEFAULT_STRATEGIES,
                 help="comma-separated JAX strategies: " + ",".join(JAX_STRATEGIES) + " (vmap is slow on CPU)")
  p.add_argument("--variants", default="model",
                 help="comma-separated JAX model variants, each timed with every strategy: " + ",".join(VARIANTS)
                      + " (model = the engine's flax FedAvgCNN; the others: same params, see variant_apply)")
  p.add_argument("--cpu-devices", "--cpu_devices", dest="cpu_devices", type=int, default=20,
                 help="forced host devices for shard_map (20 = one client per device)")
  p.add_argument("--unroll", default="auto", help="engine local-step scan unroll: auto (True on the CPU under the "
                 "conv-in-loop trap, i.e. --conv_impl xla or patches; else rolled) | true | int")
  p.add_argument("--conv_impl", default="auto", help="the JAX model's model.conv_impl: auto (canonical on the CPU) | "
                 "xla | patches | canonical")
  p.add_argument("--lr", type=float, default=0.005)
  p.add_argument("--no_shuffle", "--no-shuffle", action="store_true", help="unshuffled batches on both sides")
  p.add_argument("--xla_flags", "--xla-flags", default="", help="appended to XLA_FLAGS before JAX starts")
  p.add_argument("--breakdown", action="store_true", help="also time the ops of one B=10 client step, both sides")
  p.add_argument("--breakdown_iters", type=int, default=50)
  p.add_argument("--profile_dir", default=None,
                 help="also profile one round's local steps (one jitted step per batch, first --variants entry) "
                      "with jax.profiler into this folder and print the top XLA ops; adds "
                      "--xla_cpu_enable_xprof_traceme=true to XLA_FLAGS, so time rounds in another run")
  p.add_argument("--no_check", "--no-check", action="store_true", help="skip the one-round equality check")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None, help="write all results as JSON here")
  args = p.parse_args(argv)
  args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
  bad = [s for s in args.strategies if s not in JAX_STRATEGIES]
  if bad:
    p.error(f"unknown strategies {bad}; choose from {JAX_STRATEGIES}")
  args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
  bad = [v for v in args.variants if v not in VARIANTS]
  if bad:
    p.error(f"unknown variants {bad}; choose from {VARIANTS}")
  if args.workload != BASE_WORKLOAD and (args.variants != ["model"] or args.breakdown):
    p.error(f"--variants and --breakdown are FedAvgCNN-only (--workload {BASE_WORKLOAD}), not for {args.workload}")
  args.torch_threads = [int(t) for t in args.torch_threads.split(",") if t.strip()]
  if not args.torch_threads:
    p.error("--torch_threads needs at least one value")
  return args


# --------------------------------------------------------------------------------------------- PyTorch side
def torch_model_class(torch, model_name: str = "fedavg_cnn", hidden=()):
  """The PyTorch twin of our ``model_name`` (``fedavg_cnn`` or ``mlp`` with hidden widths ``hidden``)."""
  nn = torch.nn

  class MLP(nn.Module):
    """Our ``MLP`` (no dropout): flat input -> [Linear(h) -> ReLU] per hidden width -> head; same layer names."""

    def __init__(self, in_features=64, num_classes=10):
      super().__init__()
      widths = [in_features] + [int(h) for h in hidden]
      self.names = [f"fc{i + 1}" for i in range(len(hidden))]
      for name, a, b in zip(self.names, widths[:-1], widths[1:]):
        setattr(self, name, nn.Linear(a, b))
      self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x):
      out = torch.flatten(x, 1)
      for name in self.names:
        out = torch.relu(getattr(self, name)(out))
      return self.head(out)

  if model_name == "mlp":
    return MLP

  class FedAvgCNN(nn.Module):
    """PFLlib's ``FedAvgCNN`` (``system/flcore/trainmodel/models.py``), FedCAP's ``dim=1600``, hidden 64."""

    def __init__(self, in_features=3, num_classes=10, dim=1600, fc_dim=64):
      super().__init__()
      self.conv1 = nn.Sequential(nn.Conv2d(in_features, 32, kernel_size=5, padding=0, stride=1, bias=True),
                                 nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=(2, 2)))
      self.conv2 = nn.Sequential(nn.Conv2d(32, 64, kernel_size=5, padding=0, stride=1, bias=True),
                                 nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=(2, 2)))
      self.fc1 = nn.Sequential(nn.Linear(dim, fc_dim), nn.ReLU(inplace=True))
      self.fc = nn.Linear(fc_dim, num_classes)

    def forward(self, x):
      out = self.conv1(x)
      out = self.conv2(out)
      out = torch.flatten(out, 1)
      out = self.fc1(out)
      return self.fc(out)

  return FedAvgCNN


def jax_to_torch_state(torch, params, conv: bool) -> dict:
  """Our flax params (HWIO convs, [in, out] denses, NHWC flatten) as the PyTorch module's ``state_dict``;
  ``conv``: the workload's model is the FedAvgCNN (else the MLP)."""
  p = {k: {n: np.asarray(v) for n, v in d.items()} for k, d in params.items()}
  if not conv:  # MLP: same layer names, Linear weights are [out, in]
    sd = {f"{k}.{'weight' if n == 'kernel' else n}": (v.T if n == "kernel" else v) for k, d in p.items()
          for n, v in d.items()}
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, order="C", copy=True)) for k, v in sd.items()}
  fc1 = p["fc1"]["kernel"]  # rows in (h, w, c) order; PyTorch flattens (c, h, w)
  hw = int(round((fc1.shape[0] // p["conv2"]["kernel"].shape[-1]) ** 0.5))
  fc1 = fc1.reshape(hw, hw, -1, fc1.shape[1]).transpose(3, 2, 0, 1).reshape(fc1.shape[1], -1)
  sd = {"conv1.0.weight": p["conv1"]["kernel"].transpose(3, 2, 0, 1), "conv1.0.bias": p["conv1"]["bias"],
        "conv2.0.weight": p["conv2"]["kernel"].transpose(3, 2, 0, 1), "conv2.0.bias": p["conv2"]["bias"],
        "fc1.0.weight": fc1, "fc1.0.bias": p["fc1"]["bias"],
        "fc.weight": p["head"]["kernel"].T, "fc.bias": p["head"]["bias"]}
  return {k: torch.from_numpy(np.array(v, dtype=np.float32, order="C", copy=True)) for k, v in sd.items()}


def torch_to_flat(model, params_like, conv: bool) -> np.ndarray:
  """The module's parameters in our layout, raveled in ``jax.tree.leaves`` order of ``params_like``; ``conv`` as
  for :func:`jax_to_torch_state`."""
  import jax
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  if not conv:  # MLP
    ours = {}
    for k, v in sd.items():
      layer, n = k.split(".")
      ours.setdefault(layer, {})["kernel" if n == "weight" else n] = v.T if n == "weight" else v
    leaves = jax.tree.leaves(ours)
    assert [np.shape(a) for a in leaves] == [np.shape(a) for a in jax.tree.leaves(params_like)]
    return np.concatenate([np.ravel(a) for a in leaves])
  c2 = sd["conv2.0.weight"].shape[0]
  fc1 = sd["fc1.0.weight"]  # [out, c*h*w]
  hw = int(round((fc1.shape[1] // c2) ** 0.5))
  fc1 = fc1.reshape(fc1.shape[0], c2, hw, hw).transpose(2, 3, 1, 0).reshape(-1, fc1.shape[0])
  ours = {"conv1": {"kernel": sd["conv1.0.weight"].transpose(2, 3, 1, 0), "bias": sd["conv1.0.bias"]},
          "conv2": {"kernel": sd["conv2.0.weight"].transpose(2, 3, 1, 0), "bias": sd["conv2.0.bias"]},
          "fc1": {"kernel": fc1, "bias": sd["fc1.0.bias"]},
          "head": {"kernel": sd["fc.weight"].T, "bias": sd["fc.bias"]}}
  leaves = jax.tree.leaves(ours)  # dict leaves in sorted-key order, as for our params
  assert [np.shape(a) for a in leaves] == [np.shape(a) for a in jax.tree.leaves(params_like)]
  return np.concatenate([np.ravel(a) for a in leaves])


class TorchFedAvg:
  """Sequential FedAvg, PFLlib style (see the module docstring)."""

  def __init__(self, torch, data, wl, lr: float, shuffle: bool, seed: int):
    self.torch, self.lr, self.epochs = torch, lr, wl.epochs
    self.n = [int(n) for n in np.asarray(data.n_train)]
    self.loaders = []
    for k, n in enumerate(self.n):
      x = np.asarray(data.x_train[k, :n])
      x = x.transpose(0, 3, 1, 2) if wl.conv else x.reshape(n, -1)  # NCHW for the CNN, flat for the MLP
      x = torch.from_numpy(np.ascontiguousarray(x))
      y = torch.from_numpy(np.asarray(data.y_train[k, :n]).astype(np.int64))
      ds = torch.utils.data.TensorDataset(x, y)
      gen = torch.Generator().manual_seed(seed * 1000 + k)
      self.loaders.append(torch.utils.data.DataLoader(ds, batch_size=wl.batch_size, drop_last=wl.drop_last,
                                                      shuffle=shuffle, generator=gen))
    self.loss = torch.nn.CrossEntropyLoss()

  def train_client(self, global_model, k: int):
    model = copy.deepcopy(global_model)
    optimizer = self.torch.optim.SGD(model.parameters(), lr=self.lr)
    model.train()
    for _ in range(self.epochs):
      for x, y in self.loaders[k]:
        output = model(x)
        loss = self.loss(output, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model

  def run_round(self, global_model):
    uploads = [self.train_client(global_model, k) for k in range(len(self.n))]
    total = float(sum(self.n))
    new = copy.deepcopy(uploads[0])
    for param in new.parameters():
      param.data.zero_()
    for n, model in zip(self.n, uploads):
      for server_param, client_param in zip(new.parameters(), model.parameters()):
        server_param.data += client_param.data.clone() * (n / total)
    return new


# --------------------------------------------------------------------------------------------- JAX model variants
VARIANTS = ("model", "reshape_pool", "reshape_pool_im2col1", "reshape_pool_im2col")


def variant_apply(model, name: str):
  """``apply_fn(params, x)`` for FedAvgCNN, on the model's own params (so the engine runs it unchanged).

  ``model``: the flax module as the engine uses it (``nn.max_pool`` = ``lax.reduce_window``).
  ``reshape_pool``: the same network written by hand with each 2x2/2 max-pool as a reshape + ``max`` (same
  forward values; its gradient is an elementwise compare-select instead of XLA's windowed index tracking).
  ``reshape_pool_im2col1``: as ``reshape_pool``, and conv1 (3 input channels) as im2col (25 static slices
  concatenated on the channel axis) + one matmul, instead of ``lax.conv_general_dilated``.
  ``reshape_pool_im2col``: both convolutions as im2col + matmul (conv2: 25 slices of 32 channels, an 800-wide
  matmul), so every conv's forward and both gradients become matrix products and slice/pad-adds.
  """
  import jax
  import jax.numpy as jnp
  from jax import lax
  if name == "model":
    return lambda p, x: model.apply({"params": p}, x)
  if name not in VARIANTS:
    raise ValueError(f"unknown variant {name!r}; choose from {VARIANTS}")
  dn = ("NHWC", "HWIO", "NHWC")

  def xla_conv(x, k):
    return lax.conv_general_dilated(x, k, (1, 1), "VALID", dimension_numbers=dn)

  def im2col_conv(x, k):
    kh, kw, cin, cout = k.shape
    h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    cols = jnp.concatenate([x[:, i:i + h, j:j + w, :] for i in range(kh) for j in range(kw)], axis=-1)
    return (cols.reshape(-1, kh * kw * cin) @ k.reshape(kh * kw * cin, cout)).reshape(x.shape[0], h, w, cout)

  def pool(x):  # MaxPool2d(2): kernel = stride = 2, floor
    b, h, w, c = x.shape
    x = x[:, :h // 2 * 2, :w // 2 * 2, :]
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))

  conv1 = im2col_conv if name.startswith("reshape_pool_im2col") else xla_conv
  conv2 = im2col_conv if name == "reshape_pool_im2col" else xla_conv

  def apply(p, x):
    h = pool(jax.nn.relu(conv1(x, p["conv1"]["kernel"]) + p["conv1"]["bias"]))
    h = pool(jax.nn.relu(conv2(h, p["conv2"]["kernel"]) + p["conv2"]["bias"]))
    h = jax.nn.relu(h.reshape(h.shape[0], -1) @ p["fc1"]["kernel"] + p["fc1"]["bias"])
    return h @ p["head"]["kernel"] + p["head"]["bias"]

  return apply


def check_variants(model, params, data, variants, batch: int) -> dict:
  """Max abs difference of logits and gradients of each variant vs the flax model on one batch."""
  import jax
  import jax.numpy as jnp
  from fedjax_robust.client.local_sgd import masked_cross_entropy
  x, y = jnp.asarray(data.x_train[0, :batch]), jnp.asarray(data.y_train[0, :batch])
  ref_fn = variant_apply(model, "model")
  loss = lambda f: (lambda p: masked_cross_entropy(f(p, x), y, jnp.ones(batch)))
  ref_out, ref_grad = ref_fn(params, x), jax.grad(loss(ref_fn))(params)
  out = {}
  for v in variants:
    f = variant_apply(model, v)
    g = jax.grad(loss(f))(params)
    out[v] = {"logits": float(jnp.max(jnp.abs(f(params, x) - ref_out))),
              "grads": max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g),
                                                                            jax.tree.leaves(ref_grad)))}
  return out


# --------------------------------------------------------------------------------------------- JAX side
def jax_runner(wl, data, apply_fn, params, name: str, ndev, unroll, seed: int):
  """``(step, state, compile_s)`` for one strategy, built with rounds_per_second's own functions."""
  import jax
  import optax
  from fedjax_robust.client.local_sgd import LocalTrainSpec
  from fedjax_robust.execution import is_traceable
  from fedjax_robust.reference import ReferenceFedAvg
  if name == "reference":  # as rps.bench_reference
    spec = LocalTrainSpec(epochs=wl.epochs, batch_size=wl.batch_size, drop_last=wl.drop_last, shuffle=wl.shuffle)
    ref = ReferenceFedAvg(apply_fn, optax.sgd(wl.lr), spec, data)
    key = jax.random.key(seed)
    counter = {"r": 0}

    def ref_step(p):
      out = ref.run_round(p, key, counter["r"])
      counter["r"] += 1
      return out

    return ref_step, params, None
  _, sim = rps.build_engine(wl, data, apply_fn, name, ndev, unroll)  # as rps.bench_engine
  state = sim.init(params, seed)
  if is_traceable(sim.strategy):
    t = time.perf_counter()
    compiled = sim.lower_round(state).compile()
    # lower_round(state) lowers round(state, inputs): the run's data is an argument (engine v2)
    return (lambda s: compiled(s, sim.inputs)[0]), state, time.perf_counter() - t
  return (lambda s: sim.run_round(s)[0]), state, None


# --------------------------------------------------------------------------------------------- timing
def time_block(step, state, warmup: int, rounds: int, block):
  """``warmup`` untimed rounds, then ``rounds`` timed ones.

  Returns (state, wall times, our CPU seconds, other processes' CPU seconds, load averages before/after): the
  machine's busy time from ``/proc/stat`` minus ours is what the rest of the machine took meanwhile (the load
  average counts our own threads too, e.g. shard_map's 20 device threads).
  """
  load0 = os.getloadavg()[0]
  for _ in range(warmup):
    state = block(step(state))
  walls, cpus, others = [], [], []
  for _ in range(rounds):
    m, c, t = machine_busy_seconds(), rps._cpu_seconds(), time.perf_counter()
    state = block(step(state))
    walls.append(time.perf_counter() - t)
    cpus.append(rps._cpu_seconds() - c)
    others.append(max(machine_busy_seconds() - m - cpus[-1], 0.0))
  return state, walls, cpus, others, [load0, os.getloadavg()[0]]


def median(xs):
  return statistics.median(xs) if xs else float("nan")


# --------------------------------------------------------------------------------------------- breakdown
def _timeit(fn, iters: int, sync=lambda r: r) -> float:
  """Median ms of ``fn()`` over ``iters`` calls after 3 warm-up calls (in blocks of 5 to dampen noise)."""
  for _ in range(3):
    sync(fn())
  blocks = []
  per = 5
  for _ in range(max(iters // per, 1)):
    t = time.perf_counter()
    for _ in range(per):
      r = fn()
    sync(r)
    blocks.append((time.perf_counter() - t) / per)
  return 1e3 * statistics.median(blocks)


def breakdown(torch, model, tmodel, params, data, batch: int, steps: int, iters: int,
              torch_threads: int) -> list[dict]:
  """Where one client step's time goes, both sides at batch ``batch``.

  Ops (one jitted call each on the JAX side, eager on the PyTorch side): each conv's forward and backward, the
  first max-pool's forward + backward, the model's forward, forward + backward. Then one client's local
  training: ``steps`` SGD steps (JAX: one jitted ``lax.scan``, unrolled as the engine does on CPU, per model
  variant; PyTorch: the PFLlib loop body over the same batches), reported per step.
  """
  import jax
  import jax.numpy as jnp
  from jax import lax
  from fedjax_robust.client.local_sgd import masked_cross_entropy
  from fedjax_robust.compilation import jit as engine_jit  # the engine's XLA options (Eigen convs on CPU)
  if torch_threads:
    torch.set_num_threads(torch_threads)
  x = np.asarray(data.x_train[0, :batch])
  y = np.asarray(data.y_train[0, :batch])
  xs = np.asarray(data.x_train[0, :steps * batch]).reshape(steps, batch, *x.shape[1:])
  ys = np.asarray(data.y_train[0, :steps * batch]).reshape(steps, batch)
  rng = np.random.default_rng(0)
  sj = jax.block_until_ready
  # --- JAX
  dn = ("NHWC", "HWIO", "NHWC")
  conv = lambda a, k: lax.conv_general_dilated(a, k, (1, 1), "VALID", dimension_numbers=dn)
  import flax.linen as nn
  pool = lambda a: nn.max_pool(a, (2, 2), strides=(2, 2), padding="VALID")  # as the model's _pool
  k1, k2 = params["conv1"]["kernel"], params["conv2"]["kernel"]
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  a1 = jnp.asarray(rng.standard_normal((batch, 28, 28, 32), dtype=np.float32))
  h1 = jnp.asarray(rng.standard_normal((batch, 14, 14, 32), dtype=np.float32))
  g1 = jnp.ones((batch, 28, 28, 32), jnp.float32)
  g2 = jnp.ones((batch, 10, 10, 64), jnp.float32)
  gp = jnp.ones((batch, 14, 14, 32), jnp.float32)
  c1f, c2f = engine_jit(conv), engine_jit(conv)
  c1w = engine_jit(lambda a, k, g: jax.vjp(lambda kk: conv(a, kk), k)[1](g)[0])  # weight grad only (input = data)
  c2b = engine_jit(lambda a, k, g: jax.vjp(conv, a, k)[1](g))  # input and weight grads
  pfb = engine_jit(lambda a, g: jax.vjp(pool, a)[1](g)[0])
  apply_fn = variant_apply(model, "model")
  loss = lambda f: (lambda p, xb, yb: masked_cross_entropy(f(p, xb), yb, jnp.ones(yb.shape[0])))
  fwd = engine_jit(apply_fn)
  fb = engine_jit(jax.value_and_grad(loss(apply_fn)))
  jt = {
      "conv1 forward": _timeit(lambda: c1f(xj, k1), iters, sj),
      "conv1 backward (weight grad)": _timeit(lambda: c1w(xj, k1, g1), iters, sj),
      "conv2 forward": _timeit(lambda: c2f(h1, k2), iters, sj),
      "conv2 backward (input + weight grad)": _timeit(lambda: c2b(h1, k2, g2), iters, sj),
      "max-pool 1 forward + backward": _timeit(lambda: pfb(a1, gp), iters, sj),
      "model forward": _timeit(lambda: fwd(params, xj), iters, sj),
      "model forward + backward": _timeit(lambda: fb(params, xj, yj), iters, sj),
  }
  xsj, ysj = jnp.asarray(xs), jnp.asarray(ys)
  client = {}
  for v in VARIANTS:
    lv = loss(variant_apply(model, v))

    def local(p, xb, yb, lv=lv):
      def body(q, batch_):
        g = jax.grad(lv)(q, *batch_)
        return jax.tree.map(lambda w, d: w - 0.005 * d, q, g), None
      return lax.scan(body, p, (xb, yb), unroll=True)[0]

    f = engine_jit(local).lower(params, xsj, ysj).compile()
    client[v] = _timeit(lambda f=f: f(params, xsj, ysj), max(iters // 5, 5), sj) / steps
  # --- PyTorch
  F = torch.nn.functional
  nchw = lambda a: torch.from_numpy(np.ascontiguousarray(np.asarray(a).transpose(0, 3, 1, 2)))
  xt, yt = nchw(x), torch.from_numpy(y.astype(np.int64))
  w1 = torch.from_numpy(np.ascontiguousarray(np.asarray(k1).transpose(3, 2, 0, 1))).requires_grad_(True)
  w2 = torch.from_numpy(np.ascontiguousarray(np.asarray(k2).transpose(3, 2, 0, 1))).requires_grad_(True)
  h1t = nchw(h1).requires_grad_(True)
  a1t = nchw(a1).requires_grad_(True)
  g1t, g2t, gpt = torch.ones(batch, 32, 28, 28), torch.ones(batch, 64, 10, 10), torch.ones(batch, 32, 14, 14)

  def t_c1w():
    w1.grad = None
    F.conv2d(xt, w1).backward(g1t)

  def t_c2b():
    w2.grad = h1t.grad = None
    F.conv2d(h1t, w2).backward(g2t)

  def t_pool():
    a1t.grad = None
    F.max_pool2d(a1t, (2, 2)).backward(gpt)

  def t_fwd():
    with torch.no_grad():
      return tmodel(xt)

  lossf = torch.nn.CrossEntropyLoss()

  def t_fb():
    tmodel.zero_grad()
    lossf(tmodel(xt), yt).backward()

  tm = copy.deepcopy(tmodel)
  topt = torch.optim.SGD(tm.parameters(), lr=0.005)
  xst = [nchw(xs[i]) for i in range(steps)]
  yst = [torch.from_numpy(ys[i].astype(np.int64)) for i in range(steps)]

  def t_client():
    for xb, yb in zip(xst, yst):
      output = tm(xb)
      l = lossf(output, yb)
      topt.zero_grad()
      l.backward()
      topt.step()

  with torch.no_grad():
    tt_c1f = _timeit(lambda: F.conv2d(xt, w1), iters)
    tt_c2f = _timeit(lambda: F.conv2d(h1t, w2), iters)
  tt = {
      "conv1 forward": tt_c1f,
      "conv1 backward (weight grad)": _timeit(t_c1w, iters),
      "conv2 forward": tt_c2f,
      "conv2 backward (input + weight grad)": _timeit(t_c2b, iters),
      "max-pool 1 forward + backward": _timeit(t_pool, iters),
      "model forward": _timeit(t_fwd, iters),
      "model forward + backward": _timeit(t_fb, iters),
  }
  t_client_ms = _timeit(t_client, max(iters // 5, 5)) / steps
  rows = [{"op": k, "jax_ms": jt[k], "torch_ms": tt[k]} for k in jt]
  for v in VARIANTS:
    rows.append({"op": f"client, {steps} SGD steps, per step: JAX {v}", "jax_ms": client[v],
                 "torch_ms": t_client_ms})
  for r in rows:
    r["jax_over_torch_time"] = r["jax_ms"] / r["torch_ms"]
  return rows


# --------------------------------------------------------------------------------------------- profile
def profile_steps(model, params, data, wl, variant: str, steps: int, clients: int, outdir: str,
                  top: int = 15) -> dict:
  """XLA:CPU op profile of one round's worth of local SGD steps (``clients`` x ``steps`` one-client steps at
  batch ``wl.batch_size``, one jitted step per batch as ``ReferenceFedAvg``), on one device, so the op
  durations are not shared with other device threads. Needs ``--xla_cpu_enable_xprof_traceme=true`` (set by
  ``--profile_dir``). Returns the ops' total ms with their HLO shape and JAX op name, largest first."""
  import collections
  import glob
  import gzip
  import re
  import jax
  import jax.numpy as jnp
  import optax
  from fedjax_robust.client.local_sgd import masked_cross_entropy
  from fedjax_robust.compilation import jit as engine_jit
  apply_fn = variant_apply(model, variant)
  opt = optax.sgd(wl.lr)

  def loss(p, x, y):
    return masked_cross_entropy(apply_fn(p, x), y, jnp.ones(y.shape[0]))

  def profiled_sgd_step(p, s, x, y):
    l, g = jax.value_and_grad(loss)(p, x, y)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s, l

  b = wl.batch_size
  batches = [(jnp.asarray(data.x_train[k, i * b:(i + 1) * b]), jnp.asarray(data.y_train[k, i * b:(i + 1) * b]))
             for k in range(clients) for i in range(steps)]
  s0 = opt.init(params)
  compiled = engine_jit(profiled_sgd_step).lower(params, s0, *batches[0]).compile()
  meta, comp_op, comp = {}, {}, None  # HLO instruction -> (shape, JAX op name); computation -> first op name
  for line in compiled.as_text().splitlines():
    c = re.match(r"(?:ENTRY )?%([\w.\-]+) .*\{$", line)
    if c:
      comp = c.group(1)
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\([^)]*\)|\S+) ", line)
    if m:
      op = re.search(r'op_name="([^"]*)"', line)
      called = re.search(r"calls=%([\w.\-]+)", line)
      shape = m.group(2)
      if shape.startswith("("):  # tuple: first element and the count
        parts = shape.strip("()").split(", ")
        shape = f"({parts[0]}, ... {len(parts)} outputs)"
      meta[m.group(1)] = (shape, op.group(1) if op else "", called.group(1) if called else None)
      if op and comp and comp not in comp_op:
        comp_op[comp] = op.group(1)
  meta = {k: (sh, op or comp_op.get(called, "")) for k, (sh, op, called) in meta.items()}

  def run():
    p, s = params, s0
    for x, y in batches:
      p, s, _ = compiled(p, s, x, y)
    return jax.block_until_ready(p)

  run()
  t = time.perf_counter()
  with jax.profiler.trace(outdir, create_perfetto_trace=True):
    run()
  wall = time.perf_counter() - t
  files = sorted(glob.glob(os.path.join(outdir, "**", "*perfetto_trace.json.gz"), recursive=True),
                 key=os.path.getmtime)
  if not files:
    return {"error": f"no perfetto trace under {outdir}"}
  with gzip.open(files[-1]) as f:
    events = json.load(f)["traceEvents"]
  total = collections.Counter()
  for e in events:
    a = e.get("args") or {}
    if e.get("ph") == "X" and "profiled_sgd_step" in str(a.get("hlo_module", "")) and a.get("hlo_op"):
      total[a["hlo_op"]] += e.get("dur", 0.0) / 1e3
  ops_ms = sum(total.values())
  rows = [{"hlo_op": k, "ms": v, "share": v / ops_ms, "shape": meta.get(k, ("", ""))[0],
           "jax_op": re.sub(r"^jit\(profiled_sgd_step\)/", "", meta.get(k, ("", ""))[1])}
          for k, v in total.most_common()]
  cats = collections.Counter()
  for r in rows:
    cats[op_category(r["hlo_op"], r["jax_op"])] += r["ms"]
  return {"variant": variant, "steps": len(batches), "wall_s": wall, "ops_ms": ops_ms, "trace": files[-1],
          "categories": dict(cats.most_common()), "top": rows[:top], "all": rows}


def op_category(hlo_op: str, jax_op: str) -> str:
  """Rough class of a profiled XLA op. The max-pool gradient (select_and_scatter) is lowered as a reduce-window
  that also returns argmax indices (``wrapped_reduce-window``, 5 outputs), index grids (``wrapped_iota``), their
  packing (``concatenate_bitcast_fusion``) and a ``wrapped_scatter``; those carry no JAX op name."""
  if "conv_general_dilated" in jax_op:
    return "convolutions (forward, input and weight grads)"
  if ("reduce_window" in jax_op or "select_and_scatter" in jax_op
      or hlo_op.startswith(("wrapped_reduce-window", "wrapped_iota", "concatenate_bitcast", "wrapped_scatter"))):
    return "max-pool forward + gradient"
  if any(t in jax_op for t in ("fc1", "head", "dot_general")) or hlo_op.startswith("dot"):
    return "dense layers"
  return "other (elementwise, loss, update)"


# --------------------------------------------------------------------------------------------- driver
def main(argv=None) -> None:
  args = parse_args(argv)
  torch = require_torch()
  # XLA reads XLA_FLAGS when its CPU client starts: set it (and the host device count) before JAX does anything.
  if args.profile_dir:  # per-op trace events of the XLA:CPU runtime
    args.xla_flags = (args.xla_flags + " --xla_cpu_enable_xprof_traceme=true").strip()
  if args.xla_flags:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
  from fedjax_robust.execution import configure_cpu_devices
  configure_cpu_devices(args.cpu_devices if "shard_map" in args.strategies else 1)
  import jax
  from fedjax_robust.compilation import compiler_options, cpu_conv_choice
  from fedjax_robust.models import count_params, init_params

  backend = jax.default_backend()
  if backend != "cpu":
    print(f"note: JAX backend is {backend}; this script is meant for the CPU comparison", flush=True)
  torch_default_threads = torch.get_num_threads()
  machine = {"nproc": os.cpu_count(), "cpu": rps._cpu_info(), "python": platform.python_version(),
             "jax": jax.__version__, "backend": backend, "jax_devices": jax.device_count(),
             "torch": torch.__version__, "torch_default_threads": torch_default_threads,
             "torch_interop_threads": torch.get_num_interop_threads(),
             "torch_parallel_info": torch.__config__.parallel_info(),
             "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "loadavg_start": os.getloadavg(),
             # the engine's own per-program XLA options (fedjax_robust/compilation.py; env FEDJAX_ROBUST_CPU_CONV)
             "engine_compiler_options": compiler_options(), "FEDJAX_ROBUST_CPU_CONV": cpu_conv_choice(),
             "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
  print(f"nproc={machine['nproc']} cpu={machine['cpu']} jax={jax.__version__} ({backend}, "
        f"{jax.device_count()} devices) torch={torch.__version__} torch.get_num_threads()={torch_default_threads} "
        f"interop={machine['torch_interop_threads']} XLA_FLAGS={machine['XLA_FLAGS']!r} "
        f"engine compiler options={machine['engine_compiler_options']} "
        f"loadavg={machine['loadavg_start']}", flush=True)

  wl = dataclasses.replace(rps.WORKLOADS[args.workload], name=args.workload + ("_unshuffled" if args.no_shuffle
                                                                              else "_shuffled"),
                           lr=args.lr, shuffle=not args.no_shuffle)
  data = rps.make_data(wl)
  model = rps.make_model(wl, args.conv_impl)
  params = init_params(model, jax.random.key(args.seed), data.feature_shape)
  apply_fn = variant_apply(model, "model")
  samples = rps.samples_per_round(wl, data.n_train)
  if args.unroll == "auto":
    from fedjax_robust.experiment import conv_loop_trap
    unroll = True if conv_loop_trap(params, {"conv_impl": args.conv_impl}, backend) else 1
  else:
    unroll = True if args.unroll == "true" else int(args.unroll)
  TorchModel = torch_model_class(torch, wl.model, getattr(model, "hidden", ()))
  torch.manual_seed(args.seed)
  tmodel = TorchModel() if wl.conv else TorchModel(in_features=int(np.prod(data.feature_shape)),
                                                   num_classes=wl.num_classes)
  model_label = "FedAvgCNN" if wl.conv else "MLP " + "-".join(
      str(w) for w in (int(np.prod(data.feature_shape)), *model.hidden, wl.num_classes))
  tmodel.load_state_dict(jax_to_torch_state(torch, params, wl.conv))
  n_torch = sum(p.numel() for p in tmodel.parameters())
  info = {"workload": dataclasses.asdict(wl), "params": count_params(params), "torch_params": n_torch,
          "clients": data.num_clients, "samples_per_round": samples, "unroll": unroll,
          "steps_per_client": samples // data.num_clients // wl.batch_size}
  print(f"{model_label} {info['params']:,} params (PyTorch {n_torch:,}), {data.num_clients} clients, "
        f"B={wl.batch_size}, "
        f"E={wl.epochs}, drop_last={wl.drop_last}, shuffle={wl.shuffle}, lr={wl.lr}, {samples} samples/round "
        f"({info['steps_per_client']} steps per client), engine unroll={unroll}", flush=True)
  assert n_torch == info["params"], "PyTorch and JAX models differ in size"

  result = {"machine": machine, "info": info, "args": vars(args)}

  # ---- the check: one unshuffled round, same init, both sides
  if not args.no_check:
    wl0 = dataclasses.replace(wl, shuffle=False)
    t = time.perf_counter()
    ref_step, p0, _ = jax_runner(wl0, data, apply_fn, params, "reference", None, unroll, args.seed)
    p1 = ref_step(p0)
    ours = np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(p1)])
    tfa = TorchFedAvg(torch, data, wl0, wl.lr, shuffle=False, seed=args.seed)
    t1 = tfa.run_round(tmodel)
    theirs = torch_to_flat(t1, params, wl.conv)
    start = np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(params)])
    diff = float(np.max(np.abs(ours - theirs)))
    change = float(np.max(np.abs(ours - start)))
    result["check"] = {"max_abs_diff": diff, "max_abs_change": change}
    print(f"check: one unshuffled round from the same init, PyTorch vs ReferenceFedAvg: max |diff| {diff:.2e} "
          f"(largest parameter change {change:.2e}) [{time.perf_counter() - t:.0f} s]", flush=True)

  others = [v for v in args.variants if v != "model"]
  if others and not args.no_check:
    result["variant_check"] = check_variants(model, params, data, others, wl.batch_size)
    print("variants vs the flax model on one batch, max |diff|: " + ", ".join(
        f"{v} logits {d['logits']:.1e} grads {d['grads']:.1e}" for v, d in result["variant_check"].items()),
        flush=True)

  # ---- build everything once (--repeats 0: nothing to time, e.g. --breakdown alone)
  if args.repeats <= 0:
    args.torch_threads, args.strategies = args.torch_threads[:1], []
  tfa = TorchFedAvg(torch, data, wl, wl.lr, shuffle=wl.shuffle, seed=args.seed)
  sides = []  # (label, kind, step, state, block, threads)
  for th in args.torch_threads:
    label = f"PyTorch ({th if th else torch_default_threads} threads)"
    sides.append({"label": label, "kind": "torch", "threads": th or torch_default_threads,
                  "step": tfa.run_round, "state": copy.deepcopy(tmodel), "block": lambda s: s})
  for variant in args.variants:
    fn = variant_apply(model, variant)
    for name in args.strategies:
      ndev = args.cpu_devices if name == "shard_map" else None
      label = f"shard_map({ndev} dev)" if name == "shard_map" else name
      if variant != "model":
        label += f" [{variant}]"
      step, state, compile_s = jax_runner(wl, data, fn, params, name, ndev, unroll, args.seed)
      print(f"built {label}" + (f": compile {compile_s:.1f} s" if compile_s is not None else ""), flush=True)
      sides.append({"label": label, "kind": "jax", "variant": variant, "step": step, "state": state,
                    "block": jax.block_until_ready, "compile_s": compile_s})
  for s in sides:
    s.update(walls=[], cpus=[], others=[], loads=[], per_repeat=[])

  # ---- interleaved repeats
  dp = 2 if wl.conv else 4  # decimals of s/round (an MLP round takes a few hundredths of a second)
  for rep in range(args.repeats):
    print(f"repeat {rep + 1}/{args.repeats} (load {os.getloadavg()[0]:.1f})", flush=True)
    for s in sides:
      if s["kind"] == "torch":
        torch.set_num_threads(s["threads"])
      s["state"], walls, cpus, others, loads = time_block(s["step"], s["state"], args.warmup, args.rounds,
                                                          s["block"])
      s["walls"] += walls
      s["cpus"] += cpus
      s["others"] += others
      s["loads"].append(loads)
      s["per_repeat"].append(median(walls))
      print(f"  {s['label']:24s} s/round {' '.join(f'{w:.{dp}f}' for w in walls)}  cores used "
            f"{sum(cpus) / sum(walls):.2f} (other processes {sum(others) / sum(walls):.2f})  load average "
            f"{loads[0]:.1f}->{loads[1]:.1f}", flush=True)
  torch.set_num_threads(torch_default_threads)

  base = sides[0]
  rows = []
  for s in (sides if args.repeats > 0 else []):
    med = median(s["walls"])
    ratios = [b / w for b, w in zip(base["per_repeat"], s["per_repeat"])]  # ours rounds/s / PyTorch rounds/s
    row = {"side": s["label"], "kind": s["kind"], "threads": s.get("threads"), "compile_s": s.get("compile_s"),
           "round_s": s["walls"], "round_s_median": med, "rounds_per_s": 1.0 / med,
           "samples_per_s": samples / med, "cores_used": sum(s["cpus"]) / sum(s["walls"]),
           "other_processes_cores": sum(s["others"]) / sum(s["walls"]),
           "per_repeat_s": s["per_repeat"], "ratio_vs_base_per_repeat": ratios,
           "ratio_vs_base": median(ratios), "loadavg": s["loads"]}
    rows.append(row)
  result["rows"] = rows
  result["baseline"] = base["label"]

  if args.breakdown:
    print("breakdown: one client step at B=10 ...", flush=True)
    steps = info["steps_per_client"]
    result["breakdown"] = breakdown(torch, model, tmodel, params, data, wl.batch_size, steps, args.breakdown_iters,
                                    args.torch_threads[0])
    torch.set_num_threads(torch_default_threads)

  if args.profile_dir:
    print(f"profile: one round's local steps, variant {args.variants[0]} ...", flush=True)
    result["profile"] = profile_steps(model, params, data, wl, args.variants[0], info["steps_per_client"],
                                      data.num_clients, args.profile_dir)

  machine["loadavg_end"] = os.getloadavg()
  print(f"\n**FedAvg, {model_label}, {data.num_clients} clients ({samples} samples/round), B={wl.batch_size}, "
        f"E={wl.epochs}, drop_last={wl.drop_last}, shuffle={wl.shuffle}** "
        f"({args.repeats} repeats x {args.rounds} rounds after {args.warmup} warm-up; load average "
        f"{machine['loadavg_start'][0]:.1f} -> {machine['loadavg_end'][0]:.1f}; XLA_FLAGS={machine['XLA_FLAGS']!r})\n")
  if rows:
    print(f"| side | compile (s) | median s/round (per repeat) | rounds/s | samples/s | vs {base['label']} "
          "| cores used | other processes' cores |")
    print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    comp = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else "–"
    reps = ", ".join(f"{x:.{dp}f}" for x in r["per_repeat_s"])
    ratio = f"{r['ratio_vs_base']:.2f}x (" + ", ".join(f"{x:.2f}" for x in r["ratio_vs_base_per_repeat"]) + ")"
    print(f"| {r['side']} | {comp} | {r['round_s_median']:.{dp}f} ({reps}) | {r['rounds_per_s']:.3f} | "
          f"{r['samples_per_s']:,.0f} | {ratio} | {r['cores_used']:.2f} | {r['other_processes_cores']:.2f} |")
  if "check" in result:
    print(f"\nOne unshuffled round, same init: max |PyTorch - ReferenceFedAvg| = {result['check']['max_abs_diff']:.1e}")
  if args.breakdown:
    print(f"\n| op (one client, B={wl.batch_size}; PyTorch at {args.torch_threads[0] or torch_default_threads} "
          f"threads) | JAX ms | PyTorch ms | JAX / PyTorch time |")
    print("|---|---|---|---|")
    for b in result["breakdown"]:
      print(f"| {b['op']} | {b['jax_ms']:.2f} | {b['torch_ms']:.2f} | {b['jax_over_torch_time']:.2f} |")
  prof = result.get("profile")
  if prof and "top" in prof:
    print(f"\nProfile ({prof['variant']}): {prof['steps']} one-client SGD steps, {prof['wall_s']:.2f} s wall, "
          f"{prof['ops_ms']:.0f} ms in XLA ops; trace {prof['trace']}\n")
    for k, v in prof["categories"].items():
      print(f"  {k}: {v:.0f} ms ({100 * v / prof['ops_ms']:.0f}%)")
    print()
    print("| XLA op | ms | share | shape | JAX op |")
    print("|---|---|---|---|---|")
    for r in prof["top"]:
      print(f"| {r['hlo_op']} | {r['ms']:.0f} | {100 * r['share']:.1f}% | {r['shape']} | {r['jax_op']} |")
  elif prof:
    print(f"\nprofile: {prof.get('error')}")
  if args.out:
    from experiments.grid import provenance, store_json
    result["machine"].update({k: v for k, v in provenance().items() if k in ("commit", "dirty", "device_kind")})
    store_json(args.out, result)


if __name__ == "__main__":
  main()
