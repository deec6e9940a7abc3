"""Checkpoints: a run stopped and resumed (or extended) is the same computation as one run straight through."""

import gc
import json
import shutil

import jax
import jax.numpy as jnp
import pytest

from fedjax_robust import client_weights
from fedjax_robust.checkpoint import CheckpointError, RunCheckpointer
from fedjax_robust.experiment import build_experiment, resume_mismatches, run_experiment
from test_byzantine_e2e import byzantine_config
from test_experiment import digits_config


def metrics(run_dir):
  """Per-round records without wall times (the only field that may differ between a run and its resumption)."""
  return [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
          for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def fedcap_mr_config(rounds):
  """Partial participation (request updates), MR attackers being removed: every part of FedCAP's server state."""
  return byzantine_config("mean", "scaling", rounds=rounds, eval_every=2,
                          **{"algorithm.name": "fedcap", "algorithm.fedcap.phi": 0.3, "server.participation": 0.6,
                             "data.partition.name": "dirichlet", "data.partition.alpha": 0.3})


@pytest.mark.parametrize("make_config", [
    lambda rounds: digits_config(rounds=rounds, eval_every=2, **{"server.participation": 0.5}),
    # The client axis over the 4 host devices of conftest.py: the restored state must be placeable on the mesh.
    lambda rounds: digits_config(rounds=rounds, eval_every=2, **{"engine.strategy": "shard_map"}),
    fedcap_mr_config,
], ids=["fedavg_partial", "fedavg_shard_map", "fedcap_mr_partial"])
@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_extending_a_finished_run_equals_running_it_straight_through(tmp_path, make_config):
  straight = make_config(6)
  whole = run_experiment(straight, tmp_path / "straight")

  first = make_config(3)
  first.output.checkpoint_every = 2  # saves after rounds 2 and 3 (the last round always)
  run_experiment(first, tmp_path / "resumed")
  more = make_config(6)
  more.output.resume = True
  resumed = run_experiment(more, tmp_path / "resumed")

  assert resumed["resumed_from_round"] == 3
  got, want = metrics(tmp_path / "resumed"), metrics(tmp_path / "straight")
  assert [r["round"] for r in got] == [1, 2, 3, 4, 5, 6]
  # Round 3 was the last round of the short run, so it was evaluated there; the straight run did not evaluate it.
  drop_eval = lambda r: {k: v for k, v in r.items() if r["round"] != 3 or k in want[2]}
  assert [drop_eval(r) for r in got] == want
  assert resumed["final_client_acc"] == whole["final_client_acc"]
  assert len((tmp_path / "resumed" / "metrics.csv").read_text().splitlines()) == 1 + 6
  if (tmp_path / "straight" / client_weights.FILE).exists():  # FedCAP: the client x client weights of evaluated rounds
    want_r, want_c, want_m = client_weights.load(tmp_path / "straight" / client_weights.FILE)
    got_r, got_c, got_m = client_weights.load(tmp_path / "resumed" / client_weights.FILE)
    assert want_r.tolist() == [2, 4, 6] and got_r.tolist() == [2, 3, 4, 6]  # round 3: the short run's last
    keep = got_r != 3
    assert (got_c[keep] == want_c).all() and (got_m[keep] == want_m).all()


def test_a_crash_after_the_checkpoint_redoes_the_rounds_logged_after_it(tmp_path):
  c = digits_config(rounds=5, eval_every=5)
  c.output.checkpoint_every = 2
  run_experiment(c, tmp_path / "run")
  before = metrics(tmp_path / "run")
  # Checkpoints are kept for rounds 4 and 5; losing 5 is a crash between logging round 5 and saving it.
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "5")
  c.output.resume = True
  summary = run_experiment(c, tmp_path / "run")
  assert summary["resumed_from_round"] == 4
  assert metrics(tmp_path / "run") == before


def _truncate_largest_data_file(step_dir):
  """A copy cut short: the largest array file of an orbax checkpoint, truncated to 100 bytes."""
  files = [f for f in step_dir.rglob("*") if f.is_file()]
  biggest = max(files, key=lambda f: f.stat().st_size)
  with open(biggest, "r+b") as fh:
    fh.truncate(100)


