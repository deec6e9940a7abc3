"""FedCC: Tables II (no attack), III (Fang-Krum, Fang-Med, Targeted), I (similarity ablation), IV (K = 100, partial
participation) and V (doubled epochs), and Figs. 4 (backdoor confidence per round) and 5 (f = 1..4 attackers), spec
§4.7, §5.

Every cell is ``experiments/configs/fedcc_<dataset>.py:<scenario>,<iid|noniid>,<rule>`` run at ``--seeds``
(default 0,1,2: one vmapped program per cell) and valued by the final-round global model's top-1 accuracy on
the full official test set (%), mean ± std over the seeds (spec §2.7); Targeted cells also keep the backdoor
metrics when the run has them. Cells are keyed ``<scenario>__<dist>__<dataset>__<rule>``.

  python experiments/fedcc_tables.py --data_dir ../shared/data --mode table3 --datasets fmnist   # 3 x 2 x 6 cells
  python experiments/fedcc_tables.py --mode table3 --from_json experiments/results/fedcc_cpu.json
  python experiments/fedcc_tables.py --data_dir ../shared/data --mode table4 --datasets cifar10    # K = 100
  python experiments/fedcc_tables.py --data_dir ../shared/data --mode table5                        # E 6 / 12
  python experiments/fedcc_tables.py --data_dir ../shared/data --mode fig5 --figure runs/fedcc/fig5.png  # f = 1..4
  python experiments/fedcc_tables.py --data_dir ../shared/data --mode table3 --attacks fang_krum,fang_median \
      --placement dataless                       # the code's dataless attackers (spec §2.6 [R]), keys <key>__dl
  python experiments/fedcc_tables.py --mode placement --from_json a.json,b.json   # fixed ids vs dataless
  python experiments/fedcc_tables.py --data_dir ../shared/data --mode table2 --datasets fmnist --rounds 5 \\
      --epochs 1 --set data.samples_per_class=200 --seeds 0,1,2                      # a reduced CPU run

``--rounds`` / ``--epochs`` default to each scenario's own (spec §4.6: 20 x 3 no attack, 30 x 5 untargeted,
40 x 3 targeted); giving them reduces every cell, and the stored cells say so.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import grid  # noqa: E402

DATASETS = {"fmnist": "fMNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}
DISTS = {"noniid": "non-IID", "iid": "IID"}
RULES = {"fedavg": "FedAvg", "krum": "Krum", "median": "Coomed", "bulyan": "Bulyan", "flare": "FLARE",
         "fedcc": "FedCC"}
SIMILARITIES = {"fedcc": "Kernel CKA", "fedcc_linear_cka": "Linear CKA", "fedcc_mmd": "MMD",
                "fedcc_cosine": "Cosine", "fedcc_euclidean": "Euclidean"}
ATTACKS = {"fang_krum": "Fang-Krum", "fang_median": "Fang-Med", "targeted": "Targeted"}

# specs/fedcc.md §5, verbatim. Table II: (dist, dataset) -> per rule, in RULES order.
PAPER_TABLE2 = {
    ("noniid", "fmnist"): (69.68, 43.10, 76.12, 68.78, 42.82, 71.92),
    ("noniid", "cifar10"): (53.06, 16.16, 45.55, 46.67, 27.33, 50.80),
    ("noniid", "cifar100"): (17.22, 7.27, 12.82, 15.21, 0.99, 17.62),
    ("iid", "fmnist"): (89.89, 83.81, 88.91, 89.49, 76.86, 89.71),
    ("iid", "cifar10"): (69.17, 56.56, 67.34, 67.81, 46.84, 69.03),
    ("iid", "cifar100"): (21.49, 7.73, 15.56, 20.55, 7.59, 22.05),
}
# Table III: (attack, dist, dataset) -> per rule, in RULES order.
PAPER_TABLE3 = {
    ("fang_krum", "noniid", "fmnist"): (64.63, 16.51, 57.12, 13.39, 49.54, 66.27),
    ("fang_krum", "noniid", "cifar10"): (33.69, 15.38, 35.70, 19.23, 17.03, 37.40),
    ("fang_krum", "noniid", "cifar100"): (2.27, 1.00, 4.85, 0.98, 7.46, 14.51),
    ("fang_median", "noniid", "fmnist"): (16.32, 49.33, 68.90, 64.12, 52.25, 72.76),
    ("fang_median", "noniid", "cifar10"): (10.02, 25.06, 40.23, 32.47, 14.59, 42.37),
    ("fang_median", "noniid", "cifar100"): (1.00, 6.24, 10.27, 6.91, 1.00, 16.12),
    ("targeted", "noniid", "fmnist"): (79.07, 43.46, 71.25, 73.58, 60.57, 84.54),
    ("targeted", "noniid", "cifar10"): (30.28, 16.05, 28.87, 25.77, 10.52, 36.20),
    ("targeted", "noniid", "cifar100"): (9.84, 7.24, 11.02, 12.01, 1.04, 13.81),
    ("fang_krum", "iid", "fmnist"): (75.55, 31.66, 87.62, 50.30, 79.16, 89.23),
    ("fang_krum", "iid", "cifar10"): (49.67, 40.86, 57.40, 12.67, 25.77, 67.12),
    ("fang_krum", "iid", "cifar100"): (13.72, 1.04, 6.17, 1.59, 7.49, 18.47),
    ("fang_median", "iid", "fmnist"): (20.86, 85.33, 86.70, 87.45, 71.08, 88.44),
    ("fang_median", "iid", "cifar10"): (9.51, 54.28, 59.20, 57.69, 49.82, 64.74),
    ("fang_median", "iid", "cifar100"): (0.87, 12.27, 14.43, 12.56, 5.83, 17.83),
    ("targeted", "iid", "fmnist"): (89.32, 85.52, 88.45, 89.35, 67.65, 90.16),
    ("targeted", "iid", "cifar10"): (52.20, 45.37, 49.27, 55.77, 10.09, 51.57),
    ("targeted", "iid", "cifar100"): (12.73, 8.37, 15.91, 16.59, 1.71, 18.08),
}
# Table I (CIFAR-10): similarity -> (Fang-Med IID, NIID, Fang-mKrum IID, NIID, Targeted IID, NIID) accuracy.
PAPER_TABLE1 = {
    "fedcc": (69.20, 41.00, 70.22, 43.24, 71.44, 54.62),
    "fedcc_linear_cka": (10.00, 13.13, 64.09, 39.55, 71.02, 49.53),
    "fedcc_mmd": (63.39, 40.90, 69.69, 32.27, 70.85, 50.51),
    "fedcc_cosine": (68.82, 33.90, 68.81, 10.04, 69.76, 53.66),
    "fedcc_euclidean": (69.06, 27.82, 68.54, 41.57, 69.17, 52.20),
}
TABLE1_COLUMNS = [(a, d) for a in ("fang_median", "fang_krum", "targeted") for d in ("iid", "noniid")]
# Table IV (non-IID, K = 100, f = 30% of the clients): (participation, dataset) -> (Fang-Krum: FedAvg, Med, FLARE,
# FedCC, Fang-Med: FedAvg, Med, FLARE, FedCC).
TABLE4_RULES = ("fedavg", "median", "flare", "fedcc")
PAPER_TABLE4 = {
    (0.1, "fmnist"): (55.31, 49.83, 34.02, 64.83, 16.57, 66.41, 52.24, 69.52),
    (0.1, "cifar10"): (10.06, 22.55, 14.50, 20.49, 10.00, 15.33, 10.00, 29.81),
    (0.3, "fmnist"): (64.22, 57.52, 10.00, 73.55, 16.26, 58.07, 10.00, 61.12),
    (0.3, "cifar10"): (24.24, 12.59, 10.00, 27.81, 10.98, 22.61, 10.00, 38.27),
    (0.5, "fmnist"): (62.37, 58.20, 10.00, 76.41, 18.36, 62.49, 10.00, 69.05),
    (0.5, "cifar10"): (23.99, 17.28, 10.06, 34.32, 9.87, 27.83, 10.00, 37.27),
}
# Table I's targeted cells also give each similarity's final backdoor confidence: (IID, NIID).
PAPER_TABLE1_CONFIDENCE = {
    "fedcc": (6e-07, 0.0118),
    "fedcc_linear_cka": (0.0007, 0.0616),
    "fedcc_mmd": (1e-09, 9e-05),
    "fedcc_cosine": (0.0002, 0.0529),
    "fedcc_euclidean": (0.0221, 0.0015),
}
# FedCC's (kernel CKA) row of it is the one number behind Fig. 4, which only plots the other rules' curves ("FedCC
# stays near 0 in every round; FedAvg, Krum and Bulyan oscillate"): dist -> value.
PAPER_FEDCC_BACKDOOR_CONFIDENCE = dict(zip(("iid", "noniid"), PAPER_TABLE1_CONFIDENCE["fedcc"]))
# Table V (targeted, non-IID, benign E = 6, attacker E_mal = 12): dataset -> (FedAvg, Coomed, FLARE, FedCC).
PAPER_TABLE5 = {"fmnist": (69.40, 72.11, 72.32, 82.31), "cifar10": (53.85, 49.18, 21.61, 54.94)}
# Fig. 5 (non-IID, K = 10, full participation, Fang-Krum and Fang-Med): accuracy against the number of attackers f,
# for Table IV's four rules. The paper draws curves only; f = 3 is Table III's cell (the same key).
FIG5_ATTACKERS = (1, 2, 3, 4)


def cell_key(scenario: str, dist: str, dataset: str, rule: str, variant: str = "") -> str:
  """``<scenario>__<dist>__<dataset>__<rule>``, plus ``__<variant>`` (Table IV ``k100_p0.1``, Table V ``e6``)."""
  return f"{scenario}__{dist}__{dataset}__{rule}" + (f"__{variant}" if variant else "")


DATALESS_SUFFIX = "__dl"  # the key of a cell run with --placement dataless: its fixed-placement key + this


def placement_of(args) -> str:
  placement = getattr(args, "placement", "fixed") or "fixed"
  if placement not in ("fixed", "dataless"):
    raise SystemExit(f"--placement: fixed or dataless, got {placement!r}")
  return placement


def fedcc_setting():
  from fedjax_robust.config_files import load_module
  return load_module(Path(__file__).resolve().parent / "configs" / "fedcc_setting.py")


def cell_config(scenario: str, dist: str, dataset: str, rule: str, variant: str, args):
  from fedjax_robust.config_files import load_module
  root = Path(__file__).resolve().parent
  config = load_module(root / "configs" / f"fedcc_{dataset}.py").get_config(f"{scenario},{dist},{rule}")
  rounds, epochs = config.rounds, config.client.epochs
  if variant.startswith("k100_p"):  # Table IV: K = 100, participation C, f = 30% of the clients (spec §2.6)
    config.data.num_clients, config.server.participation = 100, float(variant[len("k100_p"):])
    config.sampler.name = "stratified"  # exactly 30% of each round's participants are attackers
  elif variant == "e6":  # Table V: benign 6 epochs, the attacker 12 (spec §4.4)
    epochs, config.attack.client.epochs = 6, 12
  elif variant.startswith("f"):  # Fig. 5: f of the K clients are attackers (floor(K * fraction) of them)
    config.attack.fraction = int(variant[1:]) / config.data.num_clients
  if placement_of(args) == "dataless":  # after the variant: f follows its K, participation and fraction
    setting = fedcc_setting()
    if scenario not in setting.DATALESS_SCENARIOS:
      raise SystemExit(f"--placement dataless: untargeted cells only {setting.DATALESS_SCENARIOS}, not {scenario!r}")
    setting.use_dataless_attackers(config)
    config.output.name += "_dataless"
  config = grid.apply_run_args(config, args)
  config.rounds = args.rounds or rounds  # 0 = the scenario's own (spec §4.6)
  # Every cell evaluates every round (spec §2.7; Fig. 4's backdoor confidence curves): the per-round curves are
  # stored in the cell, its value is the final round's accuracy.
  config.eval_every = 1
  config.client.epochs = args.epochs or epochs
  return config


def record(summary, run_dir, config) -> dict:
  final = summary["final"]
  cell = {"value": 100.0 * final["global_test_acc"]}
  for key in ("backdoor_asr", "backdoor_confidence", "detection_tpr", "detection_fpr"):
    if key in final:
      cell[key] = final[key]
  return cell


def _fmt(cell) -> str:
  if cell is None:
    return "—"
  return grid.with_std(cell, "value")


def _reduced_note(cells) -> str:
  """The setup of ``cells`` (the ones a table shows, not every cell loaded: a note must not describe a cell the
  table leaves out), one part per distinct (rounds, epochs, samples per class, seeds)."""
  runs = sorted({(c.get("rounds"), c.get("epochs"), c.get("config", {}).get("data", {}).get("samples_per_class"),
                  grid.seeds_phrase(c)) for c in cells}, key=str)
  parts = [f"{r} rounds x E = {e}, {'all' if s is None else s} samples per class, {n}" for r, e, s, n in runs]
  return "Cells ran with: " + "; ".join(parts) + "."


def _ours_vs_paper(row_headers: list[str], columns: list[str], rows, note_prefix: str = "") -> str:
  """A table of ``ours / paper`` cells: ``rows`` = ``(row labels, cells, paper values)``; a row without any cell
  run yet is left out. Below it, ``note_prefix`` and the setup of the cells shown."""
  lines = ["| " + " | ".join(row_headers + [f"{c} ours / paper" for c in columns]) + " |",
           "|" + "---|" * (len(row_headers) + len(columns))]
  shown = {}
  for labels, cells, paper in rows:
    if any(cells):
      lines.append("| " + " | ".join(list(labels) + [f"{_fmt(c)} / {p:.2f}" for c, p in zip(cells, paper)]) + " |")
      shown.update({f"{col} ({', '.join(labels)})": c for col, c in zip(columns, cells) if c})
  return "\n".join(lines + ["", grid.with_seeds_note(note_prefix + _reduced_note(list(shown.values())), shown)]) + "\n"


def table2(results: dict) -> str:
  rows = [((DISTS[dist], DATASETS[dataset]), [results.get(cell_key("none", dist, dataset, r)) for r in RULES], paper)
          for (dist, dataset), paper in PAPER_TABLE2.items()]
  return _ours_vs_paper(["Setting", "Dataset"], list(RULES.values()), rows)


def table3(results: dict) -> str:
  rows = [((ATTACKS[attack], DISTS[dist], DATASETS[dataset]),
           [results.get(cell_key(attack, dist, dataset, r)) for r in RULES], paper)
          for (attack, dist, dataset), paper in PAPER_TABLE3.items()]
  return _ours_vs_paper(["Attack", "Dist", "Dataset"], list(RULES.values()), rows)


def table1(results: dict) -> str:
  """Table I's accuracies, then (once a targeted cell is stored) its final backdoor confidences, ours / paper."""
  rows = [((SIMILARITIES[rule],), [results.get(cell_key(a, d, "cifar10", rule)) for a, d in TABLE1_COLUMNS], paper)
          for rule, paper in PAPER_TABLE1.items()]
  accuracy = _ours_vs_paper(["Similarity"], [f"{ATTACKS[a]} {DISTS[d]}" for a, d in TABLE1_COLUMNS], rows)
  lines = []
  for rule, paper in PAPER_TABLE1_CONFIDENCE.items():
    curves = [_confidence_curve(results.get(cell_key("targeted", d, "cifar10", rule), {})) for d in ("iid", "noniid")]
    if any(curves):
      ours = ["—" if c is None else f"{c[-1]:.4f}" for c in curves]
      lines.append(f"| {SIMILARITIES[rule]} | " + " | ".join(f"{o} / {p:g}" for o, p in zip(ours, paper)) + " |")
  if not lines:
    return accuracy
  head = ["Targeted cells' final backdoor confidence (target-class softmax on D_mal at the last round, lower is "
          "better):", "", "| Similarity | Targeted IID ours / paper | Targeted non-IID ours / paper |", "|---|---|---|"]
  return accuracy + "\n" + "\n".join(head + lines) + "\n"


