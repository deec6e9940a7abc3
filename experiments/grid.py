"""What the reproduction grid scripts share: their common flags, the cell loop and the sharded results files.

A grid (``byzantine_baselines.py``, ``fedcap_tables.py``) runs one experiment per cell and appends each cell's
numbers to ``<out_dir>/results.json``, or ``results.<shard>.json`` when several processes split the cells (on one
GPU, so their XLA compilations overlap); the table merges every ``results*.json`` it finds.
"""

from __future__ import annotations

import argparse
import ast
import json
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable


def add_common_args(parser: argparse.ArgumentParser, out_dir: str | None) -> None:
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--rounds", type=int, default=100)
  parser.add_argument("--epochs", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0, help="a one-seed cell's seed: sets every seed field (seed, "
                      "data.seed, attack.seed: config.seed_fields), so the cell is lane N of a --seeds program")
  parser.add_argument("--seeds", default="", help="comma-separated seeds run as ONE vmapped program per cell "
                      "(seed, data.seed and attack.seed set to each); the cell stores mean and std over them")
  parser.add_argument("--strategy", default="", help="engine strategy (default: the backend's default)")
  parser.add_argument("--out_dir", default=out_dir)
  parser.add_argument("--shard", default="", help="write results.<shard>.json, so several processes (e.g. one per "
                      "cell group, on one GPU) can fill one out_dir; the table merges every results*.json there")
  parser.add_argument("--table_only", action="store_true", help="only merge the results*.json in out_dir")
  parser.add_argument("--only", default="", metavar="PART[,PART]",
                      help="run only the cells whose key contains one of these comma-separated parts (e.g. "
                      "--only k100_p0.3,k100_p0.5 for two of Table IV's rows); the table still shows every stored cell")
  parser.add_argument("--stop_after_s", type=float, default=0.0, metavar="S",
                      help="start no new cell once S seconds have passed (a device session's time budget); 0 = run all")
  parser.add_argument("--checkpoint_every", type=int, default=0, metavar="N",
                      help="save each cell's run state every N rounds (and after the last) in <cell>/checkpoints")
  parser.add_argument("--resume", action="store_true",
                      help="go on from each cell's latest checkpoint (a cell without one starts fresh): after a crash, "
                      "or with a larger --rounds to extend finished cells")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field of every cell, e.g. --set data.samples_per_class=40 (repeatable; "
                      "the value is a Python literal, else a string)")


def apply_overrides(config, items: Iterable[str]):
  """``KEY=VALUE`` overrides (dotted keys, Python-literal values) applied to an ml_collections config in place; a
  str field keeps the text as given (``engine.host_chunk=16`` stays ``"16"``, as ``--config.engine.host_chunk=16``)."""
  for item in items:
    key, sep, raw = item.partition("=")
    if not sep:
      raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      value = raw
    *path, leaf = key.split(".")
    node = config
    for p in path:
      node = node[p]
    if isinstance(node.get(leaf), str) and not isinstance(value, str):
      value = raw  # a str field that also takes numbers ("auto" | int, e.g. engine.unroll) keeps the text, as run.py
    node[leaf] = value
  return config


def apply_run_args(config, args):
  """The grid-wide settings of a cell: rounds (evaluated at the last one), local epochs, seed, data dir, overrides."""
  from fedjax_robust.run import set_seed_fields
  config.rounds, config.eval_every = args.rounds, args.rounds
  set_seed_fields(config, args.seed)  # `--seed N`: every seed field, so the run is lane N of `--seeds ...,N`
  config.seeds = getattr(args, "seeds", "") or ""
  config.client.epochs = args.epochs
  config.data.data_dir = args.data_dir
  config.output.progress = False
  config.output.checkpoint_every, config.output.resume = args.checkpoint_every, args.resume
  if args.strategy:
    config.engine.strategy = args.strategy
  apply_overrides(config, args.set)
  split = split_seed_fields(config)
  if split:
    warnings.warn(f"a one-seed run with seed={config.seed} but {', '.join(f'{k}={v}' for k, v in split.items())}: "
                  f"its partition / attacker draws are not seed {config.seed}'s, so pooled with other seeds it varies "
                  f"only what `seed` draws; `--seed {config.seed}` sets every seed field (config.seed_fields), as "
                  f"lane {config.seed} of a --seeds program", stacklevel=2)
  return config


