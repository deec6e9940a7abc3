"""Tests of fedjax_robust.models: parameter counts, shapes, init, vmap, registry."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_robust import flat_random, models
from fedjax_robust.models import (count_params, get_model,
                                  get_model_from_config, init_params,
                                  make_model, merge_base_head, split_base_head)
from fedjax_robust.models.layers import TorchConv, TorchDense

KEY = jax.random.key(0)

# (name, kwargs, input shape, num_classes, expected #params, feature dim)
CASES = [
    ("fedavg_cnn", {"fc_dim": 64}, (32, 32, 3), 10, 156_810, 64),    # FedCAP
    ("fedavg_cnn", {"fc_dim": 512}, (32, 32, 3), 10, 878_538, 512),  # PFLlib
    ("fedavg_cnn", {"fc_dim": 512}, (28, 28, 1), 10, 582_026, 512),  # PFLlib MNIST
    ("emnist_cnn", {}, (28, 28, 1), 62, 86_910, 128),
    ("har_cnn", {}, (1, 200, 3), 6, 203_782, 64),
    # conv1 156 + conv2 2,416 + fc1 48,120 + fc2 10,164 + fc3 850
    ("lenet5", {}, (28, 28, 1), 10, 61_706, 84),
    ("lenet5", {}, (32, 32, 3), 10, 83_126, 84),  # pad 2: flatten 576
    ("cifar_cnn", {}, (32, 32, 3), 10, 62_006, 84),
    ("cifar_cnn", {}, (32, 32, 3), 100, 69_656, 84),  # FedCC CIFAR-100 LeNet at 32x32 (spec §4.3)
    ("fedcc_fmnist_cnn", {}, (28, 28, 1), 10, 3_382_346, 128),  # FedCC Table VI
    ("fedcc_cifar_cnn", {}, (32, 32, 3), 10, 109_834, 128),  # FedCC Table VII
    ("mlp", {"hidden": (200, 200)}, (8, 8, 1), 10, 55_210, 200),
    ("mlp", {"hidden": (64,), "dropout_rate": 0.5}, (32, 32, 3), 10,
     197_322, 64),
]


def _ids(c):
  return f"{c[0]}-{'-'.join(f'{k}{v}' for k, v in c[1].items())}-{'x'.join(map(str, c[2]))}"


@functools.lru_cache(maxsize=None)
def _model_and_params(name, kwargs_items, shape, num_classes):
  """One real init per configuration for the whole module (RNG compiles are slow on CPU)."""
  model = get_model(name, num_classes, **dict(kwargs_items))
  return model, init_params(model, KEY, shape)


def _cached(name, kwargs, shape, num_classes):
  return _model_and_params(name, tuple(sorted(kwargs.items())), shape,
                           num_classes)


def _np_params(model, shape, seed=0, scale=0.1):
  """Random params of the right structure without any JAX RNG compile."""
  abstract = jax.eval_shape(lambda k: init_params(model, k, shape), KEY)
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda a: jnp.asarray(rng.uniform(-scale, scale, a.shape), jnp.float32),
      abstract)


def _params_for(name, kwargs, shape, num_classes):
  """Real (cached) init for the FedCAP CNNs, numpy-random params otherwise."""
  if name in ("fedavg_cnn", "har_cnn"):
    return _cached(name, kwargs, shape, num_classes)
  model = get_model(name, num_classes, **kwargs)
  return model, _np_params(model, shape)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_param_count_and_shapes(case):
  """Exact counts and shapes for every configuration (abstract evaluation)."""
  name, kwargs, shape, num_classes, n_params, feat_dim = case
  model = get_model(name, num_classes, **kwargs)
  params = jax.eval_shape(lambda k: init_params(model, k, shape), KEY)
  assert count_params(params) == n_params
  assert all(p.dtype == jnp.float32 for p in jax.tree_util.tree_leaves(params))
  x = jax.ShapeDtypeStruct((3,) + shape, jnp.float32)
  logits = jax.eval_shape(lambda p, x: model.apply({"params": p}, x),
                          params, x)
  assert logits.shape == (3, num_classes) and logits.dtype == jnp.float32
  feats = jax.eval_shape(
      lambda p, x: model.apply({"params": p}, x, method="features"), params, x)
  assert feats.shape == (3, feat_dim) and model.feature_dim == feat_dim
  # Head / base split: params['head'] takes the features; the penultimate
  # layer (model.penultimate) produces them.
  assert params["head"]["kernel"].shape == (feat_dim, num_classes)
  assert params[model.penultimate]["kernel"].shape[-1] == feat_dim
  base, head = split_base_head(params)
  assert "head" not in base and head is params["head"]
  assert count_params(base) + count_params(head) == n_params
  assert merge_base_head(base, head).keys() == params.keys()


VALUE_CASES = [CASES[0], CASES[4], CASES[5], CASES[8]]


@pytest.mark.parametrize("case", VALUE_CASES,
                         ids=[_ids(c) for c in VALUE_CASES])
def test_logits_are_head_of_features(case):
  name, kwargs, shape, num_classes, n_params, feat_dim = case
  model, params = _params_for(name, kwargs, shape, num_classes)
  assert count_params(params) == n_params
  x = flat_random.normal(jax.random.key(1), (3,) + shape)

  @jax.jit
  def run(p, x):
    return (model.apply({"params": p}, x),
            model.apply({"params": p}, x, method="features"))

  logits, feats = run(params, x)
  assert bool(jnp.all(feats >= 0))  # post-ReLU
  head_logits = feats @ params["head"]["kernel"] + params["head"]["bias"]
  np.testing.assert_allclose(logits, head_logits, rtol=1e-5, atol=1e-5)


def test_fedrod_split_fedcap_cnn():
  model, params = _cached("fedavg_cnn", {"fc_dim": 64}, (32, 32, 3), 10)
  base, head = split_base_head(params)
  assert sorted(base) == ["conv1", "conv2", "fc1"]
  assert count_params(head) == 650
  assert model.penultimate == "fc1"
  assert get_model("lenet5", 10).penultimate == "fc2"
  assert get_model("mlp", 10, hidden=(32, 16, 8)).penultimate == "fc3"
  assert get_model("mlp", 10, hidden=()).penultimate is None


def _check_uniform(values, fan_in):
  bound = 1.0 / math.sqrt(fan_in)
  values = np.asarray(values)
  assert values.dtype == np.float32
  assert np.all(np.abs(values) <= bound)
  return bound


def test_torch_init_statistics_dense_and_conv():
  _, params = _cached("fedavg_cnn", {"fc_dim": 64}, (32, 32, 3), 10)
  # Dense fc1: fan_in = 1600 -> U(+-1/40), std 1/sqrt(3*1600).
  w = params["fc1"]["kernel"]
  assert w.shape == (1600, 64)
  bound = _check_uniform(w, 1600)
  assert bound == 1 / 40
  np.testing.assert_allclose(np.std(w), 1 / math.sqrt(3 * 1600), rtol=0.02)
  assert abs(float(np.mean(w))) < 3 * bound / math.sqrt(3 * w.size) * 2
  _check_uniform(params["fc1"]["bias"], 1600)
  assert float(np.max(np.abs(params["fc1"]["bias"]))) > 0.5 / 40  # not zeros
  # Conv2: fan_in = 5*5*32 = 800.
  k = params["conv2"]["kernel"]
  assert k.shape == (5, 5, 32, 64)
  _check_uniform(k, 800)
  np.testing.assert_allclose(np.std(k), 1 / math.sqrt(3 * 800), rtol=0.02)
  _check_uniform(params["conv2"]["bias"], 800)
  np.testing.assert_allclose(np.std(params["conv2"]["bias"]),
                             1 / math.sqrt(3 * 800), rtol=0.3)
  # Conv1: fan_in = 5*5*3 = 75; head: fan_in = 64.
  _check_uniform(params["conv1"]["kernel"], 75)
  _check_uniform(params["conv1"]["bias"], 75)
  _check_uniform(params["head"]["kernel"], 64)
  _check_uniform(params["head"]["bias"], 64)
  # HAR conv kernels (1, 5): fan_in = 1*5*3 = 15.
  _, har = _cached("har_cnn", {}, (1, 200, 3), 6)
  _check_uniform(har["conv1"]["kernel"], 15)
  _check_uniform(har["conv1"]["bias"], 15)
  np.testing.assert_allclose(np.std(har["conv2"]["kernel"]),
                             1 / math.sqrt(3 * 160), rtol=0.05)


def test_flax_init_scheme():
  assert get_model("fedavg_cnn", 10, init_scheme="flax").init_scheme == "flax"
  for kw in ({"init": "flax"}, {"init_scheme": "flax"}):
    # fc1 has fan_in = 40*40*1 = 1600.
    model = get_model("mlp", 10, hidden=(64,), **kw)
    params = init_params(model, KEY, (40, 40, 1))
    assert model.init_scheme == "flax"
    assert float(jnp.max(jnp.abs(params["fc1"]["bias"]))) == 0.0
    # LeCun normal (truncated): std ~ 1/sqrt(fan_in).
    np.testing.assert_allclose(np.std(params["fc1"]["kernel"]), 1 / 40,
                               rtol=0.05)
  with pytest.raises(ValueError, match="init"):
    get_model("fedavg_cnn", 10, init="xavier")


def test_layers_match_stock_flax_layers():
  x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 12, 12, 3)),
                  jnp.float32)
  for padding, flax_padding in (("VALID", "VALID"), (2, ((2, 2), (2, 2))),
                                ((1, 0), ((1, 1), (0, 0)))):
    ours = TorchConv(4, (5, 3), padding=padding)
    p = _np_params(ours, x.shape[1:])
    ref = nn.Conv(4, (5, 3), padding=flax_padding)
    np.testing.assert_allclose(ours.apply({"params": p}, x),
                               ref.apply({"params": p}, x), rtol=1e-5,
                               atol=1e-5)
  h = jnp.asarray(np.random.default_rng(3).normal(size=(2, 7)), jnp.float32)
  ours = TorchDense(5)
  p = _np_params(ours, h.shape[1:])
  np.testing.assert_allclose(ours.apply({"params": p}, h),
                             nn.Dense(5).apply({"params": p}, h), rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("name,kwargs,shape,num_classes", [
    ("fedavg_cnn", {"fc_dim": 64}, (32, 32, 3), 10),
    ("har_cnn", {}, (1, 200, 3), 6),
    ("lenet5", {}, (28, 28, 1), 10),
    ("mlp", {"hidden": (200, 200)}, (8, 8, 1), 10),
])
def test_vmap_over_client_params_matches_loop(name, kwargs, shape,
                                              num_classes):
  model, params = _params_for(name, kwargs, shape, num_classes)
  # Three distinct clients (cheaper than three RNG inits).
  per_client = [jax.tree_util.tree_map(lambda a, c=c: a * (1 + 0.3 * c) + 0.01 * c,
                                       params) for c in range(3)]
  stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per_client)
  x = flat_random.normal(jax.random.key(5), (3, 4) + shape)  # [clients, B, ...]

  def apply(p, xb):
    return model.apply({"params": p}, xb)

  def feats(p, xb):
    return model.apply({"params": p}, xb, method="features")

  @jax.jit
  def vmapped(stacked, x):
    return (jax.vmap(apply)(stacked, x), jax.vmap(feats)(stacked, x),
            # Shared data, per-client params.
            jax.vmap(apply, in_axes=(0, None))(stacked, x[0]))

  @jax.jit
  def single(p, xb, xs):
    return apply(p, xb), feats(p, xb), apply(p, xs)

  batched, batched_feats, shared = vmapped(stacked, x)
  for c in range(3):
    ref, ref_feats, ref_shared = single(per_client[c], x[c], x[0])
    np.testing.assert_allclose(batched[c], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batched_feats[c], ref_feats, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(shared[c], ref_shared, rtol=1e-5, atol=1e-5)


def test_mlp_dropout():
  model = get_model("mlp", 10, hidden=[200, 200], dropout_rate=0.5)
  assert model.hidden == (200, 200)  # lists from configs become tuples
  params = _np_params(model, (8, 8, 1))
  x = jnp.ones((4, 8, 8, 1))
  a = model.apply({"params": params}, x)
  np.testing.assert_array_equal(a, model.apply({"params": params}, x, False))
  b = model.apply({"params": params}, x, True,
                  rngs={"dropout": jax.random.key(7)})
  assert not np.allclose(a, b)
  with pytest.raises(Exception):
    model.apply({"params": params}, x, True)  # no dropout rng


def test_get_model_errors():
  with pytest.raises(ValueError, match="known models: .*fedavg_cnn"):
    get_model("resnet1000", 10)
  with pytest.raises(ValueError, match="fc_dims"):
    get_model("fedavg_cnn", 10, fc_dims=64)
  with pytest.raises(ValueError, match="accepted: .*fc_dim"):
    get_model("fedavg_cnn", 10, hidden=(3,))
  assert set(models.MODELS) == {"mlp", "fedavg_cnn", "emnist_cnn", "har_cnn",
                                "lenet5", "cifar_cnn", "bn_cnn", "fedcc_fmnist_cnn", "fedcc_cifar_cnn",
                                "cnn_mnist", "resnet18", "resnet8", "resnet10", "alexnet28",
                                "cifar_resnet18"}
  assert set(models.DEFAULT_INPUT_SHAPES) == set(models.MODELS)


def test_get_model_from_config_dict():
  cfg = ml_collections.ConfigDict()
  cfg.model = ml_collections.ConfigDict({"name": "fedavg_cnn", "fc_dim": 64})
  model = get_model_from_config(cfg.model, num_classes=10)
  assert isinstance(model, models.FedAvgCNN) and model.fc_dim == 64
  assert count_params(jax.eval_shape(
      lambda k: init_params(model, k, (32, 32, 3)), KEY)) == 156_810
  model = get_model(**cfg.model, num_classes=10)
  assert model.fc_dim == 64
  mlp_cfg = ml_collections.ConfigDict(
      {"name": "mlp", "hidden": [32, 16], "num_classes": 10, "init": "flax"})
  mlp = get_model_from_config(mlp_cfg)
  assert mlp.hidden == (32, 16) and mlp.init_scheme == "flax"
  # Hashable fields: the module can be a static argument of jit.
  hash(mlp)
  with pytest.raises(ValueError, match="unknown keyword"):
    get_model_from_config({"name": "mlp", "widths": [3]}, 10)


# ----------------------------------------------------------------------------- conv_impl
# Every model built on TorchConv: (name, kwargs, input shape, num_classes).
CONV_MODELS = [
    ("fedavg_cnn", {"fc_dim": 64}, (32, 32, 3), 10),
    ("emnist_cnn", {}, (28, 28, 1), 62),
    ("har_cnn", {}, (1, 200, 3), 6),
    ("lenet5", {}, (28, 28, 1), 10),   # conv1 padded (2)
    ("cifar_cnn", {}, (32, 32, 3), 10),
    ("fedcc_cifar_cnn", {}, (32, 32, 3), 10),
]
# The comparisons run under jax.default_matmul_precision("highest"): both impls
# then compute in full float32 (no TF32 / bf16 passes on GPUs or TPUs), so the
# only difference left is float32 summation order and a 1e-5 tolerance holds on
# any backend. The model itself keeps the default precision for both impls.


def test_conv_impl_registered_on_every_conv_model():
  conv_names = {n for n, *_ in CONV_MODELS} | {"bn_cnn", "fedcc_fmnist_cnn", "cnn_mnist", "resnet18", "resnet8",
                                                "resnet10", "alexnet28", "cifar_resnet18"}
  for name in models.MODELS:
    assert ("conv_impl" in models.model_kwargs(name)) == (name in conv_names)
    if name in conv_names:
      assert get_model(name, 10).conv_impl == "auto"  # canonical on the CPU, folded on a GPU, xla elsewhere


def test_conv_impl_auto_is_the_measured_fastest_per_backend():
  """``auto`` resolves per backend to what was measured fastest there: ``canonical`` on the CPU (no conv-in-loop
  trap), ``folded`` on a GPU (2.5x the engine's step on an H200), ``xla`` on a TPU (unmeasured); explicit impls pass
  through and unknown ones are refused, naming the choices."""
  from fedjax_robust.models.layers import resolve_conv_impl
  assert [resolve_conv_impl("auto", b) for b in ("cpu", "gpu", "cuda", "tpu")] == ["canonical", "folded", "folded",
                                                                                  "xla"]
  assert resolve_conv_impl("auto") == resolve_conv_impl("auto", jax.default_backend())
  assert [resolve_conv_impl(i, "gpu") for i in ("xla", "patches", "canonical")] == ["xla", "patches", "canonical"]
  with pytest.raises(ValueError, match="expected one of"):
    resolve_conv_impl("grouped", "gpu")


@pytest.mark.parametrize("name,kwargs,shape,num_classes", CONV_MODELS,
                         ids=[c[0] for c in CONV_MODELS])
def test_conv_impl_same_params(name, kwargs, shape, num_classes):
  xla = get_model(name, num_classes, **kwargs)
  pat = get_model(name, num_classes, conv_impl="patches", **kwargs)
  a = jax.eval_shape(lambda k: init_params(xla, k, shape), KEY)
  b = jax.eval_shape(lambda k: init_params(pat, k, shape), KEY)
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  assert jax.tree_util.tree_leaves(a) == jax.tree_util.tree_leaves(b)


def test_conv_impl_same_init_values():
  """Same key -> bit-identical params (real init; FedAvgCNN's xla init is cached)."""
  _, ref = _cached("fedavg_cnn", {"fc_dim": 64}, (32, 32, 3), 10)
  pat = get_model("fedavg_cnn", 10, fc_dim=64, conv_impl="patches")
  got = init_params(pat, KEY, (32, 32, 3))
  jax.tree_util.tree_map(np.testing.assert_array_equal, got, ref)


CONV_GEOMETRIES = [("VALID", (1, 1)), (2, (1, 1)), ((1, 0), (2, 1)), ("SAME", (2, 2)), (((1, 2), (0, 3)), (1, 2))]


@pytest.mark.parametrize("impl", ["patches", "canonical", "folded"])
@pytest.mark.parametrize("padding,strides", CONV_GEOMETRIES)
def test_torch_conv_impl_matches_xla(padding, strides, impl):
  """The layer alone, over paddings / strides, with a non-square kernel."""
  x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 11, 13, 3)),
                  jnp.float32)
  xla = TorchConv(4, (5, 3), strides=strides, padding=padding, impl="xla")
  pat = TorchConv(4, (5, 3), strides=strides, padding=padding, impl=impl)
  p = _np_params(xla, x.shape[1:], scale=0.5)
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(pat.apply({"params": p}, x),
                               xla.apply({"params": p}, x), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("kernel,padding,strides", [((5, 3), p, s) for p, s in CONV_GEOMETRIES] + [
    ((1, 1), "VALID", (2, 2)),  # ResNet's projection shortcut: the forward pass never reads the last row/column
    ((7, 7), 3, (2, 2)),  # ResNet-18's stem
    ((3, 3), 1, (2, 2)), ((2, 2), "VALID", (3, 3))])
def test_canonical_conv_gradients_equal_xla(kernel, padding, strides):
  """``conv_canonical``'s hand-written VJP (two NHWC x HWIO convolutions) against JAX's own gradient of
  ``lax.conv_general_dilated``: input and kernel cotangents, alone and vmapped over per-client kernels (the
  engine's client axis). On the CPU they are equal to the bit (same reductions); elsewhere to float32 rounding."""
  from fedjax_robust.models.layers import _conv_padding, conv_canonical
  rng = np.random.default_rng(7)
  x = jnp.asarray(rng.normal(size=(3, 11, 13, 4)), jnp.float32)
  w = jnp.asarray(rng.normal(size=kernel + (4, 5)), jnp.float32)
  ws = jnp.stack([w, 0.5 * w])
  pad = _conv_padding(padding)
  reference = lambda x, w: jax.lax.conv_general_dilated(x, w, strides, pad, dimension_numbers=("NHWC", "HWIO",
                                                                                              "NHWC"))
  canonical = lambda x, w: conv_canonical(x, w, strides, pad)

  def grads(conv):
    loss = lambda x, w: jnp.sum(jnp.sin(conv(x, w)))
    return jax.grad(loss, (0, 1))(x, w), jax.vmap(jax.grad(loss, (0, 1)), in_axes=(None, 0))(x, ws)

  want, got = jax.jit(lambda: grads(reference))(), jax.jit(lambda: grads(canonical))()
  exact = jax.default_backend() == "cpu"
  for r, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    assert g.shape == r.shape
    if exact:
      np.testing.assert_array_equal(g, r)
    else:
      np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(r))))
  np.testing.assert_array_equal(canonical(x, w), reference(x, w))