def table4(results: dict) -> str:
  columns = [f"FK:{RULES[r]}" for r in TABLE4_RULES] + [f"FM:{RULES[r]}" for r in TABLE4_RULES]
  rows = [((f"{frac:g}", DATASETS[dataset]),
           [results.get(cell_key(a, "noniid", dataset, r, f"k100_p{frac:g}"))
            for a in ("fang_krum", "fang_median") for r in TABLE4_RULES], paper)
          for (frac, dataset), paper in PAPER_TABLE4.items()]
  return _ours_vs_paper(["Frac", "Data"], columns, rows, "FK = Fang-Krum, FM = Fang-Med. ")


def table5(results: dict) -> str:
  """Table V's accuracies beside the paper's and, below them, the same cells' backdoor metrics (Fig. 4's columns:
  doubling the epochs is meant to strengthen the backdoor, so accuracy alone does not say whether it got in)."""
  rows = [((DATASETS[dataset],), [results.get(cell_key("targeted", "noniid", dataset, r, "e6")) for r in TABLE4_RULES],
           paper) for dataset, paper in PAPER_TABLE5.items()]
  text = _ours_vs_paper(["Dataset"], [RULES[r] for r in TABLE4_RULES], rows)
  backdoor, _ = _backdoor_rows(_targeted_rows(results, "e6"), with_paper=False)  # Table I's value is at E = 3
  return text + ("\nBackdoor metrics of the same cells (as Fig. 4's table):\n\n" +
                 "\n".join(BACKDOOR_HEADER + backdoor) + "\n" if backdoor else "")


