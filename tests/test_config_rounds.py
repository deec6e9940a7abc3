"""benchmarks/config_rounds.py: whole configs timed against the first one, with provenance, in one process."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.mark.fast_compiles  # tests/conftest.py
def test_each_config_is_timed_against_the_first_and_stored(tmp_path, monkeypatch):
  from benchmarks import config_rounds
  monkeypatch.chdir(ROOT)  # config paths are relative to the repository, as in the README's commands
  out = tmp_path / "rounds.json"
  # FedCC's setting with two of its rules, shrunk onto the embedded digits and an MLP (no download, fast compile).
  mean, median = (f"experiments/configs/fedcc_cifar10.py:none,{rule}" for rule in ("fedavg", "median"))
  small = ["data.name=digits", "data.num_clients=4", "model.name=mlp", "client.epochs=1", "rounds=2"]
  result = config_rounds.main(["--configs", mean, "--configs", median, "--rounds", "1", "--out", str(out),
                               *(a for kv in small for a in ("--set", kv))])
  first, second = result["cells"][mean], result["cells"][median]
  assert first["x_first_time"] == 1.0 and first["s_per_round"] > 0 and first["first_round_s"] > 0
  assert second["x_first_time"] == pytest.approx(second["s_per_round"] / first["s_per_round"])
  assert first["num_clients"] == second["num_clients"] == 4  # --set reaches every config
  assert (first["aggregator"]["name"], second["aggregator"]["name"]) == ("mean", "median")
  stored = json.loads(out.read_text())
  assert stored["cells"].keys() == result["cells"].keys() and {"commit", "command", "device"} <= set(stored)
  with pytest.raises(SystemExit):  # the same config twice would overwrite its own cell
    config_rounds.main(["--configs", mean, "--configs", mean])