@pytest.mark.parametrize("kernel,padding,strides", [((5, 3), "VALID", (1, 1)), ((3, 3), 1, (2, 2)),
                                                    ((1, 1), "VALID", (2, 2)), ((2, 3), "SAME", (2, 1)),
                                                    ((7, 7), 3, (2, 2))])  # the ResNets' ImageNet stem
def test_folded_conv_gradients_equal_xla_under_every_vmap(kernel, padding, strides):
  """``conv_folded``: JAX's values and gradients, and under ``vmap`` over clients the kernel gradient is ONE
  ``batch_group_count = C`` convolution (the grouped conv's weight gradient), whichever operands are batched:
  per-client data and kernels (the engine's ``vmap(grad)``), shared data (the stacked pair's ``grad(vmap)``),
  shared kernels, and two nested client axes (seeds x clients)."""
  from fedjax_robust.models.layers import _conv_padding, conv_folded
  rng = np.random.default_rng(8)
  xs = jnp.asarray(rng.normal(size=(3, 2, 9, 10, 4)), jnp.float32)  # [C, B, H, W, cin]
  ws = jnp.asarray(rng.normal(size=(3,) + kernel + (4, 5)), jnp.float32)
  pad = _conv_padding(padding)
  reference = lambda x, w: jax.lax.conv_general_dilated(x, w, strides, pad, dimension_numbers=("NHWC", "HWIO",
                                                                                              "NHWC"))
  folded = lambda x, w: conv_folded(x, w, strides, pad)

  def grads(conv):
    g = jax.grad(lambda x, w: jnp.sum(jnp.sin(conv(x, w))), (0, 1))
    return {"plain": g(xs[0], ws[0]),
            "vmap_grad": jax.vmap(g)(xs, ws),
            "grad_vmap_shared_x": jax.grad(lambda w: jnp.sum(jnp.sin(jax.vmap(conv, (None, 0))(xs[0], w))))(ws),
            "vmap_grad_shared_w": jax.vmap(g, (0, None))(xs, ws[0]),
            "nested": jax.vmap(jax.vmap(g))(jnp.stack([xs, 2 * xs]), jnp.stack([ws, -ws]))}

  want, got = jax.jit(lambda: grads(reference))(), jax.jit(lambda: grads(folded))()
  for r, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    assert g.shape == r.shape
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(r))))
  np.testing.assert_array_equal(folded(xs[0], ws[0]), reference(xs[0], ws[0]))
  loss = lambda x, w: jnp.sum(folded(x, w))
  batched = str(jax.make_jaxpr(jax.vmap(jax.grad(loss, 1)))(xs, ws))
  assert "batch_group_count=3" in batched
  assert "batch_group_count=3" not in str(jax.make_jaxpr(jax.vmap(jax.grad(lambda x, w: jnp.sum(reference(x, w)),
                                                                          1)))(xs, ws))


