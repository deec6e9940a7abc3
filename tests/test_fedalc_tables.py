"""experiments/fedalc_tables.py without training: the last-rounds window, seeds aggregation, the rendered tables and
their acceptance paragraphs from hand-made cells, and each cell's config."""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedjax_robust.config_files import load_module

t = load_module(Path(__file__).resolve().parents[1] / "experiments" / "fedalc_tables.py")
grid = t.grid  # the shared grid module the script runs with (its _seed_cells aggregates a seeds cell)


def _args(**kw):
  base = dict(rounds=0, epochs=0, seed=0, seeds="0,1,2", data_dir=None, checkpoint_every=0, resume=False,
              strategy="", set=[])
  return argparse.Namespace(**{**base, **kw})


def _rows(rounds=12, natural=None, pgd=None):
  """metrics.jsonl records: every round a train loss; the evaluated ones also their metrics."""
  natural = natural or {5: 0.50, 10: 0.80, 11: 0.82, 12: 0.84}
  pgd = pgd or {11: 0.40, 12: 0.44}
  rows = []
  for r in range(1, rounds + 1):
    row = {"round": r, "train_loss": 1.0}
    if r in natural:
      row["global_test_acc"] = natural[r]
    if r in pgd:
      row["robust_acc_pgd"] = pgd[r]
    rows.append(row)
  return rows


def _config(rounds=12, last_rounds=3, dataset="mnist"):
  c = t.cell_config(dataset, 0.1, "fedalc", _args(rounds=rounds, seeds=""))
  c.eval.last_rounds = last_rounds
  return c


def test_window_mean_and_std_over_the_evaluated_rounds_of_the_last_window():
  rows = _rows()
  assert t.window_rounds(rows, 3) == [10, 11, 12]  # round 5 is evaluated but outside the window
  mean, std, n = t.window_stats(rows, "global_test_acc", 3)
  assert (n, mean) == (3, pytest.approx(82.0)) and std == pytest.approx(math.sqrt(8 / 3))  # (4 + 0 + 4) / 3
  mean, std, n = t.window_stats(rows, "robust_acc_pgd", 3)
  assert (n, mean, std) == (2, pytest.approx(42.0), pytest.approx(2.0))
  assert t.window_stats(rows, "robust_acc_fgsm", 3) is None
  assert t.window_stats(rows, "global_test_acc", 0)[:2] == (pytest.approx(84.0), 0.0)  # 0 = the last evaluation
  cell = t.record_rows(rows, _config())
  assert cell["value"] == cell["natural"] == pytest.approx(82.0)
  assert cell["natural_window_std"] == pytest.approx(math.sqrt(8 / 3))
  assert cell["pgd"] == pytest.approx(42.0) and "fgsm" not in cell
  assert cell["window_rounds"] == [10, 11, 12]
  assert cell["curves"] == {"round": [5, 10, 11, 12], "global_test_acc": [0.5, 0.8, 0.82, 0.84],
                            "robust_acc_pgd": [None, None, 0.40, 0.44]}
  assert cell["protocol"] == {"dataset": "mnist", "rounds": 12, "paper_rounds": 100, "epochs": 1, "paper_epochs": 1,
                              "last_rounds": 3, "reduced": True}
  assert t.shown(cell, "natural") == (pytest.approx(82.0), pytest.approx(math.sqrt(8 / 3)))