@pytest.fixture
def orbax_readers_collected():
  """orbax's readers of a damaged file, left pending, report their failure again when Python discards them (at no
  fixed time: pytest shows it as an unraisable-exception warning in whichever test runs then). The checkpointer
  drops those reports (``checkpoint.is_abandoned_orbax_read``); here they are collected at the damaging test's
  end, and any that got through fails the test (``NO_UNRAISABLE``)."""
  yield
  gc.collect()


NO_UNRAISABLE = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


@NO_UNRAISABLE
@pytest.mark.usefixtures("orbax_readers_collected")
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_that_restores(tmp_path, caplog):
  """Issue 31 part 4: a truncated data file in the latest checkpoint (and, in a second resumption, an emptied
  metadata file) costs the rounds since the previous checkpoint, not the run: one warning line each, the damaged
  checkpoint kept aside, the rounds redone to the same numbers."""
  c = digits_config(rounds=3, eval_every=1)
  c.output.checkpoint_every = 1  # keeps rounds 2 and 3
  run_experiment(c, tmp_path / "run")
  before = metrics(tmp_path / "run")
  ckpt = tmp_path / "run" / "checkpoints"
  _truncate_largest_data_file(ckpt / "3")
  more = digits_config(rounds=4, eval_every=1)
  more.output.checkpoint_every, more.output.resume = 1, True
  with caplog.at_level("WARNING", logger="fedjax_robust"):
    summary = run_experiment(more, tmp_path / "run")
  assert summary["resumed_from_round"] == 2
  skipped = [r.getMessage() for r in caplog.records if "skipped the checkpoint" in r.getMessage()]
  assert len(skipped) == 1 and "after round 3" in skipped[0] and "\n" not in skipped[0]
  assert "3.damaged" in skipped[0] and not any(r.exc_info for r in caplog.records)
  assert (ckpt / "3.damaged").is_dir() and (ckpt / "3").is_dir() and (ckpt / "4").is_dir()  # round 3 saved again
  after = metrics(tmp_path / "run")
  assert [r["round"] for r in after] == [1, 2, 3, 4] and after[:3] == before  # the redone round is the same

  (ckpt / "4" / "default" / "_METADATA").write_text("")  # an emptied metadata file
  caplog.clear()
  more.rounds = 5
  with caplog.at_level("WARNING", logger="fedjax_robust"):
    assert run_experiment(more, tmp_path / "run")["resumed_from_round"] == 3
  assert any("after round 4" in r.getMessage() and "JSONDecodeError" in r.getMessage() for r in caplog.records)


@NO_UNRAISABLE
@pytest.mark.usefixtures("orbax_readers_collected")
def test_resuming_when_no_checkpoint_restores_is_refused_in_one_line(tmp_path):
  c = digits_config(rounds=2, eval_every=2)
  c.output.checkpoint_every = 1
  run_experiment(c, tmp_path / "run")
  ckpt = tmp_path / "run" / "checkpoints"
  _truncate_largest_data_file(ckpt / "2")
  (ckpt / "1" / "default" / "_METADATA").write_text("")
  c = digits_config(rounds=3, eval_every=3)
  c.output.checkpoint_every, c.output.resume = 1, True
  with pytest.raises(CheckpointError) as refused:
    run_experiment(c, tmp_path / "run")
  message = str(refused.value)
  assert "\n" not in message and len(message) < 800
  assert "no checkpoint in" in message and "round 2: ValueError" in message and "round 1: JSONDecodeError" in message
  assert "output.resume=False" in message
  assert sorted(p.name for p in ckpt.iterdir()) == ["1", "2"]  # nothing moved when nothing restores


def _coroutine_named(name: str, filename: str):
  namespace: dict = {}
  exec(compile(f"async def {name}():\n  pass\n", filename, "exec"), namespace)
  return namespace[name]()


