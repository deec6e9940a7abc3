"""FedALC and federated adversarial training through the experiment layer (specs/fedalc.md §7 properties 14-16,
the robust evaluator, ``data.normalize='model'`` and ``eval.last_rounds``)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust.data import build_federated_data
from fedjax_robust.experiment import build_experiment, default_config, run_experiment
from fedjax_robust.models import get_model, make_model
from fedjax_robust.models.interface import with_input_normalization
from fedjax_robust.run import eval_rounds


def adversarial_digits(**overrides):
  c = default_config()
  c.rounds = 6
  c.eval_every = 3
  c.data.name = "digits"
  c.data.num_clients = 5
  c.data.normalize = "model"
  c.data.partition.alpha = 1.0
  c.model.name = "mlp"
  c.client.optimizer = "adam"
  c.client.lr = 1e-2
  c.client.batch_size = 32
  c.adversarial.objective = "fedalc"
  c.adversarial.eps = 0.1
  c.adversarial.step_size = 0.025
  c.adversarial.steps = 5
  c.eval.metrics = "accuracy,robust"
  c.eval.last_rounds = 2
  c.eval.robust.examples = 200
  c.eval.robust.eps = 0.1
  c.eval.robust.step_size = 0.025
  c.eval.robust.cw_steps = 10
  c.output.progress = False
  c.update_from_flattened_dict(overrides)
  return c


@pytest.mark.fast_compiles  # tests/conftest.py
def test_fedalc_trains_and_reports_robust_accuracy_in_the_last_rounds(tmp_path):
  """6 rounds of FedALC on digits (ε = 0.1): natural accuracy 0.955 here (PGD 0.795); 0.6 leaves room for numerics while a
  broken objective (e.g. training on garbage inputs) stays far below. Robust accuracies are at most natural."""
  summary = run_experiment(adversarial_digits(), tmp_path / "run")
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  evaluated = [r["round"] for r in records if "global_test_acc" in r]
  assert evaluated == eval_rounds(6, 3, 2) == [3, 5, 6]
  final = summary["final"]
  assert final["global_test_acc"] > 0.6
  assert "client_acc_mean" in final  # the digits clients keep test splits
  for name in ("fgsm", "bim", "pgd", "cw"):
    assert 0.0 <= final[f"robust_acc_{name}"] <= final["robust_natural_acc"] + 1e-9
  assert final["robust_acc_pgd"] < final["robust_natural_acc"]


def test_eval_rounds_with_a_last_window():
  assert eval_rounds(10, 3) == [3, 6, 9, 10]
  assert eval_rounds(10, 3, 4) == [3, 6, 7, 8, 9, 10]
  assert eval_rounds(100, 10, 10)[-11:] == [90] + list(range(91, 101))
  assert eval_rounds(5, 10, 2) == [4, 5]
  with pytest.raises(ValueError, match="last_rounds"):
    eval_rounds(5, 1, 6)


@pytest.mark.fast_compiles  # tests/conftest.py
def test_seeds_program_evaluates_the_same_rounds(tmp_path):
  c = adversarial_digits(**{"rounds": 4, "eval_every": 2, "eval.last_rounds": 1, "seeds": "0,1",
                            "eval.robust.attacks": "pgd", "adversarial.objective": "pgd_at"})
  summary = run_experiment(c, tmp_path / "seeds")
  records = [json.loads(line) for line in (tmp_path / "seeds" / "seed_1" / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records if "robust_acc_pgd" in r] == [2, 4]
  assert set(summary["final"]) >= {"global_test_acc", "robust_acc_pgd"}


def test_fedprox_at_with_zero_mu_is_fedavg_at():
  """Spec property 15, through the registry: FedProx-AT (mu = 0) and FedAvg-AT produce the same round."""
  states = []
  for name in ("fedavg", "fedprox"):
    exp = build_experiment(adversarial_digits(**{"algorithm.name": name, "algorithm.fedprox.mu": 0.0,
                                                 "adversarial.objective": "pgd_at", "engine.strategy": "vmap"}))
    state, _ = exp.simulator.run_round(exp.init_state())
    states.append(state.server.params)
  for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_model_normalization_matches_normalized_data():
  """``data.normalize='model'``: [0, 1] pixels and the dataset's mean/std as the model's first layer give the
  logits the plain model gives on standardised data."""
  base = default_config().data
  base.name, base.num_clients = "digits", 3
  raw_data = build_federated_data({**base.to_dict(), "normalize": "model"})
  std_data = build_federated_data({**base.to_dict(), "normalize": True})
  assert raw_data.x_train.min() >= 0 and raw_data.x_train.max() <= 1
  norm = raw_data.info["normalize"]
  assert norm["mode"] == "model" and norm["std"] != [1.0]
  model = make_model(get_model("mlp", 10, hidden=(16,)))
  variables = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
  wrapped = with_input_normalization(model, norm["mean"], norm["std"])
  np.testing.assert_allclose(wrapped.apply(variables, jnp.asarray(raw_data.x_global_test[:20]))[0],
                             model.apply(variables, jnp.asarray(std_data.x_global_test[:20]))[0], atol=1e-5)


def test_adversarial_runs_refuse_what_they_cannot_do():
  with pytest.raises(ValueError, match="data.normalize"):
    build_experiment(adversarial_digits(**{"data.normalize": True}))
  with pytest.raises(ValueError, match="plain cross-entropy only"):
    build_experiment(adversarial_digits(**{"algorithm.name": "ditto"}))
  with pytest.raises(ValueError, match="eval.robust.attacks"):
    build_experiment(adversarial_digits(**{"eval.robust.attacks": "deepfool"}))
  with pytest.raises(ValueError, match="calib_variant"):
    build_experiment(adversarial_digits(**{"adversarial.fedalc.calib_variant": "sqrt"}))


def test_model_pretrained_loads_every_layer_but_the_head(tmp_path):
  """``model.pretrained=<file>``: a converted checkpoint (here any flax model's, saved with ``save_variables``)
  replaces the initial weights, the new task's ``head`` stays freshly initialised (FedALC Table II's ResNet-18)."""
  from fedjax_robust.models.resnet import save_variables
  c = adversarial_digits(**{"model.hidden": (16,)})
  donor = make_model(get_model("mlp", 10, hidden=(16,))).init(jax.random.key(42), jnp.zeros((1, 8, 8, 1)))
  path = tmp_path / "donor.msgpack"
  save_variables(donor, path)
  fresh = build_experiment(c).params
  with c.unlocked():
    c.model.pretrained = str(path)
  loaded = build_experiment(c).params
  np.testing.assert_array_equal(loaded["fc1"]["kernel"], donor["params"]["fc1"]["kernel"])
  np.testing.assert_array_equal(loaded["head"]["kernel"], fresh["head"]["kernel"])


def test_model_input_stats():
  """``model.input_stats=imagenet``: an ImageNet-pretrained model normalises [0, 1] pixels with ImageNet's mean/std
  (FedALC Table II); it needs the model-side normalisation and 3-channel data."""
  from fedjax_robust.experiment import input_normalization
  norm = {"mode": "model", "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]}
  assert input_normalization(norm, "dataset", 3) == ([0.5, 0.4, 0.3], [0.2, 0.2, 0.2])
  assert input_normalization(norm, "imagenet", 3) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
  assert input_normalization({"mode": "standard"}, "dataset", 3) is None
  with pytest.raises(ValueError, match="channel"):
    input_normalization({"mode": "model", "mean": [0.1], "std": [0.3]}, "imagenet", 1)
  with pytest.raises(ValueError, match="needs data.normalize='model'"):
    input_normalization({"mode": "standard"}, "imagenet", 3)
  with pytest.raises(ValueError, match="input_stats must be one of"):
    input_normalization(norm, "cifar", 3)
