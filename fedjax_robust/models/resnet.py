"""BatchNorm ResNets (BasicBlock) and a converter for PyTorch / torchvision weights.

Models (one module family, :class:`ResNet`, parameterised by ``stage_sizes`` and ``widths``):

* ``resnet18`` (:class:`ResNet18`): torchvision's ResNet-18, FedALC spec §4.3 / A20. BasicBlock
  [2, 2, 2, 2], widths 64/128/256/512, ImageNet stem (7x7/2 conv pad 3 -> BN -> ReLU -> 3x3/2 max-pool
  pad 1), head Linear(512 -> C). 11,181,642 parameters with C = 10. A 32x32 input is not resized:
  32 -> 16 (stem) -> 8 (pool) -> 8 -> 4 -> 2 -> 1.
* ``resnet8`` / ``resnet10`` (:class:`ResNet8`, :class:`ResNet10`): Fling's 3- / 4-stage ResNets
  with one BasicBlock per stage and the same ImageNet stem, FedCAC spec §3.3, A18 and property 24:
  ResNet-8 (C = 10) 1,235,274 parameters in 29 tensors (2x2 before pooling on 32x32); ResNet-10
  4,957,092 (C = 100) / 5,008,392 (C = 200) in 38 tensors (1x1 on 32x32, 2x2 on 64x64).
* ``cifar_resnet18`` (:class:`CifarResNet18`): FedVSA's CIFAR-10 ResNet-18 (spec §4.2 [R]), the CIFAR
  stem (``stem='cifar'``: 3x3/1 conv pad 1 -> norm -> ReLU, no max-pool) and GroupNorm by default
  (``norm='group'``, ``num_groups=32``; stateless) or BatchNorm (``norm='batch'``). 11,173,962
  parameters with C = 10 either way. Every ResNet takes ``stem`` and ``norm``.

Layers: every convolution is bias-free with explicit symmetric padding (3 for the stem, 1 for 3x3, 0
for 1x1; JAX's 'SAME' pads stride-2 convolutions asymmetrically, unlike PyTorch); the max-pool pads
with -inf. BasicBlock: conv3x3(s) -> BN -> ReLU -> conv3x3 -> BN -> + shortcut -> ReLU; the shortcut
is 1x1 conv(s) + BN when the stride or the width changes, else the identity.

BatchNorm, as ``BNCNN`` (``classifiers.py``): running statistics in the ``batch_stats`` collection
(``state_collections``); ``train=True`` normalises with the batch statistics of the rows where
``mask`` is True (padding rows never enter them) and updates the running ones, ``train=False``
uses the running ones. Flax momentum 0.9 = PyTorch momentum 0.1, eps 1e-5, and the running variance
averages in the unbiased batch variance as PyTorch's (``layers.TorchBatchNorm``).

Initialisation, ``conv_init``:

* ``'kaiming'`` (default): what torchvision's and Fling's ``ResNet.__init__`` re-initialise to:
  conv kernels ``kaiming_normal_(mode='fan_out', nonlinearity='relu')``, i.e. untruncated
  N(0, 2 / (C_out k^2)) (FedCAC spec §3.3); BN scale 1, bias 0. The head keeps ``init_scheme``
  ('torch': PyTorch's Linear default U(+-1/sqrt(fan_in)), as torchvision).
* ``'default'``: convs follow ``init_scheme`` too ('torch': PyTorch's Conv2d default, 'flax':
  LeCun normal), i.e. a ResNet whose ``__init__`` did not re-initialise.

Common API (``classifiers.py``): ``features(x, train, mask)`` -> the globally average-pooled
``[B, widths[-1]]`` activations (the input of ``head``), ``__call__`` = ``head(features)``, the last
layer is ``head``. ``penultimate`` is None: the penultimate representation is the pooled feature
vector, and there is no Dense layer before ``head`` whose kernel FedCC could read.
``conv_impl='xla'|'patches'`` as for every conv net (``layers.TorchConv``). Input normalisation
(e.g. ImageNet mean/std for pretrained weights) is not part of these modules.

Flax names: ``conv1``, ``bn1``, ``layer{s}_{b}`` (stage s = 1.., block b = 0..) holding ``conv1``,
``bn1``, ``conv2``, ``bn2`` and, with a projection shortcut, ``downsample_conv`` /
``downsample_bn``; ``head``. PyTorch names (``layout``): torchvision ``layer{s}.{b}.*`` and
Fling ``layers.{s-1}.{b}.*``; ``downsample.0`` / ``downsample.1``; ``fc``.

Pretrained ImageNet weights for FedALC's ResNet-18 (spec §4.3, A20), on a machine with internet::

    pip install torch torchvision
    python -c "import torch, torchvision; torch.save(torchvision.models.resnet18(
        weights='IMAGENET1K_V1').state_dict(), 'resnet18_imagenet.pth')"
    python tools/convert_torchvision_resnet18.py resnet18_imagenet.pth resnet18_imagenet.msgpack

The converter (torch is needed only to read a ``.pth``; an ``.npz`` of the state_dict's arrays
works without it) transposes conv kernels OIHW -> HWIO and Linear weights [out, in] -> [in, out]
and writes the flax variables ``{"params", "batch_stats"}`` (with the 1000-way ImageNet head) as
``flax.serialization`` msgpack. Copy the file to the offline machine and point the experiment at it
(``config.model.pretrained = '/path/resnet18_imagenet.msgpack'``; the experiment pops that key
before ``get_model`` and calls :func:`load_pretrained` on its freshly initialised variables, which
keeps their randomly initialised 10-way ``head``: FedALC replaces the 1000-way fc).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, traverse_util

from fedjax_robust.models.layers import (INIT_SCHEMES, TorchBatchNorm, TorchDense, _conv_padding,
                                         check_choice, check_conv_impl, conv2d,
                                         torch_uniform_init, variance_scaling_init)

CONV_INITS = ("kaiming", "default")
LAYOUTS = ("torchvision", "fling")
STEMS = ("imagenet", "cifar")
NORMS = ("batch", "group")


class ResNetConv(nn.Module):
  """Bias-free NHWC conv with an HWIO ``kernel`` (``TorchConv``'s layout) and ResNet init (``conv_init``)."""

  features: int
  kernel_size: int
  strides: int = 1
  padding: int = 0
  conv_init: str = "kaiming"
  init_scheme: str = "torch"
  impl: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    check_conv_impl(self.impl)
    k, cin = self.kernel_size, x.shape[-1]
    if check_choice(self.conv_init, CONV_INITS, "conv_init") == "kaiming":
      init = variance_scaling_init(2.0, "fan_out", "normal")  # untruncated, std sqrt(2/(cout k^2))
    elif check_choice(self.init_scheme, INIT_SCHEMES, "init_scheme") == "torch":
      init = torch_uniform_init(k * k * cin)
    else:
      init = variance_scaling_init(1.0, "fan_in", "truncated_normal")  # flax's lecun_normal
    kernel = self.param("kernel", init, (k, k, cin, self.features), jnp.float32)
    strides, padding = (self.strides, self.strides), _conv_padding(self.padding)
    return conv2d(x, kernel, strides, padding, self.impl)


def _batch_norm(bn: TorchBatchNorm, x: jax.Array, train: bool, mask: Optional[jax.Array]) -> jax.Array:
  """``bn`` with batch statistics over the ``mask`` rows in training, running statistics otherwise."""
  return bn(x, use_running_average=not train, mask=mask)


def _norm_layer(norm: str, momentum: float, epsilon: float, num_groups: int,
                name: Optional[str] = None) -> nn.Module:
  """The normalisation layer ``norm`` names: 'batch' (``layers.TorchBatchNorm``) or 'group' (``nn.GroupNorm``)."""
  if check_choice(norm, NORMS, "norm") == "batch":
    return TorchBatchNorm(momentum=momentum, epsilon=epsilon, name=name)
  return nn.GroupNorm(num_groups=int(num_groups), epsilon=epsilon, name=name)


def _apply_norm(layer: nn.Module, x: jax.Array, train: bool, mask: Optional[jax.Array]) -> jax.Array:
  """BatchNorm: :func:`_batch_norm` (masked batch statistics in training); GroupNorm normalises each row
  by itself (no state, the same in both modes), so ``train`` and ``mask`` do not matter to it."""
  if isinstance(layer, TorchBatchNorm):
    return _batch_norm(layer, x, train, mask)
  return layer(x)


class BasicBlock(nn.Module):
  """conv3x3(strides) -> norm -> ReLU -> conv3x3 -> norm -> + shortcut -> ReLU (FedCAC spec §3.3).

  ``norm``: 'batch' (BatchNorm, default) or 'group' (GroupNorm with ``num_groups`` groups); the layers are
  named ``bn*`` either way (torchvision's ``norm_layer`` convention)."""

  features: int
  strides: int = 1
  momentum: float = 0.9
  epsilon: float = 1e-5
  conv_init: str = "kaiming"
  init_scheme: str = "torch"
  conv_impl: str = "auto"
  norm: str = "batch"
  num_groups: int = 32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: Optional[jax.Array] = None) -> jax.Array:
    def conv(k, strides, name):
      return ResNetConv(self.features, k, strides, padding=k // 2, conv_init=self.conv_init,
                        init_scheme=self.init_scheme, impl=self.conv_impl, name=name)

    def bn(y, name):
      layer = _norm_layer(self.norm, self.momentum, self.epsilon, self.num_groups, name=name)
      return _apply_norm(layer, y, train, mask)

    y = nn.relu(bn(conv(3, self.strides, "conv1")(x), "bn1"))
    y = bn(conv(3, 1, "conv2")(y), "bn2")
    if self.strides != 1 or x.shape[-1] != self.features:
      x = bn(conv(1, self.strides, "downsample_conv")(x), "downsample_bn")
    return nn.relu(y + x)