def _field(config, dotted: str):
  node = config
  for part in dotted.split("."):
    if not hasattr(node, "get") or part not in node:
      return None
    node = node[part]
  return node


def split_seed_fields(config) -> dict:
  """``{field: value}`` of a one-seed run's seed fields (``config.seed_fields``) that differ from its ``seed``: a
  ``--set seed=N`` that left ``data.seed`` / ``attack.seed`` behind. Empty for a seeds program, which sets them all."""
  from fedjax_robust.run import seed_fields_of
  if config.get("seeds"):
    return {}
  seed = config.get("seed", 0)
  return {f: _field(config, f) for f in seed_fields_of(config)
          if f != "seed" and _field(config, f) is not None and _field(config, f) != seed}


def n_seeds(cell: dict) -> int:
  return len(cell.get("seeds") or [None])


def cell_seeds(cell: dict) -> tuple:
  """The seeds a stored cell's numbers come from: a seeds program's or pooled cell's ``seeds``, else its config's
  ``seed`` (a one-seed run). Two cells compared side by side are a like-for-like comparison only on equal tuples."""
  if cell.get("seeds"):
    return tuple(int(s) for s in cell["seeds"])
  return (int((cell.get("config") or {}).get("seed", 0)),)


def seeds_phrase(cell: dict) -> str:
  """``"3 seed(s)"`` for a table's setup note, saying when the seeds shared a draw: a cell pooled from one-seed runs
  that varied only ``seed`` (``fixed_seed_fields``, :func:`pool_seed_cells`) names the fields every run kept."""
  fixed = cell.get("fixed_seed_fields") or {}
  if n_seeds(cell) < 2 or not fixed:
    return f"{n_seeds(cell)} seed(s)"
  return (f"{n_seeds(cell)} seed(s) varying only the run key and initialization "
          f"({', '.join(f'{k} = {v}' for k, v in fixed.items())} in every one: one partition and attacker draw)")


def seeds_differ_note(labelled: dict[str, dict]) -> str:
  """A sentence naming which of a table's cells (``{row label: cell}``) ran at which seeds, or ``""`` when they all
  ran at the same ones. Two cells side by side at different seeds differ by whatever the seed draws (partition,
  initialization, run key) as well as by method, and a count ("3 seed(s)" against "1 seed(s)", or 2 against 2 at
  other seeds) does not say which cell is which. The most common seed set is summarized as "the other N cells";
  the rest are listed by label."""
  groups: dict[tuple, list[str]] = {}
  for label, cell in labelled.items():
    if cell is not None:
      groups.setdefault(cell_seeds(cell), []).append(label)
  if len(groups) < 2:
    return ""
  order = sorted(groups, key=lambda s: (-len(groups[s]), s))
  common = order[0]
  seeds = lambda s: ",".join(map(str, s))
  parts = [f"seed{'s' if len(s) > 1 else ''} {seeds(s)}: {', '.join(groups[s])}" for s in order[1:]]
  parts.append(f"seed{'s' if len(common) > 1 else ''} {seeds(common)}: the other {len(groups[common])} "
               f"cell{'s' if len(groups[common]) > 1 else ''}")
  return ("Seeds differ between the cells shown (a gap between two of them then mixes seed-to-seed variation with "
          "the method): " + "; ".join(parts) + ".")


def with_seeds_note(note: str, labelled: dict[str, dict]) -> str:
  """A table's setup ``note`` followed by :func:`seeds_differ_note` of its cells, when there is one."""
  differ = seeds_differ_note(labelled)
  return f"{note} {differ}" if differ else note