@pytest.mark.parametrize("impl", ["patches", "canonical", "folded"])
@pytest.mark.parametrize("name,kwargs,shape,num_classes", CONV_MODELS,
                         ids=[c[0] for c in CONV_MODELS])
def test_conv_impl_matches_xla(name, kwargs, shape, num_classes, impl):
  """Logits, features, param and input gradients, and the forward vmapped over
  3 clients' params (per-client and shared data) agree between impls."""
  xla = get_model(name, num_classes, conv_impl="xla", **kwargs)
  pat = get_model(name, num_classes, conv_impl=impl, **kwargs)
  params = _np_params(xla, shape)
  stacked = jax.tree_util.tree_map(
      lambda a: jnp.stack([a * (1 + 0.3 * c) + 0.01 * c for c in range(3)]),
      params)
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.normal(size=(3, 4) + shape), jnp.float32)
  y = jnp.asarray(rng.integers(0, num_classes, (4,)), jnp.int32)

  def outputs(model, params, stacked, x):
    apply = lambda p, xb: model.apply({"params": p}, xb)

    def loss(p, xb):
      logits = apply(p, xb)
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits),
                                           y[:, None], axis=1))
    gp, gx = jax.grad(loss, argnums=(0, 1))(params, x[0])
    return {"logits": apply(params, x[0]),
            "features": model.apply({"params": params}, x[0],
                                    method="features"),
            "grad_params": gp, "grad_x": gx,
            "vmap": jax.vmap(apply)(stacked, x),
            "vmap_shared_x": jax.vmap(apply, in_axes=(0, None))(stacked, x[0]),
            "vmap_grad": jax.vmap(jax.grad(loss))(stacked, x)}

  with jax.default_matmul_precision("highest"):
    ref, got = jax.jit(lambda *a: (outputs(xla, *a), outputs(pat, *a)))(
        params, stacked, x)
  for key in ref:
    for r, g in zip(jax.tree_util.tree_leaves(ref[key]),
                    jax.tree_util.tree_leaves(got[key])):
      scale = float(np.max(np.abs(r))) or 1.0
      np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * scale,
                                 err_msg=f"{name} {key}")


