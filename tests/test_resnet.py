"""BatchNorm ResNets (models/resnet.py): FedALC spec §4.3 / A20 (ResNet-18), FedCAC spec §3.3 and property 24
(ResNet-8/10), masked batch statistics, the PyTorch state_dict converter and pretrained loading.

Most tests use random variables built from the shapes (``jax.eval_shape``) instead of ``model.init``: a jitted
ResNet init spends seconds compiling its random number generation on CPU.
"""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from fedjax_robust import flat_random, models
from fedjax_robust.models import count_params, get_model, make_model
from fedjax_robust.models import resnet as R

KEY = jax.random.key(0)


def _template(model, hw=32):
  return jax.eval_shape(model.init, KEY, jax.ShapeDtypeStruct((1, hw, hw, 3), jnp.float32))


def _random_variables(model, seed=0, hw=32):
  """Variables of ``model`` with random values: kaiming-scaled kernels, non-trivial BN affine and statistics."""
  rng = np.random.default_rng(seed)
  out = {}
  for collection, tree in _template(model, hw).items():
    flat = {}
    for path, leaf in traverse_util.flatten_dict(dict(tree)).items():
      shape, leaf_name = leaf.shape, path[-1]
      if leaf_name == "kernel":
        fan_out = int(np.prod(shape[:-2])) * shape[-1] if len(shape) == 4 else shape[-1]
        v = rng.normal(0.0, np.sqrt(2.0 / fan_out), shape)
      elif leaf_name in ("scale", "var"):
        v = rng.uniform(0.5, 1.5, shape)
      else:  # bias, mean
        v = rng.normal(0.0, 0.1, shape)
      flat[path] = jnp.asarray(v, jnp.float32)
    out[collection] = traverse_util.unflatten_dict(flat)
  return out


def _close(a, b, tol=1e-5):
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol),
                         a, b)


# ----------------------------------------------------------------------------- architecture


@pytest.mark.parametrize("name,num_classes,params,tensors", [
    ("resnet18", 10, 11_181_642, 62),     # FedALC §4.3
    ("resnet8", 10, 1_235_274, 29),       # FedCAC property 24
    ("resnet10", 100, 4_957_092, 38),
    ("resnet10", 200, 5_008_392, 38),
])
def test_param_counts(name, num_classes, params, tensors):
  variables = _template(get_model(name, num_classes))
  assert count_params(variables["params"]) == params
  assert len(jax.tree_util.tree_leaves(variables["params"])) == tensors
  n_bn = sum(1 for p in traverse_util.flatten_dict(dict(variables["batch_stats"])) if p[-1] == "mean")
  assert n_bn == {"resnet18": 20, "resnet8": 9, "resnet10": 12}[name]


@pytest.mark.parametrize("name,hw,last,spatial", [
    ("resnet18", 32, "layer4_1", 1), ("resnet8", 32, "layer3_0", 2),
    ("resnet10", 32, "layer4_0", 1), ("resnet10", 64, "layer4_0", 2),
])
def test_output_and_spatial_shapes(name, hw, last, spatial):
  """Spec sizes before pooling (FedCAC property 24; FedALC §4.3: 32x32 reaches 1x1 at layer4, not resized)."""
  model = get_model(name, 7)
  variables = _template(model, hw)
  x = jax.ShapeDtypeStruct((3, hw, hw, 3), jnp.float32)
  logits, inter = jax.eval_shape(lambda v, x: model.apply(v, x, capture_intermediates=True, mutable=["intermediates"]),
                                 variables, x)
  assert logits.shape == (3, 7)
  assert inter["intermediates"][last]["__call__"][0].shape == (3, spatial, spatial, model.feature_dim)
  feats = jax.eval_shape(lambda v, x: model.apply(v, x, method="features"), variables, x)
  assert feats.shape == (3, model.feature_dim) == (3, model.widths[-1])


def test_registry_and_conventions():
  for name in ("resnet18", "resnet8", "resnet10"):
    assert models.DEFAULT_INPUT_SHAPES[name] == (32, 32, 3)
    model = get_model(name, 10)
    assert model.state_collections == ("batch_stats",) and model.penultimate is None
    assert {"stage_sizes", "widths", "conv_init", "conv_impl", "init"} <= set(models.model_kwargs(name))
  assert get_model("resnet8", 10).stage_sizes == (1, 1, 1)
  assert get_model("resnet10", 10, widths=[8, 8, 16, 16]).widths == (8, 8, 16, 16)
  with pytest.raises(ValueError, match="conv_init"):
    get_model("resnet8", 10, conv_init="xavier").init(KEY, jnp.zeros((1, 32, 32, 3)))