def test_seeds_cell_shows_the_std_across_seeds(tmp_path):
  # Two seeds' run directories as run_seeds writes them; grid._seed_cells aggregates what record returns.
  natural = {0: {10: 0.80, 11: 0.82, 12: 0.84}, 1: {10: 0.90, 11: 0.90, 12: 0.90}}
  for seed, values in natural.items():
    d = tmp_path / f"seed_{seed}"
    d.mkdir()
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(natural=values)) + "\n")
    (d / "summary.json").write_text(json.dumps({"final": {}}))
  cell = grid._seed_cells({"seeds": [0, 1]}, tmp_path, _config(), t.record)
  t.hoist_per_seed_fields(cell)
  assert cell["natural"] == pytest.approx(86.0)  # (82 + 90) / 2
  assert cell["natural_std"] == pytest.approx(4.0)  # across seeds, ddof 0
  assert cell["natural_window_std"] == pytest.approx(math.sqrt(8 / 3) / 2)  # mean of (1.633, 0)
  assert cell["protocol"]["reduced"] and cell["window_rounds"] == [10, 11, 12]
  assert t.shown(cell, "natural") == (pytest.approx(86.0), pytest.approx(4.0))
  assert "std across seeds" in t.setup_note([{**cell, "config": {}}])
  single = {**cell, "seeds": [0]}
  assert t.shown(single, "natural")[1] == pytest.approx(math.sqrt(8 / 3) / 2)  # one seed: the window std


def _cell(natural, pgd=None, seeds=(0, 1, 2), rounds=100, examples=0):
  cell = {"natural": natural, "natural_std": 0.5, "natural_window_std": 0.1, "value": natural, "seeds": list(seeds),
          "protocol": {"dataset": "mnist", "rounds": rounds, "paper_rounds": 100, "epochs": 1, "paper_epochs": 1,
                       "last_rounds": min(10, rounds), "reduced": rounds != 100},
          "config": {"eval": {"metrics": "accuracy,robust", "robust": {
              "attacks": "fgsm,bim,pgd,cw", "eps": 8 / 255, "step_size": 2 / 255, "steps": 10, "cw_c": 1.0,
              "cw_kappa": 0.0, "cw_steps": 5, "cw_lr": 0.01, "examples": examples}}}}
  if pgd is not None:
    cell.update(pgd=pgd, pgd_std=0.25, pgd_window_std=0.05)
  return cell


def test_table1_shows_ours_and_the_papers_numbers(tmp_path):
  results = {t.cell_key("mnist", 0.05, "fedalc"): _cell(86.0, pgd=60.0, examples=500),
             t.cell_key("mnist", 0.05, "fedavg"): _cell(84.0, seeds=[0], rounds=2)}
  path = tmp_path / "r.json"
  path.write_text(json.dumps(results))
  table = t.table_from_json(path, "table1")
  row = [line for line in table.splitlines() if line.startswith("| 0.05 | FedALC |")][0]
  assert "86.00 ± 0.50 / 85.62 ± 0.21" in row and "60.00 ± 0.25 / 40.43 ± 0.26" in row
  assert "— / 40.76 ± 0.19" in row  # FGSM not run
  row = [line for line in table.splitlines() if line.startswith("| 0.05 | FedAvg |")][0]
  assert "84.00 ± 0.10 / 83.84 ± 0.22" in row  # one seed: the window std
  assert "FedProx" not in table.split("Acceptance")[0]  # rows without a cell are left out
  assert "Fashion-MNIST" not in table  # a dataset without cells is left out
  assert "REDUCED from the paper's 100 x 1" in table and "first 500 test images" in table
  assert "eval.robust.cw_steps = 5 (spec §2.2: 50)" in table
  assert "std over the window's evaluated rounds" in table and "std across seeds" in table


