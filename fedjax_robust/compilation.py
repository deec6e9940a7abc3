"""XLA compiler options for the engine's programs: ``jit`` is ``jax.jit`` with them.

Why (issue 28 §8, CPU speed against PyTorch): jaxlib 0.10's XLA:CPU hands every convolution to YNNPACK by default.
For the small convolutions of federated models (batch 10, 3-64 channels, 5x5 kernels) its kernels are much slower
than XLA's own Eigen ones: a FedAvg round of FedCAP's CIFAR-10 FedAvgCNN (20 clients, B = 10) went from 0.72x
PyTorch's speed to 1.00x under ``shard_map`` (0.39x -> 0.61x for the one-client-at-a-time ``sequential`` loop) when
the convolutions moved to Eigen (``benchmarks/results/pytorch_baseline_{ynnpack,eigen}_conv_cpu.json``,
``benchmarks/README.md`` §3). So on
the CPU the engine compiles its programs with ``individual_convolution`` removed from the YNNPACK fusion types
(what ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=-individual_convolution`` does: matrix products and
reductions stay in YNNPACK, convolutions use Eigen; checked on the compiled HLO). Other backends get no options.

The options are per program (``jax.jit(..., compiler_options=...)``), not a process-wide ``XLA_FLAGS``: code of
yours around the simulator compiles as XLA decides. ``FEDJAX_ROBUST_CPU_CONV=ynnpack`` restores XLA's default for
the engine too (``eigen``, the default, is the choice above). A jaxlib that does not know the option (it is
"experimental") is detected once, logged, and gets no options.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

import jax

logger = logging.getLogger(__name__)

CPU_CONV_ENV = "FEDJAX_ROBUST_CPU_CONV"
_CPU_CONV_OPTIONS = {
    # jaxlib 0.10's default list is INDIVIDUAL_DOT, REDUCE, INDIVIDUAL_CONVOLUTION; per-program options take the
    # full list (the flag's "-individual_convolution" form is only parsed in XLA_FLAGS).
    "eigen": {"xla_cpu_experimental_ynn_fusion_type":
              "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"},
    "ynnpack": {},
}


def cpu_conv_choice() -> str:
  """``eigen`` (default) or ``ynnpack``, from the environment variable ``FEDJAX_ROBUST_CPU_CONV``."""
  value = os.environ.get(CPU_CONV_ENV, "eigen").strip().lower() or "eigen"
  if value not in _CPU_CONV_OPTIONS:
    raise ValueError(f"{CPU_CONV_ENV}={value!r}: expected one of {sorted(_CPU_CONV_OPTIONS)}")
  return value


@functools.lru_cache(maxsize=None)
def _supported(options_key: tuple) -> bool:
  """Whether this jaxlib compiles with these options (one tiny compile, once per process)."""
  try:
    jax.jit(lambda x: x + 1, compiler_options=dict(options_key)).lower(1.0).compile()
    return True
  except Exception as err:  # an unknown option is refused at compile time, with a jaxlib-specific error type
    logger.warning("XLA options %s not supported by this jaxlib (%s); compiling without them", dict(options_key),
                   str(err).splitlines()[0][:200])
    return False


def compiler_options() -> dict[str, Any] | None:
  """The XLA options of the engine's programs on the current default backend (``None`` for none)."""
  if jax.default_backend() != "cpu":
    return None
  options = _CPU_CONV_OPTIONS[cpu_conv_choice()]
  if not options or not _supported(tuple(sorted(options.items()))):
    return None
  return dict(options)


try:  # no public API says whether a call is being traced; without this one, look for tracers among the arguments
  from jax._src.core import trace_state_clean as _trace_state_clean
except ImportError:
  _trace_state_clean = None


def _under_a_trace(args, kwargs) -> bool:
  """Whether a call happens inside ``jit``/``scan``/``vmap`` tracing (JAX refuses ``compiler_options`` there)."""
  if _trace_state_clean is not None:
    return not _trace_state_clean()
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((args, kwargs)))