def test_init_kaiming_fan_out_and_torch_default():
  """torchvision / Fling init: conv N(0, 2/(C_out k^2)) untruncated, BN scale 1 bias 0 (the head: see the
  converter test, PyTorch's Linear default); conv_init='default': PyTorch's Conv2d default."""
  x = jnp.zeros((1, 4, 4, 16))
  v = jax.jit(R.BasicBlock(64, strides=2).init)(KEY, x)
  std = np.sqrt(2.0 / (64 * 9))
  k = v["params"]["conv2"]["kernel"]
  assert k.shape == (3, 3, 64, 64)
  np.testing.assert_allclose(float(jnp.std(k)), std, rtol=0.03)
  assert float(jnp.max(jnp.abs(k))) > 3.0 * std  # untruncated
  np.testing.assert_allclose(float(jnp.std(v["params"]["downsample_conv"]["kernel"])), np.sqrt(2.0 / 64), rtol=0.1)
  for path, leaf in traverse_util.flatten_dict(v).items():
    if path[-1] in ("scale", "var"):
      np.testing.assert_array_equal(leaf, 1.0)
    elif path[-1] in ("bias", "mean"):
      np.testing.assert_array_equal(leaf, 0.0)
  k = jax.jit(R.ResNetConv(64, 3, conv_init="default").init)(KEY, x)["params"]["kernel"]
  bound = 1.0 / np.sqrt(9 * 16)
  assert 0.99 * bound < float(jnp.max(jnp.abs(k))) <= bound


# ----------------------------------------------------------------------------- BatchNorm modes and the mask


def _jitted(model):
  """``model`` with jitted apply / features (one XLA compile per shape is faster than op-by-op dispatch)."""
  return model._replace(apply=jax.jit(model.apply, static_argnames="train"),
                        features=jax.jit(model.features, static_argnames="train"))


@pytest.fixture(scope="module")
def resnet8():
  module = get_model("resnet8", 10)
  return _jitted(make_model(module)), _random_variables(module)


# Every resnet8 call below uses a batch of 4 (6 with padding) so that the jitted functions compile once per mode.


def test_train_updates_batch_stats_eval_does_not(resnet8):
  model, variables = resnet8
  x = flat_random.uniform(jax.random.key(1), (4, 32, 32, 3))
  logits, state = model.apply(variables, x)
  assert logits.shape == (4, 10)
  jax.tree_util.tree_map(np.testing.assert_array_equal, state, {"batch_stats": variables["batch_stats"]})
  # Eval mode uses the running statistics: a row's logits do not depend on the rest of the batch.
  other = model.apply(variables, x.at[1:].set(flat_random.uniform(jax.random.key(2), (3, 32, 32, 3))))[0]
  _close(other[0], logits[0])
  train_logits, new_state = model.apply(variables, x, train=True)
  assert not np.allclose(train_logits, logits, atol=1e-3)
  for old, new in zip(jax.tree_util.tree_leaves(variables["batch_stats"]),
                      jax.tree_util.tree_leaves(new_state["batch_stats"])):
    assert old.shape == new.shape and not np.allclose(old, new)
  # Momentum 0.1 in PyTorch's convention: running = 0.9 running + 0.1 batch statistic (stem BN).
  mod = model.module
  stem = jax.jit(lambda v, x: mod.apply(v, x, method=lambda m, x: m.conv1(x)))(variables, x)
  np.testing.assert_allclose(new_state["batch_stats"]["bn1"]["mean"],
                             0.9 * variables["batch_stats"]["bn1"]["mean"] + 0.1 * stem.mean(axis=(0, 1, 2)),
                             rtol=1e-5, atol=1e-6)