def test_table1_from_several_files_pools_one_seed_runs_and_says_which_rows_ran_how(tmp_path):
  """FedAvg-AT's seeds run one at a time on a CPU, FedALC's as one seeds program elsewhere: one table, the pooled
  cell shown as mean ± std across its seeds, each way of running named with its rows."""
  paths = []
  for seed, natural in ((0, 84.0), (1, 88.0)):
    cell = {**_cell(natural, seeds=[seed], examples=500), "command": f"seed {seed}"}
    cell["config"]["seed"] = seed
    del cell["natural_std"]  # a one-seed run stores its window's std only
    paths.append(tmp_path / f"fedavg_seed{seed}.json")
    paths[-1].write_text(json.dumps({t.cell_key("mnist", 0.1, "fedavg"): {**cell, "seeds": []}}))
  paths.append(tmp_path / "fedalc_seeds.json")
  paths[-1].write_text(json.dumps({t.cell_key("mnist", 0.1, "fedalc"): _cell(71.0)}))
  table = t.table_from_json(",".join(str(p) for p in paths), "table1")
  row = [line for line in table.splitlines() if line.startswith("| 0.1 | FedAvg |")][0]
  assert "86.00 ± 2.00 / 79.51 ± 0.43" in row  # mean of 84 and 88 ± their std across seeds
  note = [line for line in table.splitlines() if line.startswith("Cells ran with")][0]
  pooled, program = note.split("[FedAvg α 0.1]; ")
  assert "2 seed(s) (pooled from 2 separate one-seed runs); robust columns on the first 500 test images" in pooled
  assert "3 seed(s); " in program and program.split(". Shown")[0].endswith("[FedALC α 0.1]")
  assert "first 500" not in program
  assert "FedALC − FedAvg in [+1, +4] at α = 0.1: NOT met (-15.00; seeds differ: FedALC 0,1,2 / FedAvg 0,1)" in table


def test_table2_and_its_paper_row():
  results = {t.cell_key("cifar10", 0.1, "fedalc"): _cell(44.0), t.cell_key("cifar10", 0.1, "natural"): _cell(50.0)}
  for c in results.values():
    c["protocol"].update(dataset="cifar10", paper_rounds=60, rounds=60, epochs=5, paper_epochs=5, reduced=False)
    c["config"] = {"eval": {"metrics": "accuracy"}}
  table = t.table2(results)
  assert "| Method | α=0.05 | α=0.1 | α=0.3 |" in table
  assert "| FedALC | — / 35.99 ± 1.81 | 44.00 ± 0.50 / 43.12 ± 1.40 |" in table
  assert "| Natural FedAvg (ref.) | — / — | 50.00 ± 0.50 / — |" in table
  assert "REDUCED" not in table and "robust" not in table.split("Acceptance")[0]
  assert "reference only" in table


def test_acceptance_on_a_hand_made_case():
  results = {t.cell_key("mnist", 0.1, "fedalc"): _cell(82.0), t.cell_key("mnist", 0.1, "fedavg"): _cell(80.0),
             t.cell_key("mnist", 0.1, "fedprox"): _cell(81.0),  # FedProx above FedAvg: ordering not met
             t.cell_key("mnist", 1.0, "fedalc"): _cell(96.0), t.cell_key("mnist", 1.0, "fedavg"): _cell(95.0)}
  checks = {target: (ok, numbers) for target, ok, numbers in t.acceptance_checks(results, "mnist")}
  assert checks["FedALC ≥ FedAvg > FedProx at α = 0.1"] == (False, "82.00 / 80.00 / 81.00")
  assert checks["FedALC ≥ FedAvg > FedProx at α = 0.05"] == (None, "no FedALC, FedAvg, FedProx cell")
  assert checks["FedALC − FedAvg in [+1, +4] at α = 0.1"] == (True, "+2.00")
  assert checks["|FedALC − FedAvg| ≤ 0.6 at α = 1.0"] == (False, "+1.00")
  assert checks["|FedALC − FedAvg| ≤ 0.6 at α = 0.5"][0] is None
  assert checks["FedALC rising with α (every α ≥ 0.5 cell above every α ≤ 0.1 cell)"][0] is True
  rising = "FedProx rising with α (every α ≥ 0.5 cell above every α ≤ 0.1 cell)"
  assert checks[rising] == (None, "no FedProx cell at α ≥ 0.5")
  no_prox = {k: v for k, v in results.items() if not k.endswith("__fedprox")}
  assert dict((c[0], c[1:]) for c in t.acceptance_checks(no_prox, "mnist"))[rising] == (None, "no FedProx cell")
  # The paper's own numbers meet every MNIST / FMNIST target.
  for dataset in t.TABLE1_DATASETS:
    assert all(ok for _, ok, _ in t.acceptance_checks({}, dataset, paper=True)), dataset
  text = t.acceptance(results, "mnist")
  assert "- FedALC ≥ FedAvg > FedProx at α = 0.1: NOT met (82.00 / 80.00 / 81.00); paper: met (82.62 / 79.51 / " \
         "71.70)." in text
  assert "- FedALC − FedAvg in [+1, +4] at α = 0.1: met (+2.00); paper: met (+3.11)." in text
  assert "at α = 0.05: not run" in text


