"""FedALC: Table I (MNIST / Fashion-MNIST, natural and robust accuracy) and Table II (CIFAR-10, natural accuracy),
spec §5.1-5.3.

Every cell is ``experiments/configs/fedalc_<dataset>.py:<method>,<alpha>`` (methods ``fedavg`` = FedAvg-AT,
``fedprox`` = FedProx-AT, ``fedalc``, and ``natural``, clean FedAvg, a reference row the paper does not have), run
at ``--seeds`` (default 0,1,2: one vmapped program per cell). Cells are keyed ``<dataset>__a<alpha>__<method>``.

A cell's number per metric is the paper's (spec §2.4): the mean, in %, over the evaluated rounds of the last-rounds
window (``eval.last_rounds``, 10: rounds T-9..T) of that metric, per seed. Natural = ``global_test_acc`` (the full
official test set); FGSM / BIM / CW / PGD = ``robust_acc_*`` (the first ``eval.robust.examples`` test images when
that is > 0). One seed: shown as mean ± the std over the window's rounds (the paper's ±, A16). Several seeds: the
mean over seeds of the per-seed window means ± their std across seeds; the table's note says which. Cells also
keep the per-round curves of every metric (Figs. 2-5), the config, seeds, commit and device (``grid.run_cells``).

  python experiments/fedalc_tables.py --data_dir ../shared/data --mode table1                # 2 x 4 x 3 cells
  python experiments/fedalc_tables.py --data_dir ../shared/data --mode table2                # 8 x 3 cells
  python experiments/fedalc_tables.py --data_dir ../shared/data --mode table1 --datasets mnist --alphas 0.1,1.0 \\
      --methods fedavg,fedprox,fedalc,natural --rounds 20 --set eval.robust.examples=1000   # a reduced run
  python experiments/fedalc_tables.py --mode table1 --from_json runs/fedalc/results.json
  python experiments/fedalc_tables.py --mode table1 --from_json seed0.json,seed1.json,seed2.json  # pooled seeds

``--rounds`` / ``--epochs`` default to each dataset's own (spec §1.7: 100 rounds MNIST/FMNIST, 60 CIFAR-10; local
epochs 1 MNIST, 5 FMNIST/CIFAR-10); giving them reduces every cell (the window shrinks to min(10, rounds) rounds),
and the stored cells say so (``protocol``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import grid  # noqa: E402

# ours -> (label, the paper's rounds, the paper's local epochs), spec §1.7 (= experiments/configs/fedalc_setting.py)
DATASETS = {"mnist": ("MNIST", 100, 1), "fmnist": ("Fashion-MNIST", 100, 5), "cifar10": ("CIFAR-10", 60, 5)}
DATA_NAMES = {"mnist": "mnist", "fashion_mnist": "fmnist", "cifar10": "cifar10"}  # config data.name -> ours
METHODS = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedalc": "FedALC", "natural": "Natural FedAvg (ref.)"}
PAPER_METHODS = ("fedavg", "fedprox", "fedalc")
# A cell's metrics: name -> the metrics.jsonl key (a fraction; cells store %). Table I's columns in the paper's order.
METRICS = {"natural": "global_test_acc", "fgsm": "robust_acc_fgsm", "bim": "robust_acc_bim", "cw": "robust_acc_cw",
           "pgd": "robust_acc_pgd", "robust_natural": "robust_natural_acc",
           "worst_class": "global_worst_class_acc"}  # with eval.metrics ...,class_accuracy (not a paper column)
TABLE1_COLUMNS = {"natural": "Natural", "fgsm": "FGSM", "bim": "BIM", "cw": "CW", "pgd": "PGD"}
TABLE1_DATASETS = ("mnist", "fmnist")
TABLE1_ALPHAS = (0.05, 0.1, 0.5, 1.0)
TABLE2_ALPHAS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 2.0, 5.0)
# The evaluation attacks of spec §2.2 (eval.robust): a stored cell that ran others says so in the note.
SPEC_ROBUST = {"attacks": "fgsm,bim,pgd,cw", "eps": 8 / 255, "step_size": 2 / 255, "steps": 10, "cw_c": 1.0,
               "cw_kappa": 0.0, "cw_steps": 50, "cw_lr": 0.01}

# specs/fedalc.md §5.1-5.2, verbatim: (dataset, alpha, method) -> (mean, ±) for Natural, FGSM, BIM, CW, PGD.
PAPER_TABLE1 = {
    ("mnist", 0.05, "fedavg"): ((83.84, 0.22), (40.15, 0.21), (39.83, 0.16), (41.44, 0.16), (39.96, 0.21)),
    ("mnist", 0.05, "fedprox"): ((80.12, 0.31), (38.25, 0.14), (37.95, 0.20), (38.58, 0.40), (38.13, 0.19)),
    ("mnist", 0.05, "fedalc"): ((85.62, 0.21), (40.76, 0.19), (40.65, 0.22), (42.42, 0.37), (40.43, 0.26)),
    ("mnist", 0.1, "fedavg"): ((79.51, 0.43), (38.56, 0.20), (38.24, 0.27), (39.54, 0.26), (38.57, 0.25)),
    ("mnist", 0.1, "fedprox"): ((71.70, 0.25), (33.74, 0.25), (33.21, 0.36), (36.67, 0.22), (33.69, 0.29)),
    ("mnist", 0.1, "fedalc"): ((82.62, 0.35), (40.00, 0.20), (40.02, 0.17), (41.41, 0.20), (40.11, 0.26)),
    ("mnist", 0.5, "fedavg"): ((95.35, 0.09), (46.84, 0.07), (46.73, 0.05), (47.64, 0.06), (46.72, 0.05)),
    ("mnist", 0.5, "fedprox"): ((92.14, 0.19), (45.42, 0.14), (45.27, 0.11), (46.82, 0.12), (45.35, 0.14)),
    ("mnist", 0.5, "fedalc"): ((95.90, 0.11), (47.06, 0.03), (46.91, 0.05), (47.98, 0.04), (46.91, 0.06)),
    ("mnist", 1.0, "fedavg"): ((96.00, 0.10), (47.36, 0.03), (47.16, 0.05), (47.74, 0.05), (47.15, 0.04)),
    ("mnist", 1.0, "fedprox"): ((94.27, 0.12), (46.63, 0.05), (46.32, 0.06), (47.63, 0.03), (46.32, 0.06)),
    ("mnist", 1.0, "fedalc"): ((96.40, 0.02), (47.58, 0.05), (47.34, 0.03), (48.30, 0.03), (47.45, 0.06)),
    ("fmnist", 0.05, "fedavg"): ((69.85, 0.39), (29.91, 0.45), (29.41, 0.28), (35.64, 0.20), (28.70, 0.18)),
    ("fmnist", 0.05, "fedprox"): ((66.30, 0.64), (29.66, 0.15), (28.76, 0.23), (32.37, 0.26), (27.98, 0.17)),
    ("fmnist", 0.05, "fedalc"): ((71.84, 0.56), (30.80, 0.15), (29.73, 0.19), (36.79, 0.22), (30.18, 0.14)),
    ("fmnist", 0.1, "fedavg"): ((69.94, 0.44), (30.33, 0.26), (29.62, 0.12), (34.68, 0.22), (29.31, 0.16)),
    ("fmnist", 0.1, "fedprox"): ((63.81, 0.72), (29.17, 0.10), (28.01, 0.16), (31.99, 0.24), (28.28, 0.13)),
    ("fmnist", 0.1, "fedalc"): ((72.38, 0.55), (31.84, 0.13), (31.24, 0.11), (36.92, 0.15), (30.78, 0.14)),
    ("fmnist", 0.5, "fedavg"): ((84.27, 0.05), (37.67, 0.11), (36.65, 0.07), (42.14, 0.06), (36.47, 0.07)),
    ("fmnist", 0.5, "fedprox"): ((82.82, 0.35), (36.93, 0.05), (35.56, 0.11), (39.96, 0.17), (36.29, 0.06)),
    ("fmnist", 0.5, "fedalc"): ((84.21, 0.10), (38.07, 0.08), (36.80, 0.05), (41.76, 0.05), (37.22, 0.10)),
    ("fmnist", 1.0, "fedavg"): ((84.96, 0.09), (38.21, 0.09), (37.01, 0.07), (42.28, 0.03), (37.25, 0.07)),
    ("fmnist", 1.0, "fedprox"): ((84.39, 0.10), (37.52, 0.09), (36.66, 0.03), (42.14, 0.05), (36.53, 0.08)),
    ("fmnist", 1.0, "fedalc"): ((85.29, 0.11), (38.76, 0.09), (37.52, 0.06), (42.70, 0.03), (37.69, 0.10)),
}
# specs/fedalc.md §5.3, verbatim: method -> (mean, ±) natural accuracy at each of TABLE2_ALPHAS (CIFAR-10).
PAPER_TABLE2 = {
    "fedavg": ((32.99, 2.20), (40.07, 2.18), (49.67, 1.79), (56.64, 0.68), (60.75, 0.48), (61.95, 0.59), (62.63, 0.58),
               (64.18, 0.46)),
    "fedprox": ((30.14, 2.24), (34.62, 2.83), (52.34, 1.07), (57.34, 0.49), (59.56, 0.81), (61.41, 0.47),
                (63.46, 0.44), (63.97, 0.66)),
    "fedalc": ((35.99, 1.81), (43.12, 1.40), (51.50, 1.39), (57.92, 0.69), (60.97, 0.63), (62.24, 0.56), (63.65, 0.41),
               (63.94, 0.58)),
}

# Spec §5.5's acceptance targets: FedALC's natural gain over FedAvg, in points.
GAIN_LOW_ALPHA = (1.0, 4.0)  # at alpha <= 0.1
GAIN_HIGH_ALPHA = 0.6  # |gain| at alpha >= 0.5


def paper_value(dataset: str, alpha: float, method: str, metric: str = "natural") -> tuple[float, float] | None:
  """The paper's (mean, ±) of a cell's metric, or None where the paper has no such number."""
  if dataset == "cifar10":
    if metric != "natural" or method not in PAPER_TABLE2 or alpha not in TABLE2_ALPHAS:
      return None
    return PAPER_TABLE2[method][TABLE2_ALPHAS.index(alpha)]
  row = PAPER_TABLE1.get((dataset, alpha, method))
  return None if row is None or metric not in TABLE1_COLUMNS else row[list(TABLE1_COLUMNS).index(metric)]


# ------------------------------------------------------------------------------------------ cells
def cell_key(dataset: str, alpha: float, method: str) -> str:
  return f"{dataset}__a{alpha:g}__{method}"


def cell_config(dataset: str, alpha: float, method: str, args):
  """The config of one cell: the dataset's FedALC setting for ``<method>,<alpha>``, the grid-wide flags applied,
  rounds / local epochs the dataset's own unless ``--rounds`` / ``--epochs`` reduce them, the evaluation schedule
  kept (every 10 rounds and each of the last min(10, rounds)); ``--set`` overrides win over all of it."""
  from fedjax_robust.config_files import load_module
  root = Path(__file__).resolve().parent
  config = load_module(root / "configs" / f"fedalc_{dataset}.py").get_config(f"{method},{alpha:g}")
  rounds, epochs, eval_every = config.rounds, config.client.epochs, config.eval_every
  config = grid.apply_run_args(config, args)
  config.rounds = args.rounds or rounds  # 0 = the dataset's own (spec §1.7)
  config.client.epochs = args.epochs or epochs
  config.eval_every = eval_every
  grid.apply_overrides(config, args.set)  # again: an explicit --set (eval_every, say) wins over the lines above
  config.eval.last_rounds = min(int(config.eval.last_rounds), int(config.rounds))
  return config


def protocol(config) -> dict:
  """What a cell ran against the paper's setting: its rounds / local epochs, the paper's, and the window."""
  dataset = DATA_NAMES[config.data.name]
  _, paper_rounds, paper_epochs = DATASETS[dataset]
  rounds, epochs = int(config.rounds), int(config.client.epochs)
  return {"dataset": dataset, "rounds": rounds, "paper_rounds": paper_rounds, "epochs": epochs,
          "paper_epochs": paper_epochs, "last_rounds": int(config.eval.last_rounds),
          "reduced": rounds != paper_rounds or epochs != paper_epochs}


def window_rounds(rows: list[dict], last_rounds: int, key: str = "global_test_acc") -> list[int]:
  """The rounds of ``rows`` (metrics.jsonl records) that logged ``key`` within the last ``last_rounds`` rounds of
  the run (rounds T-last_rounds+1..T; ``last_rounds`` 0 = the last evaluation only)."""
  if not rows:
    return []
  last = max(int(r["round"]) for r in rows)
  logged = [int(r["round"]) for r in rows if key in r]
  if last_rounds <= 0:
    return logged[-1:]
  return [t for t in logged if t > last - last_rounds]


def window_stats(rows: list[dict], key: str, last_rounds: int) -> tuple[float, float, int] | None:
  """``(mean, std, n)`` in % of ``key`` over the evaluated rounds in the last-rounds window (spec §2.4): the std is
  over those rounds (population, ddof = 0: the paper's ± as A16 reads it). None when no such round logged it."""
  rounds = set(window_rounds(rows, last_rounds, key))
  values = [100.0 * float(r[key]) for r in rows if int(r["round"]) in rounds]
  if not values:
    return None
  mean = sum(values) / len(values)
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)), len(values)