class ResNet(nn.Module):
  """BasicBlock ResNet; ``stage_sizes[i]`` blocks of width ``widths[i]`` per stage.

  The stem is ``widths[0]`` wide: ``stem='imagenet'`` (default) 7x7/2 conv pad 3 -> norm -> ReLU -> 3x3/2
  max-pool pad 1; ``stem='cifar'`` 3x3/1 conv pad 1 -> norm -> ReLU, no max-pool. Stage 1 has stride 1,
  later stages stride 2 (in their first block). ``norm='batch'`` (default; stateful, ``batch_stats``) or
  ``'group'`` (GroupNorm with ``num_groups`` groups, eps ``epsilon``; stateless).
  See the module docstring for BatchNorm, ``mask``, init and names.
  """

  num_classes: int = 10
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  widths: Sequence[int] = (64, 128, 256, 512)
  momentum: float = 0.9  # flax convention (PyTorch momentum 0.1)
  epsilon: float = 1e-5
  conv_init: str = "kaiming"
  init_scheme: str = "torch"
  conv_impl: str = "auto"
  stem: str = "imagenet"
  norm: str = "batch"
  num_groups: int = 32  # GroupNorm only

  penultimate = None

  @property
  def state_collections(self) -> tuple[str, ...]:
    """``("batch_stats",)`` with BatchNorm, ``()`` with GroupNorm."""
    return ("batch_stats",) if self.norm == "batch" else ()

  def setup(self):
    if len(self.stage_sizes) != len(self.widths) or not self.widths:
      raise ValueError(f"stage_sizes {self.stage_sizes} and widths {self.widths} must be non-empty, same length")
    check_choice(self.stem, STEMS, "stem")
    check_choice(self.norm, NORMS, "norm")
    if self.norm == "group":
      bad = sorted({int(w) for w in self.widths if int(w) % int(self.num_groups)})
      if bad:
        raise ValueError(f"GroupNorm with num_groups={self.num_groups} needs widths divisible by it; got {bad}")
    common = dict(conv_init=self.conv_init, init_scheme=self.init_scheme)
    norm = dict(momentum=self.momentum, epsilon=self.epsilon, norm=self.norm, num_groups=self.num_groups)
    if self.stem == "imagenet":
      self.conv1 = ResNetConv(int(self.widths[0]), 7, 2, padding=3, impl=self.conv_impl, **common)
    else:
      self.conv1 = ResNetConv(int(self.widths[0]), 3, 1, padding=1, impl=self.conv_impl, **common)
    self.bn1 = _norm_layer(self.norm, self.momentum, self.epsilon, self.num_groups)
    for s, (n, w) in enumerate(zip(self.stage_sizes, self.widths)):
      for b in range(int(n)):
        setattr(self, f"layer{s + 1}_{b}", BasicBlock(int(w), strides=2 if (s > 0 and b == 0) else 1,
                                                      conv_impl=self.conv_impl, **norm, **common))
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)

  @property
  def feature_dim(self) -> int:
    return int(self.widths[-1])

  def features(self, x: jax.Array, train: bool = False, mask: Optional[jax.Array] = None) -> jax.Array:
    """Global-average-pooled output of the last stage, ``[B, widths[-1]]`` (the input of ``head``)."""
    x = nn.relu(_apply_norm(self.bn1, self.conv1(x), train, mask))
    if self.stem == "imagenet":
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for s, n in enumerate(self.stage_sizes):
      for b in range(int(n)):
        x = getattr(self, f"layer{s + 1}_{b}")(x, train, mask)
    return jnp.mean(x, axis=(1, 2))

  def __call__(self, x: jax.Array, train: bool = False, mask: Optional[jax.Array] = None) -> jax.Array:
    return self.head(self.features(x, train, mask))