@pytest.mark.parametrize("method,algorithm,objective", [("fedalc", "fedavg", "fedalc"), ("fedavg", "fedavg", "pgd_at"),
                                                        ("fedprox", "fedprox", "pgd_at"), ("natural", "fedavg", "ce")])
def test_cell_config_per_method(method, algorithm, objective):
  c = t.cell_config("fmnist", 0.05, method, _args())
  assert (c.algorithm.name, c.adversarial.objective, c.data.partition.alpha) == (algorithm, objective, 0.05)
  assert (c.rounds, c.client.epochs, c.eval_every, c.eval.last_rounds, c.seeds) == (100, 5, 10, 10, "0,1,2")
  assert c.eval.metrics == "accuracy,robust" and c.data.name == "fashion_mnist"
  assert not t.protocol(c)["reduced"]


def test_cell_config_reduced_rounds_shrink_the_window_and_overrides_apply():
  c = t.cell_config("mnist", 1.0, "fedalc", _args(rounds=2, seeds="0", set=["eval.robust.examples=100"]))
  assert (c.rounds, c.eval_every, c.eval.last_rounds, c.eval.robust.examples) == (2, 10, 2, 100)
  assert t.protocol(c) == {"dataset": "mnist", "rounds": 2, "paper_rounds": 100, "epochs": 1, "paper_epochs": 1,
                           "last_rounds": 2, "reduced": True}
  c = t.cell_config("mnist", 1.0, "fedalc", _args(rounds=30, epochs=2))
  assert (c.rounds, c.eval.last_rounds, c.client.epochs) == (30, 10, 2)
  c = t.cell_config("cifar10", 0.3, "fedprox", _args())
  assert (c.rounds, c.client.epochs, c.eval.metrics, c.model.name) == (60, 5, "accuracy", "resnet18")
  assert (c.algorithm.name, c.algorithm.fedprox.mu) == ("fedprox", 0.001)


def test_cells_of_each_mode():
  assert len(t.cells_of("table1", [], [], list(t.PAPER_METHODS))) == 2 * 4 * 3
  assert t.cells_of("table2", ["mnist"], [], ["fedalc"]) == [("cifar10", a, "fedalc") for a in t.TABLE2_ALPHAS]
  with pytest.raises(ValueError):
    t.cells_of("table1", ["cifar10"], [], ["fedalc"])
  assert t.paper_value("mnist", 0.1, "fedalc", "cw") == (41.41, 0.20)
  assert t.paper_value("cifar10", 5.0, "fedavg") == (64.18, 0.46) and t.paper_value("cifar10", 5.0, "natural") is None


def test_setup_note_names_a_non_default_fedalc_calibration():
  """An ablation cell (spec A1: ``eq5_literal``) says which calibration it ran; default and baseline cells do not."""
  default = t.cell_config("mnist", 0.05, "fedalc", _args(seeds=""))
  variant = t.cell_config("mnist", 0.05, "fedalc", _args(seeds="", set=[
      "adversarial.fedalc.calib_variant=eq5_literal", "adversarial.fedalc.normalize=mean"]))
  baseline = t.cell_config("mnist", 0.05, "fedavg", _args(seeds=""))
  assert t._calibration_note(default.to_dict()) == "" and t._calibration_note(baseline.to_dict()) == ""
  assert t._calibration_note(variant.to_dict()) == (
      "adversarial.fedalc.calib_variant = eq5_literal (spec default inv_sqrt_freq), "
      "adversarial.fedalc.normalize = mean (spec default none)")
  note = t.setup_note([{**_cell(80.0, seeds=[0]), "config": variant.to_dict()}])
  assert "calib_variant = eq5_literal (spec default inv_sqrt_freq)" in note