def read_metrics(run_dir: Path) -> list[dict]:
  return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def record_rows(rows: list[dict], config) -> dict:
  """A run's cell fields from its metrics.jsonl records: per metric its window mean (``<name>``, %) and window std
  (``<name>_window_std``), ``value`` = natural accuracy, the window's rounds, ``protocol``, ``curves``: every
  evaluated round's metrics as logged (fractions), for the figures, and with the ``class_accuracy`` evaluator
  ``class_acc``: each class's window mean (%)."""
  last_rounds = int(config.eval.last_rounds)
  cell: dict = {}
  for name, key in METRICS.items():
    stats = window_stats(rows, key, last_rounds)
    if stats is not None:
      cell[name], cell[f"{name}_window_std"], _ = stats
  if "natural" not in cell:
    raise KeyError("the run logged no global_test_acc in its last-rounds window")
  cell["value"] = cell["natural"]
  in_window = set(window_rounds(rows, last_rounds, "global_class_acc"))
  per_class = [r["global_class_acc"] for r in rows if r["round"] in in_window and "global_class_acc" in r]
  if per_class:  # each class's window mean (%); None for a class without test rows
    cell["class_acc"] = [None if np.isnan(col).all() else 100.0 * float(np.nanmean(col))
                         for col in np.asarray(per_class, float).T]
  evaluated = [r for r in rows if "global_test_acc" in r]
  cell["window_rounds"] = window_rounds(rows, last_rounds)
  cell["curves"] = {"round": [int(r["round"]) for r in evaluated],
                    **{key: [r.get(key) for r in evaluated] for key in METRICS.values()
                       if any(key in r for r in evaluated)}}
  cell["protocol"] = protocol(config)
  return cell