def test_masked_rows_do_not_enter_batch_stats(resnet8):
  """Padding rows masked out: the same updated batch_stats and real-row logits as the batch without them."""
  model, variables = resnet8
  x = flat_random.uniform(jax.random.key(3), (4, 32, 32, 3))
  padded = jnp.concatenate([x, 100.0 * flat_random.normal(jax.random.key(4), (2, 32, 32, 3))])
  mask = jnp.array([True] * 4 + [False] * 2)
  ref_logits, ref_state = model.apply(variables, x, train=True)
  logits, state = model.apply(variables, padded, train=True, mask=mask)
  _close(logits[:4], ref_logits, 1e-4)
  _close(state, ref_state, 1e-5)
  # Counting the padding rows changes them.
  _, unmasked = model.apply(variables, padded, train=True, mask=jnp.ones(6, bool))
  assert not np.allclose(unmasked["batch_stats"]["bn1"]["mean"], ref_state["batch_stats"]["bn1"]["mean"])


def test_logits_are_head_of_features(resnet8):
  model, variables = resnet8
  x = flat_random.uniform(jax.random.key(5), (4, 32, 32, 3))
  feats = model.features(variables, x)
  assert feats.shape == (4, 256) and float(jnp.min(feats)) >= 0.0  # average of ReLU outputs
  head = model.module.apply(variables, feats, method=lambda m, f: m.head(f))
  _close(head, model.apply(variables, x)[0])
  base, head_params = models.split_base_head(variables["params"])
  assert set(base) == {"conv1", "bn1", "layer1_0", "layer2_0", "layer3_0"} and set(head_params) == {"kernel", "bias"}


def test_conv_impl_patches_matches_xla(resnet8):
  model, variables = resnet8
  patches = _jitted(make_model(get_model("resnet8", 10, conv_impl="patches")))
  x = flat_random.uniform(jax.random.key(6), (4, 32, 32, 3))
  with jax.default_matmul_precision("highest"):
    _close(patches.apply(variables, x)[0], model.apply(variables, x)[0], 1e-4)


def test_conv_impl_folded_vmapped_training_gradients_match_xla(resnet8):
  """ResNet-8 as the engine trains it on a GPU (``conv_impl=auto`` is ``folded`` there): the train-mode loss's
  parameter gradients and BatchNorm updates of two clients under ``vmap`` (stem, 3x3 blocks, the 1x1 stride-2
  shortcuts) equal JAX's own gradients (``xla``) to float32 rounding."""
  _, variables = resnet8
  stacked = jax.tree.map(lambda a: jnp.stack([a, a * 0.9 + 0.01]), variables)
  x = flat_random.uniform(jax.random.key(7), (2, 4, 32, 32, 3))
  y = jnp.array([[1, 2, 3, 4], [5, 6, 7, 8]])

  def grads(impl):
    model = make_model(get_model("resnet8", 10, conv_impl=impl))

    def loss(params, state, xb, yb):
      logits, new_state = model.apply({"params": params, **state}, xb, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), new_state

    g = jax.vmap(jax.grad(loss, has_aux=True))
    state = {k: v for k, v in stacked.items() if k != "params"}
    return jax.jit(g)(stacked["params"], state, x, y)

  with jax.default_matmul_precision("highest"):
    want, got = grads("xla"), grads("folded")
  for r, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(r))))


# ----------------------------------------------------------------------------- converter


@pytest.mark.parametrize("name,num_classes,layout,prefix", [
    ("resnet18", 10, "torchvision", "layer4.0."), ("resnet8", 10, "fling", "layers.2.0."),
    ("resnet10", 100, "fling", "layers.3.0."),
])
def test_converter_round_trip(name, num_classes, layout, prefix):
  module = get_model(name, num_classes)
  variables = _random_variables(module, seed=1)
  sd = R.torch_state_dict_from_variables(variables, layout=layout)
  assert sd["conv1.weight"].shape == (64, 3, 7, 7) and sd["fc.weight"].shape == (num_classes, module.feature_dim)
  assert f"{prefix}conv2.weight" in sd and f"{prefix}downsample.1.running_var" in sd
  assert sd["bn1.num_batches_tracked"].dtype == np.int64
  # HWIO -> OIHW and [in, out] -> [out, in].
  np.testing.assert_array_equal(sd["conv1.weight"][5, 2, 1, 6], variables["params"]["conv1"]["kernel"][1, 6, 2, 5])
  np.testing.assert_array_equal(sd["fc.weight"].T, variables["params"]["head"]["kernel"])
  back = R.variables_from_torch_state_dict(sd, name, num_classes, drop_head=False)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, variables)
  # drop_head: a fresh head for another number of classes, everything else the checkpoint's.
  fresh = R.variables_from_torch_state_dict(sd, name, 5, drop_head=True, key=jax.random.key(9))
  assert fresh["params"]["head"]["kernel"].shape == (module.feature_dim, 5)
  assert 0.9 < float(jnp.max(jnp.abs(fresh["params"]["head"]["kernel"]))) * np.sqrt(module.feature_dim) <= 1.0
  jax.tree_util.tree_map(np.testing.assert_array_equal, models.split_base_head(fresh["params"])[0],
                         models.split_base_head(variables["params"])[0])
  jax.tree_util.tree_map(np.testing.assert_array_equal, fresh["batch_stats"], variables["batch_stats"])


