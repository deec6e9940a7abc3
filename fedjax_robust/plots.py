"""Pictures of a run directory: what happened, without reading JSON.

``write_run_plots(run_dir)`` writes ``<run_dir>/plots/`` (``experiment.run_experiment`` calls it at the end of a run
when ``output.plots``); ``write_comparison_plots([run_a, run_b, ...], out_dir)`` overlays several runs' curves, with
the run names as the legend (``experiments/plot.py RUN_DIR [RUN_DIR ...]`` is the command line of both). Each figure
is written as PNG and SVG:

  accuracy   global model on the global test set, the clients' mean accuracy on their own test data with the
             range over clients (min-max, shaded), the benign clients' mean under an attack (the band then spans the
             benign clients only), the backdoor attack success rate when one is measured; an optional reference line
             (a paper's number). Accuracy in %, over rounds; only evaluated rounds are drawn.
  loss       the round's local training loss (cohort mean) and, under an attack, the benign members' mean.
  partition  clients x classes heatmap of training samples (``partition.json``); attackers' rows marked.
  detection  rounds x clients raster: who was sampled, who the server flagged or removed (split into attackers
             caught and benign clients hit when the attackers are known), FedVSA's Shapley-flagged uploads and audit
             alarms. Written when the run had attackers or flagged anyone.
  weights    clients x rounds heatmap of each cohort member's aggregation weight (``aggregation_weights`` with
             ``cohort``); grey where a client was not sampled. Written when the rule logs weights.
  client_weights
             clients x clients heatmap of the weight of each client's model (column) in each client's model (row):
             FedCAP's customized weights, FedFomo's first-order weights, FedCAC's collaborator means, FedAMP's
             attention (``client_weights.npz``, :mod:`fedjax_robust.client_weights`), at the last stored round
             and averaged over the stored (evaluated) rounds; grey rows: not sampled. Written when the run has
             that file.

The data preparation (``metric_series``, ``client_spread``, ``partition_matrix``, ``detection_raster``,
``weight_matrix``, ``client_matrices``) is plain numpy and tested on its own; drawing uses matplotlib's object API
on an Agg canvas (no pyplot, no global backend change), so it runs headless and inside notebooks alike. Needs matplotlib
(``pip install -e ".[plots]"``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from fedjax_robust import client_weights

FORMATS = ("png", "svg")


# ------------------------------------------------------------------------------------------ reading a run
@dataclasses.dataclass
class Run:
  """What a run directory holds, as read back: per-round records, partition, attackers, config, and the client x
  client weights of ``client_weights.npz`` when the algorithm reports them."""
  name: str
  path: Path
  records: list[dict]
  partition: Optional[dict] = None
  malicious: Optional[list[int]] = None  # attacker ids (malicious.json), None without an attack
  config: Optional[dict] = None
  client_weights: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None  # (round, cohort, matrix), its arrays

  @property
  def num_clients(self) -> int:
    if self.partition:
      return int(self.partition["num_clients"])
    if self.config:
      return int(self.config["data"]["num_clients"])
    ids = [i for r in self.records for i in r.get("cohort", [])]
    return max(ids) + 1 if ids else 0


def _read_json(path: Path):
  return json.loads(path.read_text()) if path.exists() else None


def run_name(path: Path) -> str:
  """A run's label: its directory name, with its parent's for a seed lane (``fedavg/seed_0``)."""
  path = Path(path)
  return f"{path.parent.name}/{path.name}" if path.name.startswith("seed_") else path.name


def load_run(run_dir: str | Path, name: Optional[str] = None) -> Run:
  run_dir = Path(run_dir)
  metrics = run_dir / "metrics.jsonl"
  if not metrics.exists():
    raise FileNotFoundError(f"{run_dir} is not a run directory: it has no metrics.jsonl")
  records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  malicious = _read_json(run_dir / "malicious.json")
  weights = run_dir / client_weights.FILE
  return Run(name or run_name(run_dir), run_dir, records, _read_json(run_dir / "partition.json"),
             None if malicious is None else [int(i) for i in malicious["malicious_clients"]],
             _read_json(run_dir / "config.json"), client_weights.load(weights) if weights.exists() else None)


# ------------------------------------------------------------------------------------------ data preparation
def _number(value) -> float:
  if value is None or isinstance(value, (list, dict, str)):
    return math.nan
  return float(value)


def metric_series(records: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """``(rounds, values)`` of a scalar metric over the rounds that logged it (``None``, NaN and infinities as NaN)."""
  pairs = [(int(r["round"]), _number(r[key])) for r in records if key in r]
  rounds = np.asarray([p[0] for p in pairs], np.int64)
  values = np.asarray([p[1] for p in pairs], np.float64)
  return rounds, np.where(np.isfinite(values), values, np.nan)


def client_spread(records: Sequence[dict], key: str = "client_acc",
                  exclude: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """``(rounds, mean, min, max)`` over clients of a per-client metric (``client_acc``: one entry per client, by id)
  at each round that logged it, leaving out the clients in ``exclude`` (the attackers, for the benign spread)."""
  rows = [(int(r["round"]), np.asarray(r[key], np.float64)) for r in records if isinstance(r.get(key), list)]
  if not rows:
    empty = np.zeros((0,))
    return empty.astype(np.int64), empty, empty, empty
  excluded = set(int(i) for i in exclude)
  keep = np.asarray([i not in excluded for i in range(len(rows[0][1]))])
  matrix = np.stack([v[keep] for _, v in rows])  # rounds x kept clients
  rounds = np.asarray([r for r, _ in rows], np.int64)
  return rounds, matrix.mean(axis=1), matrix.min(axis=1), matrix.max(axis=1)


def partition_matrix(partition: dict, split: str = "train") -> np.ndarray:
  """``(num_clients, num_classes)`` sample counts of ``partition.json`` (``<split>_label_histograms``)."""
  matrix = np.asarray(partition[f"{split}_label_histograms"], np.int64)
  expected = (int(partition["num_clients"]), int(partition["num_classes"]))
  if matrix.shape != expected:
    raise ValueError(f"partition.json's {split} histograms are {matrix.shape}, not clients x classes {expected}")
  return matrix


# detection_raster's cell states
NOT_SAMPLED, SAMPLED, SAMPLED_ATTACKER, FLAGGED_ATTACKER, FLAGGED_BENIGN, FLAGGED = range(6)


def detection_raster(records: Sequence[dict], num_clients: int,
                     malicious: Optional[Iterable[int]] = None) -> dict[str, np.ndarray]:
  """Who was sampled and who was flagged, per round: ``state`` is ``(num_clients, num_rounds)`` of
  ``NOT_SAMPLED | SAMPLED | SAMPLED_ATTACKER | FLAGGED_ATTACKER | FLAGGED_BENIGN`` (``FLAGGED`` when the attackers
  are not known), from each record's ``cohort`` and ``flagged_clients``; ``shapley`` (same shape, bool) marks the
  uploads of that round that FedVSA's Shapley step flagged, which it does in the round after (a round's
  ``shapley_ids[shapley_flagged]`` are members of the round before's cohort); ``alarm`` (``num_rounds``, bool) its loss audit's alarms; ``rounds`` the round
  numbers of the columns."""
  rounds = np.asarray([int(r["round"]) for r in records], np.int64)
  attackers = np.zeros(num_clients, bool)
  if malicious is not None:
    attackers[np.asarray(list(malicious), np.int64)] = True
  known = malicious is not None
  state = np.full((num_clients, len(records)), NOT_SAMPLED, np.int8)
  shapley = np.zeros((num_clients, len(records)), bool)
  alarm = np.zeros(len(records), bool)
  column = {int(r["round"]): j for j, r in enumerate(records)}
  for j, r in enumerate(records):
    cohort = np.asarray(r.get("cohort", []), np.int64)
    state[cohort, j] = np.where(attackers[cohort], SAMPLED_ATTACKER, SAMPLED)
    flagged = np.asarray(r.get("flagged_clients", []), np.int64)
    if known:
      state[flagged, j] = np.where(attackers[flagged], FLAGGED_ATTACKER, FLAGGED_BENIGN)
    else:
      state[flagged, j] = FLAGGED
    if "shapley_flagged" in r and "shapley_ids" in r and int(r["round"]) - 1 in column:
      ids = np.asarray(r["shapley_ids"], np.int64)[np.asarray(r["shapley_flagged"], bool)]
      shapley[ids[(ids >= 0) & (ids < num_clients)], column[int(r["round"]) - 1]] = True
    alarm[j] = bool(r.get("audit_alarm", False))
  return {"rounds": rounds, "state": state, "shapley": shapley, "alarm": alarm}


def weight_matrix(records: Sequence[dict], num_clients: int,
                  key: str = "aggregation_weights") -> tuple[np.ndarray, np.ndarray]:
  """``(rounds, weights)``: ``weights`` is ``(num_clients, num_rounds)``, each cohort member's ``key`` value (logged
  in cohort order) at its client id, NaN where the client was not in the round's cohort."""
  rows = [r for r in records if isinstance(r.get(key), list) and isinstance(r.get("cohort"), list)]
  weights = np.full((num_clients, len(rows)), np.nan)
  for j, r in enumerate(rows):
    if len(r[key]) != len(r["cohort"]):
      raise ValueError(f"round {r['round']}: {len(r[key])} {key} for a cohort of {len(r['cohort'])}")
    weights[np.asarray(r["cohort"], np.int64), j] = np.asarray(r[key], np.float64)
  return np.asarray([int(r["round"]) for r in rows], np.int64), weights


