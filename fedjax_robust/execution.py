"""How the client axis is executed: ``vmap``, ``shard_map`` over devices, or a sequential loop.

The client axis is a logical axis. Which execution is fastest depends on the
backend (``DESIGN.md``, performance notes): on GPU/TPU a ``vmap`` inside one
program; on XLA:CPU, ``vmap`` over per-client conv weights lowers to a grouped
convolution that is ~5x slower, and ``shard_map`` over forced host devices (one
client per device) or a plain sequential loop win. All strategies run the same
one-client function and must give the same numbers (``tests/test_engine.py``).

A strategy maps ``fn`` over the leading axis of the arguments whose ``in_axes``
entry is 0, broadcasting those marked ``None`` — the same contract as
``jax.vmap``. ``traceable`` says whether ``map`` may be called inside ``jit``
(the sequential reference runs a Python loop of jitted calls instead).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

logger = logging.getLogger("fedjax_robust.execution")

STRATEGIES = ("vmap", "shard_map", "sequential")
CLIENT_AXIS = "clients"


def _leading_size(in_axes: Sequence[int | None], args: Sequence[Any]) -> int:
  for ax, a in zip(in_axes, args):
    leaves = jax.tree.leaves(a)
    if ax == 0 and leaves:
      return leaves[0].shape[0]
  raise ValueError("at least one argument must be mapped (in_axes entry 0)")


class VmapStrategy:
  """All clients in one program on one device, via ``jax.vmap``."""

  name = "vmap"
  traceable = True

  def map(self, fn: Callable, in_axes: Sequence[int | None], *args):
    return jax.vmap(fn, in_axes=tuple(in_axes))(*args)


class ShardMapStrategy:
  """The client axis split over a 1-D device mesh; each device ``vmap``s its share.

  Cohorts that do not divide the device count are padded by repeating the first
  client, and the padded outputs are dropped. On a CPU, call
  :func:`configure_cpu_devices` before JAX starts to get several host devices.
  """

  name = "shard_map"
  traceable = True

  def __init__(self, devices: Sequence[jax.Device] | None = None):
    devices = list(devices if devices is not None else jax.devices())
    self.mesh = Mesh(np.array(devices), (CLIENT_AXIS,))
    self.num_devices = len(devices)

  def map(self, fn: Callable, in_axes: Sequence[int | None], *args):
    in_axes = tuple(in_axes)
    size = _leading_size(in_axes, args)
    padded = -(-size // self.num_devices) * self.num_devices
    if padded != size:
      pad_rows = lambda a: jnp.concatenate([a, jnp.repeat(a[:1], padded - size, axis=0)], axis=0)
      args = tuple(jax.tree.map(pad_rows, a) if ax == 0 else a for ax, a in zip(in_axes, args))
    specs = tuple(P(CLIENT_AXIS) if ax == 0 else P() for ax in in_axes)
    # check_vma=False: the one-client kernel is mesh-agnostic (e.g. a scan carry that starts from a
    # broadcast global model becomes client-varying), so shard_map's varying-axis typing must not apply.
    mapped = jax.shard_map(jax.vmap(fn, in_axes=in_axes), mesh=self.mesh, in_specs=specs,
                           out_specs=P(CLIENT_AXIS), check_vma=False)
    out = mapped(*args)
    return out if padded == size else jax.tree.map(lambda a: a[:size], out)


class SequentialStrategy:
  """Reference: a Python loop over clients, one jitted call per client."""

  name = "sequential"
  traceable = False

  def __init__(self):
    self._compiled: dict[int, Callable] = {}

  def map(self, fn: Callable, in_axes: Sequence[int | None], *args):
    jitted = self._compiled.get(id(fn))
    if jitted is None:
      jitted = self._compiled[id(fn)] = jax.jit(fn)
    size = _leading_size(in_axes, args)
    outs = []
    for i in range(size):
      client_args = [jax.tree.map(lambda a: a[i], a) if ax == 0 else a for ax, a in zip(in_axes, args)]
      outs.append(jitted(*client_args))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)


def default_strategy_name(backend: str, has_conv: bool, num_devices: int) -> str:
  """The fastest strategy measured per backend (``benchmarks/README.md``).

  GPU/TPU: ``vmap`` (one fused program). CPU with a conv net: ``shard_map`` when
  several host devices exist (each client's conv is a plain conv), else the
  sequential loop (a grouped conv under ``vmap`` is ~5x slower). CPU with an
  MLP: ``vmap``.
  """
  if backend != "cpu" or not has_conv:
    return "vmap"
  return "shard_map" if num_devices > 1 else "sequential"


def make_strategy(name: str, num_devices: int | None = None):
  """Builds a strategy by name; ``num_devices`` limits the ``shard_map`` mesh."""
  if name == "vmap":
    return VmapStrategy()
  if name == "sequential":
    return SequentialStrategy()
  if name == "shard_map":
    devices = jax.devices()
    if num_devices is not None:
      if num_devices > len(devices):
        raise ValueError(
            f"shard_map asked for {num_devices} devices but JAX sees {len(devices)}; on a CPU call "
            "configure_cpu_devices(n) (or set XLA_FLAGS=--xla_force_host_platform_device_count=n) before JAX starts"
        )
      devices = devices[:num_devices]
    return ShardMapStrategy(devices)
  raise ValueError(f"unknown execution strategy {name!r}; choose one of {STRATEGIES} or 'auto'")


def configure_cpu_devices(count: int) -> None:
  """Asks XLA:CPU for ``count`` host devices; must run before JAX initialises its backend."""
  try:
    jax.config.update("jax_num_cpu_devices", int(count))
  except RuntimeError as err:  # backend already initialised
    if jax.device_count() != count:
      logger.warning("could not set %d CPU devices (%s); JAX keeps %d", count, err, jax.device_count())


def is_traceable(strategy) -> bool:
  return bool(getattr(strategy, "traceable", False))


@functools.lru_cache(maxsize=None)
def backend_name() -> str:
  return jax.default_backend()
