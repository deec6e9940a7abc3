"""Orbax checkpoints of a run's :class:`~fedjax_robust.simulation.SimState`: stop a long run and go on later.

A 100-round FedCAP run takes an hour or more on a laptop CPU, and a grid of them a day; a run that dies at round
80 should not start again from round 1, and a 50-round run should be extendable to 100 rounds without redoing the
first 50. The whole run is in ``SimState`` (DESIGN invariant 4: round ``t``'s randomness is
``fold_in(run_key, t)``, so no host-side generator needs saving), which makes a resumed run the same computation
as an uninterrupted one, round for round (``tests/test_checkpoint.py``).

The state is saved as a plain dict of arrays with orbax's ``StandardSave``; the typed PRNG key is stored as its
raw key data and re-wrapped on restore, since orbax stores arrays of numeric dtypes. Restoring needs a template
state of the same structure (the experiment's initial state), which also carries the shardings to restore onto.

A checkpoint can be damaged (a disk filled up, a copy cut short, a file emptied): :meth:`RunCheckpointer.restore_newest`
then goes back to the newest one that restores, setting the damaged newer ones aside as ``<round>.damaged`` with one
warning line each, and raises :class:`CheckpointError` (one line naming each checkpoint and why) when none does;
orbax's own reports of the failed reads, which Python would print later, are dropped (:func:`is_abandoned_orbax_read`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import types
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_robust.simulation import SimState

logger = logging.getLogger("fedjax_robust")

PyTree = Any


@contextlib.contextmanager
def _quiet_orbax():
  """orbax logs some thirty INFO lines per save through absl; a run's log should say only that it saved."""
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(max(level, logging.WARNING))
  try:
    yield
  finally:
    absl_logger.setLevel(level)


# orbax (0.12) reads a checkpoint's arrays in coroutines that turn any exception into a new one, GeneratorExit
# included: after one read of a damaged checkpoint fails, the others, left pending, each print "Exception ignored
# in: <coroutine _read_array_index_and_device_put>" and a tensorstore spec when Python discards them (some 60 lines
# per array, at no fixed time: later in the run, or in another test), beside a callback to orbax's closed event
# loop. That repeats the failure the one warning line of :meth:`RunCheckpointer.restore_newest` already gave.
_ORBAX_READER = "_read_array_index_and_device_put"


def _is_orbax_reader(code: types.CodeType) -> bool:
  return code.co_name == _ORBAX_READER and "orbax" in Path(code.co_filename).parts


def is_abandoned_orbax_read(unraisable) -> bool:
  """Whether ``sys.unraisablehook``'s argument is one of those reports (and nothing else)."""
  obj, exc = unraisable.object, unraisable.exc_value
  if isinstance(obj, types.CoroutineType):
    return _is_orbax_reader(obj.cr_code)
  if obj is None and isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
    tb = unraisable.exc_traceback
    while tb is not None:
      if tb.tb_frame.f_code.co_filename == asyncio.base_events.__file__:
        return True
      tb = tb.tb_next
  return False


def is_unretrieved_orbax_read(record: logging.LogRecord) -> bool:
  """Whether an ``asyncio`` log record is the other form of those reports: the gathering future of the failed
  reads, discarded with its exception unread, logged as "_GatheringFuture exception was never retrieved" with
  orbax's reader in the traceback (and nothing else)."""
  if "exception was never retrieved" not in record.getMessage() or not record.exc_info:
    return False
  error = record.exc_info[1]
  while error is not None:
    tb = error.__traceback__
    while tb is not None:
      if _is_orbax_reader(tb.tb_frame.f_code):
        return True
      tb = tb.tb_next
    error = error.__cause__ or error.__context__
  return False