def client_matrices(rounds: np.ndarray, cohorts: np.ndarray, matrices: np.ndarray,
                    num_clients: int) -> tuple[np.ndarray, np.ndarray]:
  """``(rounds, stack)``: ``stack`` is ``(num_rounds, num_clients, num_clients)``, receiver x contributor, each
  stored round's ``[C, K]`` rows at their receivers' ids and NaN rows for clients not sampled that round."""
  stack = np.stack([client_weights.square(c, m, num_clients) for c, m in zip(cohorts, matrices)]) if len(rounds) \
      else np.zeros((0, num_clients, num_clients))
  return np.asarray(rounds, np.int64), stack


def mean_over_rounds(stack: np.ndarray) -> np.ndarray:
  """Each row's mean over the rounds its client was sampled (NaN for a client never sampled)."""
  sampled = ~np.isnan(stack).all(axis=2, keepdims=True)  # (rounds, clients, 1)
  count = sampled.sum(axis=0)
  total = np.where(sampled, stack, 0.0).sum(axis=0)
  return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def has_detection(run: Run) -> bool:
  """Whether a detection raster says something: the run had attackers, or anything was ever flagged."""
  return bool(run.malicious) or any(r.get("flagged_clients") or any(r.get("shapley_flagged", [])) or
                                    r.get("audit_alarm") for r in run.records)


