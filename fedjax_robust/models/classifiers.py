"""The classifiers of the reproduced papers, as plain flax.linen modules.

Common API of every classifier (inputs NHWC float32 ``[B, H, W, C]``; the MLP
takes any ``[B, ...]`` and flattens it):

* ``model.apply({'params': p}, x)`` or ``model.apply({'params': p}, x, train)``
  -> logits ``[B, num_classes]``.
* ``model.apply({'params': p}, x, method='features')`` -> penultimate features
  ``[B, model.feature_dim]`` (after the ReLU, i.e. exactly the input of
  ``head``). ``logits == head(features)``.
* The last layer is always the submodule ``head``: ``params['head']`` is the
  head, every other top-level entry is the base (FedRoD / FedPer / FedRep).
* ``model.penultimate`` names the layer just before ``head`` (``'fc1'`` for the
  FedCAP CNNs, ``'fc2'`` for LeNet-5 / CifarCNN, ``f'fc{len(hidden)}'`` for the
  MLP); FedCC reads ``params[model.penultimate]['kernel']``.
* ``init_scheme='torch'`` (default) reproduces PyTorch's default init;
  ``'flax'`` uses flax's (LeCun-normal kernels, zero biases).
* Conv nets (FedAvgCNN, EMNISTCNN, HARCNN, LeNet5, CifarCNN, AlexNet28) take
  ``conv_impl='xla'`` (default: ``lax.conv_general_dilated``, a grouped
  convolution under ``vmap`` over client params) or ``'patches'``
  (``conv_general_dilated_patches`` + matmul, a batched matmul under
  ``vmap``); see ``layers.TorchConv``. Params (pytree, shapes, init values
  for a key) are identical, so a run can switch it alone; outputs agree to
  float32 rounding. Config: ``model: {name: fedavg_cnn, conv_impl: patches}``.

Conv outputs are flattened in NHWC order (H, W, C), whereas PyTorch flattens
(C, H, W): the parameter counts and init distributions are identical, but to
load a PyTorch ``state_dict`` the rows of the first Dense after the flatten
must be permuted from (C, H, W) to (H, W, C) order.

Dropout: the MLP's optional ``dropout_rate`` (default 0) and AlexNet28's (0.5),
applied when ``train=True`` (the engine passes a per-step ``'dropout'`` rng).

BatchNorm: ``BNCNN`` (``bn_cnn``), a small CIFAR/MNIST CNN with BatchNorm after
each convolution. Its running statistics are the ``batch_stats`` collection
(``state_collections``), per-client state in the engine; ``__call__(x, train,
mask)`` computes training batch statistics over the rows with ``mask`` True
only (padded rows never enter them) and uses the running statistics when
``train=False``. Momentum 0.9 in flax's convention is PyTorch's
``momentum=0.1``; eps 1e-5 and the running variance's update with the unbiased
batch variance (``m / (m - 1)`` times the biased one over ``m`` real values) as
PyTorch (``layers.TorchBatchNorm``; flax's ``nn.BatchNorm`` uses the biased one).
See ``fedjax_robust/models/interface.py`` for the model interface.
"""

from __future__ import annotations

from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_robust.models.layers import Dropout, TorchBatchNorm, TorchConv, TorchDense


# How a max-pool is computed: "reduce_window" (flax's nn.max_pool), "reshape" (crop, reshape, max: the same values;
# its gradient is an elementwise compare-select instead of reduce-window + scatter, 1.58x rounds/s for FedAvgCNN
# under shard_map on the 2-core CPU, benchmarks/README.md §3) or "auto" (reshape on CPU, reduce_window elsewhere:
# not yet measured on a GPU). Environment variable FEDJAX_ROBUST_POOL overrides it.
POOL_IMPLS = ("auto", "reshape", "reduce_window")


def pool_impl() -> str:
  import os
  impl = os.environ.get("FEDJAX_ROBUST_POOL", "auto")
  if impl not in POOL_IMPLS:
    raise ValueError(f"FEDJAX_ROBUST_POOL must be one of {POOL_IMPLS}, got {impl!r}")
  if impl == "auto":
    return "reshape" if jax.default_backend() == "cpu" else "reduce_window"
  return impl


