"""Copies one grid cell from a run's results file into a committed results json, with the command that made it.

Grid runs write their cells to ``runs/<out_dir>/results[.<shard>].json`` (gitignored); the numbers a results page
cites live in ``experiments/results/*.json``. This keeps the copy exact (the cell as the grid wrote it, its
per-round curves included) and says how to rerun it::

  python experiments/keep_cell.py runs/fig7_none/results.ditto.json ditto__none \\
      experiments/results/fedcap_fig7_benign_cpu_r100.json --as ditto__none@r100 \\
      --command "python experiments/fedcap_tables.py --mode personalized --methods ditto ..."

The cell's run directory (``<source's folder>/<cell>``), when present, supplies the per-round curves
(``grid.per_round_series``) a cell written before the grid kept them lacks; what the cell holds wins. An existing
key is only replaced with ``--replace``, so a kept number is never overwritten by accident.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _grid():
  """``grid.py`` beside this script (the experiments folder is scripts, not a package)."""
  from fedjax_robust.config_files import load_module
  return load_module(Path(__file__).with_name("grid.py"))


def keep_cell(source: Path, cell: str, target: Path, key: str, command: str, replace: bool = False) -> dict:
  """Adds ``source[cell]`` plus ``command`` to ``target`` under ``key`` (created if missing); returns the entry."""
  cells = json.loads(source.read_text())
  if cell not in cells:
    raise KeyError(f"{source} has no cell {cell!r}; it has {sorted(cells)}")
  kept = json.loads(target.read_text()) if target.exists() else {}
  if key in kept and not replace:
    raise ValueError(f"{target} already holds {key!r}; pass --replace to overwrite it")
  run_dir = source.parent / cell
  curves = _grid().per_round_series(run_dir) if (run_dir / "metrics.jsonl").exists() else {}
  kept[key] = {**curves, **cells[cell], "command": command}
  target.write_text(json.dumps(kept, indent=1) + "\n")
  return kept[key]


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("source", type=Path, help="a grid's results[.<shard>].json")
  parser.add_argument("cell", help="the cell's key there, e.g. ditto__none")
  parser.add_argument("target", type=Path, help="the committed results json, e.g. experiments/results/x.json")
  parser.add_argument("--as", dest="key", default=None, help="its key in target (default: the cell's key)")
  parser.add_argument("--command", required=True, help="the exact command that produced the cell")
  parser.add_argument("--replace", action="store_true", help="overwrite an existing key in target")
  args = parser.parse_args()
  entry = keep_cell(args.source, args.cell, args.target, args.key or args.cell, args.command, args.replace)
  print(f"{args.target}: {args.key or args.cell} = {entry.get('value')}")


if __name__ == "__main__":
  main()