# ------------------------------------------------------------------------------------------ drawing
def _figure(width: float = 7.5, height: float = 4.5):
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, height), dpi=150, layout="constrained")
  return fig, fig.add_subplot()


def _save(fig, out_dir: Path, stem: str) -> list[Path]:
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for fmt in FORMATS:
    path = out_dir / f"{stem}.{fmt}"
    fig.savefig(path, format=fmt)
    paths.append(path)
  return paths


def describe(run: Run) -> str:
  """One line of what a run was: dataset, clients, partition, algorithm, rule, attack."""
  c = run.config
  if not c:
    return run.name
  data = c.get("data", {})
  part = data.get("partition", {})
  part_s = part.get("name", "")
  if part_s == "dirichlet":
    part_s = f"Dirichlet α={part.get('alpha')}"
  bits = [f"{data.get('name')}, {data.get('num_clients')} clients, {part_s}", c.get("algorithm", {}).get("name", "")]
  rule = c.get("aggregator", {}).get("name", "mean")
  if rule != "mean":
    bits.append(f"rule {rule}")
  attack = c.get("attack", {})
  kinds = [attack.get("name", "none"), attack.get("data", {}).get("kind", "none"),
           attack.get("client", {}).get("name", "none")]
  kinds = [k for k in kinds if k and k != "none"]
  if kinds:
    who = f"clients {attack['clients']}" if attack.get("clients") else f"{100 * float(attack.get('fraction', 0)):g}%"
    bits.append(f"attack {'+'.join(kinds)} ({who})")
  return " | ".join(b for b in bits if b)


def _line(ax, rounds, values, **kw):
  """A curve with markers when it has few points (an eval_every > 1 run), so single evaluations stay visible."""
  if len(rounds) == 0:
    return
  if len(rounds) <= 25:
    kw.setdefault("marker", "o")
    kw.setdefault("markersize", 3)
  ax.plot(rounds, values, **kw)


def _round_axis(ax, runs: Sequence[Run]):
  last = max((int(r.records[-1]["round"]) for r in runs if r.records), default=1)
  ax.set_xlabel("round (communication rounds completed)")
  ax.set_xlim(0.5, last + 0.5)
  if last <= 20:
    ax.set_xticks(range(1, last + 1))
  ax.grid(True, alpha=0.3)


