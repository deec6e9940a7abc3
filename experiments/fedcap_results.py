"""The tables of ``experiments/results/fedcap.md``, rebuilt from the stored result files.

Every table on that page sits between ``<!-- generated: python experiments/fedcap_results.py --table NAME -->``
and ``<!-- end generated -->``; ``tests/test_results_tables.py`` re-runs the command and fails when the page
differs, so a number on the page is always one a stored file holds. Where a cell is not its own run — read off
another variant's models (Table IV ① from ④'s customized models, ③ from ⑤'s, spec P18) or borrowed from our
Table III run on the H100 — the cell carries a mark and the table's footer says where it came from.

The paper's numbers come from ``fedcap_tables`` (Tables III, IV, Fig. 8) and ``byzantine_baselines`` (Table I);
nothing here is typed twice.

  python experiments/fedcap_results.py --table ablation          # Table IV at 100 rounds, every cell's source
  python experiments/fedcap_results.py --list                     # every table name
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import byzantine_baselines as byz  # noqa: E402
from experiments import fedcap_tables as ft  # noqa: E402
from experiments import provenance  # noqa: E402
from experiments.configs import fedcap_cifar10  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
H100_TABLE3 = "fedcap_cifar10_h100.json"
ABLATION = "fedcap_ablation_cpu.json"


@lru_cache(maxsize=None)
def load(name: str) -> dict:
  return json.loads((RESULTS / name).read_text())


def sources(*files: str) -> list[str]:
  """A provenance line per stored file a table reads (``experiments/provenance.py``)."""
  return [f"`{f}` {provenance.note(load(f))}" for f in files]


def pct(value: Optional[float]) -> str:
  return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def gap(a: Optional[float], b: Optional[float]) -> str:
  """``a - b`` in points, one decimal, signed ('0.0' for a tie at two decimals)."""
  if a is None or b is None:
    return "–"
  d = round(a, 2) - round(b, 2)
  return "0.0" if abs(d) < 0.05 else f"{d:+.1f}"


def minutes(seconds: Optional[float]) -> str:
  if not seconds:
    return "–"
  return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def device(cell: dict) -> str:
  return {"cpu": "2-core CPU", "gpu": "H100"}.get(cell.get("backend", ""), cell.get("backend", "?"))


def other_models(cell: dict, shown: str = "") -> str:
  """The models behind a value other than the one it equals, e.g. 'global 28.95' (Ditto's ``own`` is its
  personalized model, FedFomo's ``received`` the federated one)."""
  names = {"own": "personalized/own", "received": "received"}
  value = cell["value"]
  parts = [f"{names.get(k, k)} {pct(v)}" for k, v in cell.get("models", {}).items()
           if k != shown and round(v, 2) != round(value, 2)]
  return ", ".join(parts)


def removal_rounds(cell: dict, num_attackers: int = 6) -> str:
  """When the attackers left the pool: from a Table III cell's ``removed_round`` {client: round} or a CPU cell's
  per-round count of removed clients; '–' when the run recorded neither."""
  if isinstance(cell.get("removed_round"), dict):
    return ft.removal_text(cell["removed_round"], num_attackers) or "none"
  counts = cell.get("num_removed_per_round") or cell.get("num_removed_by_round")
  if counts is None:
    return "–"
  counts = list(counts.values()) if isinstance(counts, dict) else list(counts)
  if not any(counts):
    return "none"
  first = next(i for i, c in enumerate(counts) if c) + 1
  return (f"all {counts[-1]} by round {first}" if counts[-1] == num_attackers and counts[first - 1] == num_attackers
          else f"{counts[-1]} by round {len(counts)} (first in round {first})")


# ------------------------------------------------------------------------------------------ Table I / III
def vs_baselines() -> str:
  """FedCAP (Table III run) against the best rule of our Table I run, per attack, beside the paper's pair."""
  fedcap, rules = load(H100_TABLE3), load("byzantine_baselines_h100.json")
  lines = ["| Attack | FedCAP | best baseline (ours) | FedCAP - best | paper: FedCAP / best baseline |",
           "|---|---|---|---|---|"]
  for attack, name in byz.ATTACKS.items():
    ours = {r: rules[f"{attack}__{r}"]["value"] for r in byz.RULES if f"{attack}__{r}" in rules}
    top = max(ours.values())
    best = ", ".join(byz.RULES[r][0] for r, v in ours.items() if round(v, 2) == round(top, 2))
    paper = dict(zip(byz.PAPER_RULES, byz.PAPER[name]))
    paper_top = max(paper.values())
    paper_best = ", ".join(byz.RULES[r][0] for r, v in paper.items() if v == paper_top)
    lines.append(f"| {name} | {pct(fedcap[attack]['value'])} | {pct(top)} ({best}) | "
                 f"{gap(fedcap[attack]['value'], top)} | {ft.PAPER_TACC['cifar10'][name]:.2f} / {paper_top:.2f} "
                 f"({paper_best}) |")
  lines += ["", "Ours: one seed, 100 rounds, H100 (`" + H100_TABLE3 + "`, `byzantine_baselines_h100.json`); "
            "baselines' value = max(global, locally updated) benign accuracy. Paper: Tables I and III "
            "(specs/fedcap.md §5.1-5.2).", ""] + sources(H100_TABLE3, "byzantine_baselines_h100.json")
  return "\n".join(lines) + "\n"


def table3_single_seed() -> str:
  return ft.table_from_json(RESULTS / H100_TABLE3) + "\n" + sources(H100_TABLE3)[0] + "\n"


# ------------------------------------------------------------------------------------------ orphan check
ORPHAN = 16  # the benign client the artifact's attacker ids leave without a class peer


def _orphan_runs(rounds: int, seed: int = 0) -> dict:
  """``{benign, artifact?, no_orphan}`` per-client records of one seed at ``rounds`` (seed 0: the 10/50/100-round
  files; seeds 1-2: the ``*_seeds`` files)."""
  if seed == 0:
    return load(f"fedcap_orphans_cpu_r{rounds}.json")
  return load(f"fedcap_orphans_cpu_r{rounds}_seeds.json")[f"seed{seed}"]


def _orphan_values(benign: dict, attacked: dict) -> dict:
  """FedCAP's metric (fedcap_orphans.fedcap_value) of the benign and the attacked run over the attacked run's
  benign clients, with and without the orphan, and over all clients for the benign run."""
  from experiments import fedcap_orphans as fo
  n = attacked["n_test"]
  clients = [k for k in range(len(n)) if k not in attacked["malicious"]]
  without = [k for k in clients if k != ORPHAN]
  v = lambda run, ids: fo.fedcap_value(run, ids, n)
  return {"all": v(benign, range(len(n))), "benign": v(benign, clients), "attacked": v(attacked, clients),
          "benign_wo": v(benign, without), "attacked_wo": v(attacked, without)}


def orphans() -> str:
  """The controlled MR check: the artifact's attackers (client 16 orphaned) against one id moved (no orphan), each
  compared with the benign run on the same benign clients."""
  from experiments import fedcap_orphans as fo
  lines = ["| rounds | attackers | benign run, same clients | MR run | drop | drop without client 16 | "
           "client 16 benign / MR (personalized; customized) |", "|---|---|---|---|---|---|---|"]
  for rounds in (10, 50, 100):
    runs = _orphan_runs(rounds)
    for name in ("artifact", "no_orphan"):
      r, b = runs[name], runs["benign"]
      v = _orphan_values(b, r)
      who = "client 16 orphaned" if name == "artifact" else "no orphan"
      c16 = "; ".join(f"{100 * b[m][ORPHAN]:.0f} / {100 * r[m][ORPHAN]:.0f}" for m in ("personalized", "customized"))
      lines.append(f"| {rounds} | {name} {{{fo.ATTACKER_SETS[name].replace(',', ', ')}}} ({who}) | "
                   f"{pct(v['benign'])} | {pct(v['attacked'])} | **{v['benign'] - v['attacked']:.2f}** | "
                   f"{v['benign_wo'] - v['attacked_wo']:.2f} | {c16} |")
  lines += ["", "Seed 0, 2-core CPU, sequential strategy (`fedcap_orphans_cpu_r10.json`, `_r50.json`, `_r100.json`: "
            "per-client accuracies of each run); value = FedCAP's metric over the MR run's 14 benign clients.", ""]
  lines += sources(*(f"fedcap_orphans_cpu_r{r}.json" for r in (10, 50, 100)))
  return "\n".join(lines) + "\n"


def orphans_split() -> str:
  """The Table III MR gap split into averaging (20 vs the same 14 clients), the orphan and the other clients."""
  lines = ["| rounds | benign, all 20 | MR (14 benign) | gap (table) | averaging: 20 vs the same 14 | orphan (client 16) "
           "| other 13 clients | no-orphan run: drop, same 14 |", "|---|---|---|---|---|---|---|---|"]
  for rounds in (50, 100):
    runs = _orphan_runs(rounds)
    v, n = _orphan_values(runs["benign"], runs["artifact"]), _orphan_values(runs["benign"], runs["no_orphan"])
    drop, other = v["benign"] - v["attacked"], v["benign_wo"] - v["attacked_wo"]
    lines.append(f"| {rounds} | {pct(v['all'])} | {pct(v['attacked'])} | {v['all'] - v['attacked']:.2f} | "
                 f"{v['all'] - v['benign']:.2f} | {drop - other:.2f} | {other:.2f} | {n['benign'] - n['attacked']:.2f} |")
  lines += ["", "gap = averaging + orphan + other 13; orphan = the drop on the 14 minus the drop without client 16.",
            ""] + sources("fedcap_orphans_cpu_r50.json", "fedcap_orphans_cpu_r100.json")
  return "\n".join(lines) + "\n"


def orphans_seeds(rounds: int) -> str:
  """The no-orphan pair over three seeds: what MR costs the same 14 benign clients."""
  import numpy as np
  lines = ["| seed (model and data) | benign, all 20 | benign run, same 14 | no-orphan MR run | drop | "
           "drop without client 16 |", "|---|---|---|---|---|---|"]
  drops, drops_wo, alls = [], [], []
  for seed in (0, 1, 2):
    runs = _orphan_runs(rounds, seed)
    v = _orphan_values(runs["benign"], runs["no_orphan"])
    drops.append(v["benign"] - v["attacked"])
    drops_wo.append(v["benign_wo"] - v["attacked_wo"])
    alls.append(v["all"])
    lines.append(f"| {seed} | {pct(v['all'])} | {pct(v['benign'])} | {pct(v['attacked'])} | {drops[-1]:.2f} | "
                 f"{drops_wo[-1]:.2f} |")
  sd = lambda x: float(np.std(x, ddof=1))
  lines.append(f"| mean ± sd | {np.mean(alls):.2f} ± {sd(alls):.2f} | | | **{np.mean(drops):.2f} ± {sd(drops):.2f}** | "
               f"{np.mean(drops_wo):.2f} ± {sd(drops_wo):.2f} |")
  lines += ["", f"{rounds} rounds, 2-core CPU; sd over the three seeds with ddof 1. Seed 0: "
            f"`fedcap_orphans_cpu_r{rounds}.json`; seeds 1-2: `fedcap_orphans_cpu_r{rounds}_seeds.json`.", ""]
  lines += sources(f"fedcap_orphans_cpu_r{rounds}.json", f"fedcap_orphans_cpu_r{rounds}_seeds.json")
  return "\n".join(lines) + "\n"


def femnist_lambda() -> str:
  """FEMNIST stand-in at round 25: personalized accuracy by λ and attack, on the MR run's benign clients."""
  import numpy as np
  d = load("fedcap_femnist_lambda_check_cpu.json")
  n = np.asarray(d["n_test"], float)
  benign = np.ones(len(n), bool)
  benign[d["malicious_mr"]] = False
  acc = lambda cell, model: 100 * float(np.dot(n[benign], np.asarray(cell[f"{model}_client_acc"])[benign]) /
                                        n[benign].sum())
  r = d["round25"]
  lines = ["| round 25, MR's 70 benign clients | personalized, λ = 0.5 | personalized, λ = 0.1 | customized, λ = 0.5 | "
           "customized, λ = 0.1 |", "|---|---|---|---|---|"]
  for label, key in (("Benign", "benign"), ("MR", "mr")):
    lines.append(f"| {label} | " + " | ".join(pct(acc(r[f"{key}_lambda{lam}"], m)) for m in ("personalized", "customized")
                                             for lam in ("0.5", "0.1")) + " |")
  lines += ["", "T_norm = 3.0; sample-weighted over MR's benign clients (`fedcap_femnist_lambda_check_cpu.json`, "
            "whose `commands` and `machine` say how each cell ran).", ""] + sources("fedcap_femnist_lambda_check_cpu.json")
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ Table IV
SOURCE_MARKS = {
    "read_v4": ("†", "④'s customized models: ④ adds personalized models that never feed back into the customized "
                "ones (spec P18), so ① is read off the ④ run (every stored round's upload norms are bitwise "
                "equal where both ran)"),
    "read_v5": ("§", "⑤'s customized models (③ = ⑤ without the personalized models, P18)"),
    "table3": ("‡", "borrowed from our Table III run (H100, one of 8 processes, same seed and the same (alpha, phi, "
               "lambda) = (10, 0.3, 0.1), `" + H100_TABLE3 + "`): ③ is its customized models, ⑤ its value; a "
               "different device, so equal to within seed-level noise (~1 point), not bitwise"),
    "fig8_r10": ("¶", "the Fig. 8 Ditto run (λ 0.1 = ②) at 10 rounds, `fedcap_fig8_cpu_r10.json`: its models are "
                 "NaN from round 9, so it stays at 10.95 (not run to 100 rounds)"),
}
ABLATION_LABELS = {"v1": "① Cust. Agg.", "v2": "② Pers. Train. (Ditto λ 0.1)", "v3": "③ + Calib./Det.",
                   "v4": "④ + Pers. Train.", "v5": "⑤ FedCAP"}


def _check_borrowable(scenario: str) -> None:
  """A Table III cell may stand in for a Table IV one only if its hyperparameters are Table IV's."""
  if tuple(fedcap_cifar10.HYPERPARAMETERS[scenario]) != ft.ABLATION_HYPERPARAMETERS:
    raise ValueError(f"Table III's {scenario} run has (alpha, phi, lambda) = "
                     f"{fedcap_cifar10.HYPERPARAMETERS[scenario]}, not Table IV's {ft.ABLATION_HYPERPARAMETERS}")


def ablation_cell(variant: str, scenario: str, rounds: int) -> Optional[tuple[dict, str]]:
  """``(cell, source)`` of one Table IV value at ``rounds``: its own run (source ''), or the run it is read off or
  borrowed from (a ``SOURCE_MARKS`` key); None when no stored result gives it."""
  runs = load(ABLATION)
  own = runs.get(f"{variant}__{scenario}@r{rounds}")
  if own is not None:
    return own, ""
  customized = lambda cell: {**cell, "value": cell["models"]["customized"],
                             "models": {"customized": cell["models"]["customized"]}}
  if variant == "v1" and f"v4__{scenario}@r{rounds}" in runs:
    return customized(runs[f"v4__{scenario}@r{rounds}"]), "read_v4"
  if variant == "v3" and f"v5__{scenario}@r{rounds}" in runs:
    return customized(runs[f"v5__{scenario}@r{rounds}"]), "read_v5"
  if rounds == 100 and variant in ("v3", "v5") and scenario in ("min_max", "min_sum", "ipm"):
    _check_borrowable(scenario)
    cell = load(H100_TABLE3)[scenario]
    cell = {**cell, "models": {"customized": cell["customized"], "personalized": cell["personalized"]}}
    return (customized(cell) if variant == "v3" else cell), "table3"
  if rounds == 100 and variant == "v2" and scenario == "ipm":
    return load("fedcap_fig8_cpu_r10.json")["ditto__ipm"], "fig8_r10"
  return None


def _marked(found: Optional[tuple[dict, str]], detail: bool = False) -> str:
  if found is None:
    return "–"
  cell, source = found
  text = pct(cell["value"]) + (SOURCE_MARKS[source][0] if source else "")
  extra = other_models(cell) if detail else ""
  return f"{text} ({extra})" if extra else text


def _footnotes(sources: set) -> list[str]:
  return [f"{mark} {text}." for key, (mark, text) in SOURCE_MARKS.items() if key in sources]


def ablation() -> str:
  """Table IV at 100 rounds: every cell ours / paper, marked where it is not a run of its own."""
  scenarios = ft.ABLATION_SCENARIOS
  lines = ["| Variant | " + " | ".join(f"{ft.SCENARIOS[s]} ours / paper" for s in scenarios) + " |",
           "|" + "---|" * (len(scenarios) + 1)]
  used, own = set(), 0
  for variant, label in ABLATION_LABELS.items():
    cells = []
    for scenario, theirs in zip(scenarios, ft.PAPER_ABLATION[variant]):
      found = ablation_cell(variant, scenario, 100)
      if found:
        used.add(found[1])
        own += not found[1]
      cells.append(f"{_marked(found)} / {theirs:.2f}")
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  lines += ["", f"{own} of {len(scenarios) * len(ABLATION_LABELS)} cells are runs of their own (100 rounds x E = 5, "
            f"one seed, 2-core CPU, `{ABLATION}`, each with its command); the others:", ""]
  lines += _footnotes(used) + [""] + sources(ABLATION, H100_TABLE3, "fedcap_fig8_cpu_r10.json")
  return "\n".join(lines) + "\n"


def _row_rounds(scenario: str) -> list[int]:
  runs = load(ABLATION)
  found = {int(k.split("@r")[1].split("__")[0]) for k in runs if k.split("@")[0].endswith(f"__{scenario}")}
  return sorted(found | {100})


def ablation_column(scenario: str) -> str:
  """One Table IV column round by round (10 / 30 / 100 where stored), the models behind each value and the gaps
  the paper's prose is about (③ - ①: calibration + detection; ⑤ - ④, ⑤ - ②)."""
  variants = [v for v in ABLATION_LABELS if any(ablation_cell(v, scenario, r) for r in _row_rounds(scenario))]
  gaps = [(a, b) for a, b in (("v3", "v1"), ("v5", "v3"), ("v5", "v4"), ("v5", "v2"))
          if a in variants and b in variants]
  label = lambda v: ABLATION_LABELS[v].split(" ")[0]
  header = (["rounds"] + [ABLATION_LABELS[v] for v in variants] + [f"{label(a)} - {label(b)}" for a, b in gaps] +
            ["attackers removed (③)"])
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  used = set()
  for rounds in _row_rounds(scenario):
    found = {v: ablation_cell(v, scenario, rounds) for v in variants}
    used |= {f[1] for f in found.values() if f}
    value = lambda v: found[v][0]["value"] if found[v] else None
    v3 = found.get("v3")
    row = ([str(rounds)] + [_marked(found[v], detail=True) for v in variants] +
           [gap(value(a), value(b)) for a, b in gaps] + [removal_rounds(v3[0]) if v3 else "–"])
    lines.append("| " + " | ".join(row) + " |")
  paper = dict(zip(ft.ABLATION_SCENARIOS, zip(*ft.PAPER_ABLATION.values())))[scenario]
  paper = dict(zip(ft.PAPER_ABLATION, paper))
  lines.append("| " + " | ".join(["100 (paper)"] + [f"{paper[v]:.2f}" for v in variants] +
                                 [gap(paper[a], paper[b]) for a, b in gaps] + ["–"]) + " |")
  lines += ["", f"{ft.SCENARIOS[scenario]}, (alpha, phi, lambda) = (10, 0.3, 0.1), one seed; own runs: 2-core CPU, "
            f"`{ABLATION}`. In parentheses: the variant's other models (Ditto's global model; ④/⑤'s customized "
            "or personalized models)."]
  notes = _footnotes(used - {""})
  files = [ABLATION] + [{"table3": H100_TABLE3, "fig8_r10": "fedcap_fig8_cpu_r10.json"}[k] for k in
                        ("table3", "fig8_r10") if k in used]
  return "\n".join(lines + ([""] + notes if notes else []) + [""] + sources(*files)) + "\n"


# ------------------------------------------------------------------------------------------ Fig. 7
def _method_label(method: str, scenario: str) -> str:
  label = ft.METHODS[method][0]
  return f"{label} (λ {ft.DITTO_LAMBDA[scenario]})" if method == "ditto" else label


def fig7_sf_r10() -> str:
  """Fig. 7's SF column at 10 rounds, with the two cells rerun after the baseline fixes."""
  runs = load("fedcap_fig7_cpu_r10.json")
  methods = [m for m in ft.METHODS if f"{m}__sign_flip" in runs]
  values = {m: runs[f"{m}__sign_flip"]["value"] for m in methods}
  top = max(values.values())
  cell = lambda m: (f"**{pct(values[m])}**" if round(values[m], 2) == round(top, 2) else pct(values[m])) + (
      "*" if f"{m}__sign_flip__before_fix" in runs else "")
  lines = ["| " + " | ".join(_method_label(m, "sign_flip") for m in methods) + " |", "|" + "---|" * len(methods),
           "| " + " | ".join(cell(m) for m in methods) + " |",
           "| " + " | ".join(other_models(runs[f"{m}__sign_flip"]) or "–" for m in methods) + " |"]
  fixed = [m for m in methods if f"{m}__sign_flip__before_fix" in runs]
  lines += ["", "Second row: the models behind each value other than the one reported. 10 rounds x E = 5, one seed, "
            "2-core CPU (`fedcap_fig7_cpu_r10.json`)."]
  if fixed:
    lines += ["", "\\* rerun after a baseline fix; before it: " + ", ".join(
        f"{ft.METHODS[m][0]} {pct(runs[f'{m}__sign_flip__before_fix']['value'])}" for m in fixed) + "."]
  return "\n".join(lines + [""] + sources("fedcap_fig7_cpu_r10.json")) + "\n"


def _fig7_rows(runs: dict, scenario: str, fedcap: dict) -> list[str]:
  rows = []
  for method in ft.METHODS:
    keys = sorted((k for k in runs if k.startswith(f"{method}__{scenario}@")),
                  key=lambda k: -int(k.split("@r")[1]))
    if method == "fedcap":
      rows.append(f"| FedCAP (our Table III run) | 100 | {pct(fedcap['value'])} | {other_models(fedcap)} | "
                  f"{minutes(fedcap['wall_s'])} (H100, one of 8 processes at once) | – |")
      continue
    if not keys:
      rows.append(f"| {_method_label(method, scenario)} | – | not run | – | – | – |")
    for key in keys:
      r = runs[key]
      where = f"{minutes(r['wall_s'])} ({device(r)})" if "wall_s" in r else f"– (derived from `{r['derived_from']}`)"
      rows.append(f"| {_method_label(method, scenario)} | {r['rounds']} | {pct(r['value'])} | "
                  f"{other_models(r) or '–'} | {where} | "
                  f"{gap(fedcap['value'], r['value']) if r['rounds'] == 100 else '–'} |")
  return rows


def fig7_column(scenario: str, file: str) -> str:
  """One Fig. 7 column at full length: each method's value, its models, wall time and FedCAP's lead."""
  fedcap = {**load(H100_TABLE3)[scenario]}
  fedcap["models"] = {"customized": fedcap["customized"], "personalized": fedcap["personalized"]}
  lines = ["| Method | rounds | value | other models | wall (device) | FedCAP − method |", "|---|---|---|---|---|---|"]
  lines += _fig7_rows(load(file), scenario, fedcap)
  lines += ["", f"{ft.SCENARIOS[scenario]}, one seed, sequential strategy on the 2-core CPU shared with other runs "
            f"(`{file}`, each cell with its command); FedCAP: its Table III run (`{H100_TABLE3}`, the artifact's "
            "per-scenario (alpha, phi, lambda)). Wall times on a shared CPU are not speeds.", ""] + sources(
                file, H100_TABLE3)
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ Fig. 8
def fig8_ipm() -> str:
  """Fig. 8's IPM column: Ditto with each server rule at 10 rounds, and where run, 30 and 100; FedCAP's Table III
  run at 100."""
  r10, r30, r100 = (load(f) for f in ("fedcap_fig8_cpu_r10.json", "fedcap_fig8_trim_cpu_r30.json",
                                      "fedcap_fig8_ipm_cpu_r100.json"))
  methods = list(ft.DITTO_AGRS)
  lines = ["| | " + " | ".join(ft.DITTO_AGRS[m][0] for m in methods) + " |", "|" + "---|" * (len(methods) + 1)]
  fedcap = load(H100_TABLE3)["ipm"]
  for rounds, runs in ((10, r10), (30, r30), (100, r100)):
    cells = [pct(runs[f"{m}__ipm"]["value"]) if f"{m}__ipm" in runs else "–" for m in methods]
    if rounds == 100:
      cells[methods.index("fedcap")] = pct(fedcap["value"]) + "‡"
    lines.append(f"| ours, {rounds} rounds | " + " | ".join(cells) + " |")
  last = {m: next((runs[f"{m}__ipm"] for runs in (r100, r30, r10) if f"{m}__ipm" in runs), None) for m in methods}
  lines.append("| global model (ours, longest run) | " + " | ".join(
      pct(c["models"].get("global")) if c and "global" in c["models"] else "–" for c in last.values()) + " |")
  lines.append("| paper, 100 rounds | " + " | ".join(
      f"{ft.PAPER_DITTO_AGR[m][ft.DITTO_AGR_SCENARIOS.index('ipm')]:.2f}" for m in methods) + " |")
  lines += ["", "One seed, 2-core CPU, sequential strategy (`fedcap_fig8_cpu_r10.json`, `fedcap_fig8_trim_cpu_r30.json`,"
            " `fedcap_fig8_ipm_cpu_r100.json`). ‡ FedCAP's Table III IPM run (H100, `" + H100_TABLE3 + "`). Paper: "
            "approximate values from the artifact's CSV (specs/fedcap.md §5.6).", ""] + sources(
                "fedcap_fig8_cpu_r10.json", "fedcap_fig8_trim_cpu_r30.json", "fedcap_fig8_ipm_cpu_r100.json", H100_TABLE3)
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ FEMNIST stand-in
FEMNIST_ORDER = ("none", "scaling", "lie", "sign_flip", "min_max", "min_sum", "ipm", "label_flip")


def _detection(cell: dict, paper: Optional[tuple]) -> list[str]:
  ours = [cell["dacc"], cell["fpr"], cell["fnr"]]
  fmt = lambda v: "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{round(v, 2):g}"
  if paper is None:
    return [f"({fmt(v)})" for v in ours]
  return [f"{fmt(o)} / {fmt(p)}" for o, p in zip(ours, paper)]


BENIGN_RERUN = "fedcap_femnist_benign_rerun_cpu.json"


def femnist_benign_same_clients() -> float:
  """FedCAP's metric (max of the customized and personalized sample-weighted accuracies) of the Benign rerun over
  the attacked runs' 70 benign clients: the reference an attack's cost is measured against."""
  import numpy as np
  d = load(BENIGN_RERUN)
  cell, n = d["none"], np.asarray(d["none"]["n_test"], float)
  benign = np.ones(len(n), bool)
  benign[d["attackers_of_the_attacked_runs"]] = False
  return 100 * max(float(np.dot(n[benign], np.asarray(cell[f"{m}_client_acc"])[benign]) / n[benign].sum())
                   for m in ("customized", "personalized"))


def _benign_rerun_note() -> str:
  stored, rerun = load("fedcap_femnist_cpu.json")["none"]["value"], load(BENIGN_RERUN)["none"]["value"]
  return (f"Same-clients reference: the Benign rerun (`{BENIGN_RERUN}`) over the attacked runs' 70 benign clients, "
          f"{femnist_benign_same_clients():.2f}; over all 100 clients the rerun gives {rerun:.2f} and the stored "
          f"Benign row {stored:.2f}" + (" (the same run)" if round(stored, 6) == round(rerun, 6) else
                                        " (a later commit: not bitwise the same run)") + ".")


def femnist() -> str:
  """The EMNIST setting on the FEMNIST sample at T_norm = 10, against the paper's EMNIST row."""
  runs, ref = load("fedcap_femnist_cpu.json"), femnist_benign_same_clients()
  lines = ["| Scenario | TAcc ours / paper (EMNIST) | customized | personalized | global | drop vs Benign, same 70 "
           "clients | DAcc ours / paper | FPR ours / paper | FNR ours / paper | wall (2-core CPU) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for scenario in FEMNIST_ORDER:
    r, name = runs[scenario], ft.SCENARIOS[scenario]
    paper = ft.PAPER_TACC["emnist"].get(name)
    det = ["–"] * 3 if scenario == "none" else _detection(r, ft.PAPER_DETECTION["emnist"].get(name))
    drop = f"({ref:.2f} on the 70)" if scenario == "none" else gap(ref, r["value"])
    lines.append(f"| {name} | {pct(r['value'])} / {pct(paper)} | {pct(r['customized'])} | {pct(r['personalized'])} "
                 f"| {pct(r['global'])} | {drop} | " + " | ".join(det) + f" | {minutes(r['wall_s'])} |")
  lines += ["", "100 rounds x E = 5, one seed (`fedcap_femnist_cpu.json`; its `note` says which runs shared the CPU). "
            "Detection over all 100 clients; in parentheses where the paper has no number (LF). "
            + _benign_rerun_note(), ""] + sources("fedcap_femnist_cpu.json", BENIGN_RERUN)
  return "\n".join(lines) + "\n"


def femnist_tnorm() -> str:
  """T_norm = 3 against T_norm = 10 on the FEMNIST stand-in, scenario by scenario."""
  t10, t3 = load("fedcap_femnist_cpu.json"), load("fedcap_femnist_tnorm3_cpu.json")
  benign = femnist_benign_same_clients()
  lines = ["| Scenario | T_norm | TAcc (customized) | personalized | global | drop vs Benign, same 70 clients "
           f"({benign:.2f}) | DAcc / FPR / FNR | paper (EMNIST): TAcc, DAcc / FPR / FNR |",
           "|---|---|---|---|---|---|---|---|"]
  if round(t3["none"]["value"], 6) != round(t10["none"]["value"], 6):
    raise ValueError("the two Benign runs differ: T_norm should not matter when nobody is removed")
  for scenario in ("min_sum", "min_max", "scaling", "ipm", "sign_flip", "lie", "label_flip", "none"):
    name = ft.SCENARIOS[scenario]
    paper_t, paper_d = ft.PAPER_TACC["emnist"].get(name), ft.PAPER_DETECTION["emnist"].get(name)
    paper = "–" if paper_t is None else (f"{paper_t:.2f}" + (", " + " / ".join(f"{v:g}" for v in paper_d)
                                                               if paper_d else ""))
    for t, runs in ((10, t10), (3, t3)):
      r = runs[scenario]
      det = "–" if scenario == "none" else " / ".join(
          s.split(" / ")[0] for s in _detection(r, paper_d)) if paper_d else " / ".join(_detection(r, None))
      lines.append(f"| {name} | {t} | {pct(r['customized'])} | {pct(r['personalized'])} | {pct(r['global'])} | "
                   f"{'–' if scenario == 'none' else gap(benign, r['value'])} | {det} | {paper if t == 10 else ''} |")
  lines += ["", "The paper's drops are against its all-client Benign value; ours against the Benign run on the "
            "attacked runs' own 70 benign clients, so they are the attack's cost alone. " + _benign_rerun_note() +
            " (`fedcap_femnist_tnorm3_cpu.json`'s `note` holds the T_norm = 3 command.)", ""] + sources(
                "fedcap_femnist_cpu.json", "fedcap_femnist_tnorm3_cpu.json", BENIGN_RERUN)
  return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "table3_single_seed": table3_single_seed,
    "vs_baselines": vs_baselines,
    "ablation": ablation,
    "ablation_none": lambda: ablation_column("none"),
    "ablation_lie": lambda: ablation_column("lie"),
    "ablation_min_max": lambda: ablation_column("min_max"),
    "ablation_min_sum": lambda: ablation_column("min_sum"),
    "ablation_ipm": lambda: ablation_column("ipm"),
    "fig7_sf_r10": fig7_sf_r10,
    "fig7_benign": lambda: fig7_column("none", "fedcap_fig7_benign_cpu_r100.json"),
    "fig7_mr": lambda: fig7_column("scaling", "fedcap_fig7_mr_cpu_r100.json"),
    "fig8_ipm": fig8_ipm,
    "femnist": femnist,
    "femnist_tnorm": femnist_tnorm,
    "femnist_lambda": femnist_lambda,
    "orphans": orphans,
    "orphans_split": orphans_split,
    "orphans_seeds_r50": lambda: orphans_seeds(50),
    "orphans_seeds_r100": lambda: orphans_seeds(100),
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--table", choices=tuple(TABLES))
  parser.add_argument("--list", action="store_true", help="print every table name")
  args = parser.parse_args()
  if args.list or not args.table:
    print("\n".join(TABLES))
    return
  print(TABLES[args.table](), end="")


if __name__ == "__main__":
  main()
