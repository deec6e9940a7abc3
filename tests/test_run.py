"""Whole runs as one program (``fedjax_robust.run``): make_run equals the round loop; seeds vmapped in one
program equal separate runs (issue 28 §6)."""

import json

import jax
import numpy as np
import pytest

from fedjax_robust.client import ClientData
from fedjax_robust.experiment import build_experiment, default_config, run_experiment
from fedjax_robust.run import eval_rounds, make_run, pad_rows, parse_seeds, seed_config, summarize_finals


def small_config(**extra):
  c = default_config()
  c.rounds, c.eval_every = 4, 3
  c.data.name, c.data.num_clients = "digits", 6
  c.data.partition.name, c.data.partition.alpha = "dirichlet", 0.5  # per-seed client sizes differ: padding
  c.server.participation = 0.5
  c.output.progress = False
  c.engine.strategy = "vmap"
  c.update_from_flattened_dict(extra)
  return c


def rows_of(run_dir):
  return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_eval_rounds_and_seed_parsing():
  assert eval_rounds(4, 3) == [3, 4] and eval_rounds(6, 3) == [3, 6] and eval_rounds(2, 5) == [2]
  assert parse_seeds("0, 1,2") == [0, 1, 2] and parse_seeds("") == [] and parse_seeds([3]) == [3]
  with pytest.raises(ValueError, match="distinct"):
    parse_seeds("1,1")
  with pytest.raises(ValueError, match="integers"):
    parse_seeds("a,b")
  c = seed_config(small_config(), 7)
  assert (c.seed, c.data.seed, c.attack.seed, c.seeds) == (7, 7, 7, "")
  with pytest.raises(ValueError, match="not a config field"):
    seed_config(small_config(), 1, ("seed", "data.nope"))


def test_padding_rows_never_changes_a_client():
  """More padding rows (a stacked seed with a larger client) leave a client's training unchanged: the shuffle of
  the real rows does not depend on n_max."""
  from fedjax_robust.client.local_sgd import epoch_permutations
  key = jax.random.key(3)
  short = np.asarray(epoch_permutations(key, 7, 10, 2))
  long = np.asarray(epoch_permutations(key, 7, 25, 2))
  np.testing.assert_array_equal(short[:, :7], long[:, :7])
  assert sorted(short[0, :7]) == list(range(7))
  d = ClientData(np.ones((2, 3, 4)), np.ones((2, 3), np.int32), np.array([3, 2]))
  p = pad_rows(d, 5)
  assert p.x.shape == (2, 5, 4) and float(p.x[:, 3:].sum()) == 0 and p.n.tolist() == [3, 2]


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_make_run_equals_the_round_loop():
  """One program (lax.scan over rounds, evaluation inside) == run_round + evaluate called from Python."""
  exp = build_experiment(small_config())
  sim = exp.simulator
  state = exp.init_state()
  final, trace = jax.jit(make_run(sim, 4, 3))(state, sim.inputs)
  loop_losses, loop_evals = [], []
  s = state
  for t in range(1, 5):
    s, m = sim.run_round(s)
    loop_losses.append(float(m["train_loss"]))
    if t in (3, 4):
      loop_evals.append(sim.evaluate(s))
  np.testing.assert_allclose(np.asarray(trace.rounds["train_loss"]), loop_losses, rtol=1e-5)
  for i, expected in enumerate(loop_evals):
    got = sim.evaluation_record(jax.device_get(jax.tree.map(lambda a: a[i], trace.evaluations)))
    assert got["client_acc"] == pytest.approx(expected["client_acc"], abs=1e-6)
    assert got["global_test_acc"] == pytest.approx(expected["global_test_acc"], abs=1e-6)
  np.testing.assert_allclose(jax.tree.leaves(final.server)[0], jax.tree.leaves(s.server)[0], atol=1e-5)


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
@pytest.mark.parametrize("algorithm,attack", [("fedavg", "scaling"), ("fedcap", "lie")])
def test_seeds_in_one_program_equal_separate_runs(tmp_path, algorithm, attack):
  """--config.seeds=0,1: each seed's metrics (its own partition, attackers and init) equal the separate run with
  seed = data.seed = attack.seed = s. FedCAP under partial participation poisons its requests with the run's
  attacker mask, an argument of the program."""
  extra = {"algorithm.name": algorithm, "attack.name": attack, "attack.fraction": 0.34}
  c = small_config(**extra)
  c.seeds = "0,1"
  summary = run_experiment(c, tmp_path / "seeds")
  assert summary["seeds"] == [0, 1] and set(summary["final"]["train_loss"]) == {"values", "mean", "std"}
  partitions = []
  for seed in (0, 1):
    single = small_config(**extra, seed=seed, **{"data.seed": seed, "attack.seed": seed})
    run_experiment(single, tmp_path / f"single_{seed}")
    together, alone = rows_of(tmp_path / "seeds" / f"seed_{seed}"), rows_of(tmp_path / f"single_{seed}")
    assert [r["round"] for r in together] == [1, 2, 3, 4]
    for a, b in zip(together, alone):
      assert a["cohort"] == b["cohort"] if "cohort" in a else True
      assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5, abs=1e-6)
      for key in ("client_acc_mean", "global_test_acc", "benign_acc_weighted", "flagged_clients"):
        assert (key in a) == (key in b)
        if key in a:
          assert a[key] == pytest.approx(b[key], abs=1e-6), (seed, a["round"], key)
    malicious = json.loads((tmp_path / "seeds" / f"seed_{seed}" / "malicious.json").read_text())
    assert malicious == json.loads((tmp_path / f"single_{seed}" / "malicious.json").read_text())
    partitions.append(json.loads((tmp_path / "seeds" / f"seed_{seed}" / "partition.json").read_text())["n_train"])
  assert partitions[0] != partitions[1]  # the seeds really had different partitions (and shapes padded)
  losses = [rows_of(tmp_path / f"single_{s}")[-1]["train_loss"] for s in (0, 1)]
  assert summary["final"]["train_loss"]["mean"] == pytest.approx(np.mean(losses), rel=1e-5)