# curve quantities: metrics.jsonl key -> (line style, what it is)
ACCURACY_CURVES = (
    ("global_test_acc", "-", "global model, global test set"),
    ("client_acc_mean", "--", "clients' mean, own test data"),
    ("benign_acc_mean", ":", "benign clients' mean"),  # drawn for runs with attackers
    ("backdoor_asr", "-.", "backdoor attack success rate"),
)
LOSS_CURVES = (
    ("train_loss", "-", "all cohort members"),
    ("benign_train_loss", "--", "benign cohort members"),  # drawn for runs with attackers
)
_BENIGN_ONLY = ("benign_acc_mean", "benign_train_loss")


def _curves(ax, runs: Sequence[Run], curves, scale: float, bands: bool) -> tuple[list, dict]:
  """Draws each run's ``curves`` (a colour per quantity for one run; a colour per run and a line style per quantity
  for several) and, with ``bands``, the min-max range of ``client_acc`` over (benign) clients. Returns the legend
  handles and the drawn values by key."""
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch
  single = len(runs) == 1
  handles, styles_used, drawn = [], [], {}
  for i, run in enumerate(runs):
    run_color = f"C{i % 10}"
    for j, (key, style, label) in enumerate(curves):
      if key in _BENIGN_ONLY and not run.malicious:
        continue
      r, v = metric_series(run.records, key)
      if not len(r):
        continue
      color = f"C{j}" if single else run_color
      _line(ax, r, scale * v, color=color, ls=style, lw=1.8 if style == "-" else 1.4,
            label=label if single else None)
      drawn.setdefault(key, []).append((r, v))
      if (style, label) not in styles_used:
        styles_used.append((style, label))
    if bands:
      sr, _, lo, hi = client_spread(run.records, "client_acc", exclude=run.malicious or ())
      if len(sr):
        who = "benign clients" if run.malicious else "clients"
        color = ("C2" if run.malicious else "C1") if single else run_color
        ax.fill_between(sr, scale * lo, scale * hi, color=color, alpha=0.15, lw=0,
                        label=f"range over {who} (min-max)" if single else None)
        if not single and ("band", who) not in styles_used:
          styles_used.append(("band", who))
  if single:
    return ax.get_legend_handles_labels()[0], drawn
  handles = [Line2D([], [], color=f"C{i % 10}", lw=2.5, label=run.name) for i, run in enumerate(runs)]
  for style, label in styles_used:
    if style == "band":
      handles.append(Patch(facecolor="0.5", alpha=0.25, label=f"range over {label} (min-max)"))
    else:
      handles.append(Line2D([], [], color="0.35", ls=style, lw=1.5, label=label))
  return handles, drawn


def plot_accuracy(runs: Sequence[Run], out_dir: Path, stem: str = "accuracy",
                  references: Sequence[tuple[float, str]] = (), bands: Optional[bool] = None) -> list[Path]:
  """Accuracy (%) over rounds: global test accuracy (solid), clients' mean (dashed) with the min-max range over
  clients (shaded; benign clients only under an attack), benign clients' mean (dotted), backdoor attack success rate
  (dash-dot). Several runs: a colour per run (the legend names them), a line style per quantity; bands only up to
  three runs. ``references``: ``(accuracy in %, label)`` horizontal lines (a paper's number)."""
  from matplotlib.lines import Line2D
  fig, ax = _figure()
  bands = len(runs) <= 3 if bands is None else bands
  handles, drawn = _curves(ax, runs, ACCURACY_CURVES, 100.0, bands)
  dashes = ((0, (4, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)))  # one pattern per reference line, so each is legible
  for i, (value, label) in enumerate(references):
    style = dict(color="black", lw=1, ls=dashes[i % len(dashes)])
    ax.axhline(value, **style)
    handles.append(Line2D([], [], **style, label=f"reference: {label} ({value:g}%)"))
  if "global_test_acc" not in drawn and "client_acc_mean" not in drawn:
    ax.text(0.5, 0.5, "no evaluated round in metrics.jsonl", ha="center", va="center", transform=ax.transAxes)
  ax.set_ylabel("accuracy (%)")
  ax.set_ylim(0, 101)
  _round_axis(ax, runs)
  ax.set_title("Test accuracy over rounds" + (f"\n{describe(runs[0])}" if len(runs) == 1 else f" ({len(runs)} runs)"),
               fontsize=10)
  _legend_below(fig, handles)
  return _save(fig, out_dir, stem)


