"""Where FedALC's calibration weights fall, class by class, next to what each class's accuracy did.

FedALC multiplies class j's logit by w_j = sqrt(N / n_j) of the mini-batch (spec §1.4). One story for why it can
hurt is that a class rare in its clients' batches (large w_j) is learned with small raw logits and loses at test
time. This script puts that story against the stored per-class accuracies: for every α with a FedAvg-AT and a
FedALC cell that logged ``class_accuracy``, it rebuilds the partition from the cell's stored config (it is a
function of the config) and reports, per class, its rows, its largest holder and the weight its own logit gets on
its own rows (the geometric mean of w_{y_b} over every row of the class, over reshuffled local epochs of the run's
batch size), next to both methods' accuracy on the class.

  python experiments/fedalc_class_exposure.py --data_dir ../shared/data \\
      --cells experiments/results/fedalc_mnist_cpu_r100.json --out experiments/results/fedalc_class_exposure.json
  python experiments/fedalc_class_exposure.py --from_json experiments/results/fedalc_class_exposure.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EPOCHS = 20  # reshuffled local epochs averaged over: the weights of a class's rows depend on who shares its batch


def batches(labels: np.ndarray, batch_size: int, epochs: int, rng: np.random.Generator):
  """``[B, batch_size]`` labels and real-row mask of ``epochs`` shuffled passes over one client's rows."""
  ys, masks = [], []
  for _ in range(epochs):
    order = rng.permutation(len(labels))
    for start in range(0, len(labels), batch_size):
      rows = labels[order[start:start + batch_size]]
      ys.append(np.pad(rows, (0, batch_size - len(rows))))
      masks.append(np.arange(batch_size) < len(rows))
  return np.stack(ys), np.stack(masks)


def own_weights(histograms: np.ndarray, batch_size: int, calib: dict, seed: int = 0) -> np.ndarray:
  """Per class: the geometric mean, over every real row of the class in every batch, of the weight w_{y} its own
  logit is multiplied by (the run's calibration variant, class axis)."""
  import jax
  from fedjax_robust.adversarial.calibration import calibration_weights
  num_classes = histograms.shape[1]
  weigh = jax.jit(jax.vmap(lambda y, m: calibration_weights(y, m, num_classes, calib.get("calib_variant", "inv_sqrt_freq"),
                                                            calib.get("absent", "auto"), calib.get("normalize", "none"))))
  rng = np.random.default_rng(seed)
  log_sum, count = np.zeros(num_classes), np.zeros(num_classes)
  for counts in histograms:
    labels = np.repeat(np.arange(num_classes), counts)
    if not len(labels):
      continue
    y, mask = batches(labels, batch_size, EPOCHS, rng)
    w = np.asarray(weigh(y, mask))  # [B, C]
    own = np.take_along_axis(w, y, axis=1)  # [B, batch]: the weight of each row's own class
    np.add.at(log_sum, y[mask], np.log(own[mask]))
    np.add.at(count, y[mask], 1)
  return np.exp(log_sum / np.maximum(count, 1))


def spearman(a, b) -> float:
  ra, rb = (np.argsort(np.argsort(np.asarray(v, float))) for v in (a, b))
  return float(np.corrcoef(ra, rb)[0, 1])


def exposure(cells: dict, data_dir: str | None) -> dict:
  """One entry per (dataset, α) with FedAvg-AT and FedALC per-class accuracies."""
  import ml_collections
  from fedjax_robust.data.builder import build_federated_data
  out = {}
  for key, cell in sorted(cells.items()):
    dataset, alpha, method = key.split("__")
    avg = cells.get(f"{dataset}__{alpha}__fedavg", {})
    if method != "fedalc" or "class_acc" not in cell or "class_acc" not in avg:
      continue
    config = cell["config"]
    data_cfg = ml_collections.ConfigDict(config["data"])
    if data_dir:
      data_cfg.data_dir = data_dir
    data = build_federated_data(data_cfg)
    hist = np.asarray(data.label_histograms("train"))
    calib = config.get("adversarial", {}).get("fedalc", {})
    weights = own_weights(hist, int(config["client"]["batch_size"]), calib)
    holder = hist.argmax(0)
    out[f"{dataset}__{alpha}"] = {
        "histograms": hist.tolist(), "own_weight": weights.tolist(), "largest_holder": holder.tolist(),
        "fedavg_class_acc": avg["class_acc"], "fedalc_class_acc": cell["class_acc"],
        "calibration": calib, "batch_size": int(config["client"]["batch_size"]), "epochs_averaged": EPOCHS,
        "cells_commit": cell.get("commit")}
  return out


def table(stored: dict) -> str:
  lines = []
  for key, e in stored.items():
    if key == "provenance":
      continue
    dataset, alpha = key.split("__")
    hist = np.asarray(e["histograms"])
    avg, alc = np.asarray(e["fedavg_class_acc"]), np.asarray(e["fedalc_class_acc"])
    lines += [f"**{dataset}, α = {alpha[1:]}** (calibration {e['calibration'].get('calib_variant', 'inv_sqrt_freq')}, "
              f"batch {e['batch_size']})", "",
              "| class | rows | largest holder: its rows of the class / all its rows | own weight | FedAvg-AT % | "
              "FedALC % | Δ |", "|---|---|---|---|---|---|---|"]
    for c in range(hist.shape[1]):
      h = e["largest_holder"][c]
      lines.append(f"| {c} | {hist[:, c].sum()} | client {h}: {hist[h, c]} / {hist[h].sum()} | "
                   f"{e['own_weight'][c]:.2f} | {avg[c]:.1f} | {alc[c]:.1f} | {alc[c] - avg[c]:+.1f} |")
    lines += ["", f"Spearman rank correlation of own weight with Δ: {spearman(e['own_weight'], alc - avg):+.2f}.", ""]
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--cells", help="stored FedALC table cells (fedalc_tables.py results JSON)")
  parser.add_argument("--data_dir", default=None, help="where the offline dataset copies are (else the stored one)")
  parser.add_argument("--out", help="where to store the exposure JSON")
  parser.add_argument("--from_json", help="print the table of a stored exposure JSON")
  args = parser.parse_args(argv)
  if args.from_json:
    print(table(json.loads(Path(args.from_json).read_text())), end="")
    return
  if not (args.cells and args.out):
    parser.error("give --cells and --out (or --from_json)")
  from experiments.grid import provenance, store_json
  stored = exposure(json.loads(Path(args.cells).read_text()), args.data_dir)
  if not stored:
    raise SystemExit(f"no α in {args.cells} has FedAvg-AT and FedALC cells with class_acc (eval.metrics=...,class_accuracy)")
  stored["provenance"] = provenance()
  store_json(args.out, stored)
  print(table(stored), end="")


if __name__ == "__main__":
  main()