class ResNet18(ResNet):
  """torchvision ResNet-18 (FedALC spec §4.3): [2, 2, 2, 2] x 64/128/256/512; 11,181,642 params (C = 10)."""


class ResNet8(ResNet):
  """Fling ResNet-8 (FedCAC spec §3.3): [1, 1, 1] x 64/128/256; 1,235,274 params (C = 10), 29 tensors."""

  stage_sizes: Sequence[int] = (1, 1, 1)
  widths: Sequence[int] = (64, 128, 256)


class ResNet10(ResNet):
  """Fling ResNet-10 (FedCAC spec §3.3): [1, 1, 1, 1] x 64..512; 4,957,092 (C = 100) / 5,008,392 (C = 200)."""

  stage_sizes: Sequence[int] = (1, 1, 1, 1)


class CifarResNet18(ResNet):
  """CIFAR ResNet-18 (FedVSA spec §4.2 [R]): 3x3/1 stem conv 64 (no bias) -> norm -> ReLU, no max-pool,
  BasicBlock [2, 2, 2, 2] x 64/128/256/512 (stride 2 and a 1x1 projection shortcut at stages 2-4), global
  average pool, head Linear(512 -> C). 11,173,962 parameters with C = 10 (BatchNorm or GroupNorm: both
  have a scale and a bias per channel). 32x32: 32 -> 32 -> 16 -> 8 -> 4 before pooling.

  ``norm='group'`` (default, the spec's recommendation for JAX; stateless) uses GroupNorm with
  ``num_groups=32`` groups (2 channels per group in the 64-wide layers; ``nn.GroupNorm(32, C)`` is
  PyTorch's usual choice) and eps 1e-5 (PyTorch's GroupNorm default). The spec gives no group count;
  FedDyn's / FedDC's code swaps every BatchNorm of its ResNet-18 for ``GroupNorm(2, C)``:
  ``model.num_groups=2`` reproduces that. ``norm='batch'``: BatchNorm (``batch_stats``, masked batch
  statistics, PyTorch momentum 0.1 / eps 1e-5), as the other ResNets. Conv init ``conv_init='kaiming'``
  (torchvision's re-initialisation; ``'default'`` gives PyTorch's Conv2d default, e.g. the common
  kuangliu/pytorch-cifar ResNet). Names as torchvision's (``conv1``, ``bn1``, ``layer{s}_{b}``, ``head``).
  """

  stem: str = "cifar"
  norm: str = "group"