def _legend_below(fig, handles):
  """The legend under the axes, where it hides no curve."""
  if handles:
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=7, frameon=False)


def plot_loss(runs: Sequence[Run], out_dir: Path, stem: str = "loss") -> list[Path]:
  """The local training loss (mean over the round's cohort) over rounds; under an attack the benign members' mean
  dashed. Log scale when the curves span more than two decades; rounds with a non-finite loss are named in the
  title (a diverged run's NaN is a gap in the curve)."""
  fig, ax = _figure()
  handles, drawn = _curves(ax, runs, LOSS_CURVES, 1.0, bands=False)
  values = np.concatenate([v for series in drawn.values() for _, v in series]) if drawn else np.zeros(0)
  finite = values[np.isfinite(values)]
  if len(finite) and finite.min() > 0 and finite.max() / finite.min() > 100:
    ax.set_yscale("log")
  bad_rounds = sorted({int(t) for r, v in drawn.get("train_loss", []) for t in r[~np.isfinite(v)]})
  ax.set_ylabel("local training loss (cohort mean)")
  _round_axis(ax, runs)
  title = "Training loss over rounds" + (f"\n{describe(runs[0])}" if len(runs) == 1 else f" ({len(runs)} runs)")
  if bad_rounds:
    more = " ..." if len(bad_rounds) > 8 else ""
    title += (f"\nnon-finite loss (not drawn) in round{'s' if len(bad_rounds) > 1 else ''} "
              f"{', '.join(map(str, bad_rounds[:8]))}{more}")
  if not drawn:
    ax.text(0.5, 0.5, "no training loss in metrics.jsonl", ha="center", va="center", transform=ax.transAxes)
  ax.set_title(title, fontsize=10)
  _legend_below(fig, handles)
  return _save(fig, out_dir, stem)


def _rows_height(rows: int, base: float, per_row: float) -> float:
  """A figure height for ``rows`` client rows: ``per_row`` inches each up to 30, then a fifth of it, at most 10."""
  return min(base + per_row * min(rows, 30) + per_row / 5 * max(rows - 30, 0), 10.0)


def _client_ticks(ax, num_clients: int, malicious: Optional[Sequence[int]], axis: str = "y"):
  """Client-id ticks (every id up to 40 clients, else about 20 and every attacker's), attackers' ids in red."""
  step = 1 if num_clients <= 40 else int(math.ceil(num_clients / 20))
  attackers = set(int(i) for i in (malicious or ()))
  ticks = sorted(set(range(0, num_clients, step)) | (attackers if len(attackers) <= 20 else set()))
  if axis == "y":
    ax.set_yticks(ticks)
    labels = ax.set_yticklabels([str(t) for t in ticks], fontsize=7 if num_clients > 20 else 8)
  else:
    ax.set_xticks(ticks)
    labels = ax.set_xticklabels([str(t) for t in ticks], fontsize=7)
  for t, label in zip(ticks, labels):
    if t in attackers:
      label.set_color("red")
      label.set_fontweight("bold")


def plot_partition(run: Run, out_dir: Path, stem: str = "partition") -> list[Path]:
  """The partition: training samples of each class held by each client (counts printed in small grids)."""
  from matplotlib.colors import LogNorm
  matrix = partition_matrix(run.partition)
  k, c = matrix.shape
  fig, ax = _figure(min(max(7.0, 3.5 + 0.45 * c), 14), _rows_height(k, 2.6, 0.3))
  norm = LogNorm(vmin=1, vmax=max(int(matrix.max()), 2)) if matrix.max() > 50 * max(1, matrix[matrix > 0].min()) \
      else None
  shown = np.ma.masked_equal(matrix, 0)
  cmap = _cmap("viridis", bad="white")
  im = ax.imshow(shown, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
  if k * c <= 400:
    top = float(matrix.max())
    for i in range(k):
      for j in range(c):
        if matrix[i, j]:
          bright = (np.log(matrix[i, j]) / np.log(max(top, 2)) if norm is not None else matrix[i, j] / top) > 0.6
          ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=6,
                  color="black" if bright else "white")
  names = (run.partition.get("info") or {}).get("class_names")
  if names and len(names) == c and c <= 30:
    ax.set_xticks(range(c))
    ax.set_xticklabels([str(n) for n in names], fontsize=7, rotation=0 if max(len(str(n)) for n in names) <= 3 else 60)
  ax.set_xlabel("class")
  ax.set_ylabel("client id" + (" (attackers in red)" if run.malicious else ""))
  _client_ticks(ax, k, run.malicious)
  cb = fig.colorbar(im, ax=ax)
  cb.set_label("training samples" + (" (log scale)" if norm is not None else ""))
  n_train = matrix.sum(axis=1)
  classes = (matrix > 0).sum(axis=1)
  ax.set_title(f"Partition: training samples per client and class (white = none)\n{describe(run)}\n"
               f"{int(n_train.sum())} samples; per client {int(n_train.min())}-{int(n_train.max())}, "
               f"{classes.mean():.1f} of {c} classes on average", fontsize=9)
  return _save(fig, out_dir, stem)