def record(summary, run_dir, config) -> dict:
  return record_rows(read_metrics(run_dir), config)


def hoist_per_seed_fields(cell: dict) -> dict:
  """A seeds cell keeps ``record``'s non-numeric fields per seed (``grid._seed_cells``); lift the ones every seed
  shares (``protocol``, ``window_rounds``) to the cell, so the stored cell itself says what it ran."""
  per_seed = list(cell.get("per_seed", {}).values())
  for field in ("protocol", "window_rounds"):
    if per_seed and field not in cell and all(r.get(field) == per_seed[0].get(field) for r in per_seed):
      cell[field] = per_seed[0].get(field)
  return cell


def cells_of(mode: str, datasets, alphas, methods) -> list[tuple[str, float, str]]:
  """``(dataset, alpha, method)`` of every cell of ``mode``."""
  datasets = ["cifar10"] if mode == "table2" else datasets or list(TABLE1_DATASETS)
  bad = [d for d in datasets if d not in (("cifar10",) if mode == "table2" else TABLE1_DATASETS)]
  if bad:
    raise ValueError(f"--mode {mode} has no dataset {bad}")
  alphas = alphas or (TABLE2_ALPHAS if mode == "table2" else TABLE1_ALPHAS)
  return [(d, float(a), m) for d in datasets for a in alphas for m in methods]


