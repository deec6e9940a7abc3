"""FedVSA's models (specs/fedvsa.md §4.2): the 28x28 AlexNet for FMNIST (``alexnet28``) and the CIFAR
ResNet-18 (``cifar_resnet18``, GroupNorm by default, BatchNorm as an option).

ResNet-18 variables are built from shapes (``jax.eval_shape``) with numpy values, as in test_resnet.py (a
jitted ResNet init spends seconds compiling its RNG on CPU); the full ResNet-18 is compiled once, for one
training step. The BatchNorm / GroupNorm behaviour is checked on a tiny CIFAR-stem ResNet built from the
same pieces.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from fedjax_robust import models
from fedjax_robust.models import (count_params, get_model, get_model_from_config, make_model, split_base_head,
                                  train_logits)
from fedjax_robust.models import resnet as R

KEY = jax.random.key(0)


def _template(module, shape):
  return jax.eval_shape(module.init, KEY, jax.ShapeDtypeStruct((1,) + tuple(shape), jnp.float32))


def _random_variables(module, shape, seed=0):
  """Variables of ``module`` with random values (kaiming-scaled kernels, non-trivial norm affine/statistics)."""
  rng = np.random.default_rng(seed)
  out = {}
  for collection, tree in _template(module, shape).items():
    flat = {}
    for path, leaf in traverse_util.flatten_dict(dict(tree)).items():
      if path[-1] == "kernel":
        fan_in = int(np.prod(leaf.shape[:-1]))
        v = rng.normal(0.0, np.sqrt(2.0 / fan_in), leaf.shape)
      elif path[-1] in ("scale", "var"):
        v = rng.uniform(0.5, 1.5, leaf.shape)
      else:
        v = rng.normal(0.0, 0.1, leaf.shape)
      flat[path] = jnp.asarray(v, jnp.float32)
    out[collection] = traverse_util.unflatten_dict(flat)
  return out


def _ce(logits, y):
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _sgd_step(model, lr=0.01):
  """One jitted SGD step through the engine's training forward pass (dropout rng, BN mask)."""

  @jax.jit
  def step(params, state, x, y, key, mask):
    def loss_fn(p):
      logits, new_state = train_logits(model, p, state, x, key, mask)
      return _ce(logits, y), (logits, new_state)

    (loss, (logits, new_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), new_state, loss, logits, grads

  return step


def _batch(shape, n=4, seed=1):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.uniform(size=(n,) + tuple(shape)), jnp.float32),
          jnp.asarray(rng.integers(0, 10, n), jnp.int32))


# ----------------------------------------------------------------------------- AlexNet (FMNIST)


def test_alexnet28_shapes_and_param_count():
  """conv1 3*3*1*64+64 = 640; conv2 3*3*64*192+192 = 110,784; conv3 3*3*192*384+384 = 663,936;
  conv4 3*3*384*256+256 = 884,992; conv5 3*3*256*256+256 = 590,080; 28 -> 14 -> 7 -> 3 gives a 3*3*256 =
  2304 flatten: fc1 2304*1024+1024 = 2,360,320; fc2 1024*512+512 = 524,800; head 512*10+10 = 5,130.
  Total 5,140,682."""
  model = get_model("alexnet28", 10)
  assert models.DEFAULT_INPUT_SHAPES["alexnet28"] == (28, 28, 1)
  variables = _template(model, (28, 28, 1))
  params = variables["params"]
  assert set(variables) == {"params"} and make_model(model).state_collections == ()
  assert count_params(params) == 5_140_682
  assert {k: count_params(v) for k, v in params.items()} == {
      "conv1": 640, "conv2": 110_784, "conv3": 663_936, "conv4": 884_992, "conv5": 590_080,
      "fc1": 2_360_320, "fc2": 524_800, "head": 5_130}
  assert params["fc1"]["kernel"].shape == (2304, 1024)
  assert model.penultimate == "fc2" and model.feature_dim == 512
  assert params[model.penultimate]["kernel"].shape == (1024, 512)
  x = jax.ShapeDtypeStruct((4, 28, 28, 1), jnp.float32)
  assert jax.eval_shape(model.apply, variables, x).shape == (4, 10)
  assert jax.eval_shape(lambda v, x: model.apply(v, x, method="features"), variables, x).shape == (4, 512)
  assert {"dropout_rate", "conv_impl", "init"} <= set(models.model_kwargs("alexnet28"))