def _confidence_curve(cell: dict) -> list[float] | None:
  """A targeted cell's backdoor confidence per round (the seeds' mean for a seeds cell), or ``None``."""
  curves = [r.get("backdoor_confidence_per_round") for r in grid.seed_runs(cell).values()]
  if all(curves):
    return [sum(v) / len(curves) for v in zip(*curves)]
  return None


def _targeted_rows(results: dict, variant: str = "") -> list[tuple[str, str, str, dict]]:
  """``(dist, dataset, rule, cell)`` of every stored targeted cell of ``variant`` (Table III's: none; Table V's:
  ``e6``), in the table's order."""
  return [(d, ds, r, results[cell_key("targeted", d, ds, r, variant)]) for d in DISTS for ds in DATASETS
          for r in RULES if cell_key("targeted", d, ds, r, variant) in results]


def fig4(results: dict) -> str:
  """Fig. 4 as a table: the targeted cells' backdoor confidence (mean softmax of the target class on D_mal, lower
  is better, spec §2.7) at the first, a third, two thirds and the last round and its maximum over rounds, the
  final backdoor accuracy (share of D_mal predicted as the target) and who was flagged at the last round."""
  lines, shown = _backdoor_rows(_targeted_rows(results))
  return "\n".join(BACKDOOR_HEADER + lines + ["", _reduced_note(shown)]) + "\n"