def _closed_event_loop_report():
  """What ``sys.unraisablehook`` receives when a tensorstore callback reaches orbax's closed event loop."""
  import asyncio
  from types import SimpleNamespace
  closed_loop = asyncio.new_event_loop()
  closed_loop.close()
  try:
    closed_loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    return SimpleNamespace(object=None, exc_value=e, exc_traceback=e.__traceback__)
  raise AssertionError("a closed event loop took a callback")


def test_only_abandoned_orbax_reads_are_dropped_and_only_after_a_failed_restore(monkeypatch):
  import sys
  from types import SimpleNamespace

  from fedjax_robust import checkpoint
  orbax_file = "/site-packages/orbax/checkpoint/_src/serialization/serialization.py"
  reader = _coroutine_named("_read_array_index_and_device_put", orbax_file)
  other_reader = _coroutine_named("_read_array_index_and_device_put", "/site-packages/mylib/io.py")
  other_orbax = _coroutine_named("save", orbax_file)
  try:
    def report(obj, exc=None):
      return SimpleNamespace(object=obj, exc_value=exc or Exception("x"), exc_traceback=None)

    loop_closed = _closed_event_loop_report()
    assert checkpoint.is_abandoned_orbax_read(report(reader))
    assert checkpoint.is_abandoned_orbax_read(loop_closed)
    assert not checkpoint.is_abandoned_orbax_read(report(other_reader))
    assert not checkpoint.is_abandoned_orbax_read(report(other_orbax))
    assert not checkpoint.is_abandoned_orbax_read(report(None, RuntimeError("Event loop is closed")))  # not asyncio's
    assert not checkpoint.is_abandoned_orbax_read(report(None, ValueError("x")))

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    checkpoint._drop_abandoned_orbax_reads()
    checkpoint._drop_abandoned_orbax_reads()  # once: not a hook around a hook
    hook = sys.unraisablehook
    assert hook is not seen.append and hook.drops_abandoned_orbax_reads
    for r in (report(reader), loop_closed, report(other_reader), report(None, ValueError("x"))):
      hook(r)
    assert [r.object for r in seen] == [other_reader, None] and isinstance(seen[1].exc_value, ValueError)
  finally:
    for coroutine in (reader, other_reader, other_orbax):
      coroutine.close()


def _raised_in(name: str, filename: str) -> BaseException:
  namespace: dict = {}
  exec(compile(f"def {name}():\n  raise ValueError('OUT_OF_RANGE')\n", filename, "exec"), namespace)
  try:
    try:
      namespace[name]()
    except ValueError as inner:
      raise Exception("Encountered error while reading array index") from inner
  except Exception as outer:  # noqa: BLE001
    return outer


def test_only_unretrieved_orbax_reads_are_dropped_from_the_asyncio_log(monkeypatch):
  """The second form of orbax's repeated reports (CI, 2026-12-02): asyncio logs the discarded gathering future
  of the failed reads as an ERROR with a traceback, beside the one warning line of the skipped checkpoint."""
  import logging
  import sys

  from fedjax_robust import checkpoint
  orbax_file = "/site-packages/orbax/checkpoint/_src/serialization/serialization.py"

  def record(message, error):
    exc_info = (type(error), error, error.__traceback__) if error is not None else None
    return logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1, message, (), exc_info)

  unretrieved = "_GatheringFuture exception was never retrieved"
  assert checkpoint.is_unretrieved_orbax_read(record(unretrieved, _raised_in("_read_array_index_and_device_put",
                                                                              orbax_file)))
  assert not checkpoint.is_unretrieved_orbax_read(record(unretrieved, _raised_in("_read_array_index_and_device_put",
                                                                                  "/site-packages/mylib/io.py")))
  assert not checkpoint.is_unretrieved_orbax_read(record(unretrieved, _raised_in("save", orbax_file)))
  assert not checkpoint.is_unretrieved_orbax_read(record(unretrieved, None))
  assert not checkpoint.is_unretrieved_orbax_read(record("Task was destroyed but it is pending!",
                                                         _raised_in("_read_array_index_and_device_put", orbax_file)))

  asyncio_logger = logging.getLogger("asyncio")
  monkeypatch.setattr(asyncio_logger, "filters", [])
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # restored after the test
  checkpoint._drop_abandoned_orbax_reads()
  checkpoint._drop_abandoned_orbax_reads()  # once
  assert len(asyncio_logger.filters) == 1
  assert not asyncio_logger.filters[0].filter(record(unretrieved, _raised_in("_read_array_index_and_device_put",
                                                                              orbax_file)))
  assert asyncio_logger.filters[0].filter(record(unretrieved, _raised_in("save", orbax_file)))


