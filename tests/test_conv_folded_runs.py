"""What a GPU runs by default, run here: ``model.conv_impl=auto`` resolves to ``folded`` on a GPU
(``models/layers.py``), so every path of the engine that differentiates a conv net goes through its custom VJP and
custom batching rule there. CI has no GPU, so these runs force ``folded`` on the CPU and check that whole
experiments give ``canonical``'s numbers (the CPU default, itself equal to JAX's own gradients): the seeds
program (seeds x clients: two nested vmaps) with BatchNorm state, per-step adversarial examples (input gradients)
and robust evaluation; shard_map (several clients per device, padding slots); the stacked model pair of FedCAP
(``grad`` of a vmapped pass). One round each: the folded convolution is slow on XLA:CPU, and a wrong gradient
shows in the first round's loss."""

import ml_collections
import numpy as np
import pytest

from fedjax_robust.experiment import default_config, run_experiment
from fedjax_robust.run import run_seeds


def _config(conv_impl: str, **extra):
  c = default_config()
  c.rounds, c.eval_every = 1, 1
  c.data.name, c.data.num_clients, c.data.normalize = "digits", 3, False
  c.data.partition.name, c.data.partition.alpha = "dirichlet", 0.5  # unequal clients: padded rows and steps
  c.model = ml_collections.ConfigDict({"name": "bn_cnn", "widths": (4, 6), "fc_dim": 8, "conv_impl": conv_impl})
  c.client.epochs, c.client.batch_size, c.client.lr = 1, 32, 0.05
  c.engine.strategy = "vmap"
  c.output.progress, c.output.plots = False, False
  c.update_from_flattened_dict(extra)
  return c


def _numbers(final: dict) -> dict:
  return {k: float(v) for k, v in final.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
          and k != "elapsed_s"}


def _assert_same_run(got: dict, want: dict, rows: int):
  assert got.keys() == want.keys() and got
  for key in want:
    if "loss" in key:
      np.testing.assert_allclose(got[key], want[key], rtol=1e-4, err_msg=key)
    else:  # accuracies: float rounding may move one borderline example at most
      assert abs(got[key] - want[key]) <= 1.0 / rows + 1e-9, (key, got[key], want[key])


def test_folded_conv_seeds_program_with_adversarial_training_gives_the_canonical_numbers(tmp_path, monkeypatch):
  """Two seeds in one program (the clients' vmap nested in the seeds' vmap, the folded rule batched again) of a
  BatchNorm CNN trained on FedALC's per-step PGD examples and scored under FGSM and PGD. Local steps and attack
  loops rolled, as on a GPU (the CPU's auto unrolls them for a folded conv net: a program that took 24-70 s to
  compile here, depending on XLA:CPU's flags)."""
  monkeypatch.setenv("FEDJAX_ROBUST_ATTACK_UNROLL", "false")  # training and evaluation attack loops
  extra = {"seeds": "0,1", "engine.unroll": "false", "adversarial.objective": "fedalc", "adversarial.steps": 2,
           "eval.metrics": "accuracy,robust", "eval.robust.attacks": "fgsm,pgd", "eval.robust.steps": 2,
           "eval.robust.examples": 32}
  finals = {}
  for impl in ("canonical", "folded"):
    per_metric = run_seeds(_config(impl, **extra), tmp_path / impl)["final"]
    finals[impl] = [{k: v["values"][i] for k, v in per_metric.items() if k != "elapsed_s"} for i in range(2)]
  assert finals["canonical"][0]["train_loss"] != finals["canonical"][1]["train_loss"]  # two different seeds
  assert {"fgsm", "pgd"} <= {k.split("_")[-1] for k in finals["canonical"][0]}, finals["canonical"][0].keys()
  for got, want in zip(finals["folded"], finals["canonical"]):
    _assert_same_run(got, want, rows=32)


def test_folded_conv_shard_map_gives_the_canonical_numbers(tmp_path):
  """Six clients over the 4 host devices (tests/conftest.py): two per device, two padding slots."""
  finals = {impl: _numbers(run_experiment(_config(impl, **{"engine.strategy": "shard_map", "data.num_clients": 6}),
                                          tmp_path / impl)["final"]) for impl in ("canonical", "folded")}
  assert finals["canonical"]["train_loss"] > 0
  _assert_same_run(finals["folded"], finals["canonical"], rows=64)


@pytest.mark.fast_compiles  # no BatchNorm here: both sides agree unoptimized too (24 -> 16 s)
def test_folded_conv_fedcap_stacked_pair_gives_the_canonical_numbers(tmp_path, shared_data, data_cache_dir):
  """FedCAP's two models as one vmapped pass (the GPU's ``pair_forward``): ``grad`` of the stacked pass reaches the
  folded rule with the pair axis inside the clients' (FedAvgCNN on a little MNIST; FedCAP takes no BatchNorm)."""
  root = shared_data("mnist/train-images-idx3-ubyte.gz")
  extra = {"algorithm.name": "fedcap", "engine.pair_forward": "stacked", "data.name": "mnist",
           "data.data_dir": str(root), "data.cache_dir": str(data_cache_dir), "data.max_samples_per_client": 32,
           "eval.global_test_examples": 64, "client.batch_size": 8}  # 4 local steps: the loss sees the gradients
  finals = {}
  for impl in ("canonical", "folded"):
    c = _config(impl, **extra)
    c.model = ml_collections.ConfigDict({"name": "fedavg_cnn", "fc_dim": 16, "conv_impl": impl})
    finals[impl] = _numbers(run_experiment(c, tmp_path / impl)["final"])
  _assert_same_run(finals["folded"], finals["canonical"], rows=16)