def _cmap(name: str, bad: str):
  import matplotlib
  return matplotlib.colormaps[name].with_extremes(bad=bad)


_STATE_STYLE = {  # state -> (colour, legend label)
    NOT_SAMPLED: ("white", "not sampled"),
    SAMPLED: ("#cfcfcf", "sampled"),
    SAMPLED_ATTACKER: ("#f4a6a6", "attacker sampled, not flagged"),
    FLAGGED_ATTACKER: ("#b2182b", "attacker flagged (true positive)"),
    FLAGGED_BENIGN: ("#f1a340", "benign client flagged (false positive)"),
    FLAGGED: ("#b2182b", "flagged / removed"),
}


def plot_detection(run: Run, out_dir: Path, stem: str = "detection") -> list[Path]:
  """Who the server flagged, round by round (rounds across, clients down)."""
  from matplotlib.colors import BoundaryNorm, ListedColormap
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch
  k = run.num_clients
  raster = detection_raster(run.records, k, run.malicious)
  rounds, state = raster["rounds"], raster["state"]
  n = len(rounds)
  fig, ax = _figure(min(max(7.5, 3 + 0.12 * n), 16), _rows_height(k, 3.2, 0.22))
  cmap = ListedColormap([_STATE_STYLE[s][0] for s in range(len(_STATE_STYLE))])
  ax.imshow(state, aspect="auto", cmap=cmap, norm=BoundaryNorm(np.arange(len(_STATE_STYLE) + 1) - 0.5, cmap.N),
            interpolation="nearest", extent=(rounds[0] - 0.5, rounds[-1] + 0.5, k - 0.5, -0.5) if n else None)
  present = sorted(set(np.unique(state).tolist()) | {NOT_SAMPLED, SAMPLED})
  handles = [Patch(facecolor=_STATE_STYLE[s][0], edgecolor="0.5", lw=0.5, label=_STATE_STYLE[s][1]) for s in present]
  ci, ri = np.nonzero(raster["shapley"])
  if len(ci):
    ax.scatter(rounds[ri], ci, marker="x", s=28, color="black", lw=1.2, zorder=3)
    handles.append(Line2D([], [], marker="x", ls="", color="black",
                          label="upload flagged by Shapley values (in the round after)"))
  for t in rounds[raster["alarm"]]:
    ax.axvline(t, color="#7b3294", lw=1.2, ls="--", zorder=2)
  if raster["alarm"].any():
    handles.append(Line2D([], [], color="#7b3294", ls="--", label="loss-audit alarm (raised in that round)"))
  # thin lines between clients / rounds keep cells apart in small grids
  if k <= 40:
    ax.set_yticks(np.arange(-0.5, k, 1), minor=True)
  if n <= 60 and n:
    ax.set_xticks(np.arange(rounds[0] - 0.5, rounds[-1] + 1, 1), minor=True)
  ax.grid(True, which="minor", color="white", lw=0.6)
  ax.tick_params(which="minor", length=0)
  _client_ticks(ax, k, run.malicious)
  if n and n <= 30:
    ax.set_xticks(rounds)
  ax.set_xlabel("round")
  ax.set_ylabel("client id" + (" (attackers in red)" if run.malicious else ""))
  flagged = state >= FLAGGED_ATTACKER
  summary = f"{int(flagged.sum())} flags over {n} rounds"
  if run.malicious:
    tp = int((state == FLAGGED_ATTACKER).sum())
    summary += f" ({tp} on attackers, {int((state == FLAGGED_BENIGN).sum())} on benign clients)"
  if raster["shapley"].any():
    on = raster["shapley"]
    summary += f"; {int(on.sum())} uploads Shapley-flagged"
    if run.malicious:
      summary += f" ({int(on[np.asarray(run.malicious, np.int64)].sum())} from attackers)"
  ax.set_title(f"Detection: who was flagged or removed, per round\n{summary}\n{describe(run)}", fontsize=9)
  fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize=7, frameon=False)
  return _save(fig, out_dir, stem)