# ------------------------------------------------------------------------------------------ tables
def shown(cell: dict | None, metric: str) -> tuple[float, float] | None:
  """``(mean, ±)`` a table shows for a cell's metric: one seed -> the window std; several -> the std across seeds."""
  if cell is None or metric not in cell:
    return None
  std = cell.get(f"{metric}_std") if grid.n_seeds(cell) > 1 else cell.get(f"{metric}_window_std")
  return cell[metric], std


def _fmt(pair) -> str:
  if pair is None:
    return "—"
  mean, std = pair
  return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def _alphas_of(results: dict, dataset: str, paper_alphas) -> list[float]:
  ran = {float(k.split("__")[1][1:]) for k in results if k.startswith(f"{dataset}__a")}
  return sorted(set(paper_alphas) | ran)


def _methods_of(results: dict) -> list[str]:
  return [m for m in METHODS if any(k.endswith(f"__{m}") for k in results)]


def _cell_protocol(cell: dict) -> dict:
  """The stored ``protocol`` (a seeds cell: hoisted, else its first seed's), else derived from the stored config."""
  found = cell.get("protocol") or next(iter(cell.get("per_seed", {}).values()), {}).get("protocol")
  if found:
    return found
  cfg = cell["config"]
  dataset = DATA_NAMES[cfg["data"]["name"]]
  rounds, epochs = int(cfg["rounds"]), int(cfg["client"]["epochs"])
  return {"dataset": dataset, "rounds": rounds, "paper_rounds": DATASETS[dataset][1], "epochs": epochs,
          "paper_epochs": DATASETS[dataset][2], "last_rounds": int(cfg["eval"]["last_rounds"]),
          "reduced": (rounds, epochs) != DATASETS[dataset][1:]}


