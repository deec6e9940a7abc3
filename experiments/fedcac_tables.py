"""FedCAC: Table 1 (pathological), Table 2 (Dirichlet) and Table 3 (non-critical parameters: All vs As Critical),
and the ablation figures 3 (selection rules), 5 (τ) and 6 (β), specs/fedcac.md §2, §4; issue 32 §4.

Every cell is ``experiments/configs/fedcac_<dataset>.py:<partition>,<method>`` (the setting:
experiments/configs/fedcac_setting.py) run at ``--seeds`` (default 0,1,2,3,4: ONE vmapped program per cell; each
seed draws its own partition and initial model, spec §3.5). Cells are keyed ``<dataset>__<partition>__<method>``
(``cifar10__pathological__fedcac``, ``cifar100__dir0.1__fedbn``, ``cifar10__dir0.1__fedcac_as_critical``).

A cell's number (spec §3.6, A9, A24): per seed, the BEST round's ``client_acc_mean`` (the uniform mean over the 40
clients of each client's accuracy on its own 100 test rows, the method's model after aggregation), in %, taken from
the per-round series (evaluated every ``--eval_every`` rounds, default every round); the table shows the mean ± std
(ddof 0) of those per-seed bests beside the paper's mean ± std. Cells also keep each seed's last evaluated value
(``final``), the best round, FedCAC's best before-aggregation value (``before_aggregation``), the per-round curves
(``curves``), the config, seeds, command, commit, device and wall time (``grid.run_cells``).

  python experiments/fedcac_tables.py --data_dir ../shared/data --mode table1 --datasets cifar10,cifar100  # 2 x 7
  python experiments/fedcac_tables.py --data_dir ../shared/data --mode table2 --datasets cifar10,cifar100  # 6 x 7
  python experiments/fedcac_tables.py --data_dir ../shared/data --mode table3 --datasets cifar10,cifar100  # 2 x 2
  python experiments/fedcac_tables.py --data_dir ../shared/data --mode table1 --datasets cifar10 \\
      --methods fedcac,fedavg --rounds 2 --epochs 1 --seeds 0,1 --set data.num_clients=4   # a reduced CPU run
  python experiments/fedcac_tables.py --mode table1 --from_json experiments/results/fedcac_<...>.json
  python experiments/fedcac_tables.py --data_dir ../shared/data --mode fig5 --datasets cifar10 --figure f5.png

Figures (spec §2's ablation switches, §4's figure-only results; the paper gives curves, no numbers): ``fig3``
runs FedCAC on the pathological partition with τ = 0.5 and every critical parameter kept local (collaboration
``none``) under each selection rule (methods ``fedcac_local_<selection>``: sensitivity, random,
sensitivity_reverse) and draws the per-round accuracy; ``fig5`` sweeps τ (``--taus``, methods ``fedcac_tau<τ>``)
and ``fig6`` β (``--betas``, ``fedcac_beta<β>``) on Dirichlet α = 0.1 and draw the best-round accuracy against
them. A sweep's value equal to the dataset's own τ / β is the plain ``fedcac`` cell (Table 2's, the same key).
``--one_program`` runs a dataset's Fig. 6 sweep as one program (every β and seed a lane; β is traced, τ is not:
it sets static shapes), stored as the same cells with a share of the program's time each.
A figure refuses a ``--set`` of what it sets per cell (Fig. 5's τ, Fig. 6's β, Fig. 3's selection, collaboration
and τ). Cells whose FedCAC ran with another τ / β than the setting's (``--set algorithm.fedcac.beta=6``) are
starred in the tables and named under them, as reductions are (except the value a figure varies itself).
``--figure F.png`` draws them (PNG and SVG).

A seeds program is one compiled run and cannot checkpoint (fedjax_robust/run.py). Where a cell's five seeds do not
fit in one command, ``--one_seed_per_cell`` runs each seed of ``--seeds`` as its own plain run keyed
``<cell>__seed<k>`` (``seed``, ``data.seed``, ``attack.seed`` = k, as in the seeds program), which
``--checkpoint_every N --resume`` can continue across commands; the tables merge a key's ``__seed<k>`` cells into one
mean ± std (a stored seeds cell of the same key wins).

``--rounds`` / ``--epochs`` default to the paper's 500 x 5 (spec §1.2); giving them reduces every cell (spec: 300
rounds is acceptable for quick runs), and so do ``--set`` overrides of the clients, their rows or the evaluation
period: the stored cells say so (``protocol``), the tables mark such cells with ``*`` and list the reductions.
Tiny-ImageNet has no offline copy here: its columns read "not run" until ``--datasets tiny_imagenet`` runs with a
``--data_dir`` that holds it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import grid  # noqa: E402

DATASETS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "tiny_imagenet": "Tiny-ImageNet"}
OFFLINE = ("cifar10", "cifar100")  # in ../shared/data; Tiny-ImageNet is not
DATA_NAMES = {"cifar10": "cifar10", "cifar100": "cifar100", "tiny_imagenet": "tiny_imagenet"}  # data.name -> ours
# Rows of Tables 1-2, in the paper's order; fedcac_as_critical is Table 3's second row.
METHODS = {"fedavg": "FedAvg", "local": "Separate", "fedamp": "FedAMP", "fedrep": "FedRep", "fedbn": "FedBN",
           "fedper": "FedPer", "fedcac": "FedCAC"}
BASELINES = ("fedavg", "local", "fedamp", "fedrep", "fedbn", "fedper")
TABLE3_METHODS = {"fedcac": "All (FedCAC)", "fedcac_as_critical": "As Critical"}
ALPHAS = {"cifar10": (0.1, 0.5, 1.0), "cifar100": (0.01, 0.1, 0.5), "tiny_imagenet": (0.01, 0.1, 0.5)}
TABLE3_ALPHA = 0.1
PAPER_ROUNDS, PAPER_EPOCHS = 500, 5
TOLERANCE = 3.0  # spec §4: FedCAC "within about two reported standard deviations (≈ ±2-3 points)"

# ------------------------------------------------------------------------------------------ the paper's numbers
# specs/fedcac.md §4, verbatim (accuracy %, mean ± std over 5 runs, best round), all in one place.
# Table 1, pathological: method -> ((mean, std) CIFAR-10, CIFAR-100, Tiny-ImageNet).
PAPER_TABLE1 = {
    "fedavg": ((54.33, 3.03), (25.68, 1.31), (17.93, 2.81)),
    "local": ((85.85, 0.93), (88.97, 1.10), (86.43, 1.08)),
    "fedamp": ((88.88, 0.83), (91.80, 0.61), (88.23, 0.52)),
    "fedrep": ((87.10, 0.91), (90.25, 0.60), (87.22, 0.94)),
    "fedbn": ((87.02, 1.41), (91.74, 0.62), (89.41, 0.32)),
    "fedper": ((87.51, 0.95), (90.33, 0.60), (87.17, 1.10)),
    "fedcac": ((89.77, 1.14), (93.05, 0.90), (90.36, 0.75)),
}
# Table 2, Dirichlet: method -> (mean, std) at C10 α 0.1, 0.5, 1.0, C100 α 0.01, 0.1, 0.5, Tiny α 0.01, 0.1, 0.5.
PAPER_TABLE2 = {
    "fedavg": ((54.36, 2.73), (60.41, 1.36), (60.91, 0.72), (27.83, 3.03), (34.16, 0.70), (32.78, 0.23),
               (20.56, 0.25), (21.26, 1.28), (20.32, 0.91)),
    "local": ((81.45, 1.60), (60.15, 0.86), (52.24, 0.41), (82.91, 0.96), (45.57, 0.90), (22.65, 0.51),
              (64.47, 3.11), (24.07, 0.62), (8.75, 0.30)),
    "fedamp": ((84.99, 1.82), (68.26, 0.79), (64.87, 0.95), (85.11, 1.15), (46.68, 1.06), (24.74, 0.58),
               (69.86, 2.03), (27.85, 0.71), (10.70, 0.32)),
    "fedrep": ((84.59, 1.58), (67.69, 0.86), (60.52, 0.72), (84.40, 1.43), (51.25, 1.37), (26.97, 0.33),
               (70.45, 1.11), (30.83, 1.05), (12.14, 0.28)),
    "fedbn": ((83.55, 2.32), (66.79, 1.08), (62.20, 0.67), (85.43, 0.87), (54.35, 0.63), (36.94, 0.94),
              (73.90, 1.45), (33.34, 0.71), (19.61, 0.35)),
    "fedper": ((84.43, 0.47), (68.80, 0.49), (64.92, 0.66), (83.35, 0.78), (51.38, 0.94), (28.25, 1.03),
               (72.63, 0.78), (32.33, 0.31), (12.69, 0.42)),
    "fedcac": ((86.82, 1.18), (69.83, 0.46), (65.39, 0.51), (86.58, 0.85), (57.22, 1.52), (38.64, 0.63),
               (75.76, 1.21), (40.19, 1.20), (23.70, 0.28)),
}
# Table 3, Dirichlet α = 0.1: method -> ((mean, std) CIFAR-10, CIFAR-100, Tiny-ImageNet).
PAPER_TABLE3 = {
    "fedcac": ((86.82, 1.18), (57.22, 1.52), (40.19, 1.20)),
    "fedcac_as_critical": ((85.42, 1.39), (55.15, 1.10), (37.97, 0.63)),
}
TABLE2_COLUMNS = [(d, a) for d in DATASETS for a in ALPHAS[d]]

# Figures 3, 5, 6 (spec §2 ablations, §4 figure-only targets). The paper does not list its sweep values.
FIG3_SELECTIONS = {"sensitivity": "Sensitivity", "random": "Random", "sensitivity_reverse": "Sensitivity_Reverse"}
FIG3_TAU = 0.5
FIG_ALPHA = 0.1  # Figs. 5 and 6: Dirichlet α = 0.1
FIG5_TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)
FIG6_BETAS = (10, 50, 100, 170, 250, 400)
SWEPT_FIELDS = ("tau", "beta")  # FedCAC's fields the figures vary (Figs. 5, 6) or fix (Fig. 3)
SYMBOLS = {"tau": "τ", "beta": "β"}
FIG3_SKIP = SWEPT_FIELDS  # Fig. 3 fixes τ = 0.5 and keeps critical parameters local (β plays no part)
# What each figure mode sets itself, per cell: a `--set` of one of these would silently replace it (or mislabel the
# setting's own point), so the grid refuses it.
FIGURE_FIELDS = {"fig3": ("algorithm.fedcac.selection", "algorithm.fedcac.collaboration", "algorithm.fedcac.tau"),
                 "fig5": ("algorithm.fedcac.tau",), "fig6": ("algorithm.fedcac.beta",)}


def partition_name(alpha: float | None) -> str:
  """``None`` -> ``pathological``; ``0.1`` -> ``dir0.1`` (the config argument's partition)."""
  return "pathological" if alpha is None else f"dir{alpha:g}"


def paper_value(dataset: str, partition: str, method: str) -> tuple[float, float] | None:
  """The paper's (mean, std) of a cell, or None where the paper has no such number."""
  col = list(DATASETS).index(dataset)
  if partition == "pathological":
    row = PAPER_TABLE1.get(method)
    return None if row is None else row[col]
  alpha = float(partition[3:])
  if method == "fedcac_as_critical":
    return PAPER_TABLE3[method][col] if alpha == TABLE3_ALPHA else None
  row = PAPER_TABLE2.get(method)
  if row is None or (dataset, alpha) not in TABLE2_COLUMNS:
    return None
  return row[TABLE2_COLUMNS.index((dataset, alpha))]


# ------------------------------------------------------------------------------------------ cells
def cell_key(dataset: str, partition: str, method: str, seed: int | None = None) -> str:
  """``<dataset>__<partition>__<method>``; a one-seed cell (``--one_seed_per_cell``) adds ``__seed<k>``."""
  return f"{dataset}__{partition}__{method}" + ("" if seed is None else f"__seed{seed}")


def lookup(results: dict, dataset: str, partition: str, method: str) -> dict | None:
  """The cell a table shows: the seeds cell if stored, else the ``__seed<k>`` cells of that key merged
  (:func:`merge_seed_cells`), else None."""
  key = cell_key(dataset, partition, method)
  if key in results:
    return results[key]
  singles = sorted((k for k in results if k.startswith(key + "__seed")), key=lambda k: int(k.rsplit("seed", 1)[1]))
  return merge_seed_cells([results[k] for k in singles]) if singles else None


def merge_seed_cells(cells: list[dict]) -> dict:
  """One-seed cells of one setting and method as a seeds cell: each numeric field's mean and std (ddof 0) over them
  (``value``, ``value_std``, ``value_values``, ...), the seeds, the protocol (reduced if any was, every reduction
  listed), the summed wall time and the devices."""
  import numpy as np
  merged: dict = {"seeds": [int(c.get("config", {}).get("seed", i)) for i, c in enumerate(cells)]}
  for field in ("value", "final", "best_round", "before_aggregation"):
    values = [c[field] for c in cells if field in c]
    if len(values) == len(cells):
      merged[field], merged[f"{field}_std"], merged[f"{field}_values"] = (float(np.mean(values)),
                                                                          float(np.std(values)), values)
  protocols = [_protocol_of(c) for c in cells]
  merged["protocol"] = {**protocols[0], "reduced": any(p["reduced"] for p in protocols),
                        "reductions": list(dict.fromkeys(r for p in protocols for r in p["reductions"]))}
  merged["wall_s"] = sum(float(c.get("run_wall_time_s", c.get("wall_s", 0.0))) for c in cells)
  merged["device_kind"] = ", ".join(sorted({str(c.get("device_kind") or c.get("backend")) for c in cells}))
  return merged


def setting():
  from fedjax_robust.config_files import load_module
  return load_module(Path(__file__).resolve().parent / "configs" / "fedcac_setting.py")


def method_variant(method: str) -> tuple[str, dict]:
  """A figure cell's method as ``(the setting's method, config overrides)``: ``fedcac_local_<selection>`` (Fig. 3:
  that selection rule, τ = 0.5, critical parameters purely local), ``fedcac_tau<τ>`` (Fig. 5), ``fedcac_beta<β>``
  (Fig. 6); any other method is the setting's own, unchanged."""
  if method.startswith("fedcac_local_"):
    selection = method[len("fedcac_local_"):]
    if selection not in FIG3_SELECTIONS:
      raise ValueError(f"unknown selection rule in {method!r}; one of {tuple(FIG3_SELECTIONS)}")
    return "fedcac", {"algorithm.fedcac.selection": selection, "algorithm.fedcac.collaboration": "none",
                      "algorithm.fedcac.tau": FIG3_TAU}
  for prefix, field, kind in (("fedcac_tau", "tau", float), ("fedcac_beta", "beta", int)):
    if method.startswith(prefix):
      try:
        value = kind(float(method[len(prefix):]))
      except ValueError:
        raise ValueError(f"{method!r}: expected {prefix}<number>") from None
      return "fedcac", {f"algorithm.fedcac.{field}": value}
  return method, {}


def own_value(dataset: str, field: str) -> float:
  """The setting's τ (``field="tau"``) or β (``"beta"``) for ``dataset`` (spec §1.2)."""
  _, _, tau, beta, _, _ = setting().DATASETS[dataset]
  return float(tau if field == "tau" else beta)


def sweep_method(dataset: str, field: str, value: float) -> str:
  """The cell method of a Fig. 5 (``tau``) / Fig. 6 (``beta``) sweep point: the dataset's own value is the plain
  ``fedcac`` cell (Table 2's at α = 0.1), any other ``fedcac_<field><value>``."""
  return "fedcac" if float(value) == own_value(dataset, field) else f"fedcac_{field}{value:g}"


def cell_config(dataset: str, partition: str, method: str, args, seed: int | None = None):
  """One cell's config: the dataset's FedCAC setting for ``<partition>,<method>``, the grid-wide flags applied,
  rounds / local epochs the paper's (500 x 5) unless ``--rounds`` / ``--epochs`` reduce them, evaluated every
  ``--eval_every`` rounds (default 1: the best round of the whole series); ``--set`` overrides win over all of it.
  ``seed``: a one-seed cell (a plain run, so checkpoints work): ``seed``, ``data.seed`` and ``attack.seed`` set to
  it, as the seeds program sets each of its seeds (``seed_fields``)."""
  from fedjax_robust.config_files import load_module
  from fedjax_robust.run import set_seed_fields
  root = Path(__file__).resolve().parent
  base, overrides = method_variant(method)
  config = load_module(root / "configs" / f"fedcac_{dataset}.py").get_config(f"{partition},{base}")
  grid.apply_overrides(config, [f"{k}={v}" for k, v in overrides.items()])
  if overrides:
    config.output.name = f"fedcac_{dataset}_{partition}_{method}"
  rounds, epochs = config.rounds, config.client.epochs
  config = grid.apply_run_args(config, args)
  config.rounds = args.rounds or rounds
  config.client.epochs = args.epochs or epochs
  config.eval_every = int(getattr(args, "eval_every", 1) or 1)
  if seed is not None:
    config.seeds = ""
    set_seed_fields(config, seed)
  grid.apply_overrides(config, args.set)  # again: an explicit --set wins over the lines above
  return config


def beta_sweep_program(dataset: str, betas, args) -> tuple[dict, object, object]:
  """Fig. 6's β sweep of ``dataset`` as ONE grid program (``--one_program``; ``grid.run_cells``): FedCAC on
  Dirichlet α = 0.1 with ``config.grid`` over ``algorithm.fedcac.beta`` (a traced hyperparameter), each point
  stored under the key its own cell would have (``fedcac_beta<β>``, the dataset's own β the plain ``fedcac``)."""
  from fedjax_robust.run import point_label
  part = partition_name(FIG_ALPHA)
  config = cell_config(dataset, part, "fedcac", args)
  values = sorted({int(b) for b in betas})
  config.grid = "algorithm.fedcac.beta=" + ",".join(str(b) for b in values)
  config.output.name = f"fedcac_{dataset}_{part}_beta_sweep"
  keys = {point_label({"algorithm.fedcac.beta": float(b)}): cell_key(dataset, part, sweep_method(dataset, "beta", b))
          for b in values}
  return keys, config, record


def protocol(config) -> dict:
  """What a cell ran against the paper's setting (spec §1.2, §3): a ``reductions`` list, empty for a full cell."""
  s = setting()
  cfg = config if isinstance(config, dict) else json.loads(config.to_json_best_effort())
  data, part = cfg["data"], cfg["data"]["partition"]
  rounds, epochs, every = int(cfg["rounds"]), int(cfg["client"]["epochs"]), int(cfg.get("eval_every", 1))
  clients = int(data["num_clients"])
  m_train, m_test = part.get("samples_per_client"), part.get("test_samples_per_client")
  reductions = []
  if rounds != PAPER_ROUNDS:
    reductions.append(f"{rounds} rounds (paper {PAPER_ROUNDS})")
  if epochs != PAPER_EPOCHS:
    reductions.append(f"E = {epochs} (paper {PAPER_EPOCHS})")
  if clients != s.NUM_CLIENTS:
    reductions.append(f"{clients} clients (paper {s.NUM_CLIENTS})")
  if (m_train, m_test) != (s.TRAIN_PER_CLIENT, s.TEST_PER_CLIENT):
    reductions.append(f"{m_train} / {m_test} train / test rows per client (paper {s.TRAIN_PER_CLIENT} / "
                      f"{s.TEST_PER_CLIENT})")
  if every != 1:
    reductions.append(f"evaluated every {every} rounds (the best of those, not of every round)")
  return {"dataset": DATA_NAMES[data["name"]], "rounds": rounds, "paper_rounds": PAPER_ROUNDS, "epochs": epochs,
          "paper_epochs": PAPER_EPOCHS, "num_clients": clients, "samples_per_client": [m_train, m_test],
          "eval_every": every, "reduced": bool(reductions), "reductions": reductions, "changed": changed_settings(cfg)}


def changed_settings(config) -> dict[str, float]:
  """FedCAC's τ / β where a FedCAC cell ran with other values than its dataset's (spec §1.2; ``--set
  algorithm.fedcac.beta=6``, or a Fig. 5 / 6 sweep point): ``{"beta": 6.0}``; empty for the setting's own and for
  the other methods (their config carries FedCAC's fields unused)."""
  cfg = config if isinstance(config, dict) else json.loads(config.to_json_best_effort())
  algorithm = cfg.get("algorithm", {})
  if algorithm.get("name") != "fedcac":
    return {}
  dataset = DATA_NAMES[cfg["data"]["name"]]
  return {f: float(algorithm["fedcac"][f]) for f in SWEPT_FIELDS
          if float(algorithm["fedcac"][f]) != own_value(dataset, f)}


def read_metrics(run_dir: Path) -> list[dict]:
  return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _best(rows: list[dict], key: str) -> tuple[float, int] | None:
  """``(best value in %, its round)`` over the rounds that logged a finite ``key`` (the first round on ties)."""
  logged = [(100.0 * float(r[key]), int(r["round"])) for r in rows
            if key in r and r[key] is not None and math.isfinite(float(r[key]))]
  if not logged:
    return None
  best = max(v for v, _ in logged)
  return best, next(t for v, t in logged if v == best)


def record_rows(rows: list[dict], config) -> dict:
  """A run's cell fields from its metrics.jsonl records: ``value`` = the best round's ``client_acc_mean`` (%),
  ``best_round``, ``final`` (the last evaluated round's), ``before_aggregation`` (FedCAC's best
  ``before_aggregation_client_acc_mean``, when logged), ``curves`` (every evaluated round's values, fractions) and
  ``protocol``."""
  best = _best(rows, "client_acc_mean")
  if best is None:
    raise KeyError("the run logged no client_acc_mean (clients need test rows: data.client_split='per_split')")
  evaluated = [r for r in rows if "client_acc_mean" in r]
  cell = {"value": best[0], "best_round": best[1], "final": 100.0 * float(evaluated[-1]["client_acc_mean"])}
  before = _best(rows, "before_aggregation_client_acc_mean")
  if before is not None:
    cell["before_aggregation"] = before[0]
  keys = ("client_acc_mean", "before_aggregation_client_acc_mean")  # (grid keeps global_test_acc_per_round)
  cell["curves"] = {"round": [int(r["round"]) for r in evaluated],
                    **{k: [r.get(k) for r in evaluated] for k in keys if any(k in r for r in evaluated)}}
  cell["protocol"] = protocol(config)
  return cell


def record(summary, run_dir, config) -> dict:
  return record_rows(read_metrics(run_dir), config)


def hoist_protocol(cell: dict) -> dict:
  """A seeds cell keeps ``record``'s non-numeric fields per seed (``grid._seed_cells``); lift ``protocol`` (the same
  for every seed) to the cell, so the stored cell itself says what it ran."""
  per_seed = list(cell.get("per_seed", {}).values())
  if per_seed and "protocol" not in cell and all(r.get("protocol") == per_seed[0].get("protocol") for r in per_seed):
    cell["protocol"] = per_seed[0].get("protocol")
  return cell


def cells_of(mode: str, datasets, methods=None, partitions=None, taus=FIG5_TAUS, betas=FIG6_BETAS
             ) -> list[tuple[str, str, str]]:
  """``(dataset, partition, method)`` of every cell of ``mode``; ``methods`` / ``partitions`` filter (None = all the
  table's); ``taus`` / ``betas``: the Fig. 5 / Fig. 6 sweep points."""
  out = []
  for d in datasets:
    if mode == "fig3":
      parts, ms = ["pathological"], [f"fedcac_local_{s}" for s in FIG3_SELECTIONS]
    elif mode == "fig5":
      parts, ms = [partition_name(FIG_ALPHA)], [sweep_method(d, "tau", v) for v in taus]
    elif mode == "fig6":
      parts, ms = [partition_name(FIG_ALPHA)], [sweep_method(d, "beta", v) for v in betas]
    elif mode == "table1":
      parts, ms = ["pathological"], list(METHODS)
    elif mode == "table2":
      parts, ms = [partition_name(a) for a in ALPHAS[d]], list(METHODS)
    elif mode == "table3":
      parts, ms = [partition_name(TABLE3_ALPHA)], list(TABLE3_METHODS)
    else:
      raise ValueError(f"unknown mode {mode!r}")
    out += [(d, p, m) for p in parts if not partitions or p in partitions
            for m in ms if not methods or m in methods]
  return out


# ------------------------------------------------------------------------------------------ tables
def _protocol_of(cell: dict) -> dict:
  found = cell.get("protocol") or next(iter(cell.get("per_seed", {}).values()), {}).get("protocol")
  if not found:
    return protocol(cell["config"])
  if "changed" not in found:  # stored before protocols said it: read it off the cell's config
    found = {**found, "changed": changed_settings(cell["config"]) if "config" in cell else {}}
  return found


def changed_of(cell: dict, skip=()) -> dict[str, float]:
  """:func:`changed_settings` of a stored cell, less the fields in ``skip`` (what a figure varies or fixes itself)."""
  return {f: v for f, v in _protocol_of(cell)["changed"].items() if f not in skip}


def _changed_text(cell: dict, skip=()) -> list[str]:
  dataset = _protocol_of(cell)["dataset"]
  return [f"{SYMBOLS[f]} = {v:g} on {DATASETS[dataset]} (spec §1.2: {own_value(dataset, f):g})"
          for f, v in changed_of(cell, skip).items()]


def ours(cell: dict | None, field: str = "value", skip=()) -> str:
  """``mean ± std`` over seeds (one seed: the value alone), ``*`` when the cell is reduced or ran FedCAC with
  another τ / β than the setting's (less ``skip``: what the table varies itself); ``not run``."""
  if cell is None or field not in cell:
    return "not run"
  std = cell.get(f"{field}_std") if grid.n_seeds(cell) > 1 else None
  text = f"{cell[field]:.2f}" + ("" if std is None else f" ± {std:.2f}")
  return text + ("*" if _protocol_of(cell)["reduced"] or changed_of(cell, skip) else "")


def _paper(pair) -> str:
  return "—" if pair is None else f"{pair[0]:.2f} ± {pair[1]:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def setup_note(cells: list[dict], columns: list[tuple[str, str]], skip=(), paper_numbers: bool = True) -> str:
  """Which runs the table's cells are: rounds / epochs / seeds / evaluation, reductions and changed τ / β (``*``;
  less ``skip``, what the table varies itself), devices, wall time, and which columns have not run.
  ``paper_numbers=False``: a figure's table, beside no number of the paper's."""
  runs, reduced = {}, {}
  for cell in cells:
    p = _protocol_of(cell)
    runs[f"{p['rounds']} rounds x E = {p['epochs']}, {p['num_clients']} clients, {grid.seeds_phrase(cell)}, "
         f"evaluated every {p['eval_every']} round(s)"] = None
    for r in p["reductions"]:
      reduced[r] = None
  devices = sorted({str(c.get("device_kind") or c.get("backend")) for c in cells if c.get("device_kind")
                    or c.get("backend")})
  wall = sum(float(c.get("run_wall_time_s", c.get("wall_s", 0.0))) for c in cells)
  lines = ["Cells ran with: " + "; ".join(runs) + "."]
  if reduced:
    lines.append("`*` = REDUCED from the paper's protocol (500 rounds x E = 5, 40 clients, 500 / 100 rows, every "
                 "round evaluated): " + "; ".join(reduced) + ".")
  changed = list(dict.fromkeys(t for c in cells for t in _changed_text(c, skip)))
  if changed:
    lines.append("`*` also: FedCAC ran with " + "; ".join(changed) + ".")
  lines.append("Ours: best round's uniform mean client accuracy (after aggregation), mean ± std (ddof 0) over "
               "seeds" + ("; paper: mean ± std over 5 runs." if paper_numbers else ".") + (f" Devices: {', '.join(devices)}." if devices else "")
               + (f" Wall time of these cells: {wall / 3600:.2f} h." if wall else ""))
  missing = [d for d in DATASETS if any(c[0] == d for c in columns) and not any(
      _protocol_of(c)["dataset"] == d for c in cells)]
  if missing:
    offline = [DATASETS[d] for d in missing if d in OFFLINE]
    absent = [DATASETS[d] for d in missing if d not in OFFLINE]
    if offline:
      lines.append("Not run: " + ", ".join(offline) + " (in ../shared/data; the grid's command runs it).")
    if absent:
      lines.append("Not run, no offline copy here (the loader is ready): " + ", ".join(absent) + ".")
  return " ".join(lines)


def _column_label(dataset: str, partition: str) -> str:
  return DATASETS[dataset] if partition == "pathological" else f"{DATASETS[dataset]} α={float(partition[3:])}"


def render(results: dict, title: str, columns: list[tuple[str, str]], methods: dict, acceptance_fn) -> str:
  rows = []
  for m, label in methods.items():
    rows.append([label] + [f"{ours(lookup(results, d, p, m))} / {_paper(paper_value(d, p, m))}"
                           for d, p in columns])
  if any("before_aggregation" in (lookup(results, d, p, "fedcac") or {}) for d, p in columns):
    rows.append(["FedCAC, before aggregation (ours only)"]
                + [f"{ours(lookup(results, d, p, 'fedcac'), 'before_aggregation')} / —" for d, p in columns])
  labelled = {f"{label} ({_column_label(d, p)})": lookup(results, d, p, m) for d, p in columns
              for m, label in methods.items()}
  cells = [c for c in labelled.values() if c is not None]
  return "\n".join([f"**{title}** (accuracy %, ours / paper)", "",
                    *_table(["Method"] + [f"{_column_label(d, p)}" for d, p in columns], rows), "",
                    grid.with_seeds_note(setup_note(cells, columns), labelled) if cells
                    else "No cell has run yet.", "",
                    acceptance_fn(results, columns), ""])


def table1(results: dict) -> str:
  return render(results, "Table 1 — pathological non-IID (2 classes per client)",
                [(d, "pathological") for d in DATASETS], METHODS, acceptance)


def table2(results: dict) -> str:
  return render(results, "Table 2 — Dirichlet non-IID", [(d, partition_name(a)) for d, a in TABLE2_COLUMNS],
                METHODS, acceptance)


def table3(results: dict) -> str:
  return render(results, "Table 3 — collaboration on non-critical parameters (Dirichlet α = 0.1)",
                [(d, partition_name(TABLE3_ALPHA)) for d in DATASETS], TABLE3_METHODS, acceptance_table3)


# ------------------------------------------------------------------------------------------ acceptance (spec §4)
def _mean(results: dict, dataset: str, partition: str, method: str, paper: bool) -> float | None:
  if paper:
    p = paper_value(dataset, partition, method)
    return None if p is None else p[0]
  cell = lookup(results, dataset, partition, method)
  return None if cell is None or "value" not in cell else float(cell["value"])


def _status(ok: bool | None) -> str:
  return "not run" if ok is None else ("met" if ok else "NOT met")


def acceptance_checks(results: dict, columns: list[tuple[str, str]], paper: bool = False) -> list[tuple]:
  """Spec §4's targets over the settings ``columns`` as ``(target, met: True / False / None = not run, numbers)``,
  from the cells present (``paper=True``: from the paper's own numbers)."""
  mean = lambda d, p, m: _mean(results, d, p, m, paper)  # noqa: E731
  label = lambda d, p: _column_label(d, p)  # noqa: E731
  close, wins, above_avg = [], [], []
  for d, p in columns:
    cac = mean(d, p, "fedcac")
    if cac is None:
      continue
    ref = paper_value(d, p, "fedcac")
    if ref is not None and not paper:
      close.append((label(d, p), abs(cac - ref[0]) <= TOLERANCE, f"{cac - ref[0]:+.2f}"))
    base = {m: mean(d, p, m) for m in BASELINES}
    ran = {m: v for m, v in base.items() if v is not None}
    if ran:
      best = max(ran, key=ran.get)
      partial = "" if len(ran) == len(BASELINES) else f", {len(ran)} of {len(BASELINES)} baselines run"
      wins.append((label(d, p), cac > ran[best], f"{cac:.2f} vs {METHODS[best]} {ran[best]:.2f}{partial}"))
    if base["fedavg"] is not None:
      above_avg.append((label(d, p), cac > base["fedavg"], f"{cac:.2f} vs {base['fedavg']:.2f}"))
  n = len(columns)

  def summary(items, rule) -> tuple[bool | None, str]:
    if not items:
      return None, f"0 of {n} settings run"
    ok = rule(sum(1 for _, good, _ in items if good), len(items))
    misses = [f"{where} ({numbers})" for where, good, numbers in items if not good]
    good = sum(1 for _, g, _ in items if g)
    text = f"{good} of {len(items)} settings" if paper else f"{good} of {len(items)} settings run ({n} in the table)"
    return ok, text + (("; misses: " + "; ".join(misses)) if misses else "")

  checks = []
  if not paper:
    checks.append((f"FedCAC within ±{TOLERANCE:g} points of the paper in every setting",
                   *summary(close, lambda k, total: k == total)))
  checks.append(("FedCAC above the best baseline in most settings", *summary(wins, lambda k, total: 2 * k > total)))
  checks.append(("FedCAC above FedAvg in every setting", *summary(above_avg, lambda k, total: k == total)))
  return checks


def acceptance(results: dict, columns: list[tuple[str, str]]) -> str:
  """The acceptance paragraph below Table 1 / 2: each target met / NOT met / not run, ours then the paper's."""
  paper = {t: (ok, numbers) for t, ok, numbers in acceptance_checks(results, columns, paper=True)}
  lines = ["Acceptance (spec §4; our means over seeds; the paper's own numbers after ';'):"]
  for target, ok, numbers in acceptance_checks(results, columns):
    p = paper.get(target)
    theirs = f"; paper: {_status(p[0])} ({p[1]})" if p else ""
    lines.append(f"- {target}: {_status(ok)} ({numbers}){theirs}.")
  return "\n".join(lines)


def acceptance_table3(results: dict, columns: list[tuple[str, str]]) -> str:
  """Table 3's target: the "All" − "As Critical" gap has the paper's sign (positive, ≈ 1.4-2.2 points)."""
  lines = ["Acceptance (spec §4: All − As Critical > 0, as the paper's +1.40 / +2.07 / +2.22):"]
  for d, p in columns:
    gap_paper = paper_value(d, p, "fedcac")[0] - paper_value(d, p, "fedcac_as_critical")[0]
    a, b = _mean(results, d, p, "fedcac", False), _mean(results, d, p, "fedcac_as_critical", False)
    if a is None or b is None:
      lines.append(f"- {DATASETS[d]}: not run (paper {gap_paper:+.2f}).")
    else:
      stds = [lookup(results, d, p, m).get("value_std") for m in ("fedcac", "fedcac_as_critical")]
      spread = ""
      if all(sd is not None for sd in stds) and abs(a - b) < max(stds):  # several seeds: is the gap resolved?
        spread = f", smaller than the seeds' std {stds[0]:.2f} / {stds[1]:.2f}: not resolved"
      lines.append(f"- {DATASETS[d]}: {_status(a - b > 0)} ({a - b:+.2f}{spread}; paper {gap_paper:+.2f}).")
  return "\n".join(lines)


# ------------------------------------------------------------------------------------------ figures 3, 5, 6
def _figure_datasets(results: dict, keys) -> list[str]:
  """The datasets with at least one cell among ``keys(dataset)``."""
  return [d for d in DATASETS if any(lookup(results, d, p, m) for p, m in keys(d))]


def fig3_cells(results: dict, dataset: str) -> dict[str, dict]:
  """selection rule -> its Fig. 3 cell (pathological, τ = 0.5, critical parameters local), for the rules run."""
  found = {s: lookup(results, dataset, "pathological", f"fedcac_local_{s}") for s in FIG3_SELECTIONS}
  return {s: c for s, c in found.items() if c}


def _mean_curve(cell: dict) -> tuple[list[int], list[float]] | None:
  """``(rounds, client_acc_mean in %)``: the cell's curve, or the seeds' mean curve."""
  curves = [r.get("curves") for r in grid.seed_runs(cell).values()]
  curves = [c for c in curves if c and c.get("client_acc_mean")]
  if not curves:
    return None
  rounds = curves[0]["round"]
  values = [100.0 * sum(c["client_acc_mean"][i] for c in curves) / len(curves) for i in range(len(rounds))]
  return rounds, values


def fig3_claims(results: dict, dataset: str) -> list[tuple[str, bool | None, str]]:
  """Spec §4's Fig. 3 target on the best-round means: Sensitivity > Random > Sensitivity_Reverse."""
  cells = fig3_cells(results, dataset)
  claim = f"Sensitivity > Random > Sensitivity_Reverse ({DATASETS[dataset]})"
  if len(cells) < len(FIG3_SELECTIONS):
    return [(claim, None, f"{len(cells)} of {len(FIG3_SELECTIONS)} rules run")]
  v = [cells[s]["value"] for s in FIG3_SELECTIONS]
  return [(claim, v[0] > v[1] > v[2], " / ".join(f"{x:.2f}" for x in v))]


def _sweep(results: dict, dataset: str, field: str) -> list[tuple[float, dict]]:
  """``(value, cell)`` of every swept value of ``field`` with a stored cell, in increasing order: each
  ``fedcac_<field><v>`` key, and the plain ``fedcac`` cell at the value it ran with: the setting's own, or the one
  a ``--set`` gave it (Fig. 5's plain cell run with β = 6 is Fig. 6's β = 6 point, unless a ``fedcac_beta6``
  cell is stored too: that one is shown)."""
  part = partition_name(FIG_ALPHA)
  prefix = f"{dataset}__{part}__fedcac_{field}"
  values = {float(k[len(prefix):].split("__")[0]) for k in results if k.startswith(prefix)}
  found = {v: lookup(results, dataset, part, f"fedcac_{field}{v:g}") for v in values}
  plain = lookup(results, dataset, part, "fedcac")
  if plain:
    found.setdefault(changed_of(plain).get(field, own_value(dataset, field)), plain)
  return [(v, found[v]) for v in sorted(found) if found[v]]


def sweep_claims(results: dict, dataset: str, field: str) -> list[tuple[str, bool | None, str]]:
  """Figs. 5 / 6 (spec §4): the best-round accuracy peaks inside the swept range, lower at both ends (τ: near 0.5;
  β: "low for small β, decreases again for too large β")."""
  points = _sweep(results, dataset, field)
  symbol = SYMBOLS[field]
  claim = f"accuracy peaks inside the {symbol} range, lower at both ends ({DATASETS[dataset]})"
  if len(points) < 3:
    return [(claim, None, f"{len(points)} {symbol} value(s) run, 3 needed")]
  best = max(points, key=lambda p: p[1]["value"])
  inside = best[0] not in (points[0][0], points[-1][0])
  checks = [(claim, inside, f"best at {symbol} = {best[0]:g} ({best[1]['value']:.2f}); ends {points[0][1]['value']:.2f}"
             f" at {points[0][0]:g}, {points[-1][1]['value']:.2f} at {points[-1][0]:g}")]
  if field == "tau":
    checks.append((f"the best τ within 0.3-0.7 (the paper: \"around 0.5\") ({DATASETS[dataset]})",
                   0.3 <= best[0] <= 0.7, f"{best[0]:g}"))
  return checks


def _claims_text(checks) -> list[str]:
  return [f"- {claim}: {_status(ok)} ({numbers})." for claim, ok, numbers in checks]


def fig3(results: dict) -> str:
  """Fig. 3 as a table: per dataset and selection rule, the best round's accuracy, its round, the last round's, and
  the target's check (spec §4: Sensitivity > Random > Sensitivity_Reverse)."""
  lines = ["**Fig. 3 — critical-parameter selection (pathological, τ = 0.5, critical parameters kept local)** "
           "(accuracy %)", "", "| Dataset | Selection | best round's | its round | last round's |",
           "|---|---|---|---|---|"]
  checks, present = [], {}
  for d in _figure_datasets(results, lambda d: [("pathological", f"fedcac_local_{s}") for s in FIG3_SELECTIONS]):
    for s, cell in fig3_cells(results, d).items():
      lines.append(f"| {DATASETS[d]} | {FIG3_SELECTIONS[s]} | {ours(cell, skip=FIG3_SKIP)} | "
                   f"{cell.get('best_round', '—')} | {ours(cell, 'final', FIG3_SKIP)} |")
      present[f"{FIG3_SELECTIONS[s]} ({DATASETS[d]})"] = cell
    checks += fig3_claims(results, d)
  if not present:
    return "(no Fig. 3 cell in these results)\n"
  note = setup_note(list(present.values()), [], FIG3_SKIP, paper_numbers=False)
  return "\n".join(lines + ["", grid.with_seeds_note(note, present), "", "The paper's ordering (curves only, no numbers):",
                            *_claims_text(checks), ""])


def _sweep_table(results: dict, field: str, title: str) -> str:
  symbol = SYMBOLS[field]
  lines = [f"**{title}** (best-round accuracy %)", "", f"| Dataset | {symbol} | ours |", "|---|---|---|"]
  checks, present = [], {}
  for d in DATASETS:
    points = _sweep(results, d, field)
    for v, cell in points:
      own = v == own_value(d, field)
      lines.append(f"| {DATASETS[d]} | {v:g}{' (the setting’s)' if own else ''} | {ours(cell, skip=(field,))} |")
      present[f"{symbol} = {v:g} ({DATASETS[d]})"] = cell
    if points:
      checks += sweep_claims(results, d, field)
  if not present:
    return f"(no {title.split(' —')[0]} cell in these results)\n"
  note = setup_note(list(present.values()), [], (field,), paper_numbers=False)
  return "\n".join(lines + ["", grid.with_seeds_note(note, present), "", "The paper's shape (curves only, no numbers):",
                            *_claims_text(checks), ""])


def fig5(results: dict) -> str:
  return _sweep_table(results, "tau", f"Fig. 5 — effect of τ (Dirichlet α = {FIG_ALPHA})")


def fig6(results: dict) -> str:
  return _sweep_table(results, "beta", f"Fig. 6 — effect of β (Dirichlet α = {FIG_ALPHA})")


def _axes(n: int):
  """A figure of ``n`` panels side by side and their axes."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.3), squeeze=False)
  return fig, axes[0]


def _figure_note(cells, skip=()) -> str:
  """A figure title's second line: how many seeds the curves average, for reduced cells the reductions, and a τ / β
  other than the setting's (less ``skip``), so a picture read apart from its page still says what was run."""
  cells = list(cells)
  seeds = sorted({len(c.get("seeds") or c.get("value_values") or [0]) for c in cells})
  reductions = list(dict.fromkeys(r for c in cells for r in _protocol_of(c).get("reductions", [])))
  changed = list(dict.fromkeys(f"{SYMBOLS[f]} = {v:g}" for c in cells for f, v in changed_of(c, skip).items()))
  note = f"mean of {'/'.join(map(str, seeds))} seed(s)" + ("; " + ", ".join(changed) if changed else "")
  return "\n".join(textwrap.wrap(note + ("; REDUCED: " + ", ".join(reductions) if reductions else ""), 80))


def fig3_figure(results: dict, path: Path) -> None:
  """Fig. 3: mean client accuracy per round under each selection rule, one panel per dataset."""
  datasets = [d for d in DATASETS if fig3_cells(results, d)]
  if not datasets:
    raise ValueError("no Fig. 3 cell (fedcac_local_<selection>) in these results")
  fig, axes = _axes(len(datasets))
  for ax, d in zip(axes, datasets):
    cells = fig3_cells(results, d)
    for s, cell in cells.items():
      curve = _mean_curve(cell)
      if curve:
        ax.plot(*curve, label=FIG3_SELECTIONS[s], color=f"C{list(FIG3_SELECTIONS).index(s)}")
    ax.set(title=f"{DATASETS[d]}, pathological, τ = {FIG3_TAU}, critical local\n"
                 f"{_figure_note(cells.values(), FIG3_SKIP)}", xlabel="round",
           ylabel="mean client accuracy after aggregation (%)")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=8)
  grid.save_figure(fig, path)


