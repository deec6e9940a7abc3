"""Does the class FedALC never learns follow the digit or the label index? (experiments/results/fedalc.md)

At α = 0.5 on MNIST, FedALC with the default calibration leaves class 9 at 0.0% from round 10 to 100, where
FedAvg-AT learns it (0 -> 86%). A collapse of the LAST label index would smell of an indexing bug; a collapse that
follows the digit is the training dynamics. This runs the same FedALC cell with every label shifted,
``y -> (y + shift) mod C`` after partitioning (the same rows on the same clients, the same model and seeds; only
which output unit stands for which digit changes) and reports each DIGIT's accuracy at the evaluated rounds.

  python experiments/fedalc_label_permutation_check.py --data_dir ../shared/data --alpha 0.5 --rounds 30 \\
      --out experiments/results/fedalc_label_shift_check.json
  python experiments/fedalc_label_permutation_check.py --from_json experiments/results/fedalc_label_shift_check.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def shift_labels(data, shift: int):
  """``data`` with every label (clients' train / test, global test) moved to ``(y + shift) mod C``; padding rows
  keep label 0 (they are masked out everywhere)."""
  c = int(data.num_classes)
  move = lambda y, n: np.where(np.arange(y.shape[1])[None, :] < np.asarray(n)[:, None], (y + shift) % c, y)
  return dataclasses.replace(data, y_train=move(np.asarray(data.y_train), data.n_train).astype(np.int32),
                             y_test=move(np.asarray(data.y_test), data.n_test).astype(np.int32),
                             y_global_test=((np.asarray(data.y_global_test) + shift) % c).astype(np.int32))


def digit_accuracy(class_acc_by_index, shift: int) -> list:
  """Per digit d: the accuracy of output unit (d + shift) mod C."""
  c = len(class_acc_by_index)
  return [class_acc_by_index[(d + shift) % c] for d in range(c)]


def run(args) -> dict:
  import fedjax_robust.experiment as experiment
  from experiments import fedalc_tables
  from experiments.grid import provenance
  grid_args = argparse.Namespace(rounds=args.rounds, epochs=0, seed=0, seeds="", data_dir=args.data_dir,
                                 checkpoint_every=0, resume=False, strategy="",
                                 set=["eval.metrics=accuracy,class_accuracy"])
  config = fedalc_tables.cell_config("mnist", args.alpha, "fedalc", grid_args)
  config.output.progress = False
  build = experiment.build_federated_data
  experiment.build_federated_data = lambda cfg: shift_labels(build(cfg), args.shift)
  try:
    with tempfile.TemporaryDirectory() as tmp:
      summary = experiment.run_experiment(config, Path(tmp) / "run")
      rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
  finally:
    experiment.build_federated_data = build
  evaluated = [r for r in rows if "global_class_acc" in r]
  return {"alpha": args.alpha, "shift": args.shift, "rounds": args.rounds,
          "evaluations": [{"round": r["round"], "global_test_acc": 100 * r["global_test_acc"],
                           "digit_acc": [100 * a for a in digit_accuracy(r["global_class_acc"], args.shift)]}
                          for r in evaluated],
          "wall_s": summary.get("wall_time_s"), "config": config.to_dict(), **provenance()}


def table(stored: dict) -> str:
  lines = [f"FedALC (default calibration), MNIST α = {stored['alpha']}, labels shifted by {stored['shift']} "
           f"(digit d trained as output unit (d + {stored['shift']}) mod 10), per DIGIT accuracy %:", "",
           "| round | all | " + " | ".join(f"digit {d}" for d in range(10)) + " |", "|---" * 12 + "|"]
  for e in stored["evaluations"]:
    lines.append(f"| {e['round']} | {e['global_test_acc']:.1f} | " + " | ".join(f"{a:.1f}" for a in e["digit_acc"])
                 + " |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--alpha", type=float, default=0.5)
  parser.add_argument("--rounds", type=int, default=30)
  parser.add_argument("--shift", type=int, default=1)
  parser.add_argument("--out", help="where to store the result JSON")
  parser.add_argument("--from_json", help="print the table of a stored result")
  args = parser.parse_args(argv)
  if args.from_json:
    print(table(json.loads(Path(args.from_json).read_text())), end="")
    return
  from experiments.grid import store_json
  result = run(args)
  if args.out:
    store_json(args.out, result)
  print(table(result), end="")


if __name__ == "__main__":
  main()
