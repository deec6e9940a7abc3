"""experiments/grid.py's helpers shared by the table scripts and the benchmarks."""

import json

import numpy as np

from experiments import grid


def test_store_json_makes_the_folder_and_writes_what_json_cannot_say_as_text(tmp_path, capsys):
  path = tmp_path / "new" / "folder" / "result.json"
  grid.store_json(path, {"rounds_per_s": 1.5, "dtype": np.dtype("float32"), "nested": {"seeds": [0, 1]}})
  assert json.loads(path.read_text()) == {"rounds_per_s": 1.5, "dtype": "float32", "nested": {"seeds": [0, 1]}}
  assert f"stored {path}" in capsys.readouterr().out