def _robust_note(cfg: dict) -> str:
  robust = cfg.get("eval", {}).get("robust")
  if not robust or "robust" not in str(cfg.get("eval", {}).get("metrics", "")):
    return ""
  parts = []
  if int(robust.get("examples", 0)) > 0:
    parts.append(f"robust columns on the first {int(robust['examples'])} test images")
  for key, spec in SPEC_ROBUST.items():
    ours = robust.get(key)
    same = ours == spec if isinstance(spec, str) else ours is not None and math.isclose(float(ours), spec)
    if not same:
      parts.append(f"eval.robust.{key} = {ours} (spec §2.2: {spec:g})" if not isinstance(spec, str) else
                   f"eval.robust.{key} = {ours} (spec §2.2: {spec})")
  return ", ".join(parts)


def _calibration_note(cfg: dict) -> str:
  """A FedALC cell's calibration options that differ from the spec's default (§1.4: ``inv_sqrt_freq`` on the class
  axis, A1-A3, A21), so an ablation's table says which variant it ran."""
  adversarial = cfg.get("adversarial", {})
  if adversarial.get("objective") != "fedalc":
    return ""
  from fedjax_robust.adversarial.objectives import OBJECTIVES
  ours = adversarial.get("fedalc", {})
  return ", ".join(f"adversarial.fedalc.{key} = {ours[key]} (spec default {default})"
                   for key, default in OBJECTIVES["fedalc"].options.items() if key in ours and ours[key] != default)