def _sweep_figure(results: dict, path: Path, field: str) -> None:
  symbol = SYMBOLS[field]
  datasets = [d for d in DATASETS if _sweep(results, d, field)]
  if not datasets:
    raise ValueError(f"no {symbol} sweep cell in these results")
  fig, axes = _axes(len(datasets))
  for ax, d in zip(axes, datasets):
    points = _sweep(results, d, field)
    xs = [v for v, _ in points]
    ax.errorbar(xs, [c["value"] for _, c in points], yerr=[c.get("value_std", 0.0) for _, c in points], marker="o",
                capsize=3, label="FedCAC (ours)")
    ax.axvline(own_value(d, field), color="gray", ls=":", lw=1,
               label=f"the paper's choice ({symbol} = {own_value(d, field):g})")
    ax.set(title=f"{DATASETS[d]}, Dirichlet α = {FIG_ALPHA}\n{_figure_note((c for _, c in points), (field,))}",
           xlabel=symbol,
           ylabel="best-round mean client accuracy (%)")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=8)
  grid.save_figure(fig, path)


def fig5_figure(results: dict, path: Path) -> None:
  _sweep_figure(results, path, "tau")


def fig6_figure(results: dict, path: Path) -> None:
  _sweep_figure(results, path, "beta")


TABLES = {"table1": table1, "table2": table2, "table3": table3, "fig3": fig3, "fig5": fig5, "fig6": fig6}
FIGURES = {"fig3": fig3_figure, "fig5": fig5_figure, "fig6": fig6_figure}


