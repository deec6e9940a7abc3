"""Past one host (issue 31, part 5): JAX's multi-controller runtime, tested with two processes on localhost.

Each process is started the way a cluster would start it (``experiments/run.py --coordinator_address=...
--num_processes=2 --process_id=I``), with two forced host devices (``XLA_FLAGS``), so the ``shard_map`` mesh spans
four devices over two processes; cross-process collectives on the CPU go through gloo (JAX's default
``jax_cpu_collectives_implementation``). Checked: the per-round metrics equal those of one process with four forced
host devices (this test process, ``tests/conftest.py``); process 0 alone prints and writes the run directory;
``place_clients`` gives each process only its devices' client rows (``make_array_from_callback``) and ``to_host``
brings sharded and replicated values back on every process; what a multi-process run refuses is refused.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import xla_flags_with_devices

from fedjax_robust.config_files import load_module

REPO = Path(__file__).resolve().parents[1]
ROUNDS, CLIENTS = 3, 8
OVERRIDES = [f"--config.rounds={ROUNDS}", f"--config.data.num_clients={CLIENTS}", "--config.engine.strategy=shard_map",
             "--config.output.plots=False", "--config.output.progress=False"]

pytestmark = pytest.mark.slow


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def child_env(devices: int = 2) -> dict:
  env = dict(os.environ, XLA_FLAGS=xla_flags_with_devices(devices), JAX_PLATFORMS="cpu")
  env.pop("JAX_NUM_CPU_DEVICES", None)
  return env


def launch(argv_for, cwd, timeout=240) -> list[subprocess.CompletedProcess]:
  """Starts ``argv_for(process_id)`` for processes 0 and 1 together, returns both once they end (both killed if one
  hangs: a process whose peer died waits on the coordinator)."""
  procs = [subprocess.Popen(argv_for(i), cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i in range(2)]
  done = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=timeout)
      done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, r in enumerate(done):
    assert r.returncode == 0, f"process {i} failed:\n{r.stderr[-4000:]}"
  return done


def read_jsonl(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_two_processes_equal_one(tmp_path):
  assert jax.device_count() == 4, "tests/conftest.py forces 4 host devices: the one-process run has as many as two"
  port = free_port()
  two_dir = tmp_path / "two"
  argv = lambda i: [sys.executable, str(REPO / "experiments" / "run.py"), "--config",
                    str(REPO / "experiments" / "configs" / "quickstart.py"), *OVERRIDES, "--run_dir", str(two_dir),
                    f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"]
  procs = [subprocess.Popen(argv(i), cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i in range(2)]
  try:
    # The one-process reference runs here meanwhile: same config, 4 devices of one process.
    from fedjax_robust.experiment import run_experiment
    config = load_module(REPO / "experiments" / "configs" / "quickstart.py").get_config()
    with config.unlocked():
      config.rounds, config.data.num_clients, config.engine.strategy = ROUNDS, CLIENTS, "shard_map"
      config.output.plots, config.output.progress = False, False
    one = run_experiment(config, tmp_path / "one")
    results = []
    for p in procs:
      out, err = p.communicate(timeout=240)
      results.append((p.returncode, out, err))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, (rc, _, err) in enumerate(results):
    assert rc == 0, f"process {i} failed:\n{err[-4000:]}"
  assert "process 0 of 2, 2 local of 4 devices" in results[0][2]
  assert "process 1 of 2, 2 local of 4 devices" in results[1][2]
  # Process 0 prints the summary; process 1 prints nothing of its own (gloo's "[Gloo] Rank ..." lines aside).
  own = [[line for line in out.splitlines() if not line.startswith("[Gloo]")] for _, out, _ in results]
  printed = json.loads("\n".join(own[0]))
  # (gloo's native logging can leave stray fragments on stdout, e.g. a lone "3" seen in one CI run: only the
  # summary, a JSON object, must be process 0's alone.)
  assert not any(line.lstrip().startswith(("{", '"')) for line in own[1]), own[1]
  assert printed["strategy"] == "shard_map" and printed["run_dir"] == str(two_dir)
  summary = json.loads((two_dir / "summary.json").read_text())
  assert summary["processes"] == 2 and len(summary["devices"]) == 4

  got, want = read_jsonl(two_dir / "metrics.jsonl"), read_jsonl(tmp_path / "one" / "metrics.jsonl")
  assert [r["round"] for r in got] == [r["round"] for r in want] == list(range(1, ROUNDS + 1))
  for g, w in zip(got, want):
    assert set(g) == set(w)
    assert g["cohort"] == w["cohort"]
    for key in ("train_loss", "global_test_acc", "client_acc_mean", "client_acc_weighted",
                "global_client_acc_weighted", "client_acc"):
      np.testing.assert_allclose(g[key], w[key], rtol=1e-5, atol=1e-6, err_msg=f"round {g['round']} {key}")
  assert one["final"]["global_test_acc"] == pytest.approx(summary["final"]["global_test_acc"], abs=1e-6)


PLACEMENT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_robust.execution import initialize_distributed, make_strategy, to_host
    initialize_distributed(sys.argv[1], 2, int(sys.argv[2]))
    me = jax.process_index()
    strategy = make_strategy("shard_map")
    host = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    keys = jax.random.split(jax.random.key(0), 8)
    placed = strategy.place_clients({"x": host, "local": jnp.asarray(host) + 1, "keys": keys, "odd": np.ones((6, 2))})
    x = placed["x"]
    assert not x.is_fully_addressable and x.sharding.spec == jax.sharding.PartitionSpec("clients")
    rows = sorted(int(s.index[0].start) for s in x.addressable_shards)
    assert rows == [4 * me, 4 * me + 2], rows  # this process's two devices hold its 4 of the 8 clients
    for s in x.addressable_shards:
      np.testing.assert_array_equal(np.asarray(s.data), host[s.index])
    assert placed["odd"].sharding.is_fully_replicated  # 6 clients do not divide 4 devices: replicated
    doubled = jax.jit(lambda t: jax.tree.map(lambda a: a * 2, t))({"x": x, "local": placed["local"]})
    back = to_host({"doubled": doubled, "total": jax.jit(jnp.sum)(x), "keys": jax.random.key_data(placed["keys"])})
    np.testing.assert_array_equal(back["doubled"]["x"], 2 * host)
    np.testing.assert_array_equal(back["doubled"]["local"], 2 * (host + 1))
    np.testing.assert_array_equal(back["keys"], jax.random.key_data(keys))
    assert float(back["total"]) == host.sum()
    from fedjax_robust.experiment import default_config, run_experiment
    for field, value in (("output.checkpoint_every", 1), ("seeds", "0,1")):
      config = default_config()
      group, _, leaf = field.rpartition(".")
      setattr(config[group] if group else config, leaf, value)
      try:
        run_experiment(config, "unused")
      except ValueError as e:
        assert "multi-process" in str(e) or "one seed" in str(e), e
      else:
        raise AssertionError(field + " was not refused")
    try:
      make_strategy("shard_map", num_devices=2)
    except ValueError as e:
      assert "every process" in str(e), e
    else:
      raise AssertionError("a mesh over part of the processes was not refused")
    print("ok", me)
""")


def test_placement_and_host_values_across_processes(tmp_path):
  port = free_port()
  results = launch(lambda i: [sys.executable, "-c", PLACEMENT, f"localhost:{port}", str(i)], cwd=REPO)
  assert [r.stdout.split()[-2:] for r in results] == [["ok", "0"], ["ok", "1"]]