def test_conv_impl_errors_and_config():
  with pytest.raises(ValueError, match="expected one of .*'xla', 'patches'"):
    get_model("fedavg_cnn", 10, conv_impl="im2col")
  with pytest.raises(ValueError, match="expected one of .*'xla', 'patches'"):
    TorchConv(4, (3, 3), impl="im2col").init(KEY, jnp.ones((1, 5, 5, 1)))
  with pytest.raises(ValueError, match="unknown keyword"):
    get_model("mlp", 10, conv_impl="patches")
  cfg = ml_collections.ConfigDict(
      {"name": "fedavg_cnn", "fc_dim": 64, "conv_impl": "patches"})
  model = get_model_from_config(cfg, num_classes=10)
  assert isinstance(model, models.FedAvgCNN) and model.conv_impl == "patches"
  hash(model)


def test_fedcc_cnns_penultimate_has_no_activation_and_dropout_is_train_only():
  """FedCC's fc1 has no ReLU (spec §4.3: the PLR layer feeds the head directly); dropout acts in training only."""
  for name, shape in (("fedcc_cifar_cnn", (32, 32, 3)), ("fedcc_fmnist_cnn", (28, 28, 1))):
    model = get_model(name, 10)
    assert model.penultimate == "fc1"
    params = _np_params(model, shape)
    x = jnp.asarray(np.random.default_rng(0).uniform(0, 1, (4,) + shape), jnp.float32)
    feats = model.apply({"params": params}, x, method="features")
    assert feats.shape == (4, 128) and float(feats.min()) < 0  # no ReLU
    eval_logits = model.apply({"params": params}, x)
    np.testing.assert_allclose(model.apply({"params": params}, x, False), eval_logits)
    train_logits = model.apply({"params": params}, x, True, rngs={"dropout": jax.random.key(1)})
    assert not np.allclose(train_logits, eval_logits)