def test_converter_fails_loudly():
  variables = _random_variables(get_model("resnet8", 10))
  sd = R.torch_state_dict_from_variables(variables, layout="fling")
  R.variables_from_torch_state_dict(sd, "resnet8", 10)  # fits
  missing = {k: v for k, v in sd.items() if k != "layers.1.0.bn2.running_mean"}
  with pytest.raises(ValueError, match=r"missing keys \['layers.1.0.bn2.running_mean'\]"):
    R.variables_from_torch_state_dict(missing, "resnet8", 10)
  with pytest.raises(ValueError, match=r"unexpected keys \['layers.3.0.conv1.weight'\]"):
    R.variables_from_torch_state_dict({**sd, "layers.3.0.conv1.weight": np.zeros((512, 256, 3, 3))}, "resnet8", 10)
  bad = {**sd, "layers.0.0.conv2.weight": np.zeros((64, 64, 1, 3))}
  with pytest.raises(ValueError, match=r"layers.0.0.conv2.weight: got \(64, 64, 1, 3\), expected \(64, 64, 3, 3\)"):
    R.variables_from_torch_state_dict(bad, "resnet8", 10)
  with pytest.raises(ValueError, match="fc.weight: got"):  # keeping the head needs num_classes rows
    R.variables_from_torch_state_dict(sd, "resnet8", 100, drop_head=False)
  with pytest.raises(ValueError, match="missing keys"):  # torchvision names for a Fling model
    R.variables_from_torch_state_dict(sd, "resnet8", 10, layout="torchvision")
  no_fc = {k: v for k, v in sd.items() if not k.startswith("fc.")}
  R.variables_from_torch_state_dict(no_fc, "resnet8", 10, drop_head=True)
  with pytest.raises(ValueError, match=r"missing keys \['fc.bias', 'fc.weight'\]"):
    R.variables_from_torch_state_dict(no_fc, "resnet8", 10, drop_head=False)


def test_load_pretrained_and_cli(tmp_path):
  module = get_model("resnet8", 10)
  pretrained = _random_variables(module, seed=2)
  own = _random_variables(module, seed=3)
  path = tmp_path / "pre.msgpack"
  R.save_variables(pretrained, path)
  loaded = R.load_pretrained(path, make_model(module), own)
  base = lambda v: models.split_base_head(v["params"])[0]  # noqa: E731
  jax.tree_util.tree_map(np.testing.assert_array_equal, base(loaded), base(pretrained))
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded["batch_stats"], pretrained["batch_stats"])
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded["params"]["head"], own["params"]["head"])
  full = R.load_pretrained(path, module, own, drop_head=False)
  jax.tree_util.tree_map(np.testing.assert_array_equal, full, pretrained)
  # A file for another architecture (head aside, the trees differ).
  with pytest.raises(ValueError, match="do not fit"):
    R.load_pretrained(path, get_model("resnet10", 10), _random_variables(get_model("resnet10", 10)))
  # The CLI: a PyTorch state_dict as .npz (no torch) with a 1000-way fc -> msgpack -> a 10-class model.
  sd = R.torch_state_dict_from_variables(_random_variables(get_model("resnet8", 1000), seed=4), layout="fling")
  np.savez(tmp_path / "sd.npz", **sd)
  spec = importlib.util.spec_from_file_location(
      "convert_cli", Path(__file__).resolve().parents[1] / "tools" / "convert_torchvision_resnet18.py")
  cli = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(cli)
  assert cli.main([str(tmp_path / "sd.npz"), str(tmp_path / "out.msgpack"), "--model", "resnet8"]) == 0
  converted = R.load_pretrained(tmp_path / "out.msgpack", module, own)
  np.testing.assert_array_equal(converted["params"]["layer2_0"]["downsample_conv"]["kernel"],
                                np.transpose(sd["layers.1.0.downsample.0.weight"], (2, 3, 1, 0)))
  np.testing.assert_array_equal(converted["params"]["head"]["kernel"], own["params"]["head"]["kernel"])
  # ... and the state_dict read directly.
  direct = R.load_pretrained(tmp_path / "sd.npz", module, own)
  jax.tree_util.tree_map(np.testing.assert_array_equal, direct, converted)


