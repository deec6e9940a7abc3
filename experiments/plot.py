"""Draws run directories: one run's figures, or several runs' curves overlaid.

  python experiments/plot.py runs/quickstart
  python experiments/plot.py runs/fedavg_ipm runs/median_ipm --out runs/compare_ipm --reference "95.1:paper, Table II"

One RUN_DIR: every figure of ``fedjax_robust/plots.py`` (accuracy, loss, partition, detection, weights,
client_weights; PNG and SVG) into ``RUN_DIR/plots`` (or ``--out``), what a run writes at its end with
``output.plots=True`` (a seeds/grid run's ``seed_<s>`` directories get theirs this way). Several: their
accuracy and loss curves overlaid, one colour per run named in the legend (``--names`` to rename them), into
``--out`` (default ``compare_<name>_<name>...`` beside the first run); ``--each`` also redraws every run's own
figures. ``--reference VALUE[:LABEL]`` (repeatable) draws a horizontal line at VALUE % accuracy, e.g. a paper's
number. Prints the files written. Needs matplotlib (``pip install -e ".[plots]"``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main(argv=None) -> list[Path]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
  parser.add_argument("--out", type=Path, default=None, help="where the figures go")
  parser.add_argument("--reference", action="append", default=[], metavar="VALUE[:LABEL]",
                      help="a reference accuracy in %% (e.g. a paper's number), drawn as a dashed line")
  parser.add_argument("--names", default="", help="comma-separated legend names of the runs (default: directory names)")
  parser.add_argument("--each", action="store_true", help="with several runs, also redraw each run's own figures")
  args = parser.parse_args(argv)

  from fedjax_robust import plots
  if not plots.matplotlib_available():
    sys.exit('error: plotting needs matplotlib: pip install -e ".[plots]"')
  references = [plots.parse_reference(r) for r in args.reference]
  for run_dir in args.run_dirs:
    if not (run_dir / "metrics.jsonl").exists():
      sys.exit(f"error: {run_dir} is not a run directory (no metrics.jsonl)")
  written: list[Path] = []
  if len(args.run_dirs) == 1:
    written += plots.write_run_plots(args.run_dirs[0], args.out, references=references)
  else:
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(args.run_dirs):
      sys.exit(f"error: --names gives {len(names)} names for {len(args.run_dirs)} runs")
    out = args.out or args.run_dirs[0].parent / ("compare_" + "_".join(d.name for d in args.run_dirs))[:120]
    written += plots.write_comparison_plots(args.run_dirs, out, references=references, names=names)
    if args.each:
      for run_dir in args.run_dirs:
        written += plots.write_run_plots(run_dir, references=references)
  for path in written:
    print(path)
  return written


if __name__ == "__main__":
  main()
