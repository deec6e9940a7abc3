"""A run directory a person can look at: plots (fedjax_robust/plots.py, experiments/plot.py), TensorBoard event files,
a metrics.csv with every scalar, a strict-JSON summary.json."""

import csv
import json
import math
import sys

import numpy as np
import pytest

from fedjax_robust import plots
from fedjax_robust.experiment import RunWriter, run_experiment
from test_byzantine_e2e import byzantine_config
from test_experiment import REPO

pytest.importorskip("matplotlib")

FIGURES = ("accuracy", "loss", "partition", "detection", "weights")


def _strict(text):
  def refuse(constant):
    raise ValueError(f"non-strict JSON constant {constant}")
  return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two tiny digits runs: multi-Krum under a scaling attack with half the clients per round (flags, attackers,
  unsampled clients, TensorBoard on), and plain FedAvg evaluated only at its end."""
  root = tmp_path_factory.mktemp("plots")
  attacked = byzantine_config("multi_krum", "scaling", rounds=3, eval_every=1,
                              **{"aggregator.num_byzantine": 2, "server.participation": 0.7,
                                 "data.partition.name": "dirichlet", "data.partition.alpha": 0.5,
                                 "output.tensorboard": True})
  clean = byzantine_config("mean", "none", rounds=2, eval_every=2)
  # A module fixture is set up before conftest's per-test no-plots patch, so these runs draw their plots.
  summaries = {"attacked": run_experiment(attacked, root / "attacked"), "clean": run_experiment(clean, root / "clean")}
  return root, summaries


@pytest.mark.plots
def test_a_run_writes_every_figure_as_png_and_svg(runs):
  root, _ = runs
  out = root / "attacked" / "plots"
  for stem in FIGURES:
    for fmt in ("png", "svg"):
      assert (out / f"{stem}.{fmt}").stat().st_size > 1000, f"{stem}.{fmt}"
  assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # a clean run has no detection figure (nothing flagged, no attacker)
  clean = {p.name for p in (root / "clean" / "plots").iterdir()}
  assert {"accuracy.png", "loss.png", "partition.png", "weights.png"} <= clean and "detection.png" not in clean


@pytest.mark.plots
def test_plot_py_compares_runs_and_redraws_one(runs, tmp_path):
  root, _ = runs
  sys.path.insert(0, str(REPO / "experiments"))
  try:
    import plot as plot_cli
  finally:
    sys.path.remove(str(REPO / "experiments"))
  written = plot_cli.main([str(root / "attacked"), str(root / "clean"), "--out", str(tmp_path / "cmp"),
                           "--reference", "90:paper", "--names", "krum,avg"])
  assert sorted(p.name for p in written) == ["accuracy.png", "accuracy.svg", "loss.png", "loss.svg"]
  assert all(p.stat().st_size > 1000 for p in written)
  one = plot_cli.main([str(root / "clean"), "--out", str(tmp_path / "one")])
  assert {p.stem for p in one} == {"accuracy", "loss", "partition", "weights"}
  with pytest.raises(SystemExit, match="not a run directory"):
    plot_cli.main([str(tmp_path)])


@pytest.mark.plots
def test_metrics_csv_carries_every_scalar_and_summary_is_strict_json(runs):
  root, summaries = runs
  records = [json.loads(line) for line in (root / "attacked" / "metrics.jsonl").read_text().splitlines()]
  with open(root / "attacked" / "metrics.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  header = list(rows[0])
  assert header[:3] == ["round", "elapsed_s", "train_loss"]
  scalars = {k for r in records for k, v in r.items() if isinstance(v, (int, float, bool))}
  assert scalars <= set(header)
  assert {"benign_train_loss", "num_flagged", "flagged_clients", "detection_tpr", "detection_fpr",
          "benign_acc_mean"} <= set(header)
  for row, record in zip(rows, records):
    assert int(row["num_flagged"]) == len(record["flagged_clients"])
    assert row["flagged_clients"].split() == [str(i) for i in record["flagged_clients"]]
    assert float(row["benign_train_loss"]) == pytest.approx(record["benign_train_loss"])
  for run in ("attacked", "clean"):
    stored = _strict((root / run / "summary.json").read_text())
    assert stored["final"]["round"] == summaries[run]["final"]["round"]
    _strict((root / run / "config.json").read_text())
    _strict((root / run / "partition.json").read_text())


@pytest.mark.plots
def test_tensorboard_event_files_hold_every_scalar_per_round(runs):
  pytest.importorskip("tensorboardX")
  from fedjax_robust.tensorboard_log import read_scalars, tag
  root, _ = runs
  records = [json.loads(line) for line in (root / "attacked" / "metrics.jsonl").read_text().splitlines()]
  events = read_scalars(root / "attacked" / "tb")
  for key in ("global_test_acc", "train_loss", "benign_train_loss", "detection_tpr", "num_flagged", "elapsed_s"):
    assert [step for step, _ in events[tag(key)]] == [1, 2, 3], key
  got = [v for _, v in events["accuracy/global_test_acc"]]
  assert got == pytest.approx([r["global_test_acc"] for r in records], rel=1e-6)
  assert [v for _, v in events["detection/num_flagged"]] == [len(r["flagged_clients"]) for r in records]
  assert not (root / "clean" / "tb").exists()  # off by default


def test_tensorboard_without_tensorboardx_says_how_to_install_it(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails
  with pytest.raises(ImportError, match=r"pip install -e \"\.\[tensorboard\]\""):
    RunWriter(tmp_path / "run", tensorboard=True)


def test_run_writer_rewrites_the_csv_header_when_a_round_brings_new_keys(tmp_path):
  writer = RunWriter(tmp_path)
  writer.log_round({"round": 1, "train_loss": 2.0, "elapsed_s": 1.0, "cohort": [0, 1]})
  writer.log_round({"round": 2, "train_loss": float("nan"), "elapsed_s": 2.0, "global_test_acc": 0.5,
                    "audit_alarm": True, "flagged_clients": [3, 1], "client_acc": [0.1, 0.2]})
  writer.write_json("summary.json", {"final": {"train_loss": float("nan"), "x": float("inf"), "acc": 0.5}})
  writer.close()
  with open(tmp_path / "metrics.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0]) == ["round", "elapsed_s", "train_loss", "global_test_acc", "audit_alarm", "flagged_clients",
                           "num_flagged"]
  assert rows[0]["global_test_acc"] == "" and rows[1]["global_test_acc"] == "0.5"
  assert rows[1]["flagged_clients"] == "3 1" and rows[1]["num_flagged"] == "2" and rows[1]["train_loss"] == "nan"
  assert _strict((tmp_path / "summary.json").read_text()) == {"final": {"train_loss": None, "x": None, "acc": 0.5}}


# ------------------------------------------------------------------------------------------ data preparation
RECORDS = [
    {"round": 1, "cohort": [0, 2, 3], "flagged_clients": [3], "aggregation_weights": [0.5, 0.5, 0.0],
     "client_acc": [0.1, 0.2, 0.3, 0.4], "global_test_acc": 0.25, "train_loss": 1.0},
    {"round": 2, "cohort": [1, 3, 4], "flagged_clients": [], "aggregation_weights": [0.2, 0.3, 0.5],
     "shapley_ids": [0, 2, 3], "shapley_flagged": [False, True, True], "audit_alarm": True,
     "client_acc": [0.5, 0.6, 0.7, 0.8], "train_loss": None},
    {"round": 3, "cohort": [0, 1, 2], "flagged_clients": [0, 1], "aggregation_weights": [0.0, 0.0, 1.0],
     "global_test_acc": 0.75, "train_loss": float("nan")},
]


def test_detection_raster_marks_cohorts_flags_shapley_uploads_and_alarms():
  raster = plots.detection_raster(RECORDS, num_clients=5, malicious=[3, 0])
  assert raster["state"].shape == (5, 3) and raster["shapley"].shape == (5, 3)
  s = plots
  assert raster["state"][:, 0].tolist() == [s.SAMPLED_ATTACKER, s.NOT_SAMPLED, s.SAMPLED, s.FLAGGED_ATTACKER,
                                            s.NOT_SAMPLED]
  assert raster["state"][:, 2].tolist() == [s.FLAGGED_ATTACKER, s.FLAGGED_BENIGN, s.SAMPLED, s.NOT_SAMPLED,
                                            s.NOT_SAMPLED]
  # round 2's Shapley step judged round 1's uploads: clients 2 and 3, drawn in round 1's column
  assert np.argwhere(raster["shapley"]).tolist() == [[2, 0], [3, 0]]
  assert raster["alarm"].tolist() == [False, True, False] and raster["rounds"].tolist() == [1, 2, 3]
  unknown = plots.detection_raster(RECORDS, num_clients=5)  # no attackers known: flags are plain flags
  assert unknown["state"][3, 0] == s.FLAGGED and unknown["state"][0, 0] == s.SAMPLED


def test_weight_matrix_is_clients_by_rounds_with_gaps_where_not_sampled():
  rounds, weights = plots.weight_matrix(RECORDS, num_clients=5)
  assert rounds.tolist() == [1, 2, 3] and weights.shape == (5, 3)
  np.testing.assert_array_equal(weights[:, 1], [np.nan, 0.2, np.nan, 0.3, 0.5])
  assert weights[3, 0] == 0.0 and np.isnan(weights[4, 0]) and np.isnan(weights[4, 2])
  with pytest.raises(ValueError, match="cohort of 3"):
    plots.weight_matrix([{"round": 1, "cohort": [0, 1, 2], "aggregation_weights": [1.0]}], 3)


def test_partition_matrix_is_clients_by_classes():
  partition = {"num_clients": 3, "num_classes": 2, "train_label_histograms": [[1, 0], [2, 3], [0, 4]]}
  assert plots.partition_matrix(partition).shape == (3, 2)
  with pytest.raises(ValueError, match="clients x classes"):
    plots.partition_matrix({**partition, "num_classes": 3})


def test_series_and_client_spread():
  rounds, values = plots.metric_series(RECORDS, "global_test_acc")
  assert rounds.tolist() == [1, 3] and values.tolist() == [0.25, 0.75]
  rounds, values = plots.metric_series(RECORDS, "train_loss")
  assert rounds.tolist() == [1, 2, 3] and values[0] == 1.0 and math.isnan(values[1]) and math.isnan(values[2])
  rounds, mean, lo, hi = plots.client_spread(RECORDS, exclude=[3])
  assert rounds.tolist() == [1, 2]
  assert mean == pytest.approx([0.2, 0.6]) and lo.tolist() == [0.1, 0.5] and hi.tolist() == [0.3, 0.7]


def test_output_reference_parses_and_bad_values_are_refused():
  assert plots.parse_references("") == []
  assert plots.parse_references("84.29:FedCAP paper, Table III; 90") == [(84.29, "FedCAP paper, Table III"),
                                                                          (90.0, "reference")]
  assert plots.config_references({"output": {"reference": "95:target"}}) == [(95.0, "target")]
  assert plots.config_references({"output": {}}) == [] and plots.config_references(None) == []
  for bad in ("high:paper", "nan:x", "inf"):
    with pytest.raises(ValueError, match="reference"):
      plots.parse_references(bad)


@pytest.mark.plots
def test_a_runs_own_reference_line_is_drawn_and_redrawn(runs, tmp_path, monkeypatch):
  """``output.reference`` reaches the accuracy plot of the run and of ``experiments/plot.py``'s redraw; an explicit
  ``--reference`` replaces it."""
  root, _ = runs
  config = json.loads((root / "clean" / "config.json").read_text())
  config["output"]["reference"] = "85.6:paper, Table III"
  (root / "clean" / "config.json").write_text(json.dumps(config))
  seen = []
  real = plots.plot_accuracy
  monkeypatch.setattr(plots, "plot_accuracy", lambda runs_, out, references=(), **kw: seen.append(list(references))
                      or real(runs_, out, references=references, **kw))
  plots.write_run_plots(root / "clean", tmp_path / "own")
  plots.write_run_plots(root / "clean", tmp_path / "given", references=[(70.0, "mine")])
  assert seen == [[(85.6, "paper, Table III")], [(70.0, "mine")]]


def test_paper_configs_name_the_papers_number():
  from fedjax_robust.config_files import load_module
  configs = REPO / "experiments" / "configs"
  assert load_module(configs / "fedcap_cifar10.py").get_config("ipm").output.reference == \
      "84.29:FedCAP paper, Table III"
  assert load_module(configs / "fedcap_cifar10.py").get_config("label_flip").output.reference == ""  # Fig. 7 only
  assert load_module(configs / "fedvsa_mnist.py").get_config("dir0.5").output.reference.startswith("90:")
  with pytest.raises(ValueError, match="output.reference"):
    run_experiment(byzantine_config("mean", "none", rounds=1, **{"output.reference": "x"}), None)