def plot_weights(run: Run, out_dir: Path, stem: str = "weights", key: str = "aggregation_weights") -> list[Path]:
  """Each cohort member's aggregation weight, round by round (grey: not sampled)."""
  k = run.num_clients
  rounds, weights = weight_matrix(run.records, k, key)
  n = len(rounds)
  fig, ax = _figure(min(max(7.5, 3 + 0.12 * n), 16), _rows_height(k, 3.2, 0.22))
  cmap = _cmap("viridis", bad="#e6e6e6")
  im = ax.imshow(np.ma.masked_invalid(weights), aspect="auto", cmap=cmap, vmin=0,
                 vmax=max(float(np.nanmax(weights)) if np.isfinite(weights).any() else 1.0, 1e-12),
                 interpolation="nearest", extent=(rounds[0] - 0.5, rounds[-1] + 0.5, k - 0.5, -0.5) if n else None)
  _client_ticks(ax, k, run.malicious)
  if n and n <= 30:
    ax.set_xticks(rounds)
  ax.set_xlabel("round")
  ax.set_ylabel("client id" + (" (attackers in red)" if run.malicious else ""))
  cb = fig.colorbar(im, ax=ax)
  cb.set_label("aggregation weight (share of the round's update)")
  zero = int(np.sum(weights == 0))
  ax.set_title(f"Aggregation weights per round (grey = not sampled{'; 0 = left out' if zero else ''})\n"
               f"{describe(run)}", fontsize=9)
  return _save(fig, out_dir, stem)


# what a row of the client x client matrix weighs, per algorithm (config algorithm.name); the colorbar's label
CLIENT_MATRIX_MEANING = {
    "fedcap": "p_k,i: weight of client i's model in client k's customized model (Eqs. 3-5)",
    "fedfomo": "w_k,n: weight of client n's model in client k's federated model (diagonal: k's own previous model)",
    "fedcac": "weight of client j's model in client i's critical parameters (Eq. 10)",
    "fedamp": "ξ_ij: weight of client j's model in client i's cloud model (attention)",
}


def plot_client_matrix(run: Run, out_dir: Path, stem: str = "client_weights") -> list[Path]:
  """The client x client weights (rows: receiving clients, columns: contributing clients) of the last stored round
  and, with several stored rounds, their mean over the rounds each row's client was sampled; grey rows: not sampled.
  Attackers' ids in red on both axes."""
  from matplotlib.colors import TwoSlopeNorm
  from matplotlib.figure import Figure
  k = run.num_clients
  rounds, stack = client_matrices(*run.client_weights, num_clients=k)
  panels = [(stack[-1], f"round {rounds[-1]}")]
  if len(rounds) > 1:
    span = f"mean over {len(rounds)} evaluated rounds {rounds[0]}-{rounds[-1]}"
    panels.append((mean_over_rounds(stack), f"{span}\n(each row over the rounds it was sampled)"))
  side = min(max(3.2, 1.6 + 0.16 * k), 7.0)
  fig = Figure(figsize=(side * len(panels) + 1.4, side + 1.4), dpi=150, layout="constrained")
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  finite = np.concatenate([m[np.isfinite(m)] for m, _ in panels])
  lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
  if lo < 0:  # FedAMP's self weight may be negative: a diverging map, 0 white
    cmap, norm = _cmap("RdBu_r", bad="#e6e6e6"), TwoSlopeNorm(0.0, lo, max(hi, 1e-12))
  else:
    cmap, norm = _cmap("viridis", bad="#e6e6e6"), None
  for ax, (matrix, title) in zip(axes, panels):
    im = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, norm=norm, vmin=None if norm else 0.0,
                   vmax=None if norm else max(hi, 1e-12), interpolation="nearest")
    if k <= 40:  # thin lines keep the cells apart in small grids
      ax.set_xticks(np.arange(-0.5, k, 1), minor=True)
      ax.set_yticks(np.arange(-0.5, k, 1), minor=True)
      ax.grid(True, which="minor", color="white", lw=0.4)
      ax.tick_params(which="minor", length=0)
    _client_ticks(ax, k, run.malicious, "y")
    _client_ticks(ax, k, run.malicious, "x")
    ax.set_xlabel("contributing client (column)", fontsize=8)
    ax.set_title(title, fontsize=8)
  axes[0].set_ylabel("receiving client (row)" + (", attackers in red" if run.malicious else ""), fontsize=8)
  algorithm = (run.config or {}).get("algorithm", {}).get("name", "")
  cb = fig.colorbar(im, ax=list(axes), shrink=0.85)
  meaning = CLIENT_MATRIX_MEANING.get(algorithm, "weight of the column client's model in the row client's model")
  cb.set_label(textwrap.fill(meaning, int(12 * side)), fontsize=7)
  fig.suptitle(f"Client x client weights (row: receiver, column: contributor; grey: not sampled)\n{describe(run)}",
               fontsize=9)
  return _save(fig, out_dir, stem)