def _pool(x: jax.Array, window: tuple[int, int] = (2, 2), impl: str | None = None) -> jax.Array:
  """MaxPool2d(window) (kernel = stride = window, floor); default MaxPool2d(2). ``impl``: see ``POOL_IMPLS``.

  Both implementations give the same values; their gradients differ only where a window holds several equal
  maxima (reduce_window sends the gradient to one of them, the reshape's max splits it), which after a ReLU
  happens at 0, where the ReLU's own gradient is 0 anyway."""
  impl = impl or pool_impl()
  if impl == "reduce_window":
    return nn.max_pool(x, window_shape=window, strides=window, padding="VALID")
  b, h, w, c = x.shape
  wh, ww = window
  x = x[:, : (h // wh) * wh, : (w // ww) * ww]
  return x.reshape(b, h // wh, wh, w // ww, ww, c).max(axis=(2, 4))


def _flatten(x: jax.Array) -> jax.Array:
  return x.reshape((x.shape[0], -1))


class _TwoConvCNN(nn.Module):
  """The body the FedCAP artifact's three CNNs share.

  conv k -> ReLU -> maxpool -> conv k -> ReLU -> maxpool -> flatten -> fc1
  Dense(fc_dim) -> ReLU -> head Dense(num_classes), convolutions VALID, pools
  kernel = stride = ``pool_window`` (floor). The subclasses fix the widths,
  kernel and pool as class constants (not module fields: each is one paper's
  architecture), so ``get_model`` accepts exactly num_classes, fc_dim,
  init_scheme and conv_impl for each.
  """

  num_classes: int = 10
  fc_dim: int = 512
  init_scheme: str = "torch"
  conv_impl: str = "auto"

  conv_features = (32, 64)
  kernel_size = (5, 5)
  pool_window = (2, 2)
  penultimate = "fc1"

  def setup(self):
    self.conv1 = TorchConv(self.conv_features[0], self.kernel_size,
                           init_scheme=self.init_scheme, impl=self.conv_impl)
    self.conv2 = TorchConv(self.conv_features[1], self.kernel_size,
                           init_scheme=self.init_scheme, impl=self.conv_impl)
    self.fc1 = TorchDense(self.fc_dim, init_scheme=self.init_scheme)
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)

  @property
  def feature_dim(self) -> int:
    return self.fc_dim

  def features(self, x: jax.Array, train: bool = False) -> jax.Array:
    del train
    x = _pool(nn.relu(self.conv1(x)), self.pool_window)
    x = _pool(nn.relu(self.conv2(x)), self.pool_window)
    return nn.relu(self.fc1(_flatten(x)))

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    return self.head(self.features(x, train))


class FedAvgCNN(_TwoConvCNN):
  """PFLlib / FedCAP ``FedAvgCNN``.

  conv 5x5 32 VALID -> ReLU -> maxpool2 -> conv 5x5 64 VALID -> ReLU ->
  maxpool2 -> flatten -> fc1 Dense(fc_dim) -> ReLU -> head Dense(num_classes).

  Flatten is 1600 on 32x32xC and 1024 on 28x28xC. Parameters (10 classes):
  fc_dim=64 (FedCAP) on 32x32x3: 156,810; fc_dim=512 (PFLlib) on 32x32x3:
  878,538; fc_dim=512 on 28x28x1: 582,026.
  """


class EMNISTCNN(_TwoConvCNN):
  """FedCAP EMNIST CNN: conv 16 k5 -> pool -> conv 32 k5 -> pool -> fc1 128 -> head.

  28x28x1, 62 classes: flatten 512, 86,910 parameters.
  """

  num_classes: int = 62
  fc_dim: int = 128

  conv_features = (16, 32)


class HARCNN(_TwoConvCNN):
  """FedCAP WISDM ``HARCNN``; input NHWC ``[B, 1, 200, 3]`` (H=1, W=time, C=axes).

  conv 32 k(1,5) -> ReLU -> maxpool (1,2)/(1,2) -> conv 64 k(1,5) -> ReLU ->
  maxpool (1,2)/(1,2) -> flatten (64*1*47 = 3008) -> fc1 64 -> ReLU -> head 6.
  203,782 parameters.
  """

  num_classes: int = 6
  fc_dim: int = 64

  kernel_size = (1, 5)
  pool_window = (1, 2)


class LeNet5(nn.Module):
  """LeNet-5 (FedVSA MNIST).

  Conv(6, 5x5, pad conv1_padding) -> ReLU -> MaxPool2 -> Conv(16, 5x5 VALID) ->
  ReLU -> MaxPool2 -> fc1 120 -> ReLU -> fc2 84 -> ReLU -> head.

  With the default ``conv1_padding=2``: 28x28x1 flattens to 16*5*5 = 400
  (61,706 parameters with 10 classes); 32x32x3 flattens to 16*6*6 = 576
  (83,126 parameters). With ``conv1_padding=0`` (``CifarCNN``) 32x32x3
  flattens to 400 (62,006 parameters).
  """

  num_classes: int = 10
  conv1_padding: int = 2
  init_scheme: str = "torch"
  conv_impl: str = "auto"

  penultimate = "fc2"

  def setup(self):
    self.conv1 = TorchConv(6, (5, 5), padding=self.conv1_padding,
                           init_scheme=self.init_scheme,
                           impl=self.conv_impl)
    self.conv2 = TorchConv(16, (5, 5), init_scheme=self.init_scheme,
                           impl=self.conv_impl)
    self.fc1 = TorchDense(120, init_scheme=self.init_scheme)
    self.fc2 = TorchDense(84, init_scheme=self.init_scheme)
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)

  @property
  def feature_dim(self) -> int:
    return 84

  def features(self, x: jax.Array, train: bool = False) -> jax.Array:
    del train
    x = _pool(nn.relu(self.conv1(x)))
    x = _pool(nn.relu(self.conv2(x)))
    x = nn.relu(self.fc1(_flatten(x)))
    return nn.relu(self.fc2(x))

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    return self.head(self.features(x, train))


class CifarCNN(LeNet5):
  """FedVSA Table 7 ``Cifar_model``: LeNet-5 with an unpadded conv1.

  Conv(6,5) -> ReLU -> MaxPool2 -> Conv(16,5) -> ReLU -> MaxPool2 -> fc1 120 ->
  fc2 84 -> head. 32x32x3: flatten 400, 62,006 parameters.
  """

  conv1_padding: int = 0


class AlexNet28(nn.Module):
  """FedVSA's FMNIST AlexNet, a 28x28 adaptation (spec §4.2 [R]; not in the paper's code).

  conv1 3x3 1->64 pad 1 -> ReLU -> MaxPool2 -> conv2 3x3 ->192 pad 1 -> ReLU -> MaxPool2 -> conv3 3x3 ->384
  pad 1 -> ReLU -> conv4 3x3 ->256 pad 1 -> ReLU -> conv5 3x3 ->256 pad 1 -> ReLU -> MaxPool2 (28 -> 14 -> 7
  -> 3, floor) -> flatten 3*3*256 = 2304 -> Dropout -> fc1 1024 -> ReLU -> Dropout -> fc2 512 -> ReLU ->
  head. 28x28x1 with 10 classes: 5,140,682 parameters. ``dropout_rate`` (0.5) acts in training only
  (``train=True`` with a ``'dropout'`` rng), as the MLP's; ``features`` is fc2 after its ReLU.
  """

  num_classes: int = 10
  dropout_rate: float = 0.5
  init_scheme: str = "torch"
  conv_impl: str = "auto"

  conv_features = (64, 192, 384, 256, 256)
  pool_after = (True, True, False, False, True)
  penultimate = "fc2"

  def setup(self):
    for i, width in enumerate(self.conv_features):
      setattr(self, f"conv{i + 1}", TorchConv(width, (3, 3), padding=1, init_scheme=self.init_scheme,
                                              impl=self.conv_impl))
    self.fc1 = TorchDense(1024, init_scheme=self.init_scheme)
    self.fc2 = TorchDense(512, init_scheme=self.init_scheme)
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)
    if self.dropout_rate > 0:
      self.dropout = Dropout(self.dropout_rate)

  @property
  def feature_dim(self) -> int:
    return 512

  def _drop(self, x: jax.Array, train: bool) -> jax.Array:
    return self.dropout(x, deterministic=not train) if self.dropout_rate > 0 else x

  def features(self, x: jax.Array, train: bool = False) -> jax.Array:
    for i, pool in enumerate(self.pool_after):
      x = nn.relu(getattr(self, f"conv{i + 1}")(x))
      if pool:
        x = _pool(x)
    x = nn.relu(self.fc1(self._drop(_flatten(x), train)))
    return nn.relu(self.fc2(self._drop(x, train)))

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    return self.head(self.features(x, train))