def test_seeds_refuse_what_one_program_cannot_do():
  c = small_config()
  c.seeds = "0,1"
  c.engine.strategy = "sequential"
  with pytest.raises(ValueError, match="strategy"):
    run_experiment(c)
  c.engine.strategy = "vmap"
  c.output.checkpoint_every = 2
  with pytest.raises(ValueError, match="checkpoint"):
    run_experiment(c)


def test_summarize_finals():
  s = summarize_finals([{"a": 1.0, "b": "x", "c": 2.0}, {"a": 3.0, "b": "y"}])
  assert s == {"a": {"values": [1.0, 3.0], "mean": 2.0, "std": 1.0}}


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_grid_over_traced_hyperparameters_equals_separate_runs(tmp_path):
  """--config.grid: FedProx's mu x the client lr, the algorithm built inside the program with tracers; each lane
  equals the separate run with those values (mu = 0 included, where the separate run skips the prox term)."""
  from fedjax_robust.run import parse_grid
  c = small_config(**{"algorithm.name": "fedprox"})
  c.rounds, c.eval_every = 3, 3
  c.grid = "algorithm.fedprox.mu=0,0.5;client.lr=0.05,0.1"
  summary = run_experiment(c, tmp_path / "grid")
  assert len(summary["grid"]) == 4 and set(summary["final"]) == {
      "algorithm.fedprox.mu=0__client.lr=0.05", "algorithm.fedprox.mu=0__client.lr=0.1",
      "algorithm.fedprox.mu=0.5__client.lr=0.05", "algorithm.fedprox.mu=0.5__client.lr=0.1"}
  finals = {}
  for mu, lr in ((0.0, 0.05), (0.5, 0.1), (0.5, 0.05)):
    single = small_config(**{"algorithm.name": "fedprox", "algorithm.fedprox.mu": mu, "client.lr": lr})
    single.rounds, single.eval_every = 3, 3
    run_experiment(single, tmp_path / f"mu{mu}_lr{lr}")
    lane = tmp_path / "grid" / f"algorithm.fedprox.mu={mu:g}__client.lr={lr:g}" / "seed_0"
    together, alone = rows_of(lane), rows_of(tmp_path / f"mu{mu}_lr{lr}")
    for a, b in zip(together, alone):
      assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5, abs=1e-6)
    assert together[-1]["client_acc_mean"] == pytest.approx(alone[-1]["client_acc_mean"], abs=1e-6)
    stored = json.loads((lane / "config.json").read_text())
    assert (stored["algorithm"]["fedprox"]["mu"], stored["client"]["lr"]) == (mu, lr)
    finals[(mu, lr)] = together[-1]["train_loss"]
  assert len(set(finals.values())) == 3  # the lanes really ran different hyperparameters
  with pytest.raises(ValueError, match="not a traced hyperparameter"):
    parse_grid("algorithm.fedprox.epochs=1,2", "fedprox")
  with pytest.raises(ValueError, match="not a traced hyperparameter"):
    parse_grid("algorithm.ditto.lamda=1,2", "fedprox")
  assert parse_grid("algorithm.fedcap.phi=0.1,0.3", "fedcap") == [{"algorithm.fedcap.phi": 0.1},
                                                                  {"algorithm.fedcap.phi": 0.3}]