def open_results(out_dir: str, shard: str) -> tuple[Path, Path, dict]:
  """``(out, results_path, results)``: creates ``out_dir`` and loads this shard's results file (empty if new)."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  results_path = results_file(out, shard)
  return out, results_path, load_results(results_path)


def results_file(out: Path, shard: str) -> Path:
  return out / (f"results.{shard}.json" if shard else "results.json")


def load_results(path: Path) -> dict:
  return json.loads(path.read_text()) if path.exists() else {}


def merged_results(out: Path) -> dict:
  """Every cell found in ``out/results*.json`` (later files win on a repeated cell)."""
  return merge_files(sorted(out.glob("results*.json")))


def merge_files(paths: Iterable) -> dict:
  """The cells of several stored results files, merged in order (a later file's cell wins)."""
  merged = {}
  for path in paths:
    merged.update(json.loads(Path(path).read_text()))
  return merged


# ------------------------------------------------------------------------------------------ reported accuracies
def benign_acc(final: dict, model: str = "") -> float | None:
  """Sample-weighted accuracy (%) over the benign clients of one evaluated model, from a run's final metrics.

  ``model``: ``""`` = each client's own evaluation model (``client_acc_*``: personalized, locally updated or local),
  ``"global"`` = the global model on every client's test split, ``"customized"`` / ``"personalized"`` = FedCAP's
  two models. Without attackers every client is benign (the ``*_client_acc_weighted`` metric). None if absent.
  """
  prefix = f"{model}_" if model else ""
  value = final.get(f"{prefix}benign_acc_weighted", final.get(f"{prefix}client_acc_weighted"))
  return None if value is None else 100.0 * value


def reported(final: dict, models: Iterable[str]) -> tuple[float, dict]:
  """The paper's number for a run (spec §3/§4.4): the best benign accuracy among ``models``, and each of them."""
  accs = {(m or "own"): benign_acc(final, m) for m in models}
  present = [v for v in accs.values() if v is not None]
  if not present:
    raise KeyError(f"none of the metrics for models {list(accs)} is in the run's final record")
  return max(present), accs


# ------------------------------------------------------------------------------------------ per-round curves
# metrics.jsonl scalar -> the cell's per-round list (index r-1 = round r), where the run logs it.
PER_ROUND_SCALARS = {"train_loss": "train_loss_per_round", "benign_train_loss": "benign_train_loss_per_round",
                     "num_removed": "num_removed_per_round",
                     "backdoor_confidence": "backdoor_confidence_per_round",  # FedCC Fig. 4 (every-round eval)
                     "global_test_acc": "global_test_acc_per_round",
                     # FedVSA's detection (algorithms/fedvsa.py): how many reports exceeded the audit's reference
                     # (it fires at a quorum of them), when it fired, whom Shapley flagged
                     "audit_exceedances": "audit_exceedances_per_round",
                     "audit_alarm": "audit_alarm_per_round", "shapley_flagged_benign": "shapley_flagged_benign_per_round",
                     "shapley_flagged_attackers": "shapley_flagged_attackers_per_round",
                     # an attacked run's detection counts of the round (simulation.py: detection_rates of the
                     # rule's flags): in which rounds an attacker was kept (fn > 0) or a benign client dropped (fp > 0)
                     "detection_tp": "detection_tp_per_round", "detection_fn": "detection_fn_per_round",
                     "detection_fp": "detection_fp_per_round", "detection_tn": "detection_tn_per_round"}


def per_round_series(run_dir: Path) -> dict:
  """A run's per-round curves, kept in its grid cell so a table can be checked without the run directory.

  From ``metrics.jsonl`` (one record per round, 1..rounds, a resumed run's history included): each scalar of
  ``PER_ROUND_SCALARS`` the run logs, and, for runs that log FedCAP's calibrated upload norms (Eq. 7's ||Δ̂_k||,
  compared with T_norm), ``benign_max_upload_norm_per_round``: the largest norm among the round's cohort members
  that are not attackers, i.e. how close the benign clients came to the threshold. For attacked runs of a rule
  that logs a per-client detection score (``detection_scores``, see ``aggregators.base.round_diagnostics``: FedCC's
  CKA similarity to the global model, Krum's, DnC's and Zeno++'s scores), ``benign_score_range_per_round`` and
  ``attacker_score_range_per_round``: each round's ``[min, max]`` over the cohort's benign clients and attackers
  (``None`` when the round has none), i.e. how far apart the two groups were when the rule split them.
  ``flagged_clients_per_round``: the ids the rule flagged each round (experiment.py's ``flagged_clients``), so
  whom a detector dropped in a given round stands on the stored cell. ``malicious_clients`` comes from
  ``malicious.json`` when the run wrote one (an attacked run); without it every client counts as benign.
  """
  rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
  rounds = [int(r["round"]) for r in rows]
  if rounds != list(range(1, len(rows) + 1)):
    raise ValueError(f"{run_dir / 'metrics.jsonl'} does not hold rounds 1..{len(rows)} in order")
  series: dict = {}
  malicious_file = run_dir / "malicious.json"
  malicious = set()
  if malicious_file.exists():
    series["malicious_clients"] = json.loads(malicious_file.read_text())["malicious_clients"]
    malicious = set(series["malicious_clients"])
  for metric, name in PER_ROUND_SCALARS.items():
    if rows and all(metric in r for r in rows):
      series[name] = [r[metric] for r in rows]
  if rows and all("calibrated_norms" in r for r in rows):
    series["benign_max_upload_norm_per_round"] = [
        max((n for k, n in zip(r["cohort"], r["calibrated_norms"]) if k not in malicious), default=None)
        for r in rows]
  if rows and all("flagged_clients" in r for r in rows):
    series["flagged_clients_per_round"] = [r["flagged_clients"] for r in rows]
  if rows and malicious and all("detection_scores" in r for r in rows):
    for group, is_attacker in (("benign", False), ("attacker", True)):
      series[f"{group}_score_range_per_round"] = [
          _range([s for k, s in zip(r["cohort"], r["detection_scores"]) if (k in malicious) == is_attacker])
          for r in rows]
  return series


def _range(values: list) -> list | None:
  return [min(values), max(values)] if values else None


Record = Callable[[dict, Path, object], dict]


def provenance() -> dict:
  """Where a stored result came from: the command, the git commit (and whether the tree had changes), the
  device, the JAX version."""
  import subprocess
  import sys
  import jax
  root = Path(__file__).resolve().parents[1]
  git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()
  return {"command": " ".join([Path(sys.executable).name, *sys.argv]), "commit": git("rev-parse", "HEAD") or None,
          "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "device": str(jax.devices()[0]),
          "device_kind": getattr(jax.devices()[0], "device_kind", None), "jax": jax.__version__}


def save_figure(fig, path) -> None:
  """A table script's figure as ``path`` (PNG, 120 dpi) and the same name with ``.svg``, its folder made; the
  saved area grows to hold a legend placed outside the axes (which ``tight_layout`` alone would cut off)."""
  path = Path(path)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  fig.savefig(path.with_suffix(".svg"), bbox_inches="tight")


def store_json(path, result: dict, indent: int = 1) -> None:
  """Write a stored result (a benchmark's, a table's) as JSON at ``path``, making its folder; values JSON cannot
  say (a dtype, a device) are written as their ``str``."""
  import json
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=indent, default=str))
  print("stored", path)