def test_setup_note_says_where_a_resnet18_cell_started():
  """Table II's ResNet-18 is ImageNet-pretrained in the paper: a cell without ``model.pretrained`` is labelled a
  from-scratch stand-in, one with it names the file; the CNN cells of Table I say nothing."""
  scratch = t.cell_config("cifar10", 0.1, "fedavg", _args(seeds="")).to_dict()
  loaded = t.cell_config("cifar10", 0.1, "fedavg", _args(seeds="", set=["model.pretrained=/somewhere/r18.msgpack"])).to_dict()
  cnn = t.cell_config("mnist", 0.1, "fedavg", _args(seeds="")).to_dict()
  assert "STAND-IN" in t._start_note(scratch) and "random init" in t._start_note(scratch)
  assert t._start_note(loaded) == "ResNet-18 started from r18.msgpack (paper: ImageNet-pretrained)"
  assert t._start_note(cnn) == ""
  assert "random init, a STAND-IN" in t.setup_note([{**_cell(50.0, seeds=[0]), "config": scratch}])


def test_record_keeps_the_window_mean_of_each_class_and_the_worst_class():
  """With ``eval.metrics=...,class_accuracy``: ``class_acc`` = each class's mean over the window's evaluated rounds
  (None for a class without test rows), ``worst_class`` the window mean of the worst-class accuracy."""
  rows = _rows()
  per_class = {10: [0.5, 1.0, float("nan")], 11: [0.7, 0.8, float("nan")], 12: [0.9, 0.6, float("nan")],
               5: [0.0, 0.0, float("nan")]}  # round 5 is outside the last-3 window
  for row in rows:
    if row["round"] in per_class:
      row["global_class_acc"] = per_class[row["round"]]
      row["global_worst_class_acc"] = float(np.nanmin(per_class[row["round"]]))
  cell = t.record_rows(json.loads(json.dumps(rows)), _config())  # through JSON, as metrics.jsonl is read
  assert cell["class_acc"][0] == pytest.approx(70.0) and cell["class_acc"][1] == pytest.approx(80.0)
  assert cell["class_acc"][2] is None
  assert cell["worst_class"] == pytest.approx(60.0)  # mean of 0.5, 0.7, 0.6
  assert "class_acc" not in t.record_rows(_rows(), _config())