def test_restoring_installs_nothing_until_a_restore_fails(tmp_path, monkeypatch):
  import sys
  sentinel = lambda unraisable: None  # noqa: E731
  monkeypatch.setattr(sys, "unraisablehook", sentinel)
  c = digits_config(rounds=2, eval_every=2)
  c.output.checkpoint_every = 1
  run_experiment(c, tmp_path / "run")
  c.output.resume = True
  c.rounds = 3
  import logging
  monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])
  assert run_experiment(c, tmp_path / "run")["resumed_from_round"] == 2
  assert sys.unraisablehook is sentinel and not logging.getLogger("asyncio").filters


def test_orbax_reports_that_arrive_before_a_failed_restore_raises_are_dropped(monkeypatch):
  """tensorstore's threads report orbax's closed event loop as soon as an abandoned read completes, which can be
  before the restore's exception reaches restore_newest (CI, 2026-12-06): the hook is in place from the start of
  each restore, stays when it fails and goes when it succeeds."""
  import logging
  import sys
  from types import SimpleNamespace

  from fedjax_robust import checkpoint

  loop_closed = _closed_event_loop_report()
  other = SimpleNamespace(object=None, exc_value=ValueError("x"), exc_traceback=None)
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])

  def restore_reporting(template, step):
    sys.unraisablehook(loop_closed)  # from tensorstore's thread, while the restore is still unwinding
    sys.unraisablehook(other)
    if step == 3:
      raise ValueError("OUT_OF_RANGE")
    return f"state {step}"

  ckpt = SimpleNamespace(saved_rounds=[2], restore=restore_reporting)
  assert checkpoint.RunCheckpointer.restore_newest(ckpt, template=None) == "state 2"
  assert seen == [other] and sys.unraisablehook == seen.append  # succeeded: nothing left installed
  assert not logging.getLogger("asyncio").filters

  ckpt = SimpleNamespace(saved_rounds=[2, 3], restore=restore_reporting, _set_aside=lambda step: f"{step}.damaged",
                         _manager=SimpleNamespace(reload=lambda: None))
  assert checkpoint.RunCheckpointer.restore_newest(ckpt, template=None) == "state 2"
  assert seen == [other, other, other]  # the closed loop's reports dropped in both the failed and the good restore
  assert sys.unraisablehook.drops_abandoned_orbax_reads  # failed once: stays, for the reads discarded later
  sys.unraisablehook(loop_closed)
  assert seen == [other, other, other]
  assert len(logging.getLogger("asyncio").filters) == 1


def test_resuming_with_a_different_experiment_is_refused(tmp_path):
  c = digits_config(rounds=2)
  c.output.checkpoint_every = 1
  run_experiment(c, tmp_path / "run")
  other = digits_config(rounds=4, **{"client.lr": 0.5})
  other.output.resume = True
  with pytest.raises(ValueError, match=r"client\.lr"):
    run_experiment(other, tmp_path / "run")
  shorter = digits_config(rounds=1)
  shorter.output.resume = True
  with pytest.raises(ValueError, match="after 2 rounds"):
    run_experiment(shorter, tmp_path / "run")


def test_resume_mismatches_ignores_only_length_output_and_engine():
  stored = {"rounds": 5, "eval_every": 5, "seed": 0, "output": {"dir": "a"}, "engine": {"strategy": "vmap"},
            "client": {"lr": 0.1}}
  current = {"rounds": 9, "eval_every": 3, "seed": 1, "output": {"dir": "b"}, "engine": {"strategy": "sequential"},
             "client": {"lr": 0.1, "momentum": 0.9}}
  assert resume_mismatches(stored, current) == ["client.momentum", "seed"]


