"""FedALC: the paper's per-round figures (spec §2.4, §5.4) from the curves a results file of
``experiments/fedalc_tables.py`` stores.

  Fig. 2: natural accuracy vs round (MNIST / Fashion-MNIST, α = 0.1)
  Fig. 3: FGSM robust accuracy vs round (MNIST / Fashion-MNIST, α = 0.1)
  Fig. 4: PGD robust accuracy vs round (MNIST / Fashion-MNIST, α = 0.1)
  Fig. 5: natural accuracy vs round (CIFAR-10, α = 0.1)

One line per method (FedAvg, FedProx, FedALC, and the clean-FedAvg reference row when the file has it): the mean
over seeds of each evaluated round, a shaded min-max band across seeds when there are several, and the paper's
last-10-round Table I / II number for that method at that α (``fedalc_tables.PAPER_TABLE1`` / ``PAPER_TABLE2``) as a
dashed horizontal line of the same colour. The paper's figure text quotes relative gains computed from those
table numbers (spec §5.4), not values read off the curves, so the dashed lines are what a curve's last rounds should
be compared with. The title says what the cells ran (rounds and local epochs against the paper's, the robust
evaluation's test subset), from each cell's stored ``protocol`` and ``config``.

  python experiments/fedalc_figures.py runs/fedalc/results.json [--out_dir experiments/results/figures] [--alpha 0.1]

Writes ``fedalc_fig<N>_<dataset>_a<alpha>.png`` and ``.svg`` per figure; a figure with no stored data is skipped with
a printed note. Needs matplotlib (``pip install -e ".[plots]"``); draws with the non-interactive Agg canvas.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import fedalc_tables as tables  # noqa: E402
from experiments import grid  # noqa: E402

# figure -> (metric name of fedalc_tables.METRICS, y-axis quantity, the datasets the paper draws it for)
FIGURES = {
    2: ("natural", "natural accuracy", tables.TABLE1_DATASETS),
    3: ("fgsm", "FGSM robust accuracy", tables.TABLE1_DATASETS),
    4: ("pgd", "PGD robust accuracy", tables.TABLE1_DATASETS),
    5: ("natural", "natural accuracy", ("cifar10",)),
}
COLORS = {"fedavg": "tab:blue", "fedprox": "tab:orange", "fedalc": "tab:red", "natural": "tab:gray"}
MARKERS = {"fedavg": "o", "fedprox": "s", "fedalc": "^", "natural": "D"}


# ------------------------------------------------------------------------------------------ stored curves
def seed_curves(cell: dict, key: str) -> list[tuple[list[int], list[float]]]:
  """``[(rounds, accuracies in %)]``, one per seed, of metrics.jsonl ``key`` over the evaluated rounds that logged
  it: a seeds cell's ``per_seed[*].curves``, else the cell's own ``curves``; for the natural accuracy of a cell
  stored without curves, its every-round ``global_test_acc_per_round`` (``grid.per_round_series``)."""
  out = []
  for run in grid.seed_runs(cell).values():
    curves = run.get("curves") or {}
    if key in curves:
      pairs = [(int(r), 100.0 * float(v)) for r, v in zip(curves["round"], curves[key]) if v is not None]
    elif key == "global_test_acc" and run.get("global_test_acc_per_round"):
      pairs = [(i + 1, 100.0 * float(v)) for i, v in enumerate(run["global_test_acc_per_round"]) if v is not None]
    else:
      continue
    if pairs:
      out.append(([r for r, _ in pairs], [v for _, v in pairs]))
  return out


def seed_stats(curves: list[tuple[list[int], list[float]]]) -> tuple[list[int], list[float], list[float],
                                                                      list[float], list[int]]:
  """``(rounds, mean, min, max, n)`` over seeds at every round any seed logged (n: how many seeds did)."""
  by_round: dict[int, list[float]] = {}
  for rounds, values in curves:
    for r, v in zip(rounds, values):
      by_round.setdefault(r, []).append(v)
  rounds = sorted(by_round)
  vals = [by_round[r] for r in rounds]
  return (rounds, [sum(v) / len(v) for v in vals], [min(v) for v in vals], [max(v) for v in vals],
          [len(v) for v in vals])


# ------------------------------------------------------------------------------------------ what the cells ran
def _robust(cell: dict) -> dict:
  return (cell.get("config") or {}).get("eval", {}).get("robust") or {}


def run_note(cell: dict, metric: str) -> str:
  """One line on what a cell ran against the paper: rounds / local epochs (REDUCED when they differ), the robust
  evaluation's test subset and attack settings (robust metrics only), and the seeds."""
  p = tables._cell_protocol(cell)
  parts = [f"{p['rounds']} rounds" + (f" (paper {p['paper_rounds']})" if p["rounds"] != p["paper_rounds"] else ""),
           f"E = {p['epochs']}" + (f" (paper {p['paper_epochs']})" if p["epochs"] != p["paper_epochs"] else "")]
  if metric != "natural":
    robust = _robust(cell)
    examples = int(robust.get("examples", 0) or 0)
    parts.append(f"robust eval on the first {examples} test images" if examples > 0 else
                 "robust eval on the full test set")
    eps = robust.get("eps")
    if eps is not None:
      attack = f"ε = {float(eps) * 255:.3g}/255"
      if metric == "pgd":
        attack += f", {robust.get('steps')} steps of {float(robust.get('step_size', 0)) * 255:.3g}/255"
      parts.append(attack)
  else:
    parts.append("natural acc. on the full test set")
  head = "REDUCED: " if p["reduced"] or (metric != "natural" and int(_robust(cell).get("examples", 0) or 0) > 0) \
      else ""
  return head + ", ".join(parts)