RESNETS: dict[str, type[ResNet]] = {"resnet18": ResNet18, "resnet8": ResNet8, "resnet10": ResNet10,
                                    "cifar_resnet18": CifarResNet18}
# The PyTorch naming each model's reference code uses.
DEFAULT_LAYOUTS = {"resnet18": "torchvision", "resnet8": "fling", "resnet10": "fling",
                   "cifar_resnet18": "torchvision"}


# ----------------------------------------------------------------------------- PyTorch names

_BLOCK = re.compile(r"layer(\d+)_(\d+)$")
_TORCH_SUBMODULE = {"downsample_conv": "downsample.0", "downsample_bn": "downsample.1", "head": "fc"}
# (collection, flax leaf) -> PyTorch tensor suffix
_TORCH_LEAF = {("params", "kernel"): "weight", ("params", "scale"): "weight", ("params", "bias"): "bias",
               ("batch_stats", "mean"): "running_mean", ("batch_stats", "var"): "running_var"}


def _torch_name(collection: str, path: tuple[str, ...], layout: str) -> str:
  """The PyTorch state_dict key of the flax leaf ``variables[collection][path...]``."""
  *modules, leaf = path
  parts = []
  for m in modules:
    block = _BLOCK.match(m)
    if block:
      s, b = int(block.group(1)), int(block.group(2))
      parts.append(f"layer{s}.{b}" if layout == "torchvision" else f"layers.{s - 1}.{b}")
    else:
      parts.append(_TORCH_SUBMODULE.get(m, m))
  if (collection, leaf) not in _TORCH_LEAF:
    raise ValueError(f"no PyTorch name for {collection}/{'/'.join(path)}")
  return ".".join(parts + [_TORCH_LEAF[collection, leaf]])