def _seed_cells(summary: dict, run_dir: Path, config, record: Record) -> dict:
  """A seeds cell: ``record`` of every seed's run directory, and each numeric field's mean and std over seeds
  (``value`` = the mean, ``value_std``, ``values``; per-seed records under ``per_seed``)."""
  per_seed = {}
  for seed in summary["seeds"]:
    seed_dir = run_dir / f"seed_{seed}"
    seed_summary = json.loads((seed_dir / "summary.json").read_text())
    per_seed[str(seed)] = {**per_round_series(seed_dir), **record(seed_summary, seed_dir, config)}
  return _over_seeds(list(summary["seeds"]), per_seed)


def _over_seeds(seeds: list, per_seed: dict) -> dict:
  """``{"seeds", "per_seed"}`` and, for each numeric field every seed's record has, its mean, std (ddof 0) and values
  (``<field>``, ``<field>_std``, ``<field>_values``); ``models`` averaged model by model."""
  import numpy as np
  first = per_seed[str(seeds[0])]
  cell = {"seeds": seeds, "per_seed": per_seed}
  numeric = {key: [r.get(key) for r in per_seed.values()] for key in first}
  numeric = {k: v for k, v in numeric.items() if all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                      for x in v)}
  cell.update({key: float(np.mean(values)) for key, values in numeric.items()})
  for key, values in numeric.items():  # after the means: a record's own `<key>_std` never hides the seeds' std
    cell[f"{key}_std"], cell[f"{key}_values"] = float(np.std(values)), values
  if isinstance(first.get("models"), dict):
    cell["models"] = {m: float(np.mean([r["models"][m] for r in per_seed.values()])) for m in first["models"]
                      if all(r["models"].get(m) is not None for r in per_seed.values())}
  return cell