def table_from_json(paths, mode: str) -> str:
  """The mode's table from one stored results file or several (``grid.load_pooled``; ``path::key1+key2`` takes
  only those cells of a file: Fig. 6 reuses Fig. 5's plain cell, which ran at the β it sweeps)."""
  return TABLES[mode](grid.load_pooled(paths))


def _names(value: str) -> list[str]:
  return [v for v in value.replace(" ", "").split(",") if v]


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--mode", choices=tuple(TABLES), default="table1")
  parser.add_argument("--datasets", default=",".join(OFFLINE),
                      help=f"comma-separated from {','.join(DATASETS)} (default: the offline ones)")
  parser.add_argument("--methods", default="", help="comma-separated subset of the table's methods (default all: "
                      f"{','.join(METHODS)}; table3 {','.join(TABLE3_METHODS)})")
  parser.add_argument("--partitions", default="", help="comma-separated subset of the table's partitions "
                      "(pathological, dir<alpha>; default all)")
  parser.add_argument("--eval_every", type=int, default=1, help="evaluate every N rounds (default 1: spec §3.6)")
  parser.add_argument("--one_seed_per_cell", action="store_true",
                      help="run each of --seeds as its own plain run, keyed <cell>__seed<k> (the tables merge them): "
                      "unlike the one vmapped seeds program, such cells can --checkpoint_every / --resume")
  parser.add_argument("--from_json", default=None, help="print the mode's table from stored results files "
                      "(comma-separated; path::key1+key2 takes only those cells) and exit")
  parser.add_argument("--taus", default=",".join(f"{v:g}" for v in FIG5_TAUS), help="--mode fig5: the τ values")
  parser.add_argument("--betas", default=",".join(f"{v:g}" for v in FIG6_BETAS), help="--mode fig6: the β values")
  parser.add_argument("--figure", default="", help="fig3 / fig5 / fig6: also draw the figure to this PNG (+SVG)")
  parser.add_argument("--one_program", action="store_true",
                      help="--mode fig6: run each dataset's β sweep as ONE program (--seeds x --betas lanes, β "
                      "traced) instead of one program per β; memory grows with the lanes")
  grid.add_common_args(parser, "runs/fedcac")
  parser.set_defaults(rounds=0, epochs=0, seeds="0,1,2,3,4")
  args = parser.parse_args()
  if args.figure and args.mode not in FIGURES:
    parser.error(f"--figure: --mode {args.mode} draws no figure (only {', '.join(FIGURES)})")
  if args.from_json:
    print(table_from_json(args.from_json, args.mode), end="")
    if args.figure:
      FIGURES[args.mode](grid.load_pooled(args.from_json), Path(args.figure))
    return
  datasets, methods = _names(args.datasets), _names(args.methods)
  bad = [d for d in datasets if d not in DATASETS] + [m for m in methods if method_variant(m)[0] not in
                                                      {**METHODS, **TABLE3_METHODS}]
  if bad or not datasets:
    parser.error(f"unknown or empty --datasets / --methods: {bad or datasets}")
  logging.basicConfig(level=logging.WARNING)
  try:
    taus, betas = [float(v) for v in _names(args.taus)], [int(float(v)) for v in _names(args.betas)]
  except ValueError:
    parser.error(f"--taus / --betas: numbers, got {args.taus!r} / {args.betas!r}")
  fixed = [item for item in args.set if item.partition("=")[0].strip() in FIGURE_FIELDS.get(args.mode, ())]
  if fixed:
    parser.error(f"--mode {args.mode} sets {', '.join(FIGURE_FIELDS[args.mode])} per cell itself; --set {fixed[0]} "
                 f"would replace it (or mislabel the setting's own point): drop it" + (
                     " and sweep with --taus / --betas" if args.mode != "fig3" else ""))
  chosen = cells_of(args.mode, datasets, methods or None, _names(args.partitions) or None, taus, betas)
  if args.one_program and (args.mode != "fig6" or args.one_seed_per_cell):
    parser.error("--one_program: only --mode fig6 (β is traced; τ sets static shapes), without --one_seed_per_cell")
  if args.one_program:
    cells = [beta_sweep_program(d, betas, args) for d in datasets]
  elif args.one_seed_per_cell:
    seeds = [int(s) for s in _names(args.seeds)] or [args.seed]
    cells = [(cell_key(*c, seed=s), cell_config(*c, args, seed=s), record) for c in chosen for s in seeds]
  else:
    cells = [(cell_key(*c), cell_config(*c, args), record) for c in chosen]
  if not cells:
    table = cells_of(args.mode, datasets, taus=taus, betas=betas)
    parser.error(f"no cell selected: --mode {args.mode} on {', '.join(datasets)} has partitions "
                 f"{', '.join(dict.fromkeys(p for _, p, _ in table))} and methods "
                 f"{', '.join(dict.fromkeys(m for _, _, m in table))}")
  print(grid.run_and_tabulate(cells, args, TABLES[args.mode], hoist_protocol))
  if args.figure:
    FIGURES[args.mode](grid.merged_results(Path(args.out_dir)), Path(args.figure))


if __name__ == "__main__":
  main()
