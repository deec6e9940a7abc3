"""experiments/grid.py's helpers shared by the table scripts and the benchmarks."""

import json

import numpy as np

from experiments import grid


def test_store_json_makes_the_folder_and_writes_what_json_cannot_say_as_text(tmp_path, capsys):
  path = tmp_path / "new" / "folder" / "result.json"
  grid.store_json(path, {"rounds_per_s": 1.5, "dtype": np.dtype("float32"), "nested": {"seeds": [0, 1]}})
  assert json.loads(path.read_text()) == {"rounds_per_s": 1.5, "dtype": "float32", "nested": {"seeds": [0, 1]}}
  assert f"stored {path}" in capsys.readouterr().out


def test_cell_line_shows_only_what_the_cell_has():
  assert grid.cell_line("plain", {"value": 29.0, "wall_s": 201.4}).split() == ["plain", "29.00", "201s"]
  line = grid.cell_line("seeds", {"value": 63.0, "value_std": 1.1, "wall_s": 300.0,
                                  "models": {"before": 63.25, "unused": None},
                                  "detection_tpr": 0.0, "detection_fpr": 4 / 7})
  assert line.split()[1:] == ["63.00", "±", "1.10", "(before", "63.25,", "TPR", "0.00", "FPR", "0.57)", "300s"]