def _to_torch(array: np.ndarray, path: tuple[str, ...]) -> np.ndarray:
  """flax layout -> PyTorch layout: HWIO -> OIHW conv kernels, [in, out] -> [out, in] Dense kernels."""
  if path[-1] == "kernel":
    return np.transpose(array, (3, 2, 0, 1)) if array.ndim == 4 else np.transpose(array)
  return array


def _from_torch(array: np.ndarray, path: tuple[str, ...]) -> np.ndarray:
  if path[-1] == "kernel":
    return np.transpose(array, (2, 3, 1, 0)) if array.ndim == 4 else np.transpose(array)
  return array


def _bn_prefixes(variables: Mapping[str, Any], layout: str) -> list[str]:
  """PyTorch prefixes of the BatchNorm layers (the owners of ``num_batches_tracked``)."""
  flat = traverse_util.flatten_dict(dict(variables.get("batch_stats", {})))
  return sorted({_torch_name("batch_stats", path, layout).rsplit(".", 1)[0] for path in flat})


def torch_state_dict_from_variables(variables: Mapping[str, Any], layout: str = "torchvision",
                                    num_batches_tracked: bool = True) -> dict[str, np.ndarray]:
  """Inverse of :func:`variables_from_torch_state_dict`: flax ``{"params", "batch_stats"}`` -> a PyTorch
  state_dict of numpy arrays (``torch.from_numpy`` each to ``load_state_dict`` it). ``num_batches_tracked``
  adds each BatchNorm's counter (int64 0; flax keeps none), which a strict PyTorch load expects."""
  check_choice(layout, LAYOUTS, "layout")
  out = {}
  for collection in ("params", "batch_stats"):
    for path, value in traverse_util.flatten_dict(dict(variables.get(collection, {}))).items():
      out[_torch_name(collection, path, layout)] = np.array(_to_torch(np.asarray(value, np.float32), path))
  if num_batches_tracked:
    for prefix in _bn_prefixes(variables, layout):
      out[f"{prefix}.num_batches_tracked"] = np.array(0, np.int64)
  return out


