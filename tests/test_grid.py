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


def _one_seed_cell(seed, value, wall_s=100.0, rounds=100, commit="abc"):
  return {"value": value, "natural": value, "natural_window_std": 0.5, "curves": {"round": [1]}, "rounds": rounds,
          "epochs": 1, "protocol": {"rounds": rounds, "reduced": False}, "config": {"seed": seed, "rounds": rounds},
          "command": f"run --seed {seed}", "commit": commit, "dirty": False, "device_kind": "cpu", "wall_s": wall_s}


def test_one_seed_runs_pool_into_a_seeds_cell_by_hand():
  cell = grid.pool_seed_cells([_one_seed_cell(2, 90.0, 300.0), _one_seed_cell(0, 84.0), _one_seed_cell(1, 87.0)])
  assert cell["seeds"] == [0, 1, 2] and list(cell["per_seed"]) == ["0", "1", "2"]  # ordered by seed
  assert cell["value"] == 87.0 and cell["natural_values"] == [84.0, 87.0, 90.0]
  assert np.isclose(cell["natural_std"], np.sqrt(6.0))  # ddof 0: (9 + 0 + 9) / 3
  assert cell["natural_window_std"] == 0.5 and cell["natural_window_std_std"] == 0.0
  assert "command" not in cell["per_seed"]["0"] and cell["per_seed"]["2"]["curves"] == {"round": [1]}
  assert cell["pooled_runs"]["2"]["command"] == "run --seed 2" and cell["wall_s"] == 500.0
  assert cell["config"] == {"seed": 0, "rounds": 100} and cell["protocol"] == {"rounds": 100, "reduced": False}


def test_seed_runs_gives_each_pooled_seed_its_record_and_a_one_run_cell_itself():
  pooled = grid.pool_seed_cells([_one_seed_cell(1, 87.0), _one_seed_cell(0, 84.0)])
  runs = grid.seed_runs(pooled)
  assert list(runs) == ["0", "1"] and [r["value"] for r in runs.values()] == [84.0, 87.0]
  single = _one_seed_cell(0, 84.0)
  assert grid.seed_runs(single) == {None: single}
  assert grid.seed_runs({**single, "per_seed": {}}) == {None: {**single, "per_seed": {}}}  # an empty per_seed: the cell


def test_pooling_refuses_what_would_be_silently_wrong():
  import pytest
  with pytest.raises(ValueError, match="distinct seeds"):
    grid.pool_seed_cells([_one_seed_cell(1, 80.0), _one_seed_cell(1, 81.0)])
  with pytest.raises(ValueError, match="'protocol'"):
    grid.pool_seed_cells([_one_seed_cell(0, 80.0), _one_seed_cell(1, 81.0, rounds=20)])
  with pytest.raises(ValueError, match="already pooled"):
    grid.pool_seed_cells([{**_one_seed_cell(0, 80.0), "seeds": [0, 1]}, _one_seed_cell(2, 81.0)])
  with pytest.raises(ValueError, match="no cells"):
    grid.pool_seed_cells([])


def test_load_pooled_pools_a_key_found_in_several_files_and_keeps_the_rest(tmp_path):
  files = []
  for seed, value in ((0, 84.0), (1, 87.0)):
    path = tmp_path / f"seed{seed}.json"
    path.write_text(json.dumps({"a": _one_seed_cell(seed, value), f"only{seed}": _one_seed_cell(seed, 1.0)}))
    files.append(path)
  cells = grid.load_pooled(files)
  assert sorted(cells) == ["a", "only0", "only1"]
  assert cells["a"]["seeds"] == [0, 1] and cells["a"]["value"] == 85.5
  assert "seeds" not in cells["only0"]  # found once: as stored


def test_a_records_own_std_field_never_hides_the_std_across_seeds():
  cells = [{**_one_seed_cell(seed, value), "natural_std": 0.5} for seed, value in ((0, 84.0), (1, 88.0))]
  assert grid.pool_seed_cells(cells)["natural_std"] == 2.0


def test_load_pooled_takes_only_the_named_keys_of_a_file(tmp_path):
  import pytest
  big, single = tmp_path / "big.json", tmp_path / "seed1.json"
  big.write_text(json.dumps({"a": _one_seed_cell(0, 84.0), "b": {**_one_seed_cell(0, 1.0), "seeds": [0, 1]}}))
  single.write_text(json.dumps({"a": _one_seed_cell(1, 88.0)}))
  cells = grid.load_pooled([f"{big}::a", single])
  assert list(cells) == ["a"] and cells["a"]["seeds"] == [0, 1] and cells["a"]["value"] == 86.0
  with pytest.raises(KeyError, match="no cell"):
    grid.load_pooled([f"{big}::a+c"])
  # a table script's --from_json: the same, as one comma-separated string
  assert grid.load_pooled(f"{big}::a,{single}") == cells
  assert sorted(grid.load_pooled(str(big))) == ["a", "b"]