# ----------------------------------------------------------------------------- against PyTorch (skipped without torch)


def _torch_resnet(torch, stage_sizes, widths, num_classes, fling):
  """A hand-written PyTorch ResNet (BasicBlock, ImageNet stem); torchvision names, or Fling's ``layers``."""
  tnn = torch.nn

  class Block(tnn.Module):

    def __init__(self, cin, cout, stride):
      super().__init__()
      self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
      self.bn1 = tnn.BatchNorm2d(cout)
      self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
      self.bn2 = tnn.BatchNorm2d(cout)
      self.downsample = None
      if stride != 1 or cin != cout:
        self.downsample = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

    def forward(self, x):
      out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
      return torch.relu(out + (x if self.downsample is None else self.downsample(x)))

  class Net(tnn.Module):

    def __init__(self):
      super().__init__()
      self.conv1 = tnn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
      self.bn1 = tnn.BatchNorm2d(widths[0])
      self.maxpool = tnn.MaxPool2d(3, 2, 1)
      stages, cin = [], widths[0]
      for s, (n, w) in enumerate(zip(stage_sizes, widths)):
        stages.append(tnn.Sequential(*[Block(cin if b == 0 else w, w, 2 if (s > 0 and b == 0) else 1)
                                       for b in range(n)]))
        cin = w
      if fling:
        self.layers = tnn.Sequential(*stages)
      else:
        for s, stage in enumerate(stages):
          setattr(self, f"layer{s + 1}", stage)
      self.stages = stages
      self.fc = tnn.Linear(widths[-1], num_classes)

    def forward(self, x):
      x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
      for stage in self.stages:
        x = stage(x)
      return self.fc(x.mean(dim=(2, 3)))

  net = Net()
  with torch.no_grad():  # non-trivial BatchNorm affine parameters and running statistics
    for m in net.modules():
      if isinstance(m, tnn.BatchNorm2d):
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_(0.0, 0.1)
        m.running_mean.normal_(0.0, 0.1)
        m.running_var.uniform_(0.5, 1.5)
  return net


@pytest.mark.parametrize("name,fling", [("resnet18", False), ("resnet8", True)])
def test_matches_pytorch(name, fling):
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  module = get_model(name, 10)
  net = _torch_resnet(torch, module.stage_sizes, module.widths, 10, fling)
  sd = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}  # copies: training updates in place
  variables = R.variables_from_torch_state_dict(sd, name, 10, drop_head=False)
  model = _jitted(make_model(module))
  x = np.random.default_rng(0).uniform(size=(4, 32, 32, 3)).astype(np.float32)
  xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  with jax.default_matmul_precision("highest"):
    net.eval()
    with torch.no_grad():
      ref = net(xt).numpy()
    np.testing.assert_allclose(model.apply(variables, x)[0], ref, rtol=1e-4, atol=1e-4)
    # Training mode: batch statistics, same running-mean update (momentum 0.1).
    net.train()
    with torch.no_grad():
      ref = net(xt).numpy()
    logits, state = model.apply(variables, x, train=True)
  np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)
  after = R.torch_state_dict_from_variables(state, layout="fling" if fling else "torchvision")
  new_sd = net.state_dict()
  running = [k for k in after if k.endswith(("running_mean", "running_var"))]
  assert len(running) >= 2 * (1 + sum(module.stage_sizes))
  for k in running:  # both running statistics as PyTorch's, the variance with the unbiased batch variance
    np.testing.assert_allclose(after[k], new_sd[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