def test_a_fresh_run_removes_stale_checkpoints_and_resume_without_one_starts_fresh(tmp_path):
  c = digits_config(rounds=2)
  c.output.checkpoint_every = 1
  run_experiment(c, tmp_path / "run")
  assert (tmp_path / "run" / "checkpoints" / "2").exists()
  fresh = digits_config(rounds=1)  # no checkpointing, not resuming: the old state must not survive
  run_experiment(fresh, tmp_path / "run")
  assert not (tmp_path / "run" / "checkpoints").exists()

  resume = digits_config(rounds=2)
  resume.output.resume = True  # nothing to resume: runs from round 1
  summary = run_experiment(resume, tmp_path / "new")
  assert summary["resumed_from_round"] == 0
  assert [r["round"] for r in metrics(tmp_path / "new")] == [1, 2]


def test_checkpointer_saves_every_n_rounds_and_restores_the_state_exactly(tmp_path):
  exp = build_experiment(digits_config(rounds=3))
  state = exp.init_state()
  checkpointer = RunCheckpointer(tmp_path / "ckpt", every=2)
  saved = []
  for _ in range(3):
    state, _ = exp.simulator.run_round(state)
    saved.append(checkpointer.save(state))
  assert saved == [False, True, False]
  assert checkpointer.save(state, force=True) and checkpointer.latest_round == 3
  restored = checkpointer.restore(exp.init_state())
  assert int(restored.round) == 3
  assert jnp.array_equal(jax.random.key_data(restored.key), jax.random.key_data(state.key))
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), restored.server, state.server))
  at_two = checkpointer.restore(exp.init_state(), completed_rounds=2)
  assert int(at_two.round) == 2
  checkpointer.close()
  with pytest.raises(ValueError, match=">= 0"):
    RunCheckpointer(tmp_path / "bad", every=-1)