# ------------------------------------------------------------------------------------------ figures
def _cells_at(results: dict, dataset: str, alpha: float) -> dict[str, dict]:
  return {m: results[k] for m in tables.METHODS if (k := tables.cell_key(dataset, alpha, m)) in results}


def datasets_of(results: dict) -> list[str]:
  present = {k.split("__")[0] for k in results}
  return [d for d in tables.DATASETS if d in present]


def draw(fig_no: int, dataset: str, alpha: float, cells: dict[str, dict], out_dir: Path) -> list[Path]:
  """One figure from ``cells`` (method -> stored cell); returns the PNG and SVG written, [] (and a printed note)
  when no cell holds the figure's metric."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator

  metric, quantity, _ = FIGURES[fig_no]
  key = tables.METRICS[metric]
  label = tables.DATASETS[dataset][0]
  series = {m: seed_curves(c, key) for m, c in cells.items()}
  series = {m: s for m, s in series.items() if s}
  name = f"fedalc_fig{fig_no}_{dataset}_a{alpha:g}"
  if not series:
    print(f"skip {name}: no stored {key} curve in the {dataset} cells at α = {alpha:g} "
          f"({', '.join(cells) or 'no cell'})")
    return []

  fig = Figure(figsize=(10.5, 5.6), layout="constrained")
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  table = "Table II" if dataset == "cifar10" else "Table I"
  last_round = 0
  n_seeds = set()
  paper_drawn = False
  for m, curves in series.items():
    color, cell = COLORS[m], cells[m]
    rounds, mean, lo, hi, n = seed_stats(curves)
    last_round = max(last_round, rounds[-1])
    n_seeds.add(len(curves))
    ours = cell.get(metric)
    window = tables._cell_protocol(cell)["last_rounds"]
    ours_txt = f"; last-{window} mean {ours:.2f}" if ours is not None else ""
    seeds_txt = f"{len(curves)} seeds" if len(curves) > 1 else "1 seed"
    ax.plot(rounds, mean, color=color, marker=MARKERS[m], markersize=3.5, linewidth=1.6,
            label=f"{tables.METHODS[m]} (ours, {seeds_txt}{ours_txt})")
    if max(n) > 1:
      ax.fill_between(rounds, lo, hi, color=color, alpha=0.18, linewidth=0)
    paper = tables.paper_value(dataset, alpha, m, metric)
    if paper is not None:
      paper_drawn = True
      ax.axhline(paper[0], color=color, linestyle="--", linewidth=1.2,
                 label=f"{tables.METHODS[m]}, paper {table} (last-10 mean {paper[0]:.2f} ± {paper[1]:.2f})")
  ax.set_xlabel("communication round")
  ax.set_ylabel(f"{quantity} (%)")
  ax.set_xlim(0, last_round + 0.5)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.grid(True, alpha=0.3)
  band = "; band: min-max across seeds" if max(n_seeds) > 1 else ""
  legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, title_fontsize=8.5,
                     frameon=False, borderaxespad=0.0, alignment="left",
                     title=f"solid: ours, mean over seeds{band}" + (
                         f"\ndashed: paper {table}, mean of its last 10 of {tables.DATASETS[dataset][1]} rounds"
                         if paper_drawn else f"\n(the paper has no {table} number at α = {alpha:g})"))
  legend.get_title().set_multialignment("left")

  notes: dict[str, list[str]] = {}
  for m in series:
    notes.setdefault(run_note(cells[m], metric), []).append(tables.METHODS[m])
  lines = [note if len(notes) == 1 else f"{', '.join(ms)}: {note}" for note, ms in notes.items()]
  fig.suptitle(f"Fig. {fig_no}: {label}, {quantity} per round, α = {alpha:g}", fontsize=13, x=0.01, ha="left")
  ax.set_title("\n".join(lines), fontsize=9, loc="left")

  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  for ext, meta in (("png", {}), ("svg", {"Date": None})):
    path = out_dir / f"{name}.{ext}"
    fig.savefig(path, format=ext, dpi=130, metadata=meta)
    written.append(path)
  print(f"wrote {written[0]} (+ .svg): {', '.join(tables.METHODS[m] for m in series)}")
  return written


def plot_figures(results: dict, out_dir, alpha: float = 0.1) -> list[Path]:
  """Every figure of spec §2.4 for every dataset in ``results`` at ``alpha``; returns the files written."""
  out_dir = Path(out_dir)
  written = []
  for dataset in datasets_of(results):
    cells = _cells_at(results, dataset, float(alpha))
    figs = [f for f, (_, _, datasets) in FIGURES.items() if dataset in datasets]
    if not cells:
      print(f"skip {', '.join(f'Fig. {f}' for f in figs)} for {dataset}: no cell at α = {alpha:g}")
      continue
    for fig_no in figs:
      written += draw(fig_no, dataset, float(alpha), cells, out_dir)
  return written


def main(argv=None) -> list[Path]:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("results_json", help="a results file of experiments/fedalc_tables.py")
  parser.add_argument("--out_dir", default="experiments/results/figures")
  parser.add_argument("--alpha", type=float, default=0.1, help="the Dirichlet α of the cells drawn (paper: 0.1)")
  args = parser.parse_args(argv)
  import matplotlib
  matplotlib.use("Agg")
  results = json.loads(Path(args.results_json).read_text())
  written = plot_figures(results, args.out_dir, args.alpha)
  if not written:
    print(f"no figure written: no stored curve at α = {args.alpha:g} in {args.results_json}")
  return written


if __name__ == "__main__":
  main()