def test_a_pooled_cell_keeps_the_setting_once_not_as_a_statistic():
  cell = grid.pool_seed_cells([_one_seed_cell(0, 84.0), _one_seed_cell(1, 88.0)])
  assert (cell["rounds"], cell["epochs"]) == (100, 1) and "rounds_std" not in cell and "wall_s_std" not in cell


def test_only_selects_cells_by_a_part_of_their_key_and_refuses_an_empty_selection():
  import pytest
  cells = [("fang_krum__k100_p0.1", 1, None), ("fang_krum__k100_p0.3", 2, None),
           ({"lr=0.1": "fedcac__a", "lr=0.2": "fedcac__b"}, 3, None)]
  assert grid.selected_cells(cells, "") == cells
  assert [c[1] for c in grid.selected_cells(iter(cells), "p0.3,__b")] == [2, 3]
  assert [c[1] for c in grid.selected_cells(cells, "fang_krum")] == [1, 2]
  with pytest.raises(SystemExit, match="matches none of the 3 cells"):
    grid.selected_cells(cells, "p0.5")


def _run_args(*argv):
  import argparse
  parser = argparse.ArgumentParser()
  grid.add_common_args(parser, "runs/x")
  return parser.parse_args(list(argv))


def test_seed_sets_every_seed_field_as_the_seeds_program_does():
  """`--seed 2` is lane 2 of `--seeds 0,1,2`: run key, partition and attacker draws all seed 2's."""
  from fedjax_robust.experiment import default_config
  from fedjax_robust.run import seed_config
  c = grid.apply_run_args(default_config(), _run_args("--seed", "2", "--rounds", "3"))
  assert (c.seed, c.data.seed, c.attack.seed) == (2, 2, 2) and c.seeds == ""
  lane = seed_config(default_config(), 2)
  assert (lane.seed, lane.data.seed, lane.attack.seed) == (c.seed, c.data.seed, c.attack.seed)
  assert grid.split_seed_fields(c) == {}


def test_a_set_seed_alone_warns_that_the_draws_stay_seed_zeros():
  import warnings

  import pytest
  from fedjax_robust.experiment import default_config
  with pytest.warns(UserWarning, match=r"seed=1 but data.seed=0, attack.seed=0.*--seed 1"):
    c = grid.apply_run_args(default_config(), _run_args("--set", "seed=1"))
  assert grid.split_seed_fields(c) == {"data.seed": 0, "attack.seed": 0}
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # an explicit draw for each field, or a seeds program: nothing to warn about
    grid.apply_run_args(default_config(), _run_args("--set", "seed=1", "--set", "data.seed=1", "--set",
                                                    "attack.seed=1"))
    grid.apply_run_args(default_config(), _run_args("--seeds", "0,1", "--set", "seed=1"))


def _drawn_cell(seed, data_seed, attack_seed, value):
  cell = _one_seed_cell(seed, value)
  cell["config"] = {**cell["config"], "seed_fields": "seed,data.seed,attack.seed", "data": {"seed": data_seed},
                    "attack": {"seed": attack_seed}}
  return cell


def test_pooled_runs_that_shared_a_draw_say_so_in_the_setup_note():
  shared = grid.pool_seed_cells([_drawn_cell(0, 0, 0, 80.0), _drawn_cell(1, 0, 0, 82.0), _drawn_cell(2, 0, 0, 84.0)])
  assert shared["fixed_seed_fields"] == {"data.seed": 0, "attack.seed": 0}
  assert grid.seeds_phrase(shared) == ("3 seed(s) varying only the run key and initialization (data.seed = 0, "
                                       "attack.seed = 0 in every one: one partition and attacker draw)")
  own = grid.pool_seed_cells([_drawn_cell(0, 0, 0, 80.0), _drawn_cell(1, 1, 1, 82.0)])
  assert "fixed_seed_fields" not in own and grid.seeds_phrase(own) == "2 seed(s)"
  half = grid.pool_seed_cells([_drawn_cell(0, 0, 0, 80.0), _drawn_cell(1, 1, 0, 82.0)])  # attackers shared only
  assert half["fixed_seed_fields"] == {"attack.seed": 0}
  assert grid.seeds_phrase({"value": 1.0}) == "1 seed(s)" and grid.seeds_phrase({"seeds": [0, 1, 2]}) == "3 seed(s)"


