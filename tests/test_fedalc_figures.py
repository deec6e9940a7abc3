"""experiments/fedalc_figures.py from a hand-made results file in the layout experiments/fedalc_tables.py stores:
a seeds cell (``per_seed[*].curves``, hoisted ``protocol``, ``config``) and a one-run cell (``curves`` at the top)."""

import json
from pathlib import Path

import matplotlib  # the `plots` extra: required, not skipped

from fedjax_robust.config_files import load_module

f = load_module(Path(__file__).resolve().parents[1] / "experiments" / "fedalc_figures.py")

ROUNDS = [1, 2, 10, 11, 12]


def _protocol(dataset, rounds=12, paper_rounds=100, epochs=1, paper_epochs=1):
  return {"dataset": dataset, "rounds": rounds, "paper_rounds": paper_rounds, "epochs": epochs,
          "paper_epochs": paper_epochs, "last_rounds": 3, "reduced": True}


def _config(name, examples=100):
  return {"rounds": 12, "client": {"epochs": 1}, "data": {"name": name},
          "eval": {"metrics": "accuracy,robust", "last_rounds": 3,
                   "robust": {"attacks": "fgsm,bim,pgd,cw", "eps": 8 / 255, "step_size": 2 / 255, "steps": 10,
                              "examples": examples}}}


def _seed_run(natural, fgsm):
  curves = {"round": ROUNDS, "global_test_acc": natural}
  if fgsm is not None:
    curves["robust_acc_fgsm"] = fgsm
  return {"natural": 100 * sum(natural[-3:]) / 3, "curves": curves, "protocol": _protocol("mnist"),
          "window_rounds": [10, 11, 12]}


def _seeds_cell(offset, robust=True):
  """Two seeds; FGSM logged (one round missing: None), PGD never."""
  runs = {str(s): _seed_run([0.2 + offset + 0.01 * s, 0.4 + offset, 0.7 + offset, 0.72 + offset, 0.75 + offset],
                            [0.05, None, 0.3 + offset, 0.31 + offset + 0.02 * s, 0.33] if robust else None)
          for s in (0, 1)}
  cell = {"seeds": [0, 1], "per_seed": runs, "natural": sum(r["natural"] for r in runs.values()) / 2,
          "config": _config("mnist"), "protocol": _protocol("mnist"), "window_rounds": [10, 11, 12]}
  if robust:
    cell["fgsm"] = 31.5 + 100 * offset
  return cell


def _results():
  return {
      "mnist__a0.1__fedavg": _seeds_cell(0.0),
      "mnist__a0.1__fedalc": _seeds_cell(0.05),
      "mnist__a1__fedalc": _seeds_cell(0.1),  # another alpha: not drawn at 0.1
      # a one-run (no seeds) cell: curves at the cell's top level
      "cifar10__a0.1__fedavg": {"natural": 40.0, "curves": {"round": [1, 2, 3], "global_test_acc": [0.2, 0.3, 0.4]},
                                "protocol": _protocol("cifar10", 3, 60, 1, 5), "config": _config("cifar10", 0)},
  }


def _check_files(out: Path, names):
  for name in names:
    png, svg = out / f"{name}.png", out / f"{name}.svg"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert svg.stat().st_size > 1000 and b"<svg" in svg.read_bytes()[:2000], svg


def test_seed_stats_mean_min_max_over_seeds_per_round():
  curves = f.seed_curves(_seeds_cell(0.0), "robust_acc_fgsm")
  assert len(curves) == 2 and curves[0][0] == [1, 10, 11, 12]  # the None round dropped
  rounds, mean, lo, hi, n = f.seed_stats(curves)
  assert rounds == [1, 10, 11, 12] and n == [2, 2, 2, 2]
  assert abs(mean[2] - 32.0) < 1e-9 and abs(lo[2] - 31.0) < 1e-9 and abs(hi[2] - 33.0) < 1e-9
  assert f.seed_curves(_seeds_cell(0.0), "robust_acc_pgd") == []


def test_figures_written_and_missing_metric_skipped(tmp_path, capsys):
  src = tmp_path / "results.json"
  src.write_text(json.dumps(_results()))
  out = tmp_path / "figs"
  written = f.main([str(src), "--out_dir", str(out), "--alpha", "0.1"])
  assert matplotlib.get_backend().lower() == "agg"
  drawn = ["fedalc_fig2_mnist_a0.1", "fedalc_fig3_mnist_a0.1", "fedalc_fig5_cifar10_a0.1"]
  _check_files(out, drawn)
  assert sorted(p.name for p in written) == sorted(f"{n}.{e}" for n in drawn for e in ("png", "svg"))
  # PGD was never logged: Fig. 4 skipped with a note, not drawn empty
  assert not list(out.glob("fedalc_fig4_*"))
  assert "skip fedalc_fig4_mnist_a0.1" in capsys.readouterr().out


def test_figure_skipped_when_no_cell_holds_the_metric(tmp_path, capsys):
  results = {"mnist__a0.1__fedprox": _seeds_cell(0.0, robust=False)}
  written = f.plot_figures(results, tmp_path, 0.1)
  assert [p.name for p in written] == ["fedalc_fig2_mnist_a0.1.png", "fedalc_fig2_mnist_a0.1.svg"]
  printed = capsys.readouterr().out
  assert "skip fedalc_fig3_mnist_a0.1" in printed and "skip fedalc_fig4_mnist_a0.1" in printed
  assert f.plot_figures(results, tmp_path / "none", 0.5) == [] and not (tmp_path / "none").exists()


def test_title_names_the_reduction():
  cell = _seeds_cell(0.0)
  assert f.run_note(cell, "natural").startswith("REDUCED: 12 rounds (paper 100), E = 1")
  assert "first 100 test images" in f.run_note(cell, "pgd") and "10 steps of 2/255" in f.run_note(cell, "pgd")