BACKDOOR_HEADER = ["| Dist | Dataset | Rule | accuracy % | backdoor confidence by round | max | final ours / paper | "
                   "backdoor acc. | last round TPR / FPR |", "|---" * 9 + "|"]


def _backdoor_rows(targeted_rows, with_paper: bool = True) -> tuple[list[str], list[dict]]:
  """Fig. 4's table rows below ``BACKDOOR_HEADER``, one per targeted cell with a per-round confidence curve, and
  the cells those rows show (for the setup note, so it describes exactly them); the paper's final value beside
  FedCC's CIFAR-10 cells is Table I's (its only number for the backdoor, at Table III's epochs: ``with_paper=False``
  for other settings)."""
  lines, shown = [], []
  for dist, dataset, rule, cell in targeted_rows:
    curve = _confidence_curve(cell)
    if curve is None:
      continue
    n = len(curve)
    marks = sorted({1, max(1, round(n / 3)), max(1, round(2 * n / 3)), n})
    by_round = ", ".join(f"{t}: {curve[t - 1]:.3f}" for t in marks)
    paper = (PAPER_FEDCC_BACKDOOR_CONFIDENCE[dist] if with_paper and rule == "fedcc" and dataset == "cifar10"
             else None)
    final = f"{curve[-1]:.4f} / " + ("—" if paper is None else f"{paper:g}")
    detection = (f"{cell['detection_tpr']:.2f} / {cell['detection_fpr']:.2f}" if "detection_tpr" in cell else "—")
    asr = f"{cell['backdoor_asr']:.2f}" if "backdoor_asr" in cell else "—"
    lines.append(f"| {DISTS[dist]} | {DATASETS[dataset]} | {RULES[rule]} | {_fmt(cell)} | {by_round} | "
                 f"{max(curve):.3f} | {final} | {asr} | {detection} |")
    shown.append(cell)
  return lines, shown