class _EngineJit:
  """``jax.jit`` with the engine's options at top level, plain ``jax.jit`` when called inside another traced
  program (the outer program's options then apply: e.g. an evaluation kernel inside the scanned seeds program).
  Without options (GPU, TPU, ``FEDJAX_ROBUST_CPU_CONV=ynnpack``) a call goes straight to the one ``jax.jit``."""

  def __init__(self, fn: Callable, options: dict[str, Any] | None, **kwargs):
    self._top = jax.jit(fn, compiler_options=options, **kwargs)
    self._nested = jax.jit(fn, **kwargs) if options else self._top
    functools.update_wrapper(self, fn)

  def __call__(self, *args, **kwargs):
    if self._nested is not self._top and _under_a_trace(args, kwargs):
      return self._nested(*args, **kwargs)
    return self._top(*args, **kwargs)

  def lower(self, *args, **kwargs):
    return self._top.lower(*args, **kwargs)


def jit(fn: Callable, **kwargs) -> Callable:
  """``jax.jit(fn, **kwargs)`` with :func:`compiler_options` (at top level; see :class:`_EngineJit`). Call it when
  the program is built, not at import (reading the backend starts JAX, which must not happen before
  ``jax.distributed.initialize`` or ``XLA_FLAGS``)."""
  return _EngineJit(fn, compiler_options(), **kwargs)


def has_conv(params) -> bool:
  """Whether a model is a convolutional net (some parameter has >= 4 dims): what the engine's CPU choices key on
  (unrolled local steps, ``engine.rounds_loop``, the default strategy), since XLA:CPU's convolution traps above and
  in :func:`scan` touch only convolutions."""
  return any(jax.numpy.ndim(leaf) >= 4 for leaf in jax.tree.leaves(params))


def scan(f: Callable, init: Any, xs: Any, *, unroll: bool | int = 1, length: int | None = None):
  """``jax.lax.scan``, except that a full unroll (``unroll=True``) of a one-step scan is a plain call of ``f``.

  Why: JAX resolves ``unroll=True`` to ``unroll=length``, and for ``length == 1`` that is ``unroll=1``, a rolled
  one-trip ``while`` loop. XLA:CPU moves convolutions into the layout its Eigen kernels take (conv canonicalization)
  only in a program's entry computation, so the gradient convolutions inside that loop body fall to its naive
  emitter: a one-step ResNet-8 client update on 100 images took 2.7 s against 1.09 s for a three-step (truly
  unrolled) one on a 2-core CPU, ~7x per flop (``tests/test_compilation.py`` checks the compiled convolutions'
  layouts).
  Engine code that unrolls its steps on the CPU (local SGD, the attacks' loops) calls this instead of
  ``lax.scan``; the result is the same either way.
  """
  n = length if length is not None else jax.tree.leaves(xs)[0].shape[0]
  if unroll is True and n == 1:
    carry, y = f(init, jax.tree.map(lambda a: a[0], xs))
    return carry, jax.tree.map(lambda a: jax.numpy.asarray(a)[None], y)
  return jax.lax.scan(f, init, xs, length=length, unroll=unroll)


def map(f: Callable, xs: Any):  # noqa: A001 (jax.lax.map's name, as scan and fori_loop keep theirs)
  """``jax.lax.map``, except that a one-element map is a plain call of ``f``: a rolled one-trip loop would put
  ``f``'s convolutions in a loop body (see :func:`scan`). Robust evaluation attacks its rows in batches with it: a
  single batch of PGD-10 on FedALC's MNIST CNN ran 2.1x faster (500 rows, 2-core CPU, with
  the unrolled steps; ``benchmarks/robust_eval_cost.py``)."""
  if jax.tree.leaves(xs)[0].shape[0] == 1:
    return jax.tree.map(lambda a: jax.numpy.asarray(a)[None], f(jax.tree.map(lambda a: a[0], xs)))
  return jax.lax.map(f, xs)


def fori_loop(lower: int, upper: int, body: Callable, init: Any, *, unroll: bool | int = 1):
  """``jax.lax.fori_loop`` with :func:`scan`'s fix: a full unroll of one iteration is a plain call of ``body``."""
  if unroll is True and int(upper) - int(lower) == 1:
    return body(int(lower), init)
  return jax.lax.fori_loop(lower, upper, body, init, unroll=unroll)