class MnistCNN(nn.Module):
  """The LeNet-style "CNNMnist" of the FedAvg reference code and FedProto (FedALC spec §4.3, A11).

  conv1 5x5 1->10 -> max-pool 2 -> ReLU -> conv2 5x5 10->20 -> Dropout2d(0.5) -> max-pool 2 -> ReLU -> flatten
  320 -> fc1 50 -> ReLU -> Dropout(0.5) -> head 10. 28x28x1 with 10 classes: 21,840 parameters. Dropout2d
  drops whole channels (``broadcast_dims`` over H and W); both dropouts act in training only.
  """

  num_classes: int = 10
  dropout_rate: float = 0.5
  init_scheme: str = "torch"
  conv_impl: str = "auto"

  penultimate = "fc1"

  def setup(self):
    self.conv1 = TorchConv(10, (5, 5), init_scheme=self.init_scheme, impl=self.conv_impl)
    self.conv2 = TorchConv(20, (5, 5), init_scheme=self.init_scheme, impl=self.conv_impl)
    self.fc1 = TorchDense(50, init_scheme=self.init_scheme)
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)
    if self.dropout_rate > 0:
      self.channel_dropout = Dropout(self.dropout_rate, broadcast_dims=(1, 2))
      self.dropout = Dropout(self.dropout_rate)

  @property
  def feature_dim(self) -> int:
    return 50

  def features(self, x: jax.Array, train: bool = False) -> jax.Array:
    """fc1 after its ReLU (the input of ``head`` before the last dropout)."""
    x = nn.relu(_pool(self.conv1(x)))
    x = self.conv2(x)
    if self.dropout_rate > 0:
      x = self.channel_dropout(x, deterministic=not train)
    x = nn.relu(_pool(x))
    return nn.relu(self.fc1(_flatten(x)))

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    x = self.features(x, train)
    if self.dropout_rate > 0:
      x = self.dropout(x, deterministic=not train)
    return self.head(x)


