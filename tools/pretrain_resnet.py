#!/usr/bin/env python
"""Pre-trains a ResNet centrally on an offline dataset and writes it as a ``model.pretrained`` checkpoint.

    python tools/pretrain_resnet.py --data_dir ../shared/data --dataset cifar100 --epochs 10 \\
        --out runs/pretrained/resnet18_cifar100.msgpack

FedALC's Table II fine-tunes an ImageNet-pretrained ResNet-18 (spec §4.3, A20). ImageNet weights cannot be
downloaded offline, so this writes a stated stand-in: the same torchvision-layout network trained on another
dataset that is here (CIFAR-100: same 32x32 images, no class in common with CIFAR-10). The file has the
layout ``fedjax_robust.models.resnet.load_pretrained`` reads (``{"params", "batch_stats"}``, the source task's
head included; the experiment keeps its own fresh head). Inputs are [0, 1] pixels normalised inside the model
with ``--input_stats`` (default ImageNet's, as the FedALC CIFAR-10 config sets ``model.input_stats``), so the
weights expect what the fine-tuning run feeds them. Next to OUT, ``OUT.json`` records the dataset, epochs,
optimizer, per-epoch loss and test accuracy, the file's sha256, commit, command, device and wall time.

Training: SGD with momentum 0.9 and a cosine learning-rate decay over all steps, weight decay added to the
gradient (PyTorch's coupled form), random 4-pixel-padded crops and horizontal flips; the last partial batch is
dropped (BatchNorm in train mode). Defaults are a short CPU schedule, not a tuned recipe.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedjax_robust.data.augment import random_crop, random_flip  # noqa: E402
from fedjax_robust.data.registry import DatasetSpec  # noqa: E402
from fedjax_robust.data.sources import load_raw  # noqa: E402
from fedjax_robust.data.transforms import normalize_images  # noqa: E402
from fedjax_robust.experiment import INPUT_STATS, input_normalization  # noqa: E402
from fedjax_robust.metrics.evaluation import score_one  # noqa: E402
from fedjax_robust.models.interface import Model, make_model, with_input_normalization  # noqa: E402
from fedjax_robust.models.resnet import RESNETS, save_variables  # noqa: E402


def subset(x: np.ndarray, y: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """``n`` rows drawn without replacement (seeded), or all rows when ``n`` is 0 or too large. Random, not the
  first ``n``: some offline copies are sorted by class (the CIFAR-100 PNG archive's first 500 rows are class 0)."""
  if not n or n >= len(x):
    return x, y
  rows = np.sort(np.random.default_rng(seed).choice(len(x), n, replace=False))
  return x[rows], y[rows]


def build_model(name: str, num_classes: int, input_stats: str, spec: DatasetSpec) -> Model:
  """The named ResNet as a ``Model`` preceded by ``(x - mean) / std`` with ``input_stats``' statistics (``dataset``:
  ``spec``'s), checked against the images' channels as an experiment's ``model.input_stats`` is."""
  norm = {"mode": "model", "mean": tuple(spec.mean), "std": tuple(spec.std)}
  mean, std = input_normalization(norm, input_stats, int(spec.image_shape[-1]))
  return with_input_normalization(make_model(RESNETS[name](num_classes=num_classes)), mean, std)


def make_steps(model: Model, optimizer: optax.GradientTransformation, crop_padding: int):
  """Jitted ``train_step(variables, opt_state, x, y, key) -> (variables, opt_state, loss)`` and
  ``accuracy(variables, x, y) -> %`` (eval mode: running BatchNorm statistics; in batches of 500 rows)."""

  def loss_fn(params, state, x, y):
    logits, new_state = model.apply({"params": params, **state}, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new_state

  @jax.jit
  def train_step(variables, opt_state, x, y, key):
    k_crop, k_flip = jax.random.split(key)
    if crop_padding:
      x = random_crop(x, k_crop, crop_padding)
    x = random_flip(x, k_flip)
    params = variables["params"]
    state = {k: v for k, v in variables.items() if k != "params"}
    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return {"params": optax.apply_updates(params, updates), **new_state}, opt_state, loss

  @jax.jit
  def accuracy(variables, x, y):
    return 100.0 * score_one(lambda v, xb: model.apply(v, xb)[0], variables, x, y, batch_size=500).accuracy

  return train_step, accuracy


def train_central(model: Model, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, *,
                  epochs: int, batch_size: int, lr: float, weight_decay: float, seed: int = 0, crop_padding: int = 4,
                  log: Callable[[str], None] = print) -> tuple[dict, list[dict]]:
  """Central SGD training of ``model`` (module docstring); returns the variables and one record per epoch
  (``epoch``, ``train_loss``: mean over the epoch's steps, ``test_acc`` in %, ``seconds``)."""
  if epochs < 1 or batch_size < 1 or len(x_train) < batch_size:
    raise ValueError(f"need epochs >= 1 and 1 <= batch_size <= {len(x_train)} training rows, "
                     f"got epochs={epochs}, batch_size={batch_size}")
  steps_per_epoch = len(x_train) // batch_size
  schedule = optax.cosine_decay_schedule(lr, epochs * steps_per_epoch)
  optimizer = optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(schedule, momentum=0.9))
  key = jax.random.key(seed)
  key, k_init = jax.random.split(key)
  variables = dict(model.init(k_init, jnp.asarray(x_train[:1])))
  opt_state = optimizer.init(variables["params"])
  train_step, accuracy = make_steps(model, optimizer, crop_padding)
  rng = np.random.default_rng(seed)
  history = []
  for epoch in range(1, epochs + 1):
    start, losses = time.time(), []
    order = rng.permutation(len(x_train))
    for i in range(steps_per_epoch):
      rows = order[i * batch_size:(i + 1) * batch_size]
      key, k_step = jax.random.split(key)
      variables, opt_state, loss = train_step(variables, opt_state, x_train[rows], y_train[rows], k_step)
      losses.append(loss)
    record = {"epoch": epoch, "train_loss": float(np.mean(jax.device_get(losses))),
              "test_acc": float(accuracy(variables, x_test, y_test)), "seconds": time.time() - start}
    history.append(record)
    log(f"epoch {epoch}/{epochs}: train loss {record['train_loss']:.4f}, test accuracy {record['test_acc']:.2f}% "
        f"({record['seconds']:.0f} s)")
  return variables, history


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default="../shared/data")
  parser.add_argument("--dataset", default="cifar100")
  parser.add_argument("--model", default="resnet18", choices=sorted(RESNETS))
  parser.add_argument("--input_stats", default="imagenet", choices=sorted(INPUT_STATS),
                      help="mean/std applied inside the model: imagenet (default) or the dataset's own")
  parser.add_argument("--epochs", type=int, default=10)
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--weight_decay", type=float, default=5e-4)
  parser.add_argument("--crop_padding", type=int, default=4, help="random-crop padding in pixels (0: no crops)")
  parser.add_argument("--train_examples", type=int, default=0, help="train on N random training images (0: all)")
  parser.add_argument("--test_examples", type=int, default=0, help="score on N random test images (0: all)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", required=True, help="msgpack file to write (OUT.json gets the provenance)")
  args = parser.parse_args(argv)

  started = time.time()
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
  from grid import provenance, store_json  # noqa: E402  (experiments/grid.py: command, commit, device)
  origin = provenance()  # the commit the run starts from (the tree may move on during a long run)
  raw = load_raw(args.dataset, args.data_dir)
  x_train, y_train = normalize_images(raw.x_train, raw.spec, "model"), np.asarray(raw.y_train, np.int32)
  x_test, y_test = normalize_images(raw.x_test, raw.spec, "model"), np.asarray(raw.y_test, np.int32)
  x_train, y_train = subset(x_train, y_train, args.train_examples, args.seed)
  x_test, y_test = subset(x_test, y_test, args.test_examples, args.seed)
  model = build_model(args.model, raw.num_classes, args.input_stats, raw.spec)
  print(f"{args.model} on {args.dataset} ({raw.source}): {len(x_train)} training / {len(x_test)} test images, "
        f"{args.epochs} epochs")
  variables, history = train_central(model, x_train, y_train, x_test, y_test, epochs=args.epochs,
                                     batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
                                     seed=args.seed, crop_padding=args.crop_padding)
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  save_variables(variables, out)
  store_json(out.with_name(out.name + ".json"), {
      "file": out.name, "sha256": hashlib.sha256(out.read_bytes()).hexdigest(), "model": args.model,
      "dataset": args.dataset, "source": raw.source, "num_classes": raw.num_classes,
      "train_examples": len(x_train), "test_examples": len(x_test), "input_stats": args.input_stats,
      "options": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out")},
      "history": history, "test_acc": history[-1]["test_acc"], "wall_s": time.time() - started,
      **origin})
  print(f"wrote {out} (final test accuracy {history[-1]['test_acc']:.2f}%)")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
