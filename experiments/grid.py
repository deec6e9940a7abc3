"""What the reproduction grid scripts share: their common flags and the sharded results files.

A grid (``byzantine_baselines.py``, ``fedcap_tables.py``) runs one experiment per cell and appends each cell's
numbers to ``<out_dir>/results.json``, or ``results.<shard>.json`` when several processes split the cells (on one
GPU, so their XLA compilations overlap); the table merges every ``results*.json`` it finds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_common_args(parser: argparse.ArgumentParser, out_dir: str) -> None:
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--rounds", type=int, default=100)
  parser.add_argument("--epochs", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--strategy", default="", help="engine strategy (default: the backend's default)")
  parser.add_argument("--out_dir", default=out_dir)
  parser.add_argument("--shard", default="", help="write results.<shard>.json, so several processes (e.g. one per "
                      "cell group, on one GPU) can fill one out_dir; the table merges every results*.json there")
  parser.add_argument("--table_only", action="store_true", help="only merge the results*.json in out_dir")


def results_file(out: Path, shard: str) -> Path:
  return out / (f"results.{shard}.json" if shard else "results.json")


def load_results(path: Path) -> dict:
  return json.loads(path.read_text()) if path.exists() else {}


def merged_results(out: Path) -> dict:
  """Every cell found in ``out/results*.json`` (later files win on a repeated cell)."""
  merged = {}
  for path in sorted(out.glob("results*.json")):
    merged.update(json.loads(path.read_text()))
  return merged