def test_class_exposure_weights_by_hand_and_its_table():
  """experiments/fedalc_class_exposure.py: a class's own weight is the geometric mean of w_{y} over its rows. One
  client, rows [0, 0, 0, 1] in one batch of 4: w_0 = sqrt(4/3), w_1 = sqrt(4/1) = 2 (spec §1.4); an absent class
  has no rows (reported as 1). Two clients: class 0 alone in its batches (w = 1) on one, 2 of 4 on the other
  (w = sqrt(2)): geometric mean over its 4 + 2 rows = 2 ** (2 / 12)."""
  x = load_module(Path(__file__).resolve().parents[1] / "experiments" / "fedalc_class_exposure.py")
  np.testing.assert_allclose(x.own_weights(np.array([[3, 1, 0]]), 4, {}), [math.sqrt(4 / 3), 2.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(x.own_weights(np.array([[4, 0], [2, 2]]), 4, {})[0], 2 ** (2 / 12), rtol=1e-6)
  # eq5_literal weighs a class by n_j / sqrt(N): 3 / 2 and 1 / 2.
  np.testing.assert_allclose(x.own_weights(np.array([[3, 1]]), 4, {"calib_variant": "eq5_literal"}), [1.5, 0.5],
                             rtol=1e-6)
  assert x.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
  assert x.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  stored = {"mnist__a0.1": {"histograms": [[3, 1], [0, 4]], "own_weight": [1.15, 1.5], "largest_holder": [0, 1],
                            "fedavg_class_acc": [90.0, 80.0], "fedalc_class_acc": [85.0, 81.0],
                            "calibration": {}, "batch_size": 4, "epochs_averaged": 1},
            "provenance": {"commit": "x"}}
  table = x.table(stored)
  assert "**mnist, α = 0.1** (calibration inv_sqrt_freq, batch 4)" in table
  assert "| 0 | 3 | client 0: 3 / 4 | 1.15 | 90.0 | 85.0 | -5.0 |" in table
  assert "| 1 | 5 | client 1: 4 / 4 | 1.50 | 80.0 | 81.0 | +1.0 |" in table
  assert "Spearman rank correlation of own weight with Δ: +1.00." in table


def test_label_shift_check_moves_real_labels_only_and_reads_accuracy_by_digit():
  """experiments/fedalc_label_permutation_check.py: real rows' labels move to (y + shift) mod C, padding rows keep
  0, the global test set moves too; digit d's accuracy is read off output unit (d + shift) mod C."""
  from fedjax_robust.data.federated import FederatedData
  x = load_module(Path(__file__).resolve().parents[1] / "experiments" / "fedalc_label_permutation_check.py")
  y = np.array([[9, 1, 0], [3, 0, 0]], np.int32)
  data = FederatedData("toy", 10, np.zeros((2, 3, 1)), y, np.array([2, 1]), np.zeros((2, 3, 1)), y.copy(),
                       np.array([3, 1]), np.zeros((2, 1)), np.array([9, 4], np.int32))
  moved = x.shift_labels(data, 1)
  np.testing.assert_array_equal(moved.y_train, [[0, 2, 0], [4, 0, 0]])
  np.testing.assert_array_equal(moved.y_test, [[0, 2, 1], [4, 0, 0]])
  np.testing.assert_array_equal(moved.y_global_test, [0, 5])
  by_index = [float(i) for i in range(10)]  # unit i scored i%
  assert x.digit_accuracy(by_index, 1)[9] == 0.0 and x.digit_accuracy(by_index, 1)[0] == 1.0


def test_acceptance_names_seeds_that_differ_between_compared_cells():
  """Pooled files can hold a seed more for one method: a same-α comparison then mixes partitions, and says so."""
  three, two, prox = _cell(82.0), _cell(80.0, seeds=(0, 1)), _cell(79.0, seeds=())
  prox["config"]["seed"] = 1  # a one-seed run: its config's seed
  results = {t.cell_key("mnist", 0.1, "fedalc"): three, t.cell_key("mnist", 0.1, "fedavg"): two,
             t.cell_key("mnist", 0.1, "fedprox"): prox}
  checks = {target: (ok, numbers) for target, ok, numbers in t.acceptance_checks(results, "mnist")}
  assert checks["FedALC ≥ FedAvg > FedProx at α = 0.1"] == (
      True, "82.00 / 80.00 / 79.00; seeds differ: FedALC 0,1,2 / FedAvg 0,1 / FedProx 1")
  gap = "FedALC − FedAvg in [+1, +4] at α = 0.1"
  assert checks[gap] == (True, "+2.00; seeds differ: FedALC 0,1,2 / FedAvg 0,1")
  two["seeds"] = [0, 1, 2]  # same seeds: no note
  checks = {target: numbers for target, _, numbers in t.acceptance_checks(results, "mnist")}
  assert checks["FedALC − FedAvg in [+1, +4] at α = 0.1"] == "+2.00"
  assert "FedProx 1" in checks["FedALC ≥ FedAvg > FedProx at α = 0.1"]
  assert t.grid.cell_seeds({"config": {}}) == (0,)