@pytest.mark.parametrize("window,shape", [((2, 2), (3, 9, 7, 4)), ((1, 2), (2, 1, 11, 3))])
def test_max_pool_implementations_agree(window, shape):
  """The reshape max-pool (CPU default) equals flax's reduce-window pool in values, and in gradients after a ReLU
  (the models' order), floor semantics included (odd sizes are cropped)."""
  from fedjax_robust.models.classifiers import _pool
  x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
  a, b = _pool(x, window, "reshape"), _pool(x, window, "reduce_window")
  np.testing.assert_array_equal(a, b)
  w = jnp.asarray(np.random.default_rng(1).normal(size=a.shape), jnp.float32)
  grad = lambda impl: jax.grad(lambda v: jnp.sum(_pool(jax.nn.relu(v), window, impl) * w))(x)
  np.testing.assert_array_equal(grad("reshape"), grad("reduce_window"))


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_cnn_mnist_is_fedalcs_lenet_style_cnn():
  """FedALC spec §4.3 / property 18: 28x28x1 -> 10 logits, 21,840 parameters; both dropouts act in training only."""
  model = make_model(get_model("cnn_mnist", 10))
  variables = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
  assert count_params(variables["params"]) == 21_840
  x = flat_random.uniform(jax.random.key(1), (4, 28, 28, 1))
  eval_logits = model.apply(variables, x)[0]
  assert eval_logits.shape == (4, 10)
  np.testing.assert_array_equal(eval_logits, model.apply(variables, x)[0])
  train_a = model.apply(variables, x, train=True, rng=jax.random.key(2))[0]
  assert not np.allclose(train_a, eval_logits)
  np.testing.assert_array_equal(train_a, model.apply(variables, x, train=True, rng=jax.random.key(2))[0])
  np.testing.assert_allclose(model.module.apply(variables, model.features(variables, x), method=lambda m, h: m.head(h)),
                             eval_logits, rtol=1e-6, atol=1e-6)
