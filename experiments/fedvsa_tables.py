"""FedVSA's tables and Fig. 3 (specs/fedvsa.md §4.7, §5): our numbers next to the paper's, from stored results.

    python experiments/fedvsa_tables.py --mode table3 --datasets mnist --partitions sigma900 \\
        --methods fedavg,fedvsa --data_dir ../shared/data          # runs the cells, prints the table
    python experiments/fedvsa_tables.py --mode table3 --from_json experiments/results/fedvsa_mnist_cpu.json

Modes:

* ``table3`` / ``table4``: rounds-to-target #R (the first round, counted after the 5-round warm start, whose global
  test accuracy reaches each target; ">T" if none within the run's T rounds) and S↑ = #R / #R(FedVSA), on the σ
  partitions (Table 3) or Dir(β) (Table 4). A cell stops once its higher target is reached (``eval.stop_at``).
  With four methods or more, a line under the table says whether the paper's order of the methods holds
  (Spearman's ρ of our rounds to each target against the paper's) and which method was fastest in each.
* ``table5``: final accuracy and the mean of the last 10 rounds with data dynamics (``fresh<α>``).
* ``fig3``: model replacement at rounds 10, 25, 50: accuracy just before, at and after each attack round, and a
  PNG of the curves (``--figure``); ``fig5``: the same for FedVSA's ablations (w/o loss comparison, w/o Shapley
  value, aggregation only, and Fig. 4's w/o clipping).
* ``table9``: each baseline's final accuracy (and the mean of its last 10 rounds, spec A15) without and with
  FedVSA's weighting plugged in (``<method>+vsa``: ``server.weighting.name=value_sensitive``, its local rule and
  its rule's selection kept); FedNova, FedDisco, FedLAW and Median have none (spec §3). The paper does not state
  Table 9's setting; spec A16 assumes MNIST σ=900 (the default cells). Its cells run the whole horizon (no stop at a
  target) and are stored under their own keys (``...__full``), apart from Table 3's; a cell not run prints "not run".
* ``table10``: the round cost measured on our engine (``benchmarks/fedvsa_cost.py`` results, ``--from_json`` only:
  FedAvg, FedDC, Zeno++, DnC, RFA and FedVSA without / with a Shapley step) beside the paper's client and server
  columns.

Every cell is one run directory under ``--out_dir`` and one entry of ``results*.json`` there, with its resolved
config, per-round accuracy, seeds, commit, command, device and wall time (``grid.run_cells``). Cells not run are
shown as "—"; a run shorter than the paper's 1,000 rounds is stated under the table.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import shlex
from pathlib import Path

import numpy as np

import grid

DATASETS = ("mnist", "fmnist", "cifar10")
SIGMAS = ("sigma300", "sigma600", "sigma900")
DIRS = ("dir0.1", "dir0.3", "dir0.5")
METHODS = ("fedavg", "fedprox", "scaffold", "fednova", "feddyn", "feddc", "feddisco", "fedlaw", "median",
           "multi_krum", "zeno", "dnc", "rfa", "fedvsa")
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova", "feddyn": "FedDyn",
          "feddc": "FedDC", "feddisco": "FedDisco", "fedlaw": "FedLAW", "median": "Median", "multi_krum": "Multi-Krum",
          "zeno": "Zeno++", "dnc": "DnC", "rfa": "RAF", "fedvsa": "**FedVSA**"}
FIG3_METHODS = ("fedavg", "multi_krum", "zeno", "median", "dnc", "rfa", "fedvsa", "fedvsa_skip", "fedvsa_retrain",
                "fedvsa_skip_pcl", "fedvsa_skip_eps10")
# Fig. 5 (detection ablations under the same attack) and Fig. 4 (no clipping).
ABLATIONS = ("fedvsa", "fedvsa_no_audit", "fedvsa_no_shapley", "fedvsa_aggregation_only", "fedvsa_noclip",
             "fedvsa_no_audit_eps10", "fedvsa_skip", "fedvsa_retrain", "fedvsa_skip_pcl", "fedvsa_skip_eps10")
LABELS.update({"fedvsa_no_audit": "FedVSA w/o loss comparison", "fedvsa_no_shapley": "FedVSA w/o Shapley value",
               "fedvsa_aggregation_only": "FedVSA aggregation only", "fedvsa_noclip": "FedVSA w/o clipping",
               "fedvsa_skip": "FedVSA, repairing round skipped",
               "fedvsa_retrain": "FedVSA, repaired before training (two-phase)",
               "fedvsa_skip_pcl": "FedVSA, skipped + per-client audit",
               "fedvsa_skip_eps10": "FedVSA, skipped, flagged only below -0.1",
               "fedvsa_no_audit_eps10": "FedVSA w/o loss comparison, flagged only below -0.1"})
ATTACK_ROUNDS = (10, 25, 50)
NONE = None  # the paper's ">1000"

# The paper's #R (spec §5), per dataset and method, in the column order partition x (low, high target).
_T3 = {
    "mnist": """fedavg 114 397 146 498 307 724; fedprox 95 378 89 378 293 658; scaffold 45 219 55 278 200 526;
      fednova 109 273 90 421 210 633; feddyn 70 173 74 218 196 532; feddc 40 151 46 161 125 335;
      feddisco 35 153 42 179 91 366; fedlaw 33 158 46 181 88 349; median - - - - - -; multi_krum 292 876 353 - 857 -;
      zeno 94 296 124 364 296 659; dnc 103 228 115 289 226 358; rfa 107 268 126 326 201 394;
      fedvsa 27 147 39 159 75 328""",
    "fmnist": """fedavg 274 462 366 662 576 897; fedprox 247 457 254 532 426 794; scaffold 203 356 234 508 364 651;
      fednova 236 375 249 526 475 745; feddyn 90 269 222 439 297 483; feddc 114 294 216 411 237 459;
      feddisco 125 308 188 389 221 455; fedlaw 108 305 192 396 201 444; median - - - - - -;
      multi_krum 398 943 539 - 891 -; zeno 229 413 354 649 404 761; dnc 126 378 195 542 267 695;
      rfa 106 364 221 589 254 712; fedvsa 64 281 177 365 198 446""",
    "cifar10": """fedavg 227 975 289 557 321 675; fedprox 224 691 286 544 318 632; scaffold 117 188 143 294 221 345;
      fednova 316 633 283 469 217 322; feddyn 88 114 106 216 129 205; feddc 96 165 117 268 198 301;
      feddisco 88 121 105 186 135 216; fedlaw 97 130 115 199 149 221; median - - - - - -;
      multi_krum 454 - 295 594 354 711; zeno 217 607 262 433 291 433; dnc 128 200 169 368 211 596;
      rfa 133 223 177 384 236 565; fedvsa 72 103 87 146 119 212""",
}
_T4 = {
    "mnist": """fedavg 90 456 31 188 25 163; fedprox 58 379 35 202 27 160; scaffold 39 178 25 135 21 121;
      fednova 47 267 23 119 14 88; feddyn 51 127 21 86 21 61; feddc 39 115 19 76 18 55; feddisco 41 125 13 61 11 42;
      fedlaw 32 105 11 56 12 49; median 73 323 20 78 24 60; multi_krum 93 586 36 262 27 168;
      zeno 67 426 27 201 23 154; dnc 54 265 32 215 15 122; rfa 49 245 29 225 18 136; fedvsa 23 79 12 44 8 33""",
    "fmnist": """fedavg 57 203 47 123 30 82; fedprox 56 279 33 102 16 66; scaffold 29 138 30 84 17 52;
      fednova 35 165 25 85 13 55; feddyn 26 81 23 64 14 37; feddc 27 79 22 50 15 45; feddisco 23 71 20 44 12 44;
      fedlaw 20 68 18 35 16 33; median 41 175 45 134 42 128; multi_krum 87 360 39 122 21 84;
      zeno 47 262 33 121 25 71; dnc 39 159 28 67 19 39; rfa 32 146 26 64 17 35; fedvsa 15 63 11 29 8 20""",
    "cifar10": """fedavg 182 363 121 218 68 136; fedprox 204 297 95 174 67 133; scaffold 145 198 72 131 61 112;
      fednova 162 347 100 203 80 158; feddyn 86 188 55 113 47 97; feddc 119 205 54 102 43 82;
      feddisco 77 154 46 99 36 65; fedlaw 69 142 49 101 33 59; median 219 415 143 181 95 169;
      multi_krum 218 435 93 187 72 134; zeno 183 343 79 185 78 138; dnc 155 251 72 136 68 112;
      rfa 102 211 67 122 65 108; fedvsa 60 131 40 83 24 42""",
}
# Table 5 (accuracy %, 100 clients): rows σ=900 α=0.1/0.3/0.5, Dir(0.1) α=0.1/0.3/0.5; columns METHODS order.
_T5 = {
    "mnist": """89.85 89.98 92.95 90.18 92.82 93.89 94.97 94.66 74.44 81.47 87.69 90.44 90.48 95.48;
      89.77 89.63 93.65 90.22 94.79 93.79 94.98 92.15 71.29 78.26 86.37 89.42 89.25 95.12;
      84.94 84.93 92.51 89.07 88.96 92.84 92.91 91.54 77.14 77.38 86.14 89.91 88.38 93.05;
      92.33 93.11 94.18 93.21 93.64 94.86 94.99 95.04 88.25 89.57 90.25 92.54 93.45 95.44;
      92.18 92.38 93.83 92.22 92.01 93.65 93.58 93.72 86.99 87.61 88.99 91.15 92.68 94.21;
      90.18 91.25 92.69 91.25 91.11 91.21 92.59 92.89 83.61 84.94 83.47 89.91 90.12 94.04""",
    "fmnist": """76.22 76.31 81.81 78.52 74.61 79.86 79.85 80.01 64.59 64.33 76.65 77.68 78.35 83.08;
      71.79 71.73 80.81 78.21 75.58 78.31 77.89 78.95 56.64 54.77 75.64 76.48 77.95 81.98;
      76.28 76.26 80.21 74.03 75.83 77.90 76.84 78.14 53.86 47.25 70.33 75.12 76.54 81.38;
      73.27 74.76 81.81 80.49 81.41 82.22 83.66 82.65 71.25 74.52 76.54 81.22 79.85 84.47;
      72.69 73.14 80.02 78.46 80.52 81.04 82.15 81.27 69.22 71.02 74.25 77.51 76.46 82.02;
      70.41 71.12 78.24 76.62 78.28 80.09 81.31 80.05 68.24 69.45 72.25 76.21 75.91 81.41""",
    "cifar10": """63.08 62.66 63.27 66.51 65.26 69.12 71.56 72.04 58.86 62.02 62.87 63.25 64.58 73.42;
      62.72 62.98 62.55 62.85 64.68 68.08 69.54 70.11 58.54 66.56 63.84 61.95 63.45 73.12;
      61.03 62.53 61.23 58.94 64.97 61.2 68.42 69.85 48.69 41.62 62.13 61.55 62.25 72.62;
      73.02 73.69 74.66 73.98 74.05 76.15 77.25 77.12 68.92 71.05 74.05 75.25 73.54 78.04;
      72.03 72.54 73.12 72.15 72.58 75.12 76.69 76.58 66.51 70.25 72.51 72.25 71.98 77.23;
      70.55 71.15 72.15 71.98 71.12 72.54 74.25 74.19 63.25 68.79 71.99 71.69 70.25 75.15""",
}
T5_SETTINGS = (("sigma900", 0.1), ("sigma900", 0.3), ("sigma900", 0.5), ("dir0.1", 0.1), ("dir0.1", 0.3),
               ("dir0.1", 0.5))


# Table 9 (accuracy %; w/o FedVSA, w/ FedVSA or None where the plug-in does not apply), spec §5.
PAPER_T9 = {"fedavg": (87.69, 93.76), "fedprox": (87.76, 89.49), "scaffold": (92.55, 93.44), "fednova": (89.54, None),
            "feddyn": (92.54, 93.17), "feddc": (93.46, 94.56), "feddisco": (93.32, None), "fedlaw": (92.87, None),
            "median": (74.59, None), "multi_krum": (77.35, 77.44), "zeno": (87.35, 87.66), "dnc": (88.32, 91.22),
            "rfa": (89.46, 92.13)}
T9_METHODS = tuple(PAPER_T9)
PLUGIN = "+vsa"
FULL = "__full"  # key suffix of the cells that run the whole horizon (Table 9), apart from Table 3's stopped ones


def _rounds_table(text: str, partitions) -> dict:
  """``{method: {(partition, 0|1): #R or None}}`` from the compact listing above."""
  out = {}
  for row in text.split(";"):
    method, *values = row.split()
    cells = [None if v == "-" else int(v) for v in values]
    out[method] = {(p, i): cells[2 * j + i] for j, p in enumerate(partitions) for i in (0, 1)}
  return out


PAPER_T3 = {d: _rounds_table(t, SIGMAS) for d, t in _T3.items()}
PAPER_T4 = {d: _rounds_table(t, DIRS) for d, t in _T4.items()}
PAPER_T5 = {d: {s: dict(zip(METHODS, map(float, row.split()))) for s, row in zip(T5_SETTINGS, t.split(";"))}
            for d, t in _T5.items()}


def cell_key(dataset: str, partition: str, method: str, fresh: float = 0.0, attack: bool = False) -> str:
  return f"{dataset}__{partition}__{method}" + (f"__fresh{fresh}" if fresh else "") + ("__attack" if attack else "")


def parse_key(key: str) -> tuple[str, str, str, float, bool]:
  dataset, partition, method, *rest = key.split("__")
  fresh = next((float(r[len("fresh"):]) for r in rest if r.startswith("fresh")), 0.0)
  return dataset, partition, method, fresh, "attack" in rest


def rounds_to(accuracies, target: float):
  """The first (1-indexed) round whose accuracy reaches ``target``, or None."""
  return next((t + 1 for t, a in enumerate(accuracies) if a is not None and a >= target), None)


def cell_config(dataset: str, partition: str, method: str, fresh: float, attack: bool, args):
  from fedjax_robust.config_files import load_module
  root = Path(__file__).resolve().parent
  arg = ",".join([partition, method] + ([f"fresh{fresh}"] if fresh else []) + (["attack"] if attack else []))
  config = load_module(root / "configs" / f"fedvsa_{dataset}.py").get_config(arg)
  rounds, stop_at = config.rounds, config.eval.stop_at
  config = grid.apply_run_args(config, args)
  config.rounds = args.rounds or rounds
  config.eval_every = 1
  config.client.epochs = args.epochs or 5
  config.init.pretrain_rounds = args.pretrain
  config.eval.stop_at = 0.0 if config.get("seeds") or getattr(args, "mode", "") == "table9" else stop_at
  config.eval.last_rounds = 0
  return fit_krum_to_cohort(config)


def fit_krum_to_cohort(config):
  """Multi-Krum's f = 2 needs a cohort of at least 2f + 3 = 7; a reduced cohort gets the largest f it allows (the
  cell's stored config says which)."""
  from fedjax_robust.experiment import cohort_size
  agg = config.get("aggregator")
  if agg is not None and agg.get("name") == "multi_krum":
    cohort = cohort_size(config, int(config.data.num_clients))
    agg.num_byzantine = min(int(agg.num_byzantine), max(0, (cohort - 3) // 2))
  return config


@functools.cache
def _setting():
  """experiments/configs/fedvsa_setting.py: the targets and spec §4.2's models, loaded once per process."""
  from fedjax_robust.config_files import load_module
  return load_module(Path(__file__).resolve().parent / "configs" / "fedvsa_setting.py")


def make_record(dataset: str, partition: str):
  """The cell record of one (dataset, partition): final and last-10 accuracy, and rounds to both targets."""
  return lambda summary, run_dir, config: record(summary, run_dir, config, dataset, partition)


def record(summary, run_dir, config, dataset: str, partition: str) -> dict:
  series = grid.per_round_series(Path(run_dir))
  acc = series["global_test_acc_per_round"]
  cell = {"value": 100.0 * acc[-1], "last10": 100.0 * float(np.mean(acc[-10:])), "rounds_run": len(acc),
          "stopped_at_round": summary.get("stopped_at_round")}
  if not config.data.dynamics.fresh_fraction and config.attack.name == "none":
    low, high = _setting().targets(dataset, partition)
    cell.update(rounds_low=rounds_to(acc, low), rounds_high=rounds_to(acc, high), targets=[low, high])
  return cell


def _fmt_rounds(value, horizon) -> str:
  return f">{horizon}" if value is None else str(value)


def _speedup(r, r_vsa) -> str:
  return "-" if r is None or r_vsa is None else f"{r / r_vsa:.2f}×"


def _seed_values(cell: dict, name: str) -> list | None:
  """Each seed's ``name`` of a cell pooled over seeds (a vmapped ``--seeds`` program, or one-seed cells stored in
  several files), None for a one-seed cell. A seed that never reached a target keeps its None."""
  per_seed = cell.get("per_seed")
  return None if not per_seed else [run.get(name) for run in per_seed.values()]


def rounds_of(cell: dict, name: str) -> float | None:
  """Rounds to a target: a one-seed cell's own, a seeds cell's mean when every seed reached it (else None)."""
  values = _seed_values(cell, name)
  if values is None:
    return cell.get(name)
  return None if any(v is None for v in values) else float(np.mean(values))


def fmt_rounds_cell(cell: dict, name: str) -> str:
  """``16`` / ``>120`` for one seed; ``13.5 ± 2.5`` over seeds, ``16.0 ± 0.0 (1 of 2 seeds; >120 the rest)``
  when only some reached the target, ``>120`` when none did."""
  values = _seed_values(cell, name)
  if values is None:
    return _fmt_rounds(cell.get(name), cell.get("rounds_run"))
  reached = [v for v in values if v is not None]
  horizon = max(int(r) for r in _seed_values(cell, "rounds_run"))
  if not reached:
    return f">{horizon}"
  text = f"{np.mean(reached):.1f} ± {np.std(reached):.1f}"
  return text if len(reached) == len(values) else f"{text} ({len(reached)} of {len(values)} seeds; >{horizon} the rest)"


# ``--set`` keys that change a method's hyperparameters (not the run's size): a cell run with one is not spec §3's
# starting value, and the table says so.
TUNING_KEYS = ("algorithm.", "aggregator.", "client.", "server.weighting.")


def hand_set_hparams(cell: dict) -> list[str]:
  """The ``KEY=VALUE`` overrides of a method's hyperparameters in the command that made ``cell`` (each pooled run's
  command, for one-seed cells pooled over seeds), in order."""
  commands = [cell.get("command")] + [run.get("command") for run in cell.get("pooled_runs", {}).values()]
  found = []
  for command in commands:
    argv = shlex.split(command or "")
    found += [value for flag, value in zip(argv, argv[1:])
              if flag == "--set" and value.startswith(TUNING_KEYS) and value not in found]
  return found


def stand_in_models(cells) -> list[str]:
  """``"lenet5 for alexnet28 on fashion_mnist"`` for each cell whose model is not spec §4.2's for its dataset (a
  CPU-sized stand-in, ``--set model.name=...``), so a table never passes a smaller model off as the paper's."""
  paper_model = {data: model for data, model, _ in _setting().DATASETS.values()}
  found = set()
  for c in cells:
    config = c.get("config", {})
    data, model = config.get("data", {}).get("name"), config.get("model", {}).get("name")
    if data in paper_model and model != paper_model[data]:
      found.add(f"{model} for {paper_model[data]} on {data}")
  return sorted(found)


def _reduced_note(labelled: dict) -> str:
  """The setup of the cells a table shows (``{row label: cell}``, never a loaded cell it leaves out), any stand-in
  model, any hyperparameter a cell's command set by hand, and which cells ran at other seeds than the rest."""
  cells = list(labelled.values())
  runs = sorted({(c.get("rounds"), c.get("config", {}).get("init", {}).get("pretrain_rounds"),
                  c.get("config", {}).get("data", {}).get("num_clients"), c.get("backend") or c.get("device_kind"),
                  grid.seeds_phrase(c))
                 for c in cells}, key=str)
  parts = [f"{r} rounds max after a {p}-round FedAvg warm start, {k} clients, {b}, {s}"
           for r, p, k, b, s in runs]
  models = stand_in_models(cells)
  if models:
    parts[-1] += "; stand-in model" + ("s " if len(models) > 1 else " ") + ", ".join(models)
  overrides = sorted({o for c in cells for o in hand_set_hparams(c)})
  changed = (f" except where a cell's command sets {', '.join(f'`{o}`' for o in overrides)}" if overrides else "")
  note = ("Our cells: " + "; ".join(parts) + ". The paper runs up to 1,000 rounds, 100 clients; its baselines were "
          f"tuned (values not reported), ours use spec §3's starting values (experiments/configs/fedvsa_setting.py)"
          f"{changed}.")
  return grid.with_seeds_note(note, labelled) + "\n"


def rounds_table(results: dict, partitions, paper: dict, title: str) -> str:
  lines, shown = [], {}
  for dataset in DATASETS:
    cells = {parse_key(k)[1:3]: v for k, v in results.items()
             if parse_key(k)[0] == dataset and parse_key(k)[1] in partitions and not parse_key(k)[3]
             and not parse_key(k)[4] and not k.endswith(FULL)}
    if not cells:
      continue
    columns = [p for p in partitions if any(key[0] == p for key in cells)]
    head = " | ".join(f"{p} @{int(round(100 * t))}% #R ours / paper | S↑ ours / paper" for p in columns
                      for t in (cells_target(cells, p, 0), cells_target(cells, p, 1)))
    lines += [f"**{title} — {dataset}**", "", f"| Method | {head} |",
              "|---" * (1 + 2 * len(columns) * 2) + "|"]
    for method in METHODS:
      if not any((p, method) in cells for p in columns):
        continue
      row = []
      for p in columns:
        cell = cells.get((p, method))
        vsa = cells.get((p, "fedvsa"))
        for i, name in ((0, "rounds_low"), (1, "rounds_high")):
          ours = "—" if cell is None else fmt_rounds_cell(cell, name)
          ref = paper.get(dataset, {}).get(method, {}).get((p, i))
          ref_vsa = paper.get(dataset, {}).get("fedvsa", {}).get((p, i))
          s_ours = "—" if cell is None or vsa is None else _speedup(rounds_of(cell, name), rounds_of(vsa, name))
          row += [f"{ours} / {_fmt_rounds(ref, 1000)}", f"{s_ours} / {_speedup(ref, ref_vsa)}"]
      lines.append(f"| {LABELS[method]} | " + " | ".join(row) + " |")
    lines.append("")
    lines += rank_agreement(cells, columns, paper.get(dataset, {}))
    lines += accuracy_rows(cells, columns)
    shown.update({f"{LABELS[m].strip('*')} ({dataset} {p})": cells[p, m]
                  for p in columns for m in METHODS if (p, m) in cells})
  return "\n".join(lines) + "\n" + _reduced_note(shown)


MIN_RANKED = 4  # fewer methods than this make a rank correlation meaningless


def rank_agreement(cells: dict, columns, paper: dict) -> list[str]:
  """Whether the paper's order of the methods holds, per partition and target: Spearman's ρ between our rounds to
  the target and the paper's over the methods run (a method that never reached the target ranks after every one
  that did, tied with the others that did not), and which method was fastest in each. The paper's speed-ups are
  one ratio per method against FedVSA; the order is what a reader of Tables 3-4 takes away, and it survives a
  different absolute pace (fedvsa.md: our baselines reach the targets many times sooner than the paper's)."""
  from scipy import stats  # a dependency of jax's

  parts = []
  for p in columns:
    methods = [m for m in METHODS if (p, m) in cells]
    if len(methods) < MIN_RANKED:
      continue
    for i, name in ((0, "rounds_low"), (1, "rounds_high")):
      ours = [rounds_of(cells[p, m], name) for m in methods]
      ref = [paper.get(m, {}).get((p, i)) for m in methods]
      ours, ref = (np.array([np.inf if v is None else v for v in x], float) for x in (ours, ref))
      target = f"{p} @{int(round(100 * cells_target(cells, p, i)))}%"
      if np.isinf(ours).all():
        parts.append(f"{target}: none of our {len(methods)} methods reached it")
        continue
      fastest = lambda x: "/".join(LABELS[m].strip("*") for m, v in zip(methods, x) if v == x.min())
      if np.unique(ours).size == 1:  # a rank correlation with a constant is undefined (scipy warns, returns NaN)
        parts.append(f"{target}: ρ undefined, all {len(methods)} of our methods tie at round {ours[0]:g}, "
                     f"paper's fastest {fastest(ref)}")
        continue
      rho = stats.spearmanr(ours, ref).statistic  # NaN when the paper's side ranks every method equal
      parts.append(f"{target}: ρ = " + ("undefined" if np.isnan(rho) else f"{rho:+.2f}")
                   + f" over {len(methods)} methods, fastest ours {fastest(ours)}, paper {fastest(ref)}")
  if not parts:
    return []
  return ["Does the paper's order of the methods hold (Spearman's ρ of our rounds to target against the paper's; a "
          "method that never reached it ranks last)? " + "; ".join(parts) + ".", ""]


def accuracy_rows(cells: dict, columns) -> list[str]:
  """Global test accuracy at the last round run / mean over its last 10 rounds, per method and partition: what a
  cell says when neither target is reached (the paper's Tables 3-4 report rounds only)."""
  lines = ["Accuracy % at the last round run / mean of the last 10 rounds (ours; not in the paper's table):", "",
           "| Method | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
  for method in METHODS:
    if any((p, method) in cells for p in columns):
      row = ["—" if (p, method) not in cells
             else f"{grid.with_std(cells[p, method], 'value')} / {grid.with_std(cells[p, method], 'last10')}"
             for p in columns]
      lines.append(f"| {LABELS[method]} | " + " | ".join(row) + " |")
  return lines + [""]


def cells_target(cells: dict, partition: str, i: int) -> float:
  return next(_first_run(c)["targets"][i] for (p, _), c in cells.items() if p == partition)


def _first_run(cell: dict) -> dict:
  """A one-seed cell itself, or a seeds cell's first seed (its non-numeric fields, e.g. ``targets``)."""
  return next(iter(cell["per_seed"].values())) if cell.get("per_seed") else cell


def table3(results: dict) -> str:
  return rounds_table(results, SIGMAS, PAPER_T3, "Table 3 (rounds to target, σ partitions)")


def table4(results: dict) -> str:
  return rounds_table(results, DIRS, PAPER_T4, "Table 4 (rounds to target, Dir(β))")


def table5(results: dict) -> str:
  lines, shown = [], {}
  for dataset in DATASETS:
    cells = {(parse_key(k)[1], parse_key(k)[3], parse_key(k)[2]): v for k, v in results.items()
             if parse_key(k)[0] == dataset and parse_key(k)[3]}
    if not cells:
      continue
    methods = [m for m in METHODS if any(key[2] == m for key in cells)]
    lines += [f"**Table 5 — {dataset}** (final accuracy % / mean of the last 10 rounds; paper)", "",
              "| Setting | " + " | ".join(LABELS[m] for m in methods) + " |", "|---" * (1 + len(methods)) + "|"]
    for partition, fresh in T5_SETTINGS:
      if not any((partition, fresh, m) in cells for m in methods):
        continue
      row = []
      for m in methods:
        c = cells.get((partition, fresh, m))
        if c is not None:
          shown[f"{LABELS[m].strip('*')} ({dataset} {partition}, α={fresh})"] = c
        ours = "—" if c is None else f"{c['value']:.2f} / {c['last10']:.2f}"
        row.append(f"{ours} ({PAPER_T5[dataset][(partition, fresh)][m]:.2f})")
      lines.append(f"| {partition}, α={fresh} | " + " | ".join(row) + " |")
    lines.append("")
    lines += table5_parts(cells)
  return "\n".join(lines) + "\n" + _reduced_note(shown)


PARTS = ("fedavg", "fedvsa_aggregation_only", "fedvsa")  # FedVSA = its weighting (Eq. 8) + its detection (Alg. 3)


def table5_parts(cells: dict) -> list[str]:
  """Which part of FedVSA moves Table 5's accuracy, per setting where FedVSA's weighting alone was run too or the
  full method's cell kept its detection's log: the mean of the last 10 rounds of FedAvg, of FedVSA's aggregation
  only (``detection="off"``) and of the full method, and, from the full method's per-round log, how often its loss
  audit fired in a run with no attacker, how many benign updates the Shapley step flagged (each removed from the
  model, spec §1.7), and the mean round-to-round accuracy change in the rounds that repaired against the rounds
  that did not."""
  settings = [(p, a) for p, a in T5_SETTINGS if (p, a, "fedvsa_aggregation_only") in cells
              or "audit_alarm_per_round" in cells.get((p, a, "fedvsa"), {})]
  if not settings:
    return []
  lines = ["FedVSA's parts (mean of the last 10 rounds %, ours; not in the paper) and its detection in these runs "
           "(no attacker):", "",
           "| Setting | " + " | ".join(LABELS[m].strip("*") for m in PARTS)
           + " | audit fired (rounds) | benign updates flagged | Δ acc. in repairing / other rounds (points) |",
           "|---" * (4 + len(PARTS)) + "|"]
  for partition, fresh in settings:
    row = [("—" if (partition, fresh, m) not in cells else f"{cells[partition, fresh, m]['last10']:.2f}")
           for m in PARTS]
    full = cells.get((partition, fresh, "fedvsa"), {})
    alarms, flagged = full.get("audit_alarm_per_round"), full.get("shapley_flagged_benign_per_round")
    if alarms is None or flagged is None:  # a cell stored before the grid kept the detection's log
      row += ["—", "—", "—"]
    else:
      acc = np.asarray(full["global_test_acc_per_round"], float)
      change = 100.0 * np.diff(acc)  # round r's change from round r - 1 (round 1 has no predecessor here)
      attackers = full.get("shapley_flagged_attackers_per_round", [0] * len(flagged))
      repairing = (np.asarray(flagged) + np.asarray(attackers))[1:] > 0
      mean = lambda x: "—" if not len(x) else f"{np.mean(x):+.1f}"
      row += [f"{int(np.sum(alarms))} of {len(alarms)}", str(int(np.sum(flagged))),
              f"{mean(change[repairing])} / {mean(change[~repairing])}"]
    lines.append(f"| {partition}, α={fresh} | " + " | ".join(row) + " |")
  return lines + [""]


def fig3_rows(results: dict, methods=FIG3_METHODS) -> list[tuple[str, str, dict]]:
  """The attack cells of ``methods``, by dataset and then in ``methods``' order."""
  rows = [(parse_key(k)[0], parse_key(k)[2], v) for k, v in results.items()
          if parse_key(k)[4] and parse_key(k)[2] in methods]
  return sorted(rows, key=lambda r: (DATASETS.index(r[0]), methods.index(r[1])))


def fig5(results: dict) -> str:
  return fig3(results, ABLATIONS, "Figs. 4-5 — FedVSA's ablations under model replacement")


def fig3(results: dict, methods=FIG3_METHODS, title: str = "Fig. 3 — model replacement") -> str:
  """Accuracy (%) at rounds t-1, t (the attack round) and t+1 for each attack round the run reached."""
  lines = [f"**{title}** (global test accuracy %, round before / attack round / round after)", "",
           "| Dataset | Method | " + " | ".join(f"t={t}" for t in ATTACK_ROUNDS) + " |",
           "|---" * (2 + len(ATTACK_ROUNDS)) + "|"]
  rows = fig3_rows(results, methods)
  for dataset, method, cell in rows:
    acc = cell["global_test_acc_per_round"]
    parts = []
    for t in ATTACK_ROUNDS:
      parts.append("—" if len(acc) <= t else " / ".join(f"{100 * acc[r - 1]:.1f}" for r in (t - 1, t, t + 1)))
    lines.append(f"| {dataset} | {LABELS[method]} | " + " | ".join(parts) + " |")
  labelled = {f"row {i} ({LABELS[m].strip('*')}, {d})": cell for i, (d, m, cell) in enumerate(rows, 1)}
  return "\n".join(lines) + "\n\n" + _reduced_note(labelled)


def fig3_figure(results: dict, path: Path, methods=FIG3_METHODS) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = fig3_rows(results, methods)
  datasets = sorted({d for d, _, _ in rows})
  fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 5.2), squeeze=False)
  for ax, dataset in zip(axes[0], datasets):
    horizon, drawn = 0, []
    for d, method, cell in rows:
      if d == dataset:
        acc = 100 * np.asarray(cell["global_test_acc_per_round"])
        horizon = max(horizon, len(acc))
        name, style = LABELS[method].strip("*"), "-" if "fedvsa" in method else "--"
        twin = next((other for other, curve in drawn if np.array_equal(curve, acc)), None)
        label = name
        if twin:  # e.g. "w/o Shapley value" applies no hotfix, so it IS "aggregation only" (spec A14): say so, and
          label, style = f"{name} (= {twin})", (0, (2, 2))  # dot it over the other so both stay visible
        drawn.append((name, acc))
        ax.plot(np.arange(1, len(acc) + 1), acc, label=label, lw=2.2 if "fedvsa" in method else 1.1, ls=style)
    attacks = [t for t in ATTACK_ROUNDS if t <= horizon]
    for t in attacks:
      ax.axvline(t, color="grey", ls=":", lw=0.8)
    ax.set(title=f"{dataset}: model replacement at rounds {', '.join(map(str, attacks))}",
           xlabel="round (after the warm start)", ylabel="global test accuracy (%)", ylim=(0, 100),
           xlim=(1, horizon))
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))
  grid.save_figure(fig, path)


def _acc(cell) -> str:
  return "not run" if cell is None else f"{cell['value']:.2f} / {cell['last10']:.2f}"


def table9(results: dict) -> str:
  """Table 9 for every (dataset, partition) with a full-horizon cell, MNIST σ=900 (spec A16) when there is none;
  a cell not run reads "not run", the plug-in's missing rows "/" as in the paper."""
  full = {parse_key(k[:-len(FULL)])[:3]: v for k, v in results.items() if k.endswith(FULL)}
  settings = sorted({(d, p) for d, p, _ in full}, key=str) or [("mnist", "sigma900")]
  lines = []
  for dataset, partition in settings:
    lines += [f"**Table 9 — {dataset} {partition}** (accuracy %, final / mean of the last 10 rounds; the paper's in "
              "parentheses, setting not stated, spec A16)", "",
              "| Method | w/o FedVSA | w/ FedVSA |", "|---|---|---|"]
    for m in T9_METHODS:
      without, with_vsa = PAPER_T9[m]
      ours = _acc(full.get((dataset, partition, m)))
      plugged = "/ (incompatible, spec §3)" if with_vsa is None else (
          f"{_acc(full.get((dataset, partition, m + PLUGIN)))} ({with_vsa:.2f})")
      lines.append(f"| {LABELS[m]} | {ours} ({without:.2f}) | {plugged} |")
    lines.append("")
  if not full:
    return "\n".join(lines) + "\nNo Table 9 cell has been run yet.\n"
  return "\n".join(lines) + "\n" + _reduced_note({f"{m} ({d} {p})": c for (d, p, m), c in full.items()})


# Table 10 (RTX 3070 PC): variant of benchmarks/fedvsa_cost.py -> (the paper's row, its client side, its server side
# in seconds). The FedVSA rows' Shapley step costs 2^m x T_test "only in rounds where Dr = 1" (spec §5).
PAPER_T10 = {"fedavg": ("FedAvg", "E × T_train", 4.75), "feddc": ("FedDC", "E × T_DC-train", 6.23),
             "zeno": ("Zeno++", "E × T_train", 4.75), "dnc": ("DnC", "E × T_DnC-train", 4.75),
             "rfa": ("RAF", "E × T_RAF-train", 4.75),
             "fedvsa_no_detection": ("FedVSA w/o Shapley Value", "(E + 1) × T_train", 5.52),
             "fedvsa_shapley_every_round/exact": ("FedVSA w/ Shapley Value", "(E + 1) × T_train", 5.52),
             "fedvsa_shapley_every_round/tmc": ("FedVSA w/ Extended-TMC-Shapley", "(E + 1) × T_train", 5.52)}


def table10(files: dict) -> str:
  """Table 10 from ``benchmarks/fedvsa_cost.py`` results (``{path: its JSON}``): per file and cohort size m, each
  variant's whole-round time on our engine, its ratio to FedAvg's and its extra time over FedAvg's (a server-side
  rule on FedAvg's clients: the server's extra cost), beside the paper's client and server columns."""
  lines = []
  for path, result in files.items():
    cells = list(result.get("cells", {}).values())
    lines += [f"**Table 10 — round cost on our engine** (`{Path(path).name}`: commit {str(result.get('commit'))[:7]}, "
              f"{result.get('device', '?')}, {result.get('rounds')} timed round(s) after a warm-up; paper: RTX 3070 "
              "PC, 100 clients)", "",
              "| m | Method (the paper's row) | ours: s / round | × FedAvg | + s over FedAvg | paper: client side | "
              "paper: server side |", "|---|---|---|---|---|---|---|"]
    for cohort in sorted({c["cohort"] for c in cells}):
      rows = {c["variant"] + (f"/{c['shapley_mode']}" if c.get("shapley_mode") and "shapley" in c["variant"] else ""):
              c for c in cells if c["cohort"] == cohort}
      base = rows.get("fedavg")
      for key, (label, client, server) in PAPER_T10.items():
        cell = rows.get(key)
        if cell is None:
          continue
        extra = "—" if base is None else f"{cell['s_per_round'] - base['s_per_round']:+.2f}"
        ratio = f"{cell['x_fedavg_time']:.2f}" if "x_fedavg_time" in cell else "—"
        shapley = (f" ({cell['coalition_models_per_shapley_step']:,} coalition models, every round)"
                   if cell.get("coalition_models_per_shapley_step") else "")
        lines.append(f"| {cohort} | {label}{shapley} | {cell['s_per_round']:.2f} | {ratio} | {extra} | {client} | "
                     f"{server:.2f} s ({server / PAPER_T10['fedavg'][2]:.2f}×) |")
    settings = sorted({(c.get("num_clients"), c.get("server_rows"), c.get("backend"), c.get("strategy"))
                       for c in cells}, key=str)
    lines += ["", "Set: " + " ".join(f"`--set {x}`" for x in result.get("set", [])) + "; "
              + "; ".join(f"{k} clients, {r} server rows, {b}, {st}" for k, r, b, st in settings)
              + ". Ours are whole rounds (every client's training and the server step, one compiled program); the "
              "paper's server column is the server step alone.", ""]
  return "\n".join(lines) if lines else "No Table 10 result stored yet (benchmarks/fedvsa_cost.py --out).\n"


TABLES = {"table3": table3, "table4": table4, "table5": table5, "fig3": fig3, "fig5": fig5, "table9": table9,
          "table10": table10}


def cells_of(mode: str, datasets, partitions, methods, fresh=(0.1, 0.3, 0.5)):
  if mode == "table3":
    return [(d, p, m, 0.0, False) for d in datasets for p in partitions if p in SIGMAS for m in methods]
  if mode == "table4":
    return [(d, p, m, 0.0, False) for d in datasets for p in partitions if p in DIRS for m in methods]
  if mode == "table5":
    return [(d, p, m, a, False) for d in datasets for p, a in T5_SETTINGS if p in partitions and a in fresh
            for m in methods]
  if mode == "table9":  # each method, and its +vsa partner where the plug-in applies
    return [(d, p, m + plug, 0.0, False) for d in datasets for p in partitions[:1] for m in methods
            if m in T9_METHODS for plug in ("", PLUGIN) if not plug or PAPER_T9[m][1] is not None]
  allowed = FIG3_METHODS if mode == "fig3" else ABLATIONS
  return [(d, p, m, 0.0, True) for d in datasets for p in partitions[:1] for m in methods if m in allowed]


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--mode", choices=tuple(TABLES), default="table3")
  parser.add_argument("--datasets", default="mnist")
  parser.add_argument("--partitions", default="", help="default: the mode's (σ for table3, Dir for table4, ...)")
  parser.add_argument("--methods", default="", help="default: the mode's (14 methods; fig5: FedVSA's ablations)")
  parser.add_argument("--fresh", default="0.1,0.3,0.5", help="table5: the α values")
  parser.add_argument("--pretrain", type=int, default=5, help="warm-start FedAvg rounds (spec §4.6)")
  parser.add_argument("--figure", default="", help="fig3 / fig5: also write the curves to this PNG (and SVG)")
  parser.add_argument("--from_json", default=None,
                      help="print the mode's table from stored results files and exit (comma-separated; a cell stored "
                           "one seed per file is pooled over seeds; `path::key1+key2` takes only those keys)")
  grid.add_common_args(parser, "runs/fedvsa")
  parser.set_defaults(rounds=0, epochs=0)
  args = parser.parse_args()
  if args.figure and args.mode not in ("fig3", "fig5"):
    parser.error(f"--figure: --mode {args.mode} draws no figure (only fig3, fig5)")
  if args.from_json and args.mode == "table10":  # benchmark files, each a table of its own
    print(table10({p: json.loads(Path(p).read_text()) for p in args.from_json.split(",")}), end="")
    return
  if args.mode == "table10":
    parser.error("--mode table10 tabulates stored benchmarks/fedvsa_cost.py results: give --from_json")
  if args.from_json:
    results = grid.load_pooled(args.from_json)
    if args.figure:
      fig3_figure(results, Path(args.figure), FIG3_METHODS if args.mode == "fig3" else ABLATIONS)
    print(TABLES[args.mode](results), end="")
    return
  logging.basicConfig(level=logging.WARNING)
  default_partitions = {"table3": SIGMAS, "table4": DIRS, "table5": ("sigma900", "dir0.1"), "fig3": ("sigma900",),
                        "fig5": ("sigma900",), "table9": ("sigma900",)}
  methods = [m for m in args.methods.split(",") if m] or list(ABLATIONS if args.mode == "fig5" else METHODS)
  partitions = [p for p in args.partitions.split(",") if p] or list(default_partitions[args.mode])
  suffix = FULL if args.mode == "table9" else ""
  cells = [(cell_key(*c) + suffix, cell_config(*c, args), make_record(c[0], c[1]))
           for c in cells_of(args.mode, [d for d in args.datasets.split(",") if d in DATASETS], partitions,
                             [m for m in methods if m in METHODS + ABLATIONS],
                             tuple(float(a) for a in args.fresh.split(",") if a))]
  table = grid.run_and_tabulate(cells, args, TABLES[args.mode])
  if args.mode in ("fig3", "fig5") and args.figure:
    fig3_figure(grid.merged_results(Path(args.out_dir)), Path(args.figure),
                FIG3_METHODS if args.mode == "fig3" else ABLATIONS)
  print(table)


if __name__ == "__main__":
  main()