# What a stored cell records about how it ran rather than what it measured: kept per run when cells are pooled.
PROVENANCE_FIELDS = ("command", "commit", "dirty", "device", "device_kind", "backend", "jax", "strategy", "wall_s",
                     "rounds_per_s", "compile_s", "run_s", "run_wall_time_s", "resumed_from_round", "config")


def with_std(cell: dict, key: str, digits: int = 2) -> str:
  """``mean ± std`` of a field of a seeds cell (a vmapped ``--seeds`` program or pooled one-seed cells), the value
  alone for a single run: how every table script prints one number of a cell."""
  if f"{key}_std" in cell:
    return f"{cell[key]:.{digits}f} ± {cell[key + '_std']:.{digits}f}"
  return f"{cell[key]:.{digits}f}"


def pool_seed_cells(cells: list[dict]) -> dict:
  """One-seed cells of one setting, each run separately (another session, another machine), as ONE seeds cell:
  the shape :func:`run_cells` stores for a seeds program (each numeric field's mean, std across seeds and values;
  the per-seed records under ``per_seed``), so a table shows them as mean ± std over seeds.

  The seed of a cell is its config's ``seed``. Refused: a seeds cell among them, a seed given twice, cells whose
  ``protocol`` (rounds, epochs, reductions: what the table's note states) or whose ``rounds`` / ``epochs`` differ,
  or cells that trained another setting (:func:`setting_differences`: a calibration variant, a learning rate, a
  partition rule), which a table would otherwise show under one label as if it were seed noise.
  The pooled cell keeps the first cell's config and protocol, each run's provenance under ``pooled_runs``, the
  summed ``wall_s`` and every device kind."""
  if not cells:
    raise ValueError("no cells to pool")
  cells = [_one_lane_as_run(c) for c in cells]
  if any("seeds" in c and c["seeds"] for c in cells):
    raise ValueError("pool_seed_cells pools one-seed cells; a seeds cell (a vmapped seeds program) is already pooled")
  seeds = [int(c.get("config", {}).get("seed", 0)) for c in cells]
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"cells to pool must have distinct seeds, got {seeds}")
  for field in ("protocol", "rounds", "epochs"):
    found = [json.dumps(c.get(field), sort_keys=True) for c in cells]
    if len(set(found)) > 1:
      raise ValueError(f"cells to pool differ in {field!r}: {sorted(set(found))}")
  differences = setting_differences([c.get("config", {}) for c in cells])
  if differences:
    shown = "; ".join(f"{k}: {v}" for k, v in list(differences.items())[:8])
    raise ValueError(f"cells to pool trained different settings ({len(differences)} config field(s), seed order "
                     f"{seeds}): {shown}")
  order = sorted(range(len(cells)), key=lambda i: seeds[i])
  per_seed = {str(seeds[i]): {k: v for k, v in cells[i].items() if k not in PROVENANCE_FIELDS + ("rounds", "epochs")}
              for i in order}  # rounds / epochs: equal (checked above), kept once on the cell
  cell = _over_seeds([seeds[i] for i in order], per_seed)
  first = cells[order[0]]
  cell.update({k: first[k] for k in ("protocol", "rounds", "epochs", "config") if k in first})
  cell["pooled_runs"] = {str(seeds[i]): {k: cells[i][k] for k in PROVENANCE_FIELDS if k in cells[i] and k != "config"}
                         for i in order}
  cell["wall_s"] = sum(float(c.get("run_wall_time_s", c.get("wall_s", 0.0))) for c in cells)
  fixed = _fixed_seed_fields([c.get("config", {}) for c in cells])
  if fixed:
    cell["fixed_seed_fields"] = fixed
  cell["device_kind"] = ", ".join(sorted({str(c.get("device_kind") or c.get("backend")) for c in cells}))
  return cell