class _FedCCConvNet(nn.Module):
  """The body of FedCC's two small CNNs (specs/fedcc.md §4.3): VALID convolutions with ReLU (and a 2x2 max pool
  after each when ``pool``), flatten, dropout, ``fc1`` WITHOUT activation (the penultimate layer whose
  weights FedCC compares), dropout, ``head``. Dropout is applied in training only (the official code also
  drops at test time, spec §4.3 [Q]; not reproduced)."""

  num_classes: int = 10
  fc_dim: int = 128
  dropout_rate: float = 0.5  # before fc1 (CIFAR: the paper's p = 0.5, absent in the code: 0.0)
  head_dropout_rate: float = 0.0  # between fc1 and head (fMNIST: 0.5)
  init_scheme: str = "torch"
  conv_impl: str = "auto"

  conv_features = (64, 64)
  kernel_size = (5, 5)
  pool = False
  penultimate = "fc1"

  def setup(self):
    for i, width in enumerate(self.conv_features):
      setattr(self, f"conv{i + 1}", TorchConv(width, self.kernel_size, init_scheme=self.init_scheme,
                                              impl=self.conv_impl))
    self.fc1 = TorchDense(self.fc_dim, init_scheme=self.init_scheme)
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)
    if self.dropout_rate > 0:
      self.dropout = Dropout(self.dropout_rate)
    if self.head_dropout_rate > 0:
      self.head_dropout = Dropout(self.head_dropout_rate)

  @property
  def feature_dim(self) -> int:
    return self.fc_dim

  def features(self, x: jax.Array, train: bool = False) -> jax.Array:
    """fc1's output (no activation: the input of ``head`` before its dropout)."""
    for i in range(len(self.conv_features)):
      x = nn.relu(getattr(self, f"conv{i + 1}")(x))
      if self.pool:
        x = _pool(x)
    x = _flatten(x)
    if self.dropout_rate > 0:
      x = self.dropout(x, deterministic=not train)
    return self.fc1(x)

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    x = self.features(x, train)
    if self.head_dropout_rate > 0:
      x = self.head_dropout(x, deterministic=not train)
    return self.head(x)


class FedCCFMNISTCNN(_FedCCConvNet):
  """FedCC Fashion-MNIST CNN (spec §4.3, Table VI): conv 64 k5 -> ReLU -> conv 64 k5 -> ReLU -> dropout 0.25 ->
  flatten 25600 -> fc1 128 (no activation; PLR = fc1's 25600 x 128 kernel) -> dropout 0.5 -> head 10.
  28x28x1: 3,382,346 parameters."""

  dropout_rate: float = 0.25
  head_dropout_rate: float = 0.5