def test_alexnet28_dropout_in_training_only_and_train_step():
  module = get_model("alexnet28", 10)
  model = make_model(module)
  x, y = _batch((28, 28, 1))
  # PyTorch default init (TorchConv / TorchDense, tested in test_models.py); a jitted init of the 5M
  # parameters compiles for ~15 s on a busy 2-core CPU, so the values here come from numpy.
  assert module.init_scheme == "torch"
  variables = _random_variables(module, (28, 28, 1))

  apply = jax.jit(model.apply, static_argnames="train")
  eval_logits = apply(variables, x)[0]
  np.testing.assert_array_equal(apply(variables, x, rng=jax.random.key(1))[0], eval_logits)  # no dropout
  drop1 = apply(variables, x, train=True, rng=jax.random.key(1))[0]
  drop2 = apply(variables, x, train=True, rng=jax.random.key(2))[0]
  assert not np.allclose(drop1, eval_logits, atol=1e-4) and not np.allclose(drop1, drop2, atol=1e-4)
  np.testing.assert_array_equal(apply(variables, x, train=True, rng=jax.random.key(1))[0], drop1)
  no_drop = make_model(get_model("alexnet28", 10, dropout_rate=0.0))
  no_drop_train = jax.jit(lambda v, x: no_drop.apply(v, x, train=True)[0])(variables, x)
  np.testing.assert_allclose(no_drop_train, eval_logits, rtol=1e-5, atol=1e-5)
  # logits = head(features) in eval mode.
  feats = jax.jit(model.features)(variables, x)
  assert feats.shape == (4, 512) and float(jnp.min(feats)) >= 0.0
  head = module.apply(variables, feats, method=lambda m, f: m.head(f))
  np.testing.assert_allclose(head, eval_logits, rtol=1e-5, atol=1e-5)

  new_params, state, loss, logits, grads = _sgd_step(model)(variables["params"], {}, x, y, jax.random.key(3), None)
  assert logits.shape == (4, 10) and np.isfinite(float(loss)) and state == {}
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
  assert not np.allclose(new_params["fc1"]["kernel"], variables["params"]["fc1"]["kernel"])


# ----------------------------------------------------------------------------- CIFAR ResNet-18


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_cifar_resnet18_param_count_and_state(norm):
  """Standard CIFAR ResNet-18: torchvision's 11,181,642 (10 classes) minus the 7x7 stem's 7*7*3*64 = 9,408
  plus the 3x3 stem's 3*3*3*64 = 1,728 = 11,173,962. GroupNorm has BatchNorm's scale and bias per channel."""
  model = get_model_from_config({"name": "cifar_resnet18", "norm": norm}, 10)
  assert isinstance(model, R.CifarResNet18) and model.norm == norm and model.stem == "cifar"
  variables = _template(model, (32, 32, 3))
  assert count_params(variables["params"]) == 11_173_962
  assert len(jax.tree_util.tree_leaves(variables["params"])) == 62
  p = variables["params"]
  assert p["conv1"]["kernel"].shape == (3, 3, 3, 64) and set(p["conv1"]) == {"kernel"}  # no bias
  assert p["layer2_0"]["downsample_conv"]["kernel"].shape == (1, 1, 64, 128)
  assert "downsample_conv" not in p["layer1_0"] and "downsample_conv" not in p["layer2_1"]
  assert p["head"]["kernel"].shape == (512, 10) and model.feature_dim == 512 and model.penultimate is None
  assert set(split_base_head(p)[0]) == {"conv1", "bn1"} | {f"layer{s}_{b}" for s in range(1, 5) for b in (0, 1)}
  wrapped = make_model(model)
  if norm == "group":
    assert set(variables) == {"params"} and model.state_collections == () and not wrapped.stateful
    assert set(p["bn1"]) == {"scale", "bias"}
  else:
    assert set(variables) == {"params", "batch_stats"} and wrapped.state_collections == ("batch_stats",)
    assert sum(1 for path in traverse_util.flatten_dict(variables["batch_stats"]) if path[-1] == "mean") == 20
  # No max-pool: 32 -> 32 (stem, layer1) -> 16 -> 8 -> 4 before the global average pool.
  x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  _, inter = jax.eval_shape(lambda v, x: model.apply(v, x, capture_intermediates=True, mutable=["intermediates"]),
                            variables, x)
  sizes = {name: inter["intermediates"][name]["__call__"][0].shape[1] for name in ("layer1_1", "layer2_0",
                                                                                   "layer3_0", "layer4_1")}
  assert sizes == {"layer1_1": 32, "layer2_0": 16, "layer3_0": 8, "layer4_1": 4}