def _one_lane_as_run(cell: dict) -> dict:
  """A seeds program of ONE seed (``--seeds 1``) as the one-seed run it is: its lane's record, the program's
  provenance, and a config whose seed fields hold the lane's seed (what ``--seed N`` would have recorded; the program
  itself keeps seed 0 in its config and sets each lane's fields when it runs). Any other cell as it is."""
  import copy
  seeds = cell.get("seeds")
  if not seeds or len(seeds) != 1 or str(seeds[0]) not in cell.get("per_seed", {}):
    return cell
  from fedjax_robust.run import seed_fields_of
  seed = int(seeds[0])
  config = copy.deepcopy(cell.get("config", {}))
  for field in seed_fields_of(config):
    *path, leaf = field.split(".")
    block = config
    for part in path:
      block = block.setdefault(part, {})
    block[leaf] = seed
  config["seeds"] = ""
  lane = {k: v for k, v in cell.items() if k in PROVENANCE_FIELDS + ("rounds", "epochs", "protocol")}
  return {**cell["per_seed"][str(seed)], **lane, "config": config}


# Config fields that say how a run was evaluated, computed, stored or where its data lay, not what it trained:
# pooled runs may differ in them (an extra evaluator, another data folder, another engine path that the engine's
# equivalence tests hold equal). What the table's note states about evaluation is the ``protocol``, checked apart.
POOL_FREE_FIELDS = ("eval", "eval_every", "engine", "output", "seeds", "grid", "data.data_dir", "data.cache_dir",
                    "data.allow_download")


