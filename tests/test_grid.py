"""experiments/grid.py's helpers shared by the table scripts and the benchmarks."""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments import grid  # noqa: E402


def test_store_json_makes_the_folder_and_writes_what_json_cannot_say_as_text(tmp_path, capsys):
  path = tmp_path / "new" / "folder" / "result.json"
  grid.store_json(path, {"rounds_per_s": 1.5, "dtype": np.dtype("float32"), "nested": {"seeds": [0, 1]}})
  assert json.loads(path.read_text()) == {"rounds_per_s": 1.5, "dtype": "float32", "nested": {"seeds": [0, 1]}}
  assert f"stored {path}" in capsys.readouterr().out