def test_run_py_extends_a_checkpointed_run(tmp_path):
  """The CLI path of the README: a 1-round run with checkpoints, then the same config resumed to 2 rounds."""
  import subprocess
  import sys

  from test_experiment import REPO
  cmd = [sys.executable, str(REPO / "experiments" / "run.py"), "--config", str(REPO / "experiments/configs/quickstart.py"),
         "--config.output.progress=False", "--config.output.checkpoint_every=1", f"--run_dir={tmp_path / 'cli'}"]
  first = subprocess.run(cmd + ["--config.rounds=1"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert first.returncode == 0, first.stderr[-3000:]
  resume = cmd + ["--config.rounds=2", "--config.output.resume=True", "--config.output.plots=False"]  # drawn once
  second = subprocess.run(resume, capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "resuming" in second.stderr
  summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
  assert summary["resumed_from_round"] == 1 and summary["final"]["round"] == 2
  assert [r["round"] for r in metrics(tmp_path / "cli")] == [1, 2]
  again = subprocess.run(resume, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)  # nothing left to run: re-evaluates and reports, no rounds/s
  assert again.returncode == 0, again.stderr[-3000:]
  assert '"resumed_from_round": 2' in again.stdout and '"rounds_per_s": null' in again.stdout
  assert [r["round"] for r in metrics(tmp_path / "cli")] == [1, 2]


def grid_module():
  """``experiments/grid.py``, the shared driver of the grid scripts (a script, not a package module)."""
  from fedjax_robust.config_files import load_module
  from test_experiment import REPO
  return load_module(REPO / "experiments" / "grid.py")


def test_grid_flags_reach_every_cell_config():
  import argparse

  grid = grid_module()
  parser = argparse.ArgumentParser()
  grid.add_common_args(parser, "runs/x")
  args = parser.parse_args(["--rounds", "7", "--checkpoint_every", "5", "--resume"])
  c = grid.apply_run_args(digits_config(), args)
  assert (c.rounds, c.output.checkpoint_every, c.output.resume) == (7, 5, True)
  assert not grid.apply_run_args(digits_config(), parser.parse_args([])).output.resume


def test_a_resumed_grid_cell_records_where_it_resumed_and_the_runs_whole_wall_time(tmp_path):
  """``wall_s`` times one invocation; for a cell finished across sessions the results file must also say so."""
  grid = grid_module()
  record = lambda summary, run_dir, config: {"value": 100.0 * summary["final"]["client_acc_weighted"]}
  first = digits_config(rounds=2, eval_every=1, **{"output.checkpoint_every": 1})
  fresh = grid.run_cells([("cell", first, record)], tmp_path, tmp_path / "results.json", {})["cell"]
  assert "resumed_from_round" not in fresh and "run_wall_time_s" not in fresh
  more = digits_config(rounds=3, eval_every=1, **{"output.checkpoint_every": 1, "output.resume": True})
  resumed = grid.run_cells([("cell", more, record)], tmp_path, tmp_path / "results.json", {})["cell"]
  assert resumed["resumed_from_round"] == 2 and resumed["rounds"] == 3
  stored = json.loads((tmp_path / "cell" / "summary.json").read_text())
  assert resumed["run_wall_time_s"] == stored["wall_time_s"] > 0
  assert json.loads((tmp_path / "results.json").read_text())["cell"]["resumed_from_round"] == 2
  # the cell's curve spans the whole run, the rounds before the checkpoint included
  assert resumed["train_loss_per_round"] == [r["train_loss"] for r in metrics(tmp_path / "cell")]
  assert len(resumed["train_loss_per_round"]) == 3 and resumed["train_loss_per_round"][:2] == fresh["train_loss_per_round"]


def _write_run(run_dir, rows, malicious=None):
  run_dir.mkdir()
  (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  if malicious is not None:
    (run_dir / "malicious.json").write_text(json.dumps({"malicious_clients": malicious}))


def test_per_round_series_of_a_hand_written_fedcap_run(tmp_path):
  """The largest calibrated norm among each round's benign cohort members; attackers (malicious.json) left out;
  a round whose cohort holds only attackers has none."""
  grid = grid_module()
  rows = [{"round": 1, "train_loss": 2.0, "benign_train_loss": 1.5, "num_removed": 0, "cohort": [0, 1, 2],
           "calibrated_norms": [1.0, 5.0, 2.0]},
          {"round": 2, "train_loss": 1.0, "benign_train_loss": 0.5, "num_removed": 1, "cohort": [1],
           "calibrated_norms": [7.0]}]
  _write_run(tmp_path / "attacked", rows, malicious=[1])
  assert grid.per_round_series(tmp_path / "attacked") == {
      "malicious_clients": [1], "train_loss_per_round": [2.0, 1.0], "benign_train_loss_per_round": [1.5, 0.5],
      "num_removed_per_round": [0, 1], "benign_max_upload_norm_per_round": [2.0, None]}
  _write_run(tmp_path / "clean", rows)  # no malicious.json: every client is benign
  assert grid.per_round_series(tmp_path / "clean")["benign_max_upload_norm_per_round"] == [5.0, 7.0]


def test_per_round_series_of_a_hand_written_detecting_rule_run(tmp_path):
  """Each round's [min, max] detection score of the cohort's benign clients and of its attackers (FedCC's CKA);
  a round without attackers has None; an unattacked run keeps no ranges."""
  grid = grid_module()
  rows = [{"round": 1, "cohort": [0, 1, 2, 3], "detection_scores": [0.9, 0.2, 0.8, 0.95], "flagged_clients": [1, 3],
           "detection_tp": 1, "detection_fn": 0, "detection_fp": 1, "detection_tn": 2},
          {"round": 2, "cohort": [0, 2], "detection_scores": [0.7, 0.6], "flagged_clients": [],
           "detection_tp": 0, "detection_fn": 0, "detection_fp": 0, "detection_tn": 2}]
  _write_run(tmp_path / "attacked", rows, malicious=[1, 4])
  series = grid.per_round_series(tmp_path / "attacked")
  assert series["benign_score_range_per_round"] == [[0.8, 0.95], [0.6, 0.7]]
  assert series["attacker_score_range_per_round"] == [[0.2, 0.2], None]
  # whom the rule flagged each round, and the round's counts, travel with the cell
  assert series["flagged_clients_per_round"] == [[1, 3], []]
  assert series["detection_fp_per_round"] == [1, 0] and series["detection_fn_per_round"] == [0, 0]
  _write_run(tmp_path / "clean", rows)
  assert "benign_score_range_per_round" not in grid.per_round_series(tmp_path / "clean")


def test_per_round_series_keeps_only_what_every_round_logs_and_rejects_a_gappy_log(tmp_path):
  grid = grid_module()
  _write_run(tmp_path / "fedavg", [{"round": 1, "train_loss": 2.0}, {"round": 2, "train_loss": 1.0, "num_removed": 0}])
  assert grid.per_round_series(tmp_path / "fedavg") == {"train_loss_per_round": [2.0, 1.0]}
  _write_run(tmp_path / "gap", [{"round": 1, "train_loss": 2.0}, {"round": 3, "train_loss": 1.0}])
  with pytest.raises(ValueError, match="rounds 1..2"):
    grid.per_round_series(tmp_path / "gap")


def test_per_round_series_keeps_fedvsas_detection_log(tmp_path):
  """A FedVSA run's audit counts and alarms and its Shapley flags travel with its cell (fedvsa_tables' Table 5
  parts block; the count of reports above the reference says how close a quiet audit came to its quorum)."""
  grid = grid_module()
  rows = [{"round": 1, "train_loss": 2.0, "audit_exceedances": 0, "audit_alarm": False, "shapley_flagged_benign": 0,
           "shapley_flagged_attackers": 0, "shapley_values": [0.0, 0.0]},
          {"round": 2, "train_loss": 1.0, "audit_exceedances": 2, "audit_alarm": True, "shapley_flagged_benign": 1,
           "shapley_flagged_attackers": 1, "shapley_values": [-0.2, -0.01]}]
  _write_run(tmp_path / "fedvsa", rows)
  assert grid.per_round_series(tmp_path / "fedvsa") == {
      "train_loss_per_round": [2.0, 1.0], "audit_exceedances_per_round": [0, 2], "audit_alarm_per_round": [False, True],
      "shapley_flagged_benign_per_round": [0, 1], "shapley_flagged_attackers_per_round": [0, 1]}


def test_keep_cell_copies_a_cell_with_its_command_and_never_overwrites_silently(tmp_path):
  from fedjax_robust.config_files import load_module
  from test_experiment import REPO
  keep = load_module(REPO / "experiments" / "keep_cell.py")
  source = tmp_path / "results.a.json"
  source.write_text(json.dumps({"a__none": {"value": 81.5, "train_loss_per_round": [2.0, 1.0]}}))
  target = tmp_path / "kept.json"
  target.write_text(json.dumps({"old": {"value": 1.0}}))
  keep.keep_cell(source, "a__none", target, "a__none@r2", "python run.py")
  assert json.loads(target.read_text()) == {
      "old": {"value": 1.0},
      "a__none@r2": {"value": 81.5, "train_loss_per_round": [2.0, 1.0], "command": "python run.py"}}
  with pytest.raises(ValueError, match="--replace"):
    keep.keep_cell(source, "a__none", target, "a__none@r2", "python other.py")
  assert keep.keep_cell(source, "a__none", target, "a__none@r2", "python other.py", replace=True)["command"] == \
      "python other.py"
  with pytest.raises(KeyError, match="no cell 'b'"):
    keep.keep_cell(source, "b", target, "b", "x")
  # a cell written before the grid kept curves gets them from its run directory; the cell's own fields win
  source.write_text(json.dumps({"old__none": {"value": 70.0, "train_loss_per_round": [9.0]}}))
  _write_run(tmp_path / "old__none", [{"round": 1, "train_loss": 2.0, "num_removed": 3}], malicious=[4])
  assert keep.keep_cell(source, "old__none", target, "old__none@r1", "c") == {
      "malicious_clients": [4], "train_loss_per_round": [9.0], "num_removed_per_round": [3], "value": 70.0,
      "command": "c"}
