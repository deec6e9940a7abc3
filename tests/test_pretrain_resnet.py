"""tools/pretrain_resnet.py: the offline stand-in for Table II's ImageNet-pretrained ResNet-18 (FedALC spec A20)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from fedjax_robust.models.interface import make_model
from fedjax_robust.models.resnet import ResNet8, load_pretrained

TOOL = Path(__file__).resolve().parents[1] / "tools" / "pretrain_resnet.py"


def _tool():
  spec = importlib.util.spec_from_file_location("pretrain_resnet", TOOL)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_subset_is_seeded_random_rows_not_the_first_ones():
  tool = _tool()
  x, y = np.arange(100)[:, None], np.repeat(np.arange(10), 10)  # sorted by class, as the CIFAR-100 PNG copy
  xs, ys = tool.subset(x, y, 20, seed=0)
  assert len(xs) == 20 and len(set(ys.tolist())) > 2 and len(set(xs[:, 0].tolist())) == 20
  assert np.array_equal(xs, tool.subset(x, y, 20, seed=0)[0]) and not np.array_equal(xs, tool.subset(x, y, 20, 1)[0])
  assert tool.subset(x, y, 0, 0)[0] is x and tool.subset(x, y, 500, 0)[0] is x
  assert np.array_equal(y[xs[:, 0]], ys)  # rows stay paired with their labels


def test_pretrain_learns_and_writes_a_checkpoint_the_experiment_loads(tmp_path):
  """Two epochs of ResNet-8 on the digits learn (loss falls, test accuracy far above chance), the file loads into a
  10-class model through ``load_pretrained`` (every tensor but the head taken from it), and the provenance
  record says what made it."""
  tool = _tool()
  out = tmp_path / "r8_digits.msgpack"
  assert tool.main(["--dataset", "digits", "--model", "resnet8", "--input_stats", "dataset", "--epochs", "2",
                    "--batch_size", "32", "--lr", "0.05", "--crop_padding", "0", "--out", str(out)]) == 0
  record = json.loads(out.with_name(out.name + ".json").read_text())
  assert [h["epoch"] for h in record["history"]] == [1, 2]
  assert record["history"][1]["train_loss"] < record["history"][0]["train_loss"]
  assert record["test_acc"] > 50.0  # chance is 10%
  assert record["dataset"] == "digits" and record["model"] == "resnet8" and len(record["sha256"]) == 64
  assert {"commit", "command", "device", "wall_s"} <= set(record)
  import hashlib
  assert hashlib.sha256(out.read_bytes()).hexdigest() == record["sha256"]
  model = make_model(ResNet8(num_classes=10))
  import jax
  import jax.numpy as jnp
  fresh = model.init(jax.random.key(1), jnp.zeros((1, 8, 8, 1)))
  loaded = load_pretrained(out, model, fresh)
  from flax import serialization, traverse_util
  stored = traverse_util.flatten_dict(serialization.msgpack_restore(out.read_bytes())["params"])
  for path, value in traverse_util.flatten_dict(dict(loaded["params"])).items():
    expected = fresh["params"]["head"][path[1]] if path[0] == "head" else stored[path]
    np.testing.assert_array_equal(np.asarray(value), np.asarray(expected))


def test_input_stats_must_match_the_channels():
  tool = _tool()
  from fedjax_robust.data.registry import get_spec
  with pytest.raises(ValueError, match="has 3 channel statistics, the data 1"):
    tool.build_model("resnet8", 10, "imagenet", get_spec("digits"))