def fig4_figure(results: dict, path: Path) -> None:
  """Fig. 4's curves: backdoor confidence per round, one panel per (dist, dataset), one line per rule."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = [(d, ds, r, _confidence_curve(c)) for d, ds, r, c in _targeted_rows(results)]
  panels = sorted({(d, ds) for d, ds, _, curve in rows if curve}, key=lambda p: (list(DISTS).index(p[0]),
                                                                                  list(DATASETS).index(p[1])))
  if not panels:
    raise ValueError("no targeted cell with a per-round backdoor confidence in these results")
  fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
  for ax, (dist, dataset) in zip(axes[0], panels):
    for d, ds, rule, curve in rows:
      if (d, ds) == (dist, dataset) and curve:
        ax.plot(range(1, len(curve) + 1), curve, label=RULES[rule], lw=2.2 if rule == "fedcc" else 1.1,
                ls="-" if rule == "fedcc" else "--", color=f"C{list(RULES).index(rule)}")  # same colour per rule
    if dataset == "cifar10":  # the one number the paper gives: FedCC's final confidence (Table I)
      ax.axhline(PAPER_FEDCC_BACKDOOR_CONFIDENCE[dist], color="black", ls=":", lw=1,
                 label=f"paper: FedCC final ({PAPER_FEDCC_BACKDOOR_CONFIDENCE[dist]:g}, Table I)")
    ax.set(title=f"{DATASETS[dataset]}, {DISTS[dist]}: targeted backdoor (f = 1, boosted)", xlabel="round",
           ylabel="backdoor confidence (target-class softmax on D_mal)", ylim=(0, 1))
    ax.legend(fontsize=8)
  grid.save_figure(fig, path)


def fig5_variant(f: int) -> str:
  """Fig. 5's cell variant for ``f`` attackers: f = 3 is Table III's own cell (no variant)."""
  return "" if f == 3 else f"f{f}"


def _fig5_rows(results: dict) -> list[tuple[str, str, str, list[dict | None]]]:
  """``(attack, dataset, rule, [cell at f = 1..4])`` of every (attack, dataset, rule) with a cell at f != 3 (Table
  III's f = 3 cells alone do not make a Fig. 5 curve)."""
  rows = []
  for attack in ("fang_krum", "fang_median"):
    for dataset in DATASETS:
      for rule in TABLE4_RULES:
        cells = [results.get(cell_key(attack, "noniid", dataset, rule, fig5_variant(f))) for f in FIG5_ATTACKERS]
        if any(c for f, c in zip(FIG5_ATTACKERS, cells) if f != 3):
          rows.append((attack, dataset, rule, cells))
  return rows


def fig5_checks(results: dict) -> list[tuple[str, bool | None, str]]:
  """The paper's two claims about Fig. 5 (§VII-A), per attack and dataset with cells: FedCC has the highest accuracy
  at every f, and Coomed's accuracy falls the most from f = 1 to f = 4 (of the three defenses), as ``(claim, met /
  NOT met / None = not run, the numbers)``."""
  by_panel: dict[tuple[str, str], dict[str, list[dict | None]]] = {}
  for attack, dataset, rule, cells in _fig5_rows(results):
    by_panel.setdefault((attack, dataset), {})[rule] = cells
  checks = []
  for (attack, dataset), rules in by_panel.items():
    where = f"{ATTACKS[attack]}, {DATASETS[dataset]}"
    complete = [r for r in TABLE4_RULES if all(rules.get(r, [None])[i] for i in range(len(FIG5_ATTACKERS)))]
    if "fedcc" in complete and len(complete) > 1:
      wins = [all(rules["fedcc"][i]["value"] >= rules[r][i]["value"] for r in complete)
              for i in range(len(FIG5_ATTACKERS))]
      checks.append((f"FedCC highest at every f ({where})", all(wins),
                     "best at f = " + ", ".join(str(f) for f, w in zip(FIG5_ATTACKERS, wins) if w) if any(wins)
                     else "best at no f"))
    else:
      checks.append((f"FedCC highest at every f ({where})", None, "needs FedCC and another rule at every f"))
    defenses = [r for r in ("median", "flare", "fedcc") if r in complete]
    if "median" in defenses and len(defenses) > 1:
      drops = {r: rules[r][0]["value"] - rules[r][-1]["value"] for r in defenses}
      checks.append((f"Coomed falls the most of the defenses from f = 1 to 4 ({where})",
                     max(drops, key=drops.get) == "median",
                     "drops: " + ", ".join(f"{RULES[r]} {d:.2f}" for r, d in drops.items())))
    else:
      checks.append((f"Coomed falls the most of the defenses from f = 1 to 4 ({where})", None,
                     "needs Coomed and another defense at every f"))
  return checks


def fig5(results: dict) -> str:
  """Fig. 5 as a table: the final global accuracy (%) at f = 1..4 attackers of 10 (non-IID), then the paper's two
  claims checked on our cells (it gives no numbers)."""
  lines = ["| Attack | Dataset | Rule | " + " | ".join(f"f = {f}" for f in FIG5_ATTACKERS) + " |",
           "|---" * (3 + len(FIG5_ATTACKERS)) + "|"]
  rows = _fig5_rows(results)
  for attack, dataset, rule, cells in rows:
    lines.append(f"| {ATTACKS[attack]} | {DATASETS[dataset]} | {RULES[rule]} | "
                 + " | ".join(_fmt(c) for c in cells) + " |")
  if not rows:
    return "(no Fig. 5 cell in these results: cells at f = 1, 2 or 4)\n"
  present = {k: results[k] for attack, dataset, rule, _ in rows for f in FIG5_ATTACKERS
             if (k := cell_key(attack, "noniid", dataset, rule, fig5_variant(f))) in results}
  status = {True: "met", False: "NOT met", None: "not run"}
  claims = [f"- {claim}: {status[ok]} ({numbers})." for claim, ok, numbers in fig5_checks(results)]
  return "\n".join(lines + ["", "The paper's claims (§VII-A; curves only, no numbers), on these cells:", *claims, "",
                            _reduced_note(present.values())]) + "\n"


def fig5_figure(results: dict, path: Path) -> None:
  """Fig. 5's curves: final accuracy against the number of attackers, one panel per (attack, dataset), one line per
  rule (± the std over seeds as error bars when a cell has several)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = _fig5_rows(results)
  panels = list(dict.fromkeys((a, ds) for a, ds, _, _ in rows))
  if not panels:
    raise ValueError("no Fig. 5 cell (f = 1, 2 or 4 attackers) in these results")
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
  for ax, (attack, dataset) in zip(axes[0], panels):
    for a, ds, rule, cells in rows:
      if (a, ds) != (attack, dataset):
        continue
      points = [(f, c["value"], c.get("value_std", 0.0)) for f, c in zip(FIG5_ATTACKERS, cells) if c]
      fs, values, stds = zip(*points)
      ax.errorbar(fs, values, yerr=stds, marker="o", capsize=3, label=RULES[rule],
                  lw=2.2 if rule == "fedcc" else 1.1, color=f"C{list(RULES).index(rule)}")  # same colour per rule
    ax.set(title=f"{ATTACKS[attack]}, {DATASETS[dataset]}, non-IID (K = 10)", xlabel="malicious clients f (of 10)",
           ylabel="global test accuracy (%)", xticks=list(FIG5_ATTACKERS))
    ax.legend(fontsize=8)
  cells = [c for _, _, _, row in rows for c in row if c]
  fig.suptitle(_reduced_note(cells).removeprefix("Cells ran with: "), fontsize=8)
  grid.save_figure(fig, path)


def placement(results: dict) -> str:
  """Every cell stored with both attacker placements (spec §2.6): fixed attacker ids 0..f-1 (the spec's alternative,
  our default) beside the code's dataless attackers ([R], keys ending ``__dl``), and the paper's number where a table
  gives one (Table III at K = 10, Table IV at K = 100)."""
  lines = ["| Attack | Dist | Dataset | Rule | Variant | fixed ids | dataless | dataless − fixed | paper |",
           "|---" * 9 + "|"]
  present = {}
  rows = []  # (fixed key, dataless key, attack, dist, dataset, rule, variant)
  for key in results:
    if key.endswith(DATALESS_SUFFIX):
      base = key[: -len(DATALESS_SUFFIX)]
      attack, dist, dataset, rule, *rest = base.split("__")
      rows.append((base, key, attack, dist, dataset, rule, rest[0] if rest else ""))
  rank = lambda value, known: list(known).index(value) if value in known else len(known)
  # the tables' order: attack, dist, dataset, variant, then RULES' order of the rules
  rows.sort(key=lambda r: (rank(r[2], ATTACKS), rank(r[3], DISTS), rank(r[4], DATASETS), r[6],
                           rank(r[5], {**RULES, **SIMILARITIES}), r[5]))
  for base, key, attack, dist, dataset, rule, variant in rows:
    fixed, dataless = results.get(base), results[key]
    present[key] = dataless
    if fixed is not None:
      present[base] = fixed
    paper = None
    if not variant and rule in RULES:
      paper = PAPER_TABLE3.get((attack, dist, dataset), (None,) * len(RULES))[list(RULES).index(rule)]
    elif variant.startswith("k100_p") and rule in TABLE4_RULES:
      row = PAPER_TABLE4.get((float(variant[len("k100_p"):]), dataset))
      paper = None if row is None else row[4 * ("fang_median" == attack) + TABLE4_RULES.index(rule)]
    gap = "—" if fixed is None else f"{dataless['value'] - fixed['value']:+.2f}"
    lines.append(f"| {ATTACKS.get(attack, attack)} | {DISTS.get(dist, dist)} | {DATASETS.get(dataset, dataset)} | "
                 f"{RULES.get(rule, SIMILARITIES.get(rule, rule))} | {variant or '—'} | {_fmt(fixed)} | "
                 f"{_fmt(dataless)} | {gap} | {'—' if paper is None else f'{paper:.2f}'} |")
  if not present:
    return "(no cell stored with --placement dataless in these results)\n"
  return "\n".join(lines + ["", _reduced_note(present.values())]) + "\n"


def _seed_runs(results: dict):
  """``(label, record)`` of every run in ``results``: a cell as it is, and a cell pooled over seeds
  (``grid.pool_seed_cells``, or a vmapped seeds program) as one record per seed, labelled ``key (seed N)``, since
  per-round series are per run and a mean of them would hide the rounds a table counts."""
  for key, cell in results.items():
    for seed, record in grid.seed_runs(cell).items():
      yield (key if seed is None else f"{key} (seed {seed})"), record


def rule_of(key: str) -> str | None:
  """The rule field of a :func:`cell_key` (``fang_krum__iid__cifar10__fedcc@scores`` -> ``fedcc``; a suffix after
  ``@`` names a rerun of the same cell), or None for a key of another shape."""
  fields = key.split("__")
  return fields[3].split("@")[0] if len(fields) >= 4 else None


def scores(results: dict) -> str:
  """Why FedCC's 2-means split does or does not find the attackers: for every stored FedCC run (kernel CKA, or a
  Table I similarity, whose scores the column then holds) that kept each round's score range of the cohort's benign
  clients and attackers (``grid.per_round_series``), the ranges over all rounds, in how many rounds every attacker
  scored above (below) every benign client, in how many rounds the rule kept an attacker and dropped a benign
  client (the per-round detection counts, where the cell kept them), and the last round's detection rates. A
  cell pooled over seeds gives one row per seed (:func:`_seed_runs`); runs without the ranges are left out, and so
  are other rules' runs (Krum's records keep ranges of Krum distances, which are not similarities and would read
  wrongly under this header)."""
  lines = ["| Cell | benign CKA [min, max] | attackers' CKA [min, max] | rounds attackers above / below / "
           "inside | rounds an attacker kept / a benign client dropped | TPR | FPR | acc. |", "|---" * 8 + "|"]
  for key, cell in _seed_runs({k: c for k, c in results.items() if rule_of(k) in SIMILARITIES}):
    benign, attackers = cell.get("benign_score_range_per_round"), cell.get("attacker_score_range_per_round")
    if not benign or not attackers:
      continue
    pairs = [(b, a) for b, a in zip(benign, attackers) if b and a]
    above = sum(a[0] > b[1] for b, a in pairs)
    below = sum(a[1] < b[0] for b, a in pairs)
    span = lambda ranges: f"[{min(r[0] for r in ranges if r):.4f}, {max(r[1] for r in ranges if r):.4f}]"  # noqa: E731
    rate = lambda name: "—" if cell.get(name) is None else f"{cell[name]:.2f}"  # noqa: E731
    kept, dropped = cell.get("detection_fn_per_round"), cell.get("detection_fp_per_round")
    errors = "—" if kept is None or dropped is None else f"{sum(n > 0 for n in kept)} / {sum(n > 0 for n in dropped)}"
    lines.append(f"| {key} | {span(benign)} | {span(attackers)} | {above} / {below} / {len(pairs) - above - below} "
                 f"| {errors} | {rate('detection_tpr')} | {rate('detection_fpr')} | {cell['value']:.2f} |")
  if len(lines) == 2:
    return "(no stored FedCC run kept the per-round score ranges of its benign clients and attackers)\n"
  return "\n".join(lines) + "\n"


TABLES = {"table2": table2, "table3": table3, "table1": table1, "table4": table4, "table5": table5, "fig4": fig4,
          "fig5": fig5, "placement": placement, "scores": scores}
FIGURES = {"fig4": fig4_figure, "fig5": fig5_figure}


def cells_of(mode: str, datasets, dists, rules, attacks=tuple(ATTACKS), attackers=FIG5_ATTACKERS
             ) -> list[tuple[str, str, str, str, str]]:
  """``(scenario, dist, dataset, rule, variant)`` of every cell of ``mode`` (``attackers``: Fig. 5's f values)."""
  if mode == "table2":
    return [("none", d, ds, r, "") for ds in datasets for d in dists for r in rules]
  if mode == "table3":
    return [(a, d, ds, r, "") for a in attacks for ds in datasets for d in dists for r in rules]
  if mode == "fig4":  # Table III's targeted cells (the same keys), evaluated every round
    return [("targeted", d, ds, r, "") for ds in datasets for d in dists for r in rules]
  if mode == "table4":
    return [(a, "noniid", ds, r, f"k100_p{f:g}") for f in (0.1, 0.3, 0.5) for ds in datasets if ds != "cifar100"
            for a in attacks if a != "targeted" for r in rules if r in TABLE4_RULES]
  if mode == "table5":
    return [("targeted", "noniid", ds, r, "e6") for ds in datasets if ds != "cifar100" for r in rules
            if r in TABLE4_RULES]
  if mode == "fig5":  # f = 3 is Table III's cell (the same key): leave it out of `attackers` to reuse a stored one
    return [(a, "noniid", ds, r, fig5_variant(f)) for ds in datasets if ds != "cifar100" for a in attacks
            if a != "targeted" for r in rules if r in TABLE4_RULES for f in attackers]
  return [(a, d, "cifar10", r, "") for a, d in TABLE1_COLUMNS if d in dists and a in attacks
          for r in SIMILARITIES if rules is None or r in rules]


def attackers_of(value: str) -> tuple[int, ...]:
  found = tuple(int(v) for v in value.replace(" ", "").split(",") if v)
  if not found or any(f not in FIG5_ATTACKERS for f in found):
    raise SystemExit(f"--attackers: numbers of attackers from {FIG5_ATTACKERS} (Fig. 5), got {value!r}")
  return found


def figure_of(mode: str):
  if mode not in FIGURES:
    raise SystemExit(f"--figure: --mode {mode} draws no figure (only {', '.join(FIGURES)})")
  return FIGURES[mode]


def table_from_json(paths, mode: str) -> str:
  """The mode's table from one stored results file or several (``grid.load_pooled``: a key stored as one-seed cells
  in several files is pooled into mean ± std over their seeds)."""
  return TABLES[mode](grid.load_pooled(paths))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--mode", choices=tuple(TABLES), default="table3")
  parser.add_argument("--datasets", default="fmnist,cifar10,cifar100")
  parser.add_argument("--dists", default="noniid,iid")
  parser.add_argument("--rules", default="", help="comma-separated rules (default: the table's all; --mode table1: "
                      "similarities, " + ",".join(SIMILARITIES) + ")")
  parser.add_argument("--attacks", default=",".join(ATTACKS),
                      help="--mode table3 / table1 / fig5: which attacks, in this order")
  parser.add_argument("--attackers", default=",".join(map(str, FIG5_ATTACKERS)),
                      help="--mode fig5: which numbers of attackers f (of 10) to run; 3 is Table III's cell, the "
                           "same key, so leave it out to show a stored Table III cell from the same --out_dir")
  parser.add_argument("--placement", choices=("fixed", "dataless"), default="fixed",
                      help="attackers: fixed ids 0..f-1 whose partitions never train (default, spec §2.6's "
                           "alternative), or dataless = FedCC's code ([R]): f crafted models besides n - f benign "
                           "clients drawn from all partitions every round; untargeted cells only, keyed <key>__dl. "
                           "--mode placement --from_json shows the two side by side")
  parser.add_argument("--from_json", default=None,
                      help="print the mode's table from stored results files (comma-separated; a cell stored as "
                           "one-seed runs in several files is shown as mean ± std over those seeds) and exit")
  parser.add_argument("--figure", default="", help="fig4 / fig5: also draw the figure's curves to this PNG (+SVG)")
  grid.add_common_args(parser, "runs/fedcc")
  parser.set_defaults(rounds=0, epochs=0, seeds="0,1,2")
  args = parser.parse_args()
  if args.from_json:
    print(table_from_json(args.from_json, args.mode), end="")
    if args.figure:
      figure_of(args.mode)(grid.load_pooled(args.from_json), Path(args.figure))
    return
  logging.basicConfig(level=logging.WARNING)
  pick = lambda value, allowed: [v for v in value.split(",") if v in allowed] or list(allowed)
  if args.mode == "placement":
    raise SystemExit("--mode placement only prints stored cells (--from_json); run their cells with --mode table3 / "
                     "table4 / fig5 --placement dataless")
  if args.mode == "scores":
    raise SystemExit("--mode scores only prints stored cells (--from_json); any attacked FedCC cell run since the "
                     "rules log detection_scores keeps its per-round score ranges")
  suffix = DATALESS_SUFFIX if args.placement == "dataless" else ""
  cells = [(cell_key(*c) + suffix, cell_config(*c, args), record)
           for c in cells_of(args.mode, pick(args.datasets, DATASETS), pick(args.dists, DISTS),
                             pick(args.rules, SIMILARITIES if args.mode == "table1" else RULES),
                             pick(args.attacks, ATTACKS), attackers_of(args.attackers))]
  draw = figure_of(args.mode) if args.figure else None  # refused before any cell runs
  # Dataless cells are keyed <key>__dl, which the mode's table does not read: show them beside any fixed ones.
  print(grid.run_and_tabulate(cells, args, placement if suffix else TABLES[args.mode]))
  if draw is not None:
    draw(grid.merged_results(Path(args.out_dir)), Path(args.figure))


if __name__ == "__main__":
  main()