def _start_note(cfg: dict) -> str:
  """Where a ResNet-18 cell's weights started: the paper's Table II fine-tunes an ImageNet-pretrained ResNet-18
  (spec §4.3), which cannot be downloaded here, so a cell without ``model.pretrained`` is a from-scratch stand-in
  and its row must say so."""
  model = cfg.get("model", {})
  if model.get("name") != "resnet18":
    return ""
  if model.get("pretrained"):
    return f"ResNet-18 started from {Path(str(model['pretrained'])).name} (paper: ImageNet-pretrained)"
  return "ResNet-18 from random init, a STAND-IN for the paper's ImageNet-pretrained one (not available offline)"


def setup_note(cells: list[dict], labels: list[str] | None = None) -> str:
  """Which runs the table's cells are, and which ± it shows; when the cells ran in different ways and ``labels``
  name their rows, each way says which rows it covers, and cells at different seeds are named
  (:func:`grid.seeds_differ_note`)."""
  runs: dict[str, list[str]] = {}
  for i, cell in enumerate(cells):
    p = _cell_protocol(cell)
    pooled = (f" (pooled from {len(cell['pooled_runs'])} separate one-seed runs)" if cell.get("pooled_runs")
              else "")
    line = (f"{p['rounds']} rounds x E = {p['epochs']}"
            + (f" (REDUCED from the paper's {p['paper_rounds']} x {p['paper_epochs']})" if p["reduced"] else "")
            + f", mean over the evaluated rounds of the last {p['last_rounds']}, {grid.seeds_phrase(cell)}{pooled}")
    cfg = cell.get("config", {})
    notes = [n for n in (_robust_note(cfg), _calibration_note(cfg), _start_note(cfg)) if n]
    runs.setdefault(line + "".join(f"; {n}" for n in notes), []).append(labels[i] if labels else "")
  if labels and len(runs) > 1:
    runs = {f"{line} [{', '.join(rows)}]": rows for line, rows in runs.items()}
  seeds = {grid.n_seeds(c) > 1 for c in cells}
  std = []
  if False in seeds:
    std.append("one seed: ± = std over the window's evaluated rounds (ddof 0; the paper's ±, spec A16)")
  if True in seeds:
    std.append("several seeds: mean of the per-seed window means ± their std across seeds (ddof 0)")
  note = "Cells ran with: " + "; ".join(runs) + ". Shown: " + "; ".join(std) + "."
  return grid.with_seeds_note(note, dict(zip(labels, cells))) if labels else note


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def table1(results: dict) -> str:
  out = []
  for dataset in TABLE1_DATASETS:
    alphas = _alphas_of(results, dataset, TABLE1_ALPHAS)
    cells = {(a, m): results.get(cell_key(dataset, a, m)) for a in alphas for m in METHODS}
    if not any(cells.values()):
      continue
    rows = [[f"{a}", METHODS[m]] + [f"{_fmt(shown(cells[a, m], c))} / {_fmt(paper_value(dataset, a, m, c))}"
                                      for c in TABLE1_COLUMNS]
            for a in alphas for m in METHODS if cells[a, m]]
    present = {f"{METHODS[m]} α {a}": c for (a, m), c in cells.items() if c}
    out += [f"**{DATASETS[dataset][0]}** (accuracy %, ours / paper)", "",
            *_table(["α", "Method"] + list(TABLE1_COLUMNS.values()), rows), "",
            setup_note(list(present.values()), list(present)), "",
            acceptance(results, dataset), ""]
  return "\n".join(out) if out else "(no Table I cell in these results)\n"


def table2(results: dict) -> str:
  alphas = _alphas_of(results, "cifar10", TABLE2_ALPHAS)
  methods = [m for m in METHODS if any(results.get(cell_key("cifar10", a, m)) for a in alphas)]
  if not methods:
    return "(no Table II cell in these results)\n"
  rows = [[METHODS[m]] + [f"{_fmt(shown(results.get(cell_key('cifar10', a, m)), 'natural'))} / "
                          f"{_fmt(paper_value('cifar10', a, m))}" for a in alphas] for m in methods]
  present = {f"{METHODS[m]} α {a}": results[cell_key("cifar10", a, m)] for a in alphas for m in methods
             if cell_key("cifar10", a, m) in results}
  return "\n".join(["**CIFAR-10** (natural accuracy %, ours / paper)", "",
                    *_table(["Method"] + [f"α={a}" for a in alphas], rows), "",
                    setup_note(list(present.values()), list(present)), "",
                    acceptance(results, "cifar10"), ""])