def test_rounds_loop_resolution():
  from fedjax_robust.run import resolve_rounds_loop
  assert resolve_rounds_loop("auto", True) == "python"  # the conv-in-loop trap (experiment.conv_loop_trap)
  assert resolve_rounds_loop("auto", False) == "scan"
  assert resolve_rounds_loop("Python", False) == "python"
  assert resolve_rounds_loop("scan", True) == "scan"
  with pytest.raises(ValueError, match="rounds_loop"):
    resolve_rounds_loop("while", True)


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_seeds_with_rounds_called_from_python_equal_the_scanned_program(tmp_path):
  """engine.rounds_loop=python (auto's choice on the CPU for conv nets) writes the same per-round metrics and
  evaluations as the one scanned program, seeds and grid lanes alike, with client x client weights (FedCAP). Seeds
  x a grid: the lane axis of a seeds-only program is the same code with fewer lanes (that case ran here too until
  2026-11-28, 20 s of suite time for no path of its own)."""
  grid = "client.lr=0.05,0.1"
  summaries, rows = {}, {}
  for loop in ("scan", "python"):
    c = small_config(**{"algorithm.name": "fedcap", "engine.rounds_loop": loop})
    c.seeds, c.grid = "0,1", grid
    summaries[loop] = run_experiment(c, tmp_path / loop)
    lanes = sorted(p.parent for p in (tmp_path / loop).rglob("metrics.jsonl"))
    rows[loop] = {str(p.relative_to(tmp_path / loop)): rows_of(p) for p in lanes}
  assert summaries["scan"]["rounds_loop"] == "scan" and summaries["python"]["rounds_loop"] == "python"
  assert rows["scan"].keys() == rows["python"].keys() and len(rows["scan"]) == 4  # 2 seeds x 2 grid points
  for lane, scanned in rows["scan"].items():
    stepped = rows["python"][lane]
    assert [r["round"] for r in stepped] == [r["round"] for r in scanned] == [1, 2, 3, 4]
    for a, b in zip(scanned, stepped):
      assert a.keys() == b.keys(), lane
      for key, value in a.items():
        if isinstance(value, float):
          assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (lane, a["round"], key)
    scanned_w, stepped_w = (np.load(tmp_path / loop / lane / "client_weights.npz") for loop in ("scan", "python"))
    assert scanned_w.files == stepped_w.files and scanned_w.files
    for name in scanned_w.files:
      np.testing.assert_allclose(stepped_w[name], scanned_w[name], rtol=1e-5, atol=1e-6)