def write_run_plots(run_dir: str | Path, out_dir: Optional[str | Path] = None,
                    references: Sequence[tuple[float, str]] = ()) -> list[Path]:
  """Every figure of one run into ``out_dir`` (default ``<run_dir>/plots``); returns the files written.

  ``references``: horizontal accuracy lines; by default the run's own ``output.reference`` (a paper's number that
  its config names), so a redraw by ``experiments/plot.py`` shows the same lines as the run's own plots."""
  run = load_run(run_dir)
  out = Path(out_dir) if out_dir is not None else run.path / "plots"
  references = list(references) or config_references(run.config)
  paths = plot_accuracy([run], out, references=references) + plot_loss([run], out)
  if run.partition:
    paths += plot_partition(run, out)
  if run.num_clients and has_detection(run) and any("cohort" in r for r in run.records):
    paths += plot_detection(run, out)
  if any(isinstance(r.get("aggregation_weights"), list) for r in run.records):
    paths += plot_weights(run, out)
  if run.client_weights is not None and len(run.client_weights[0]) and run.num_clients:
    paths += plot_client_matrix(run, out)
  return paths


def write_comparison_plots(run_dirs: Sequence[str | Path], out_dir: str | Path,
                           references: Sequence[tuple[float, str]] = (),
                           names: Optional[Sequence[str]] = None) -> list[Path]:
  """Several runs' accuracy and loss curves overlaid (legend: the run names) into ``out_dir``."""
  runs = [load_run(d, None if names is None else names[i]) for i, d in enumerate(run_dirs)]
  labels = [r.name for r in runs]
  if len(set(labels)) < len(labels):  # same directory names under different parents: use the parents too
    for r in runs:
      r.name = f"{r.path.parent.name}/{r.path.name}"
  out = Path(out_dir)
  return plot_accuracy(runs, out, references=references) + plot_loss(runs, out)


def matplotlib_available() -> bool:
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    return False
  return True


def parse_reference(text: str) -> tuple[float, str]:
  """``"95.1:FedCAP Table II"`` -> ``(95.1, "FedCAP Table II")`` (accuracy in %)."""
  value, _, label = text.partition(":")
  try:
    number = float(value)
  except ValueError:
    raise ValueError(f"a reference is VALUE[:LABEL] with VALUE an accuracy in %, got {text!r}") from None
  if not math.isfinite(number):
    raise ValueError(f"a reference accuracy must be finite, got {text!r}")
  return number, label.strip() or "reference"


def parse_references(text: str) -> list[tuple[float, str]]:
  """``output.reference``: ``"VALUE[:LABEL]"`` items separated by ``;`` ('' = none)."""
  return [parse_reference(item.strip()) for item in (text or "").split(";") if item.strip()]


def config_references(config: Optional[dict]) -> list[tuple[float, str]]:
  """The reference lines a run's config asks for (``output.reference``; none in configs written before it)."""
  return parse_references(((config or {}).get("output") or {}).get("reference", ""))


__all__ = ["Run", "load_run", "metric_series", "client_spread", "partition_matrix", "detection_raster",
           "weight_matrix", "client_matrices", "mean_over_rounds", "parse_references", "config_references", "write_run_plots", "write_comparison_plots",
           "plot_accuracy", "plot_loss", "plot_partition", "plot_detection", "plot_weights", "plot_client_matrix"]