# ------------------------------------------------------------------------------------------ acceptance (spec §5.5)
def _natural(results: dict, dataset: str, alpha: float, method: str, paper: bool = False) -> float | None:
  if paper:
    p = paper_value(dataset, alpha, method)
    return None if p is None else p[0]
  cell = results.get(cell_key(dataset, alpha, method))
  return None if cell is None or "natural" not in cell else float(cell["natural"])


def _status(ok: bool | None) -> str:
  return "not run" if ok is None else ("met" if ok else "NOT met")


def _seed_mismatch(results: dict, dataset: str, alpha: float, methods: tuple) -> str:
  """``"; seeds differ: FedALC 0,1,2 / FedAvg 0,1"`` when the cells a same-α target compares were not run at the
  same seeds (pooled files with a seed more for one method), else ``""``: their means then differ by partition too."""
  cells = {m: results.get(cell_key(dataset, alpha, m)) for m in methods}
  seeds = {m: grid.cell_seeds(c) for m, c in cells.items() if c is not None}
  if len(set(seeds.values())) < 2:
    return ""
  return "; seeds differ: " + " / ".join(f"{METHODS[m]} {','.join(map(str, s))}" for m, s in seeds.items())


def acceptance_checks(results: dict, dataset: str, paper: bool = False) -> list[tuple[str, bool | None, str]]:
  """Spec §5.5's targets on natural accuracy, as ``(target, met: True / False / None = not run, the numbers)``,
  from the cells present (``paper=True``: from the paper's own numbers). A same-α comparison of cells run at
  different seeds says so in its numbers (:func:`_seed_mismatch`)."""
  nat = lambda a, m: _natural(results, dataset, a, m, paper)
  differ = lambda a, *ms: "" if paper else _seed_mismatch(results, dataset, a, ms)
  alphas = _alphas_of({} if paper else results, dataset, TABLE2_ALPHAS if dataset == "cifar10" else TABLE1_ALPHAS)
  low, high = [a for a in alphas if a <= 0.1], [a for a in alphas if a >= 0.5]
  checks = []
  for a in low:
    fa, fv, fp = nat(a, "fedalc"), nat(a, "fedavg"), nat(a, "fedprox")
    missing = [METHODS[m] for m, v in (("fedalc", fa), ("fedavg", fv), ("fedprox", fp)) if v is None]
    checks.append((f"FedALC ≥ FedAvg > FedProx at α = {a}", None if missing else fa >= fv > fp,
                   f"no {', '.join(missing)} cell" if missing
                   else f"{fa:.2f} / {fv:.2f} / {fp:.2f}{differ(a, 'fedalc', 'fedavg', 'fedprox')}"))
  for a in low + high:
    fa, fv = nat(a, "fedalc"), nat(a, "fedavg")
    if a in low:
      target, ok = f"FedALC − FedAvg in [+{GAIN_LOW_ALPHA[0]:g}, +{GAIN_LOW_ALPHA[1]:g}] at α = {a}", (
          lambda g: GAIN_LOW_ALPHA[0] <= g <= GAIN_LOW_ALPHA[1])
    else:
      target, ok = f"|FedALC − FedAvg| ≤ {GAIN_HIGH_ALPHA:g} at α = {a}", lambda g: abs(g) <= GAIN_HIGH_ALPHA
    missing = [METHODS[m] for m, v in (("fedalc", fa), ("fedavg", fv)) if v is None]
    checks.append((target, None if missing else ok(fa - fv),
                   f"no {', '.join(missing)} cell" if missing else f"{fa - fv:+.2f}{differ(a, 'fedalc', 'fedavg')}"))
  for m in PAPER_METHODS:
    lo = [v for v in (nat(a, m) for a in low) if v is not None]
    hi = [v for v in (nat(a, m) for a in high) if v is not None]
    target = f"{METHODS[m]} rising with α (every α ≥ 0.5 cell above every α ≤ 0.1 cell)"
    if not lo or not hi:
      where = "" if not lo and not hi else f" at α {'≤ 0.1' if not lo else '≥ 0.5'}"
      checks.append((target, None, f"no {METHODS[m]} cell{where}"))
    else:
      checks.append((target, min(hi) > max(lo), f"max {max(lo):.2f} at α ≤ 0.1, min {min(hi):.2f} at α ≥ 0.5"))
  return checks