def test_seeds_differ_note_names_the_cells_off_the_common_seed_set():
  three, two, one = {"seeds": [0, 1, 2]}, {"seeds": [0, 1]}, {"config": {"seed": 1}}
  assert grid.seeds_differ_note({"A": three, "B": dict(three), "C": None}) == ""  # a missing cell is not a seed set
  assert grid.seeds_differ_note({"A": three, "B": three, "C": two, "D": one}) == (
      "Seeds differ between the cells shown (a gap between two of them then mixes seed-to-seed variation with the "
      "method): seeds 0,1: C; seed 1: D; seeds 0,1,2: the other 2 cells.")
  # equal counts at other seeds are still a difference a "2 seed(s)" phrase would hide; ties break on the seeds
  note = grid.seeds_differ_note({"A": {"seeds": [1, 2]}, "B": {"seeds": [0, 1]}})
  assert note.endswith("seeds 1,2: A; seeds 0,1: the other 1 cell.")


def _setting_cell(seed, value, **config):
  cell = _one_seed_cell(seed, value)
  cell["config"] = {**cell["config"], "seed_fields": "seed,data.seed", "data": {"seed": seed, "data_dir": f"/d{seed}"},
                    "algorithm": {"name": "fedavg", "fedprox": {"mu": 0.0}},
                    "attack": {"client": {"name": "none", "epochs": 0}}, "eval": {"metrics": "accuracy"}, **config}
  return cell


def test_pooling_refuses_runs_that_trained_another_setting_and_names_the_field():
  """A calibration axis (or a learning rate) differing between the runs would show up as seed noise in one row."""
  import pytest
  calib = lambda axis: {"adversarial": {"fedalc": {"calib_axis": axis}}}
  with pytest.raises(ValueError, match=r"different settings.*adversarial\.fedalc\.calib_axis: \['class', 'sample'\]"):
    grid.pool_seed_cells([_setting_cell(0, 80.0, **calib("class")), _setting_cell(1, 81.0, **calib("sample"))])
  assert grid.setting_differences([{"client": {"lr": 0.1}}, {"client": {"lr": 0.05}}]) == {"client.lr": [0.1, 0.05]}
  assert grid.setting_differences([{"client": {"lr": 0.1}}]) == {}


def test_pooling_ignores_what_does_not_change_what_was_trained():
  """Seed fields, the data folder, evaluators, a switched-off block's fields, an algorithm nobody ran, and a field an
  older run's config does not record at all (added since: that run ran its default)."""
  cells = [_setting_cell(0, 80.0),
           _setting_cell(1, 82.0, attack={"client": {"name": "none", "epochs": 6}}, eval={"metrics": "accuracy,robust"},
                         algorithm={"name": "fedavg", "fedprox": {"mu": 0.01}}, engine={"pair_forward": "auto"})]
  assert grid.setting_differences([c["config"] for c in cells]) == {}
  assert grid.pool_seed_cells(cells)["value"] == 81.0
  ran = [_setting_cell(0, 80.0, algorithm={"name": "fedprox", "fedprox": {"mu": 0.0}}),
         _setting_cell(1, 82.0, algorithm={"name": "fedprox", "fedprox": {"mu": 0.01}})]
  assert grid.setting_differences([c["config"] for c in ran]) == {"algorithm.fedprox.mu": [0.0, 0.01]}
  on = [_setting_cell(0, 80.0, attack={"client": {"name": "backdoor_training", "epochs": 6}}),
        _setting_cell(1, 82.0, attack={"client": {"name": "backdoor_training", "epochs": 12}})]
  assert grid.setting_differences([c["config"] for c in on]) == {"attack.client.epochs": [6, 12]}


def test_a_seeds_program_of_one_seed_pools_as_that_seeds_run():
  """`--seeds 1` stores a seeds cell of one lane (config.seed stays 0); pooled, it is seed 1's run with its own
  record and provenance, and its config's seed fields say 1, as `--seed 1` would have recorded."""
  lane = _drawn_cell(1, 1, 1, 88.0)
  program = {"seeds": [1], "per_seed": {"1": {"value": 88.0, "natural": 88.0, "natural_window_std": 0.5}},
             "value": 88.0, "value_std": 0.0, "rounds": 100, "epochs": 1, "protocol": lane["protocol"],
             "command": "run --seeds 1", "commit": "def", "wall_s": 50.0,
             "config": {**lane["config"], "seed": 0, "seeds": "1", "data": {"seed": 0}, "attack": {"seed": 0}}}
  cell = grid.pool_seed_cells([_drawn_cell(0, 0, 0, 84.0), program])
  assert cell["seeds"] == [0, 1] and cell["value_values"] == [84.0, 88.0] and cell["value"] == 86.0
  assert cell["pooled_runs"]["1"]["command"] == "run --seeds 1" and cell["wall_s"] == 150.0
  assert "fixed_seed_fields" not in cell  # each run drew its own partition and attackers
  import pytest
  with pytest.raises(ValueError, match="already pooled"):  # two lanes: a real seeds program, not one run
    grid.pool_seed_cells([_drawn_cell(2, 2, 2, 84.0), {**program, "seeds": [0, 1]}])
