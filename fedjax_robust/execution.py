"""How the client axis is executed: ``vmap``, ``shard_map`` over devices, or a sequential loop.

The client axis is a logical axis. Which execution is fastest depends on the
backend (``DESIGN.md``, performance notes): on GPU/TPU a ``vmap`` inside one
program; on XLA:CPU, ``vmap`` over per-client conv weights lowers to a grouped
convolution that is slower (1.4x the sequential loop's time for FedCAP's CNN with the engine's Eigen
convolutions, ``compilation.py``; 3.0x with YNNPACK's), and ``shard_map`` over forced host devices (one
client per device) or a plain sequential loop win. All strategies run the same
one-client function and must give the same numbers (``tests/test_engine.py``).

A strategy maps ``fn`` over the leading axis of the arguments whose ``in_axes``
entry is 0, broadcasting those marked ``None`` — the same contract as
``jax.vmap``. ``traceable`` says whether ``map`` may be called inside ``jit``
(the sequential reference runs a Python loop of jitted calls instead).

Placement. Every strategy also says where the population's arrays live:
``place_clients(tree)`` for pytrees with a leading client axis ``K`` (per-client
train/test data, the stacked client state) and ``place_replicated(tree)`` for
what every client reads (server state, the global test set). Under
``shard_map`` the client axis is sharded over the 1-D ``'clients'`` mesh with
``NamedSharding(mesh, P('clients'))`` — each device holds ``K / devices`` rows
instead of a full replica — and the rest is replicated with
``NamedSharding(mesh, P())``; for ``vmap`` and the sequential loop both are the
identity (one device, JAX's default placement). Inside a jitted round the
cohort gather ``tree[cohort]`` from sharded client state and the ``shard_map``
over the gathered cohort are partitioned by XLA (``tests/test_sharding.py``).

Padding. A cohort of ``C`` clients that does not divide the device count is
padded to the next multiple with *masked slots*: rows of zeros (for
``ClientData(x, y, n)`` that is ``n = 0``, a client with no data, so the
client kernel does zero real steps — an exact no-op), a fixed valid key
(``jax.random.key(0)``) for typed PRNG-key leaves. The padded slots' outputs
are dropped, so they never reach aggregation; they are never copies of a real
client.

Several hosts. The ``shard_map`` mesh spans ``jax.devices()``, which after
:func:`initialize_distributed` (JAX's multi-controller runtime,
``jax.distributed.initialize``) is every device of every process. Each process
runs the same program on its own devices; :meth:`ShardMapStrategy.place_clients`
then builds every global array with ``jax.make_array_from_callback``, so a
process writes only the client rows of its own devices, and :func:`to_host`
brings a round's metrics to every process (a replicated value from a local
copy, a sharded one through ``multihost_utils.process_allgather``).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_robust.compilation import jit

logger = logging.getLogger("fedjax_robust.execution")

STRATEGIES = ("vmap", "shard_map", "sequential")
CLIENT_AXIS = "clients"


def _leading_size(in_axes: Sequence[int | None], args: Sequence[Any]) -> int:
  for ax, a in zip(in_axes, args):
    leaves = jax.tree.leaves(a)
    if ax == 0 and leaves:
      return leaves[0].shape[0]
  raise ValueError("at least one argument must be mapped (in_axes entry 0)")


def _masked_rows(a, count: int):
  """``count`` masked-slot rows shaped like ``a[0]``: zeros, or a fixed valid key for typed PRNG keys.

  Zeros make a client with no data (``n = 0``: zero local steps) and zero
  weights/flags; a typed key array gets ``jax.random.key(0)`` of the same
  implementation, since raw zero key data is not guaranteed valid for every
  key implementation.
  """
  if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
    return jnp.broadcast_to(jax.random.key(0, impl=jax.random.key_impl(a)), (count,) + a.shape[1:])
  return jnp.zeros((count,) + a.shape[1:], a.dtype)


def _pad_masked(a, count: int):
  """``a`` with ``count`` masked-slot rows appended along the leading (client) axis."""
  if not isinstance(a, jax.Array):
    a = jnp.asarray(a)
  return jnp.concatenate([a, _masked_rows(a, count)], axis=0)


class VmapStrategy:
  """All clients in one program on one device, via ``jax.vmap``."""

  name = "vmap"
  traceable = True

  def map(self, fn: Callable, in_axes: Sequence[int | None], *args):
    return jax.vmap(fn, in_axes=tuple(in_axes))(*args)

  def place_clients(self, tree):
    """Identity: one device holds every client."""
    return tree

  def place_replicated(self, tree):
    """Identity: one device."""
    return tree


class ShardMapStrategy:
  """The client axis split over a 1-D device mesh; each device ``vmap``s its share.

  What is sharded: the mapped (``in_axes`` 0) arguments of :meth:`map` enter
  the ``shard_map`` with ``P('clients')`` (each device gets ``C / devices``
  clients) and the broadcast ones with ``P()``; outputs leave sharded the same
  way. :meth:`place_clients` puts per-client data and the stacked client state
  on the mesh with ``NamedSharding(mesh, P('clients'))``, and
  :meth:`place_replicated` puts server state on every device
  (``NamedSharding(mesh, P())``), so nothing per-client is replicated.

  Padding: a cohort of ``C`` clients that does not divide the device count is
  padded to the next multiple with masked slots — zero rows, i.e. clients with
  no data (``n = 0``, zero local steps) and a fixed valid key — and the padded
  outputs are dropped. A masked slot is never a copy of a real client. Its
  outputs are whatever the one-client function returns for an empty client
  (possibly ``0/0`` metrics); they are discarded before anyone reads them.

  On a CPU, call :func:`configure_cpu_devices` before JAX starts to get several
  host devices.
  """

  name = "shard_map"
  traceable = True

  def __init__(self, devices: Sequence[jax.Device] | None = None):
    devices = list(devices if devices is not None else jax.devices())
    self.mesh = Mesh(np.array(devices), (CLIENT_AXIS,))
    self.num_devices = len(devices)
    self._clients_sharding = NamedSharding(self.mesh, P(CLIENT_AXIS))
    self._replicated = NamedSharding(self.mesh, P())
    self._logged_sizes: set[int] = set()

  def map(self, fn: Callable, in_axes: Sequence[int | None], *args):
    in_axes = tuple(in_axes)
    size = _leading_size(in_axes, args)
    padded = -(-size // self.num_devices) * self.num_devices
    if padded != size:
      pad = functools.partial(_pad_masked, count=padded - size)
      args = tuple(jax.tree.map(pad, a) if ax == 0 else a for ax, a in zip(in_axes, args))
    specs = tuple(P(CLIENT_AXIS) if ax == 0 else P() for ax in in_axes)
    # check_vma=False: the one-client kernel is mesh-agnostic (e.g. a scan carry that starts from a
    # broadcast global model becomes client-varying), so shard_map's varying-axis typing must not apply.
    mapped = jax.shard_map(jax.vmap(fn, in_axes=in_axes), mesh=self.mesh, in_specs=specs,
                           out_specs=P(CLIENT_AXIS), check_vma=False)
    out = mapped(*args)
    return out if padded == size else jax.tree.map(lambda a: a[:size], out)

  def place_clients(self, tree):
    """Shards every leaf's leading client axis ``K`` over the mesh: ``NamedSharding(mesh, P('clients'))``.

    Each device then holds ``K / devices`` rows. Rank-0 leaves are replicated.
    When ``K`` does not divide the device count the leaf is replicated (XLA's
    ``NamedSharding`` needs equal shards; padding the population would change
    ``K`` for every caller), and the reason is logged once per ``K`` at INFO.
    """
    return jax.tree.map(self._place_client_leaf, tree)

  def place_replicated(self, tree):
    """Every leaf on every device of the mesh: ``NamedSharding(mesh, P())``."""
    return jax.tree.map(lambda a: _put(a, self._replicated), tree)

  def keep_placement(self, server, clients):
    """Inside the compiled round: the new server state replicated and the new client state sharded exactly as
    :meth:`place_replicated` / :meth:`place_clients` placed the initial ones.

    Without it XLA keeps whatever layout the round's last op left (a server cache of per-client uploads leaves the
    ``shard_map`` split over the devices), so round 2's inputs differ in sharding from round 1's and the round is
    compiled a second time (seen with FedVSA's one-round upload cache)."""
    constrain = lambda tree, sharding_of: jax.tree.map(
        lambda a: jax.lax.with_sharding_constraint(a, sharding_of(np.shape(a))), tree)
    return constrain(server, lambda shape: self._replicated), constrain(clients, self._client_leaf_sharding)

  def _client_leaf_sharding(self, shape) -> NamedSharding:
    if not shape:
      return self._replicated
    size = shape[0]
    if size % self.num_devices == 0:
      return self._clients_sharding
    if size not in self._logged_sizes:
      self._logged_sizes.add(size)
      logger.info("place_clients: %d clients do not divide the %d devices of the mesh, so arrays with this "
                  "leading axis stay replicated on every device instead of sharded", size, self.num_devices)
    return self._replicated

  def _place_client_leaf(self, a):
    return _put(a, self._client_leaf_sharding(np.shape(a)))


def _put(a, sharding: NamedSharding):
  """``a`` as a global array with ``sharding``.

  One process: ``jax.device_put``. Several (``jax.distributed``): an array that is already global is resharded by
  ``jax.device_put``; a host or process-local value (the same on every process, e.g. the client data every process
  built from the same seed) becomes ``jax.make_array_from_callback(shape, sharding, ...)``, which asks this process
  only for the rows of its own devices — ``jax.device_put`` of a process-local array onto devices of other
  processes is not what a multi-controller program may do. Typed PRNG keys travel as their key data.
  """
  if jax.process_count() == 1 or (isinstance(a, jax.Array) and not a.is_fully_addressable):
    return jax.device_put(a, sharding)
  if isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(_put(jax.random.key_data(a), sharding), impl=jax.random.key_impl(a))
  host = np.asarray(a)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


class SequentialStrategy:
  """Reference: a Python loop over clients, one jitted call per client."""

  name = "sequential"
  traceable = False

  def __init__(self):
    self._compiled: dict[int, Callable] = {}

  def map(self, fn: Callable, in_axes: Sequence[int | None], *args):
    jitted = self._compiled.get(id(fn))
    if jitted is None:
      jitted = self._compiled[id(fn)] = jit(fn)
    size = _leading_size(in_axes, args)
    outs = []
    for i in range(size):
      client_args = [jax.tree.map(lambda a: a[i], a) if ax == 0 else a for ax, a in zip(in_axes, args)]
      outs.append(jitted(*client_args))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

  def place_clients(self, tree):
    """Identity: one device holds every client."""
    return tree

  def place_replicated(self, tree):
    """Identity: one device."""
    return tree


def default_strategy_name(backend: str, has_conv: bool, num_devices: int) -> str:
  """The fastest strategy measured per backend (``benchmarks/README.md``).

  GPU/TPU: ``vmap`` (one fused program). CPU with a conv net: ``shard_map`` when
  several host devices exist (each client's conv is a plain conv), else the
  sequential loop (a grouped conv under ``vmap`` is 1.4x slower on FedCAP's CNN). CPU with an
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
      if jax.process_count() > 1 and num_devices != len(devices):
        raise ValueError(f"engine.num_devices={num_devices} in a run of {jax.process_count()} processes: the mesh "
                         f"must span every process's devices, so leave it 0 (all {len(devices)} devices)")
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


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, local_device_ids: Sequence[int] | None = None) -> None:
  """Joins this process to a multi-process run through JAX's own runtime: ``jax.distributed.initialize``.

  Must run before the first JAX computation. Arguments left ``None`` are auto-detected by JAX from the cluster
  environment (SLURM, Open MPI, a Cloud TPU pod slice, ...); on a plain set of machines give all three:
  ``coordinator_address`` (``host:port`` of process 0, reachable by every process), ``num_processes`` and this
  process's ``process_id`` (0 .. num_processes-1). Afterwards ``jax.devices()`` lists every process's devices and
  ``jax.local_devices()`` this one's; the ``shard_map`` strategy's mesh spans them all. On CPUs, cross-process
  collectives use gloo (``jax_cpu_collectives_implementation``, JAX's default on CPU).
  """
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, local_device_ids=local_device_ids)
  logger.info("jax.distributed: process %d of %d, %d local of %d devices", jax.process_index(), jax.process_count(),
              jax.local_device_count(), jax.device_count())


def is_primary() -> bool:
  """Whether this is process 0: the one process that writes a run's outputs (always true in one process)."""
  return jax.process_index() == 0


def to_host(tree):
  """``tree`` with its arrays fetched as numpy, the same on every process.

  One process: ``jax.device_get``. Several: a global array spanning other processes' devices is read from this
  process's copy when it is fully replicated, else gathered with ``multihost_utils.process_allgather`` — a
  collective, which every process runs in the same order since every process runs the same program.
  """
  def fetch(a):
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
      if a.sharding.is_fully_replicated:
        return np.asarray(a.addressable_data(0))
      from jax.experimental import multihost_utils
      return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return a
  return jax.device_get(jax.tree.map(fetch, tree))


def is_traceable(strategy) -> bool:
  return bool(getattr(strategy, "traceable", False))


@functools.lru_cache(maxsize=None)
def backend_name() -> str:
  return jax.default_backend()