def acceptance(results: dict, dataset: str) -> str:
  """The acceptance paragraph below a dataset's table: each target met / NOT met / not run, ours then the paper's."""
  ours = acceptance_checks(results, dataset)
  paper = {target: (ok, numbers) for target, ok, numbers in acceptance_checks(results, dataset, paper=True)}
  scope = ("spec §5.5 states these targets for MNIST / Fashion-MNIST; on CIFAR-10 they are a reference only"
           if dataset == "cifar10" else "spec §5.5, natural accuracy; robust numbers are not targets (A15)")
  lines = [f"Acceptance, {DATASETS[dataset][0]} ({scope}; means as shown; ours, then the paper's own numbers):"]
  for target, ok, numbers in ours:
    p = paper.get(target)
    theirs = f"; paper: {_status(p[0])} ({p[1]})" if p and p[0] is not None else ""
    lines.append(f"- {target}: {_status(ok)} ({numbers}){theirs}.")
  return "\n".join(lines)


TABLES = {"table1": table1, "table2": table2}


def table_from_json(paths, mode: str) -> str:
  """The mode's table from one stored results file or several (a comma-separated string or a list): a cell found
  as one-seed cells in several files is pooled into mean ± std over those seeds (``grid.load_pooled``)."""
  return TABLES[mode](grid.load_pooled(paths))


def _floats(value: str) -> list[float]:
  return [float(v) for v in value.replace(" ", "").split(",") if v]


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--mode", choices=tuple(TABLES), default="table1")
  parser.add_argument("--datasets", default="", help="table1: mnist,fmnist (default both); table2 is cifar10")
  parser.add_argument("--alphas", default="", help="Dirichlet alphas (default: the table's, "
                      f"table1 {','.join(f'{a:g}' for a in TABLE1_ALPHAS)}, "
                      f"table2 {','.join(f'{a:g}' for a in TABLE2_ALPHAS)})")
  parser.add_argument("--methods", default=",".join(PAPER_METHODS),
                      help=f"comma-separated from {','.join(METHODS)} (natural: clean FedAvg, a reference row)")
  parser.add_argument("--from_json", default=None,
                      help="print the mode's table from stored results files (comma-separated; a cell stored as "
                           "one-seed runs in several files is shown as mean ± std over those seeds) and exit")
  grid.add_common_args(parser, "runs/fedalc")
  parser.set_defaults(rounds=0, epochs=0, seeds="0,1,2")
  args = parser.parse_args()
  if args.from_json:
    print(table_from_json(args.from_json, args.mode), end="")
    return
  methods = [m for m in args.methods.replace(" ", "").split(",") if m]
  unknown = [m for m in methods if m not in METHODS]
  if unknown or not methods:
    parser.error(f"--methods: unknown or empty {unknown or methods}; choose from {list(METHODS)}")
  logging.basicConfig(level=logging.WARNING)
  datasets = [d for d in args.datasets.replace(" ", "").split(",") if d]
  cells = [(cell_key(*c), cell_config(*c, args), record)
           for c in cells_of(args.mode, datasets, _floats(args.alphas), methods)]
  print(grid.run_and_tabulate(cells, args, TABLES[args.mode], hoist_per_seed_fields))


if __name__ == "__main__":
  main()