def _resolve_model(model: Any, num_classes: int) -> tuple[ResNet, str]:
  """(module, name) from a registry name or a ResNet module."""
  if isinstance(model, ResNet):
    name = next((n for n, cls in RESNETS.items() if type(model) is cls), "resnet")
    return model.replace(num_classes=int(num_classes)) if model.num_classes != num_classes else model, name
  key = str(model).lower()
  if key not in RESNETS:
    raise ValueError(f"unknown ResNet {model!r}; expected one of {sorted(RESNETS)} or a ResNet module")
  return RESNETS[key](num_classes=int(num_classes)), key


@functools.lru_cache(maxsize=32)
def _template(module: nn.Module, input_shape: tuple[int, ...]) -> dict:
  """Shapes of ``module``'s variables, without computing anything (cached: tracing a ResNet takes ~0.3 s)."""
  x = jax.ShapeDtypeStruct((1,) + input_shape, jnp.float32)
  return jax.eval_shape(module.init, jax.random.key(0), x)


def variables_from_torch_state_dict(state_dict: Mapping[str, Any], model_name: Any, num_classes: int,
                                    drop_head: bool = True, *, key: Optional[jax.Array] = None,
                                    layout: Optional[str] = None,
                                    input_shape: Sequence[int] = (32, 32, 3)) -> dict:
  """A PyTorch ResNet state_dict (name -> array) as flax variables ``{"params", "batch_stats"}``.

  ``model_name``: 'resnet18' | 'resnet8' | 'resnet10' or a :class:`ResNet` module (its fields give the
  architecture). ``layout``: 'torchvision' (``layer1.0.conv1.weight``) or 'fling' (``layers.0.0...``);
  default: the model's reference code (torchvision for resnet18, Fling for resnet8/10).
  ``drop_head=True``: ``fc.*`` is ignored (allowed, not required) and ``head`` is freshly initialised
  for ``num_classes`` from ``key`` (default key 0), as FedALC does with ImageNet weights; else ``fc``
  becomes ``head`` and must have ``num_classes`` rows. ``*.num_batches_tracked`` counters are ignored.

  Raises ValueError on any missing or unexpected key or any shape mismatch (all of them listed).
  """
  module, name = _resolve_model(model_name, num_classes)
  layout = check_choice(layout or DEFAULT_LAYOUTS.get(name, "torchvision"), LAYOUTS, "layout")
  template = _template(module, tuple(int(d) for d in input_shape))
  wanted = {}  # torch name -> (collection, flax path, shape)
  for collection in ("params", "batch_stats"):
    for path, leaf in traverse_util.flatten_dict(dict(template.get(collection, {}))).items():
      if drop_head and path[0] == "head":
        continue
      wanted[_torch_name(collection, path, layout)] = (collection, path, leaf.shape)
  optional = {f"{p}.num_batches_tracked" for p in _bn_prefixes(template, layout)}
  if drop_head:
    optional |= {"fc.weight", "fc.bias"}
  missing = sorted(set(wanted) - set(state_dict))
  unexpected = sorted(set(state_dict) - set(wanted) - optional)
  flat: dict[str, dict] = {c: {} for c in ("params", "batch_stats") if c in template}
  mismatched = []
  for tname, (collection, path, shape) in wanted.items():
    if tname not in state_dict:
      continue
    value = _from_torch(np.asarray(state_dict[tname], np.float32), path)
    if value.shape != tuple(shape):
      mismatched.append(f"{tname}: got {np.shape(state_dict[tname])}, expected "
                        f"{_to_torch(np.zeros(shape, np.float32), path).shape}")
    flat[collection][path] = jnp.asarray(value)
  if missing or unexpected or mismatched:
    raise ValueError(f"state_dict does not fit {name} ({layout} layout, {num_classes} classes, "
                     f"drop_head={drop_head}): missing keys {missing}, unexpected keys {unexpected}, "
                     f"shape mismatches {mismatched}")
  variables = {c: traverse_util.unflatten_dict(f) for c, f in flat.items()}
  if drop_head:
    head = TorchDense(int(num_classes), init_scheme=module.init_scheme)
    key = jax.random.key(0) if key is None else key
    variables["params"]["head"] = head.init(key, jnp.zeros((1, module.feature_dim), jnp.float32))["params"]
  return variables