def test_cifar_resnet18_options_and_registry():
  assert models.DEFAULT_INPUT_SHAPES["cifar_resnet18"] == (32, 32, 3)
  assert {"norm", "num_groups", "stem", "conv_impl", "init"} <= set(models.model_kwargs("cifar_resnet18"))
  assert get_model("cifar_resnet18", 10).num_groups == 32
  assert get_model("resnet18", 10).norm == "batch" and get_model("resnet18", 10).stem == "imagenet"
  x = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
  with pytest.raises(ValueError, match="norm"):
    jax.eval_shape(get_model("cifar_resnet18", 10, norm="layer").init, KEY, x)
  with pytest.raises(ValueError, match="stem"):
    jax.eval_shape(get_model("cifar_resnet18", 10, stem="tiny").init, KEY, x)
  with pytest.raises(ValueError, match="divisible"):
    jax.eval_shape(get_model("cifar_resnet18", 10, num_groups=3).init, KEY, x)
  # FedDyn / FedDC's GroupNorm(2, C): same parameters.
  assert count_params(_template(get_model("cifar_resnet18", 10, num_groups=2), (32, 32, 3))["params"]) == 11_173_962


def test_cifar_resnet18_jitted_train_step():
  """One jitted SGD step of the full GroupNorm ResNet-18 on a batch of 4 (stateless: no model state)."""
  module = get_model("cifar_resnet18", 10)
  model = make_model(module)
  variables = _random_variables(module, (32, 32, 3))
  x, y = _batch((32, 32, 3))
  new_params, state, loss, logits, grads = _sgd_step(model)(variables["params"], {}, x, y, None,
                                                            jnp.ones(4, bool))
  assert logits.shape == (4, 10) and np.isfinite(float(loss)) and state == {}
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
  assert float(jnp.abs(grads["conv1"]["kernel"]).sum()) > 0 and float(jnp.abs(grads["bn1"]["scale"]).sum()) > 0
  assert not np.allclose(new_params["layer4_1"]["conv2"]["kernel"], variables["params"]["layer4_1"]["conv2"]["kernel"])


# The norm layers' behaviour on a tiny CIFAR-stem ResNet (same BasicBlock / stem / norm code as ResNet-18).
TINY = dict(stage_sizes=(1, 1), widths=(32, 64), stem="cifar")


