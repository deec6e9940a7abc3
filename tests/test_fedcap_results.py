"""experiments/fedcap_results.py: how a Table IV cell that is not a run of its own gets its value, and the
readable removal column. (Every generated block itself is checked against the page by test_results_tables.py.)"""

import pytest

from experiments import fedcap_results as fr
from experiments import fedcap_tables as ft


def test_removal_text_groups_clients_by_round():
  assert ft.removal_text({"10": 8, "1": 9, "17": 9, "8": 61}) == "round 8: 10; round 9: 1, 17; round 61: 8"
  assert ft.removal_text({"1": 22, "8": 22}, num_attackers=2) == "all 2 in round 22"
  assert ft.removal_text("{'3': 4}") == "round 4: 3"  # older files stored the dict as its str
  assert ft.removal_text({}) == ""


def test_removal_rounds_from_per_round_counts():
  assert fr.removal_rounds({"num_removed_per_round": [0, 0, 6, 6]}) == "all 6 by round 3"
  assert fr.removal_rounds({"num_removed_per_round": [0, 2, 5]}) == "5 by round 3 (first in round 2)"
  assert fr.removal_rounds({"num_removed_per_round": [0, 0]}) == "none"
  assert fr.removal_rounds({}) == "–"


def test_ablation_cells_say_where_they_come_from():
  own, source = fr.ablation_cell("v4", "min_max", 100)
  assert source == "" and own["value"] == pytest.approx(73.333, abs=1e-3)
  read, source = fr.ablation_cell("v1", "min_max", 100)
  assert source == "read_v4" and read["value"] == own["models"]["customized"]
  borrowed, source = fr.ablation_cell("v3", "ipm", 100)
  assert source == "table3" and borrowed["value"] == fr.load(fr.H100_TABLE3)["ipm"]["customized"]
  assert fr.ablation_cell("v2", "none", 30) is None


def test_a_table3_run_stands_in_only_with_table4_hyperparameters():
  fr._check_borrowable("min_max")
  with pytest.raises(ValueError, match="not Table IV's"):
    fr._check_borrowable("lie")  # Table III's LIE run used phi = 0.2


def test_gap_is_signed_and_ties_read_zero():
  assert fr.gap(80.76, 78.76) == "+2.0"
  assert fr.gap(84.40, 84.4000001) == "0.0"
  assert fr.gap(None, 1.0) == "–"