class _DropUnretrievedOrbaxReads(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return not is_unretrieved_orbax_read(record)


def _drop_abandoned_orbax_reads() -> Callable[[], None]:
  """Install (once) an unraisable-exception hook that drops :func:`is_abandoned_orbax_read` reports and hands every
  other one to the hook it replaces, and a filter on the ``asyncio`` logger that drops
  :func:`is_unretrieved_orbax_read` records. Returns what takes this installation back out again (nothing, where an
  earlier one is still in place), for a restore that then succeeds: see :func:`_watching_orbax_reads`."""
  asyncio_logger = logging.getLogger("asyncio")
  log_filter = None
  if not any(isinstance(f, _DropUnretrievedOrbaxReads) for f in asyncio_logger.filters):
    log_filter = _DropUnretrievedOrbaxReads()
    asyncio_logger.addFilter(log_filter)
  hook = None
  if not getattr(sys.unraisablehook, "drops_abandoned_orbax_reads", False):
    previous = sys.unraisablehook

    def hook(unraisable):
      if not is_abandoned_orbax_read(unraisable):
        previous(unraisable)

    hook.drops_abandoned_orbax_reads = True
    sys.unraisablehook = hook

  def uninstall() -> None:
    if log_filter is not None:
      asyncio_logger.removeFilter(log_filter)
    if hook is not None and sys.unraisablehook is hook:  # never undo a hook someone installed after ours
      sys.unraisablehook = previous

  return uninstall


@contextlib.contextmanager
def _watching_orbax_reads():
  """Drop orbax's repeated reports of a failed read from before a restore starts, and keep dropping them (for good)
  when it fails; a restore that succeeds leaves the hooks as they were.

  Installing them only once the restore has raised is too late: tensorstore completes the abandoned reads in its
  own threads, whose callbacks find orbax's event loop already closed and report that at once, sometimes before the
  restore's exception reaches us (CI, 2026-12-06: "Exception ignored in: None", RuntimeError: Event loop is closed).
  """
  uninstall = _drop_abandoned_orbax_reads()
  yield  # an exception raised here skips the line below: the hooks stay
  uninstall()


class CheckpointError(RuntimeError):
  """No checkpoint of a run restores; the message names each one and why, on one line."""


def failure_reason(error: BaseException, limit: int = 240) -> str:
  """One line saying why a restore failed: the innermost explicit cause (orbax wraps tensorstore's ``DATA_LOSS`` /
  ``OUT_OF_RANGE`` errors in a generic one), its first line, cut to ``limit`` characters."""
  while error.__cause__ is not None:
    error = error.__cause__
  lines = str(error).strip().splitlines()
  text = lines[0] if lines else ""
  if len(text) > limit:
    text = text[:limit - 3] + "..."
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _is_typed_key(key: jax.Array) -> bool:
  return jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


def state_to_tree(state: SimState) -> dict[str, PyTree]:
  """The checkpointed form of a state: its fields, with the run key as raw key data."""
  key = jax.random.key_data(state.key) if _is_typed_key(state.key) else state.key
  return {"round": state.round, "server": state.server, "clients": state.clients, "key": key}


def tree_to_state(tree: dict[str, PyTree], template: SimState) -> SimState:
  key = tree["key"]
  if _is_typed_key(template.key):
    key = jax.random.wrap_key_data(key, impl=jax.random.key_impl(template.key))
  return SimState(tree["round"], tree["server"], tree["clients"], key)


class RunCheckpointer:
  """Saves a run's state every ``every`` rounds under ``directory`` (keeping the last ``max_to_keep``).

  Args:
    directory: where the checkpoints go (one sub-directory per saved round, named by the round).
    every: save after every ``every``-th completed round (and whenever ``save(force=True)``); 0 = only forced saves.
    max_to_keep: how many of the latest checkpoints to keep on disk.
  """

  def __init__(self, directory: str | Path, every: int, max_to_keep: int = 2):
    if every < 0:
      raise ValueError(f"checkpoint interval must be >= 0 rounds, got {every}")
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    import orbax.checkpoint as ocp
    self._ocp = ocp
    self.directory = Path(directory).resolve()  # orbax wants an absolute path
    self.every = int(every)
    # Synchronous saves: a round's state is small next to a round's compute, and a finished save is on disk
    # before the next round starts, so a crash never leaves a half-written latest checkpoint behind.
    with _quiet_orbax():
      self._manager = ocp.CheckpointManager(
          self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                               enable_async_checkpointing=False))

  @property
  def latest_round(self) -> Optional[int]:
    """The number of completed rounds in the newest checkpoint, or None when there is none."""
    return self._manager.latest_step()

  def save(self, state: SimState, force: bool = False) -> bool:
    """Saves ``state`` if its round is a multiple of ``every`` (or ``force``); returns whether it saved."""
    completed = int(state.round)
    due = self.every > 0 and completed % self.every == 0
    if not (due or force) or completed == self.latest_round:
      return False
    with _quiet_orbax():
      self._manager.save(completed, args=self._ocp.args.StandardSave(state_to_tree(state)))
      self._manager.wait_until_finished()
    logger.info("saved the state after round %d to %s", completed, self.directory)
    return True

  def restore(self, template: SimState, completed_rounds: Optional[int] = None) -> SimState:
    """The saved state after ``completed_rounds`` rounds (default: the latest), shaped like ``template``."""
    step = self.latest_round if completed_rounds is None else int(completed_rounds)
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(self._ocp.utils.to_shape_dtype_struct, state_to_tree(template))
    with _quiet_orbax():
      tree = self._manager.restore(step, args=self._ocp.args.StandardRestore(abstract))
    # orbax hands back arrays committed to the device they were saved from; a fresh state's arrays are uncommitted,
    # which lets the jitted round place them itself (shard_map spreads the client axis over a device mesh, and a
    # committed single-device input is refused there). So restore to the same footing as a fresh init.
    tree = jax.tree.map(lambda a: jnp.asarray(np.asarray(a)), tree)
    state = tree_to_state(tree, template)
    if int(state.round) != step:
      raise ValueError(f"checkpoint {step} in {self.directory} holds a state after {int(state.round)} rounds")
    return state

  @property
  def saved_rounds(self) -> list[int]:
    """The rounds after which a checkpoint is on disk, oldest first (damaged ones included)."""
    return sorted(int(s) for s in self._manager.all_steps())

  def restore_newest(self, template: SimState, at_most: Optional[int] = None) -> SimState:
    """The newest saved state that restores (of those after at most ``at_most`` rounds), shaped like ``template``.

    A newer checkpoint that fails to restore (a truncated data file, an empty metadata file: orbax raises anything
    from ``ValueError: DATA_LOSS`` to ``JSONDecodeError``) is skipped with one warning line saying why, and moved to
    ``<round>.damaged`` beside the others, where orbax no longer sees it, so that this run can save that round again.
    Raises :class:`CheckpointError` when no checkpoint restores (leaving them all in place), FileNotFoundError when
    there is none.
    """
    rounds = [r for r in reversed(self.saved_rounds) if at_most is None or r <= at_most]
    if not rounds:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    failed = []
    for step in rounds:
      try:
        with _watching_orbax_reads():
          state = self.restore(template, step)
      except Exception as e:  # noqa: BLE001 (orbax and tensorstore raise many kinds for a damaged checkpoint)
        failed.append((step, failure_reason(e)))
        continue
      for bad, reason in failed:
        kept = self._set_aside(bad)
        logger.warning("skipped the checkpoint after round %d, which does not restore (%s); kept as %s", bad, reason,
                       kept)
      if failed:
        with _quiet_orbax():
          self._manager.reload()
      return state
    raise CheckpointError(f"no checkpoint in {self.directory} restores: "
                          + "; ".join(f"round {step}: {reason}" for step, reason in failed)
                          + " (start the run afresh with output.resume=False, which deletes them)")

  def _set_aside(self, step: int) -> Path:
    target = self.directory / f"{step}.damaged"
    n = 1
    while target.exists():
      n += 1
      target = self.directory / f"{step}.damaged{n}"
    (self.directory / str(step)).rename(target)
    return target

  def close(self) -> None:
    with _quiet_orbax():
      self._manager.close()


def remove_checkpoints(directory: str | Path) -> None:
  """Deletes an earlier run's checkpoints, so a fresh run in the same directory cannot be resumed from them."""
  directory = Path(directory)
  if directory.exists():
    logger.warning("removing the checkpoints of an earlier run in %s (fresh start; resume=True would go on)",
                   directory)
    shutil.rmtree(directory)