def test_tiny_batchnorm_masked_statistics():
  """BatchNorm path: train updates batch_stats with the real rows only; eval uses the running statistics."""
  module = get_model("resnet8", 10, norm="batch", **TINY)
  model = make_model(module)
  variables = _random_variables(module, (8, 8, 3), seed=2)
  apply = jax.jit(model.apply, static_argnames="train")
  x, y = _batch((8, 8, 3), n=6, seed=3)
  padded = x.at[4:].set(100.0)
  mask = jnp.array([True] * 4 + [False] * 2)
  ref_logits, ref_state = apply(variables, jnp.concatenate([x[:4], x[:2]]), train=True,
                                mask=jnp.array([True] * 4 + [False] * 2))
  logits, state = apply(variables, padded, train=True, mask=mask)
  np.testing.assert_allclose(logits[:4], ref_logits[:4], rtol=1e-4, atol=1e-4)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), state, ref_state)
  _, unmasked = apply(variables, padded, train=True, mask=jnp.ones(6, bool))
  assert not np.allclose(unmasked["batch_stats"]["bn1"]["mean"], state["batch_stats"]["bn1"]["mean"])
  # PyTorch momentum 0.1 on the stem BN.
  stem = module.apply(variables, padded[:4], method=lambda m, x: m.conv1(x))
  np.testing.assert_allclose(state["batch_stats"]["bn1"]["mean"],
                             0.9 * variables["batch_stats"]["bn1"]["mean"] + 0.1 * stem.mean(axis=(0, 1, 2)),
                             rtol=1e-5, atol=1e-6)
  eval_logits, eval_state = apply(variables, padded)
  jax.tree_util.tree_map(np.testing.assert_array_equal, eval_state, {"batch_stats": variables["batch_stats"]})
  np.testing.assert_allclose(apply(variables, x)[0][:4], eval_logits[:4], rtol=1e-5, atol=1e-5)


def test_tiny_groupnorm_is_per_row_and_mode_free():
  """GroupNorm path: no state, train == eval, a row's logits do not depend on the rest of the batch."""
  module = get_model("resnet8", 10, norm="group", num_groups=16, **TINY)
  model = make_model(module)
  variables = _random_variables(module, (8, 8, 3), seed=4)
  assert set(variables) == {"params"} and not model.stateful
  apply = jax.jit(model.apply, static_argnames="train")
  x, _ = _batch((8, 8, 3), n=6, seed=5)
  logits, state = apply(variables, x, train=True, mask=jnp.array([True] * 4 + [False] * 2))
  assert state == {}
  np.testing.assert_allclose(apply(variables, x)[0], logits, rtol=1e-5, atol=1e-5)
  other = apply(variables, x.at[1:].set(100.0))[0]
  np.testing.assert_allclose(other[0], logits[0], rtol=1e-5, atol=1e-5)
  # flax's GroupNorm is PyTorch's: per row, statistics over (H, W, channels of the group), eps 1e-5.
  h = module.apply(variables, x, method=lambda m, x: m.conv1(x))
  g = np.asarray(h).reshape(6, 8, 8, 16, 2)  # 16 groups of 2 consecutive channels
  ref = (g - g.mean(axis=(1, 2, 4), keepdims=True)) / np.sqrt(g.var(axis=(1, 2, 4), keepdims=True) + 1e-5)
  ref = ref.reshape(6, 8, 8, 32) * variables["params"]["bn1"]["scale"] + variables["params"]["bn1"]["bias"]
  got = module.apply(variables, x, method=lambda m, x: m.bn1(m.conv1(x)))
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_cifar_resnet18_torch_names_round_trip():
  """torchvision names (conv1 3x3, no running statistics with GroupNorm) and back."""
  module = get_model("cifar_resnet18", 10)
  variables = _random_variables(module, (32, 32, 3), seed=6)
  sd = R.torch_state_dict_from_variables(variables)
  assert sd["conv1.weight"].shape == (64, 3, 3, 3) and sd["layer2.0.downsample.1.weight"].shape == (128,)
  assert not any(k.endswith(("running_mean", "num_batches_tracked")) for k in sd)
  back = R.variables_from_torch_state_dict(sd, "cifar_resnet18", 10, drop_head=False)
  assert set(back) == {"params"}
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, variables)