def read_state_dict(path: str | Path) -> dict[str, np.ndarray]:
  """A PyTorch state_dict from ``.npz`` (arrays by name; no torch needed) or ``.pth`` / ``.pt``
  (``torch.load``; torch is imported here only). A checkpoint dict holding ``state_dict`` / ``model``,
  or a whole pickled ``nn.Module``, is unwrapped."""
  path = Path(path)
  if path.suffix == ".npz":
    with np.load(path, allow_pickle=False) as data:
      return {k: np.asarray(data[k]) for k in data.files}
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(f"reading {path} needs torch (pip install torch), or convert it to .npz first") from e
  try:
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except Exception:  # a pickled nn.Module: only load files you trust
    obj = torch.load(path, map_location="cpu", weights_only=False)
  if hasattr(obj, "state_dict"):
    obj = obj.state_dict()
  for wrapper in ("state_dict", "model"):
    if isinstance(obj, Mapping) and isinstance(obj.get(wrapper), Mapping):
      obj = obj[wrapper]
  return {k: v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v) for k, v in obj.items()}


def save_variables(variables: Mapping[str, Any], path: str | Path) -> None:
  """Writes ``variables`` as ``flax.serialization`` msgpack bytes (numpy leaves)."""
  tree = jax.tree_util.tree_map(np.asarray, {k: dict(v) for k, v in variables.items()})
  Path(path).write_bytes(serialization.msgpack_serialize(tree))


def load_pretrained(path: str | Path, model: Any, variables: Mapping[str, Any], drop_head: bool = True) -> dict:
  """``variables`` with every entry except ``head`` replaced by the pretrained ones in ``path``.

  ``path``: a ``.msgpack`` written by :func:`save_variables` / ``tools/convert_torchvision_resnet18.py``
  (any flax model), or a PyTorch ``.pth`` / ``.npz`` state_dict (``model`` must then be a ResNet; see
  :func:`read_state_dict`). ``model``: the flax module (or a ``Model`` from ``make_model``).
  ``drop_head=True`` keeps ``variables['params']['head']`` (the new task's classifier); False takes the
  file's head, which must then have the same shape. Raises ValueError when the two trees differ in
  any key or shape (head aside).
  """
  module = getattr(model, "module", None) or model
  path = Path(path)
  if path.suffix in (".npz", ".pth", ".pt"):
    num_classes = getattr(module, "num_classes", 10)
    loaded = variables_from_torch_state_dict(read_state_dict(path), module, num_classes, drop_head=drop_head)
  else:
    loaded = serialization.msgpack_restore(path.read_bytes())
  out = {}
  problems = []
  for collection, tree in variables.items():
    mine = traverse_util.flatten_dict(dict(tree))
    theirs = traverse_util.flatten_dict(dict(loaded.get(collection, {})))
    keep_head = drop_head and collection == "params"
    new = {}
    for p, v in mine.items():
      if keep_head and p[0] == "head":
        new[p] = v
      elif p not in theirs:
        problems.append(f"missing {collection}/{'/'.join(p)}")
      elif np.shape(theirs[p]) != np.shape(v):
        problems.append(f"{collection}/{'/'.join(p)}: file {np.shape(theirs[p])}, model {np.shape(v)}")
      else:
        new[p] = jnp.asarray(theirs[p], jnp.asarray(v).dtype)
    problems += [f"unexpected {collection}/{'/'.join(p)}" for p in theirs
                 if p not in mine and not (keep_head and p[0] == "head")]
    out[collection] = traverse_util.unflatten_dict(new)
  problems += [f"unexpected collection {c}" for c in loaded if c not in variables]
  if problems:
    raise ValueError(f"pretrained variables in {path} do not fit the model: {problems}")
  return out


__all__ = ["ResNet", "ResNet18", "ResNet8", "ResNet10", "CifarResNet18", "BasicBlock", "ResNetConv", "RESNETS",
           "CONV_INITS", "LAYOUTS", "STEMS", "NORMS", "variables_from_torch_state_dict", "torch_state_dict_from_variables", "read_state_dict",
           "save_variables", "load_pretrained"]