class FedCCCifarCNN(_FedCCConvNet):
  """FedCC CIFAR-10 CNN (spec §4.3, Table VII): [conv 64 k3 -> ReLU -> maxpool 2] x 3 -> flatten 256 ->
  dropout 0.5 (the paper's; ``dropout_rate=0`` is the code's) -> fc1 128 (no activation; PLR = fc1's
  256 x 128 kernel) -> head 10. 32x32x3: 109,834 parameters. (CIFAR-100's LeNet is ``cifar_cnn`` with 100
  classes: 69,656 parameters at 32x32, 5,414,936 at the paper's 224x224.)"""

  conv_features = (64, 64, 64)
  kernel_size = (3, 3)
  pool = True


class MLP(nn.Module):
  """Flatten -> [Dense(h) -> (Dropout) -> ReLU] for h in hidden -> head.

  Hidden layers are named ``fc1 .. fcN``; ``hidden=()`` is multinomial logistic
  regression (``penultimate`` is then None and ``features`` is the flattened
  input). ``dropout_rate > 0`` applies dropout after each hidden Dense when
  ``train=True``, which then needs a ``'dropout'`` rng
  (``model.apply(v, x, True, rngs={'dropout': key})``). FedVSA Table 7's MLP is
  ``MLP(hidden=(64,), dropout_rate=0.5)``.
  """

  num_classes: int = 10
  hidden: Sequence[int] = (200, 200)
  dropout_rate: float = 0.0
  init_scheme: str = "torch"

  def setup(self):
    for i, h in enumerate(self.hidden):
      setattr(self, f"fc{i + 1}",
              TorchDense(int(h), init_scheme=self.init_scheme))
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)
    if self.dropout_rate > 0:
      self.dropout = Dropout(self.dropout_rate)

  @property
  def penultimate(self) -> Optional[str]:
    return f"fc{len(self.hidden)}" if len(self.hidden) else None

  @property
  def feature_dim(self) -> Optional[int]:
    """Width of ``features``; None for ``hidden=()`` (it is the input size)."""
    return int(self.hidden[-1]) if len(self.hidden) else None

  def features(self, x: jax.Array, train: bool = False) -> jax.Array:
    x = _flatten(x)
    for i in range(len(self.hidden)):
      x = getattr(self, f"fc{i + 1}")(x)
      if self.dropout_rate > 0:
        x = self.dropout(x, deterministic=not train)
      x = nn.relu(x)
    return x

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    return self.head(self.features(x, train))


class BNCNN(nn.Module):
  """Small CNN with BatchNorm: [conv 3x3 SAME (no bias) -> BatchNorm -> ReLU -> maxpool2] per width ->
  flatten -> fc1 Dense(fc_dim) -> ReLU -> head.

  The model the engine's BatchNorm support is tested with (FedAvg, FedBN); FedCAC's
  ResNets follow the same conventions. ``batch_stats`` holds each BatchNorm's
  running ``mean`` / ``var``; ``mask`` ([B] bool, training only) restricts the
  batch statistics to the real rows. 32x32x3, widths (16, 32), fc_dim 64, 10
  classes: 136,922 parameters.
  """

  num_classes: int = 10
  widths: Sequence[int] = (16, 32)
  fc_dim: int = 64
  momentum: float = 0.9  # flax convention: running = momentum * running + (1 - momentum) * batch (PyTorch 0.1)
  epsilon: float = 1e-5
  init_scheme: str = "torch"
  conv_impl: str = "auto"

  penultimate = "fc1"
  state_collections = ("batch_stats",)

  def setup(self):
    for i, w in enumerate(self.widths):
      setattr(self, f"conv{i + 1}", TorchConv(int(w), (3, 3), padding=1, use_bias=False,
                                              init_scheme=self.init_scheme, impl=self.conv_impl))
      setattr(self, f"bn{i + 1}", TorchBatchNorm(momentum=self.momentum, epsilon=self.epsilon))
    self.fc1 = TorchDense(self.fc_dim, init_scheme=self.init_scheme)
    self.head = TorchDense(self.num_classes, init_scheme=self.init_scheme)

  @property
  def feature_dim(self) -> int:
    return self.fc_dim

  def features(self, x: jax.Array, train: bool = False, mask: Optional[jax.Array] = None) -> jax.Array:
    for i in range(len(self.widths)):
      x = getattr(self, f"conv{i + 1}")(x)
      x = getattr(self, f"bn{i + 1}")(x, use_running_average=not train, mask=mask)
      x = _pool(nn.relu(x))
    return nn.relu(self.fc1(_flatten(x)))

  def __call__(self, x: jax.Array, train: bool = False, mask: Optional[jax.Array] = None) -> jax.Array:
    return self.head(self.features(x, train, mask))
