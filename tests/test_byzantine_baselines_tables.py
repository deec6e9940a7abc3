"""experiments/byzantine_baselines.py's table renderer: the grid's table.md and the --from_json tables of
experiments/results/byzantine_baselines.md are one code path (paper numbers from PAPER only)."""

from experiments import byzantine_baselines as bb


def test_paper_value_maps_a_variant_to_its_column():
  assert bb.paper_value("ipm", "rfa_vector") == bb.paper_value("ipm", "rfa") == 36.48
  assert bb.paper_value("scaling", "fltrust") == 20.67


def test_tables_old_and_new_cell_formats():
  old = {"ipm__median": {"value": 61.4285, "global": 14.38, "local": 61.4285}}  # H100 file: top-level models
  new = {"ipm__median": {"value": 61.4285, "models": {"global": 14.38, "local": 61.4285}, "commit": "a" * 40,
                         "dirty": False, "device_kind": "NVIDIA H100", "jax": "0.11.2", "command": "python x.py"}}
  for results in (old, new):
    assert "| IPM | 61.43 / 75.05 |" in bb.render(results, "ours")
    assert "| IPM | **-13.6** |" in bb.render(results, "diff")  # |diff| > 10: bold
    assert "| IPM | 14.4 |" in bb.render(results, "global")
  assert "provenance: not recorded in this file" in bb.render(old, "ours")
  note = bb.render(new, "ours").splitlines()[-1]
  assert note == "provenance: commit aaaaaaaaaaaa; device NVIDIA H100; jax 0.11.2; command `python x.py`"


def test_missing_cells_and_column_order():
  table = bb.markdown_table({"sign_flip__mean": {"value": 10.95}}, ["sign_flip", "ipm"], ["mean", "median"])
  assert table.splitlines()[2:] == ["| SF | 10.95 / 10.95 | — / 78.86 |", "| IPM | — / 10.95 | — / 75.05 |"]
  header = bb.render({"ipm__rfa_vector": {"value": 1}, "ipm__trimmed_mean": {"value": 1}, "ipm__mean": {"value": 1}},
                     "diff").splitlines()[0]
  assert header == "| Attack | Mean | RFA (whole vector) | Trim. |"  # a variant sits at its paper column