def _flat_config(config: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in (config or {}).items():
    if isinstance(value, dict):
      flat.update(_flat_config(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = json.dumps(value, sort_keys=True)
  return flat


def setting_differences(configs: list[dict]) -> dict[str, list]:
  """``{dotted field: [each run's value]}`` for the fields in which several runs' resolved configs trained a
  different setting: every field all of them record, except the seed fields, :data:`POOL_FREE_FIELDS`, the fields of
  a block switched off in every run (``name`` = ``"none"``, e.g. an unused ``attack.client``) and the option blocks
  of algorithms none of them ran (``algorithm.<other>``). A field only some runs record (a config key added since
  the older runs) is not compared: it did not exist when they ran, so they ran its default."""
  if len(configs) < 2:
    return {}
  from fedjax_robust.run import seed_fields_of
  flats = [_flat_config(c) for c in configs]
  shared = set.intersection(*(set(f) for f in flats))
  free = set(POOL_FREE_FIELDS) | {f for c in configs for f in seed_fields_of(c)}
  off = {key[:-len("name")] for key in shared if key.endswith(".name") and all(f[key] == '"none"' for f in flats)}
  ran = {json.loads(f["algorithm.name"]) for f in flats if "algorithm.name" in f}

  def compared(key: str) -> bool:
    if any(key == f or key.startswith(f + ".") for f in free) or any(key.startswith(p) for p in off):
      return False
    parts = key.split(".")
    return not (parts[0] == "algorithm" and len(parts) > 2 and ran and parts[1] not in ran)

  return {key: [json.loads(f[key]) for f in flats] for key in sorted(shared)
          if compared(key) and len({f[key] for f in flats}) > 1}


def _fixed_seed_fields(configs: list[dict]) -> dict:
  """``{field: value}`` of the seed fields (other than ``seed``) that every one of several runs' configs has with one
  value: runs made with ``--set seed=N`` alone share their partition and attacker draws."""
  from fedjax_robust.run import seed_fields_of
  if len(configs) < 2:
    return {}
  fields = [f for f in seed_fields_of(configs[0]) if f != "seed"]
  values = {f: [_field(c, f) for c in configs] for f in fields}
  return {f: v[0] for f, v in values.items() if v[0] is not None and len(set(map(str, v))) == 1}


def load_pooled(paths) -> dict:
  """The cells of one stored results file or several (a list, or a comma-separated string: a table script's
  ``--from_json``); a key that holds one-seed cells in more than one file is pooled into one seeds cell
  (:func:`pool_seed_cells`). Any other key found twice is refused (which one would a table show?). An entry
  ``path::key1+key2`` takes only those keys from that file (a file that also holds cells not meant for this table)."""
  if isinstance(paths, (str, Path)):
    paths = [p for p in str(paths).split(",") if p]
  found: dict[str, list[dict]] = {}
  for entry in paths:
    path, _, keys = str(entry).partition("::")
    cells = json.loads(Path(path).read_text())
    if keys:
      wanted = [k for k in keys.split("+") if k]
      missing = [k for k in wanted if k not in cells]
      if missing:
        raise KeyError(f"{path} holds no cell {missing}")
      cells = {k: cells[k] for k in wanted}
    for key, cell in cells.items():
      found.setdefault(key, []).append(cell)
  return {key: cells[0] if len(cells) == 1 else pool_seed_cells(cells) for key, cells in found.items()}


def seed_runs(cell: dict) -> dict[str | None, dict]:
  """The runs of a stored cell, ``{seed: record}``: a cell pooled over seeds (:func:`pool_seed_cells`, or a vmapped
  seeds program) gives each seed's record from ``per_seed``; a one-run cell is ``{None: cell}``. Per-round series and
  curves are per run, so a script reads them here rather than guessing which of the two shapes it holds."""
  return dict(cell["per_seed"]) if cell.get("per_seed") else {None: cell}


def grid_program_dir(keys: dict) -> str:
  """The run directory of a grid program (:func:`run_cells`): its first cell's key and ``__grid``."""
  return f"{next(iter(keys.values()))}__grid"


def point_config(config, point: dict):
  """``config`` as one lane of its grid program ran it: ``grid`` cleared, the point's values set (an int field keeps
  an int where the value is whole)."""
  import copy
  c = copy.deepcopy(config)
  c.grid = ""
  return apply_overrides(c, [f"{k}={v:g}" if float(v).is_integer() else f"{k}={v!r}" for k, v in point.items()])


def check_grid_keys(keys: dict, config) -> None:
  """Before a grid program runs: ``keys`` names each point of ``config.grid`` once (by ``run.point_label``)."""
  from fedjax_robust.run import parse_grid, point_label
  if not config.get("grid"):
    raise ValueError(f"cells keyed by grid point need config.grid: {sorted(keys.values())}")
  labels = [point_label(p) for p in parse_grid(config.grid, config.algorithm.name)]
  if sorted(labels) != sorted(keys) or len(set(keys.values())) != len(keys):
    raise ValueError(f"a grid cell's keys must name each point of its grid once, each its own cell: points {labels}, "
                     f"keys {keys}")


def _grid_cells(keys: dict, summary: dict, run_dir: Path, config, record: Record) -> dict:
  """The cells of one grid program: per point, ``keys[point label]`` -> a seeds cell of that point's lanes (as
  :func:`_seed_cells`), recorded with the point's own config."""
  from fedjax_robust.run import point_label
  cells = {}
  for point in summary["grid"]:
    label, c = point_label(point), point_config(config, point)
    cells[keys[label]] = (_seed_cells(summary, run_dir / label, c, record), c)
  return cells


def run_cells(cells: Iterable[tuple[str | dict, object, Record]], out: Path, results_path: Path, results: dict,
              stop_after_s: float = 0.0) -> dict:
  """Runs each ``(key, config, record)`` cell into ``out/<key>/`` and stores ``record(summary, run_dir, config)``
  (a dict holding ``value``, optionally ``models``), the run's ``per_round_series`` and timing under
  ``results[key]``, rewriting
  ``results_path`` after every cell. ``wall_s`` is this call's time; a cell resumed from a checkpoint also records
  ``resumed_from_round`` and ``run_wall_time_s``, the run's training time summed over every session.

  A grid program (``config.grid`` set: seeds x traced-hyperparameter lanes in ONE program, ``fedjax_robust.run``)
  has as ``key`` a dict ``{point label: cell key}`` naming each point's cell (``run.point_label``); it runs into
  ``out/<first key>__grid/`` and stores one seeds cell per point, recorded with that point's config, each with an
  equal share of the program's wall, compile and run time (so a table's summed wall time counts the program once)
  and ``program`` = the program's cells and whole times."""
  import jax
  from fedjax_robust.experiment import run_experiment
  start = time.perf_counter()
  source = provenance()  # the code this process runs: recorded now, not when a cell ends (HEAD may move meanwhile)
  cells = list(cells)
  for key, config, _ in cells:  # refused before anything runs
    if isinstance(key, dict):
      check_grid_keys(key, config)
  for key, config, record in cells:
    if stop_after_s and time.perf_counter() - start > stop_after_s:
      print(f"stopping before {key}: {stop_after_s:.0f} s budget spent", flush=True)
      break
    t0 = time.perf_counter()
    grid_program = isinstance(key, dict)
    if grid_program:
      run_dir = out / grid_program_dir(key)
      summary = run_experiment(config, run_dir)
      made = _grid_cells(key, summary, run_dir, config, record)
    else:
      summary = run_experiment(config, out / key)
      if config.get("seeds"):  # one vmapped program over the seeds: mean and std over their run directories
        made = {key: (_seed_cells(summary, out / key, config, record), config)}
      else:
        made = {key: ({**per_round_series(out / key), **record(summary, out / key, config)}, config)}
    wall_s = time.perf_counter() - t0
    share = 1.0 / len(made)  # a grid program's cells split its times, so that summing cells counts it once
    for k, (cell, c) in made.items():
      if grid_program or config.get("seeds"):
        cell.update(compile_s=summary["compile_s"] * share, run_s=summary["run_s"] * share)
      cell.update(wall_s=wall_s * share, rounds_per_s=summary["rounds_per_s"], rounds=int(c.rounds),
                  epochs=int(c.client.epochs), backend=jax.default_backend(), strategy=summary["strategy"],
                  config=json.loads(c.to_json_best_effort()), **source)
      if grid_program:
        cell["program"] = {"cells": list(made), "run_dir": grid_program_dir(key), "wall_s": wall_s,
                           "compile_s": summary["compile_s"], "run_s": summary["run_s"],
                           "rounds_per_s": summary["rounds_per_s"]}
      if summary.get("resumed_from_round"):  # wall_s is this invocation only; the run's clock spans every session
        cell.update(resumed_from_round=summary["resumed_from_round"], run_wall_time_s=summary["wall_time_s"])
      results[k] = cell
      print(cell_line(k, cell), flush=True)
    results_path.write_text(json.dumps(results, indent=1))
  return results


def cell_line(key: str, cell: dict) -> str:
  """One finished cell as a progress line: its value (± over seeds), other models' values, detection, wall time."""
  parts = [f"{k} {v:.2f}" for k, v in cell.get("models", {}).items() if v is not None]
  if cell.get("detection_tpr") is not None:
    parts.append(f"TPR {cell['detection_tpr']:.2f} FPR {cell.get('detection_fpr', float('nan')):.2f}")
  spread = f" ± {cell['value_std']:.2f}" if "value_std" in cell else ""
  details = f" ({', '.join(parts)})" if parts else ""
  return f"{key:24s} {cell['value']:6.2f}{spread}{details} {cell['wall_s']:.0f}s"


def selected_cells(cells, only: str) -> list:
  """The cells whose key (for a grid program, any of its cell keys) contains one of ``only``'s comma-separated
  parts; all of them when ``only`` is empty. A selection that matches no cell is an error, not an empty grid."""
  cells = list(cells)
  parts = [p for p in only.split(",") if p]
  if not parts:
    return cells
  keys_of = lambda key: list(key.values()) if isinstance(key, dict) else [key]  # noqa: E731
  chosen = [c for c in cells if any(p in k for k in keys_of(c[0]) for p in parts)]
  if not chosen:
    example = keys_of(cells[0][0])[0] if cells else "none"
    raise SystemExit(f"--only {only} matches none of the {len(cells)} cells (e.g. {example})")
  return chosen


def run_and_tabulate(cells, args, render: Callable[[dict], str], finish_cell: Callable[[dict], None] | None = None
                     ) -> str:
  """A table script's main job: runs ``cells`` into ``args.out_dir`` (unless ``--table_only``), lets
  ``finish_cell`` reshape each new stored cell in place (then rewrites the results file), and renders the table of
  every results file there with ``render``, written to ``<out_dir>/<args.mode>.md`` and returned."""
  out, results_path, results = open_results(args.out_dir, args.shard)
  cells = selected_cells(cells, args.only)
  if not args.table_only:
    run_cells(cells, out, results_path, results, args.stop_after_s)
    if finish_cell is not None:
      for key, _, _ in cells:
        for k in (key.values() if isinstance(key, dict) else [key]):  # a grid program's cells, one per point
          if k in results:
            finish_cell(results[k])
      results_path.write_text(json.dumps(results, indent=1))
  table = render(merged_results(out))
  (out / f"{args.mode}.md").write_text(table)
  return table
