"""Hyperparameters that may be traced values, so one program runs a grid of them (``fedjax_robust.run``).

A grid over, say, FedProx's ``mu`` or FedCAP's ``phi`` is a ``jax.vmap`` over the algorithm BUILT INSIDE the
trace with that value as a tracer. A factory that accepts such a value validates it only when it is concrete
and keeps it as a number, never a Python ``bool``/``float`` of it; these helpers say so in one place.
"""

from __future__ import annotations

from typing import Any, Callable

import jax


def is_traced(value: Any) -> bool:
  return isinstance(value, jax.core.Tracer)


def check(value: Any, ok: Callable[[Any], bool], message: str) -> None:
  """Raises ``ValueError(message)`` when ``value`` is concrete and not ``ok``; a traced value is checked on the
  host where the grid is parsed."""
  if not is_traced(value) and not ok(value):
    raise ValueError(message)


def scalar(value: Any) -> Any:
  """``float(value)``, or the tracer itself."""
  return value if is_traced(value) else float(value)


def may_be_nonzero(value: Any) -> bool:
  """Whether a term scaled by ``value`` must be computed (always for a traced value: it is exactly 0 in a lane
  where the value is 0, so the lane equals the run that skips the term)."""
  return True if is_traced(value) else bool(value)
