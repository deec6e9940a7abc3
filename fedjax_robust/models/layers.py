"""Dense and Conv layers with PyTorch's default initialisation.

PyTorch initialises ``nn.Linear`` / ``nn.Conv2d`` weights with
``kaiming_uniform_(a=sqrt(5))``, which is ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
(the same as ``nn.initializers.variance_scaling(1/3, 'fan_in', 'uniform')``),
and biases with ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``. Flax's ``bias_init``
receives no fan-in, so these layers create their own parameters; fan-in is read
from the input (``in_features`` for Dense, ``kh * kw * in_channels`` for Conv).

Parameter names and layouts are exactly those of ``flax.linen.Dense`` /
``flax.linen.Conv``: ``kernel`` ``[in, out]`` / ``[kh, kw, in, out]`` (HWIO) and
``bias`` ``[out]``, so pytrees are interchangeable with stock flax layers.

``init_scheme='flax'`` gives flax's defaults instead (LeCun-normal kernel, zero
bias). Everything is float32.

``TorchConv(impl=...)`` picks how the convolution is computed; the parameters
(names, shapes, init values for a given key) do not depend on it:

* ``'auto'`` (default): ``'canonical'`` on the CPU, ``'folded'`` on a GPU, ``'xla'`` elsewhere
  (:func:`resolve_conv_impl`).
* ``'xla'``: one ``lax.conv_general_dilated``, differentiated by JAX. Under ``jax.vmap``
  over per-client kernels it lowers to a grouped convolution.
* ``'canonical'``: the same forward convolution with a custom gradient made of two more convolutions in the
  dimension order XLA:CPU's Eigen kernels take (:func:`conv_canonical`), so a conv net's training step runs fast
  inside a rolled ``lax.scan`` on the CPU (3.0 ms against 13.4 ms a step of FedALC's CNN-MNIST; unrolled 3.3) and
  loops need not be unrolled. Same numbers as ``'xla'`` (equal to the bit in the tests).
* ``'folded'``: the forward convolution and input gradient of ``'xla'``, and a kernel gradient that under
  ``jax.vmap`` over clients is the gradient of ONE grouped convolution of all clients (``batch_group_count = C``;
  :func:`conv_folded`). Same numbers to float32 rounding. On an H200 the engine's FedAvgCNN step ran 2.5x faster
  this way (0.80 against 1.98 ms; the stacked model pair 1.37 against 1.56), so ``auto`` takes it on a GPU; on
  XLA:CPU that convolution is 7x slower.
* ``'patches'``: ``lax.conv_general_dilated_patches`` (im2col; it has no
  weights, so under ``vmap`` the client axis folds into the batch) followed by
  a matmul against the kernel reshaped to ``[cin*kh*kw, cout]`` (a batched
  matmul under ``vmap``). Same math, different kernels. The patch
  extraction is itself a grouped conv with a one-hot kernel
  (``feature_group_count = cin``), forward and backward. On a 2-core CPU the
  vmapped FedAvgCNN step in a ``lax.scan`` (unroll 1) was 3.3x faster this way,
  but the CPU default strategy (``shard_map``, unrolled) was 3x slower
  (``benchmarks/README.md``, "Per-step latency"); on GPU it is unmeasured.

``TorchBatchNorm`` is PyTorch's ``BatchNorm2d`` / ``BatchNorm1d`` over the last (feature) axis with flax's
names (params ``scale`` / ``bias``, ``batch_stats`` ``mean`` / ``var``), a row ``mask`` for padded batches,
and PyTorch's running-variance update (the unbiased batch variance; flax's ``nn.BatchNorm`` averages in the
biased one).

All convolution implementations run at the default matmul/conv precision (TF32 may be used on recent
NVIDIA GPUs for either); they agree to float32 rounding under
``jax.default_matmul_precision('highest')``.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from fedjax_robust import flat_random

INIT_SCHEMES = ("torch", "flax")
CONV_IMPLS = ("auto", "xla", "patches", "canonical", "folded")
# What ``auto`` is per backend (measured; ``jax.default_backend()`` says "gpu" for CUDA and ROCm, the platform names
# are listed too); any other backend (TPU) gets ``xla``.
AUTO_CONV_IMPL = {"cpu": "canonical", "gpu": "folded", "cuda": "folded", "rocm": "folded"}

Padding = Union[str, int, Sequence[int], Sequence[Sequence[int]]]


# Every initialiser and dropout mask here draws through ``flat_random``: the numbers of ``jax.random`` / flax's
# initialisers and ``nn.Dropout`` (equal to the bit in the tests), compiled several times faster on XLA:CPU.
def torch_uniform_init(fan_in: int):
  """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``: PyTorch's default weight and bias init."""
  bound = 1.0 / math.sqrt(fan_in)

  def init(key, shape, dtype=jnp.float32):
    return flat_random.uniform(key, shape, dtype, -bound, bound)

  return init


def check_choice(value: str, allowed: Sequence[str], what: str) -> str:
  """``value`` when it is one of ``allowed``, else a ValueError naming ``what`` and the choices."""
  if value not in allowed:
    raise ValueError(f"unknown {what} {value!r}; expected one of {tuple(allowed)}")
  return value


VARIANCE_SCALING_MODES = ("fan_in", "fan_out")
VARIANCE_SCALING_DISTRIBUTIONS = ("normal", "truncated_normal")


def variance_scaling_init(scale: float, mode: str, distribution: str):
  """``nn.initializers.variance_scaling(scale, mode, distribution)`` with its default axes (a kernel's last two
  axes are (in, out): Dense's ``[in, out]``, Conv's HWIO), drawn through :mod:`flat_random`: the same numbers.
  ``(1, "fan_in", "truncated_normal")`` is flax's ``lecun_normal``, ``(2, "fan_out", "normal")`` PyTorch's
  ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``. The fans and the constants are computed as jax does, in
  the same order, so that the float32 results match to the bit."""
  check_choice(mode, VARIANCE_SCALING_MODES, "mode")
  check_choice(distribution, VARIANCE_SCALING_DISTRIBUTIONS, "distribution")

  def init(key, shape, dtype=jnp.float32):
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2:
      raise ValueError(f"variance scaling needs a kernel of two or more axes, got shape {shape}")
    receptive_field = math.prod(shape) / shape[-2] / shape[-1]
    fan = (shape[-2] if mode == "fan_in" else shape[-1]) * receptive_field
    variance = jnp.array(scale / fan, dtype=dtype)
    if distribution == "normal":
      return flat_random.normal(key, shape, dtype) * jnp.sqrt(variance)
    stddev = jnp.sqrt(variance) / jnp.array(.87962566103423978, dtype)  # std of N(0, 1) truncated to (-2, 2)
    return flat_random.truncated_normal(key, -2, 2, shape, dtype) * stddev

  return init


def _initializers(init_scheme: str, fan_in: int):
  """(kernel_init, bias_init) for the given scheme and fan-in."""
  if init_scheme == "torch":
    return torch_uniform_init(fan_in), torch_uniform_init(fan_in)
  if init_scheme == "flax":
    return variance_scaling_init(1.0, "fan_in", "truncated_normal"), nn.initializers.zeros_init()
  raise ValueError(
      f"unknown init_scheme {init_scheme!r}; expected one of {INIT_SCHEMES}")


class TorchDense(nn.Module):
  """``y = x @ kernel + bias`` with PyTorch (default) or flax initialisation."""

  features: int
  use_bias: bool = True
  init_scheme: str = "torch"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    fan_in = x.shape[-1]
    kernel_init, bias_init = _initializers(self.init_scheme, fan_in)
    kernel = self.param("kernel", kernel_init, (fan_in, self.features),
                        jnp.float32)
    y = lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    if self.use_bias:
      bias = self.param("bias", bias_init, (self.features,), jnp.float32)
      y = y + bias
    return y


def _conv_padding(padding: Padding):
  """'VALID'/'SAME', an int p (p on every side), (ph, pw) or ((lo, hi), (lo, hi))."""
  if isinstance(padding, str):
    return padding.upper()
  if isinstance(padding, int):
    return ((padding, padding), (padding, padding))
  padding = tuple(padding)
  if len(padding) != 2:
    raise ValueError(f"2-D padding expected, got {padding!r}")
  return tuple((p, p) if isinstance(p, int) else tuple(p) for p in padding)


def check_conv_impl(impl: str) -> str:
  """Returns ``impl`` if it is one of :data:`CONV_IMPLS`, else raises ValueError."""
  if impl not in CONV_IMPLS:
    raise ValueError(
        f"unknown conv impl {impl!r}; expected one of {CONV_IMPLS}")
  return impl


def resolve_conv_impl(impl: str, backend: str | None = None) -> str:
  """``auto`` -> ``canonical`` on the CPU (its gradient keeps XLA:CPU's Eigen kernels inside loops,
  :func:`conv_canonical`), ``folded`` on a GPU (every client's kernel gradient as one grouped convolution,
  :func:`conv_folded`: 2.5x the per-client form's step on an H200, ``benchmarks/README.md`` "Per-step latency"),
  ``xla`` on other backends (TPU: neither form measured there); any other impl is itself."""
  if check_conv_impl(impl) != "auto":
    return impl
  return AUTO_CONV_IMPL.get(backend or jax.default_backend(), "xla")


def conv_patches(x: jax.Array, kernel: jax.Array, strides, padding) -> jax.Array:
  """NHWC x HWIO convolution as im2col patches + one matmul.

  ``conv_general_dilated_patches`` orders each patch's features as
  (cin, kh, kw) (input channel major), so the HWIO kernel is transposed to
  (cin, kh, kw, cout) before the reshape to ``[cin*kh*kw, cout]``.
  """
  kh, kw, cin, cout = kernel.shape
  patches = lax.conv_general_dilated_patches(
      x, (kh, kw), window_strides=tuple(strides), padding=padding,
      dimension_numbers=("NHWC", "HWIO", "NHWC"))  # [N, Ho, Wo, cin*kh*kw]
  kmat = jnp.transpose(kernel, (2, 0, 1, 3)).reshape(cin * kh * kw, cout)
  return lax.dot_general(patches, kmat, (((3,), (0,)), ((), ())))


_NHWC = ("NHWC", "HWIO", "NHWC")


def _explicit_pads(padding, x_hw, k_hw, strides) -> tuple[tuple[int, int], ...]:
  if isinstance(padding, str):
    return tuple(tuple(p) for p in lax.padtype_to_pads(x_hw, k_hw, strides, padding))
  return tuple((int(lo), int(hi)) for lo, hi in padding)


def _plain_conv(x, kernel, strides, pads, groups: int = 1):
  return lax.conv_general_dilated(x, kernel, strides, pads, dimension_numbers=_NHWC, feature_group_count=groups)


def _conv_fwd(x, kernel, strides, pads):
  """Forward rule of the custom-VJP convolutions below: the plain convolution, with ``(x, kernel)`` kept."""
  return _plain_conv(x, kernel, strides, pads), (x, kernel)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_canonical(x, kernel, strides, pads):
  return _plain_conv(x, kernel, strides, pads)


def _conv_canonical_bwd(strides, pads, residuals, g):
  """Both cotangents as NHWC x HWIO convolutions: the input's is the transposed convolution (``g`` dilated by the
  strides, the kernel flipped with its channel axes swapped); the kernel's correlates ``x`` with ``g`` with the
  batch and channel axes exchanged (``x`` as ``[cin, H, W, batch]``, ``g`` as the kernel ``[Ho, Wo, batch,
  cout]``, dilated by the strides), then moved back to HWIO."""
  x, kernel = residuals
  k_hw, x_hw, g_hw = kernel.shape[:2], x.shape[1:3], g.shape[1:3]
  dx_pads, dk_pads = [], []
  for (lo, _), k, n, m, s in zip(pads, k_hw, x_hw, g_hw, strides):
    reach = (m - 1) * s + 1  # the dilated cotangent's extent
    dx_pads.append((k - 1 - lo, n - reach + lo))  # output n rows
    dk_pads.append((lo, k - n - lo + reach - 1))  # output k rows (negative: rows the forward pass never read)
  flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)
  dx = lax.conv_general_dilated(g, flipped, (1, 1), dx_pads, lhs_dilation=strides, dimension_numbers=_NHWC)
  dk = lax.conv_general_dilated(x.transpose(3, 1, 2, 0), g.transpose(1, 2, 0, 3), (1, 1), dk_pads,
                                rhs_dilation=strides, dimension_numbers=_NHWC)
  return dx, dk.transpose(1, 2, 0, 3)


_conv_canonical.defvjp(_conv_fwd, _conv_canonical_bwd)


def conv_canonical(x: jax.Array, kernel: jax.Array, strides, padding) -> jax.Array:
  """NHWC x HWIO convolution (``lax.conv_general_dilated``'s values) whose gradient is computed by two more
  NHWC x HWIO convolutions and transposes, instead of JAX's transposed-dimension convolutions.

  Why (jax-ml/jax#12868): XLA:CPU runs a convolution on its Eigen kernels only in the dimension order
  ``b01f_01io->b01f``. JAX writes the gradient convolutions in other orders (``f01b_i01o->01bf`` for the
  kernel's, ``b01f_01oi->b01f`` for the input's) and XLA:CPU rewrites them ("conv canonicalization") in a
  program's entry computation only, so inside a ``lax.scan`` / ``while`` body they fell to the naive emitter:
  local SGD of FedALC's CNN-MNIST at batch 32 took 13.4 ms a step rolled against 3.3 ms unrolled. In this form a
  rolled step takes 3.0 ms (``benchmarks/conv_loop.py``, ``benchmarks/README.md`` §5), so loops need not be
  unrolled and compile in seconds. Same numbers as ``lax.conv_general_dilated``'s own gradient
  (``tests/test_models.py``); forward-mode differentiation (``jax.jvp``) is not defined for it.
  """
  strides = tuple(int(s) for s in strides)
  pads = _explicit_pads(padding, x.shape[1:3], kernel.shape[:2], strides)
  return _conv_canonical(x, kernel, strides, pads)


def _kernel_grad(x, g, kernel_shape, strides, pads, groups: int = 1):
  """JAX's own cotangent of the kernel of ``_plain_conv(x, kernel)`` for the output cotangent ``g``."""
  zeros = jnp.zeros(kernel_shape, x.dtype)
  return jax.vjp(lambda k: _plain_conv(x, k, strides, pads, groups), zeros)[1](g)[0]


def _fold_clients(a):
  """``[C, B, H, W, ch]`` -> ``[B, H, W, C*ch]``: the client axis folded into the channels, client-major."""
  c, b, h, w, ch = a.shape
  return jnp.moveaxis(a, 0, 3).reshape(b, h, w, c * ch)


def _folded_kernel_grad(kernel_shape, strides, pads):
  """The kernel cotangent as a ``custom_vmap`` function: unbatched, JAX's own; batched over clients (``vmap``), the
  kernel cotangent of ONE grouped convolution with the clients folded into the channels, which JAX writes with
  ``batch_group_count = C`` (the weight-gradient form a GPU's grouped-convolution kernels take), instead of the
  ``vmap`` of the per-client form (feature-grouped over the transposed batch axis, with transposes of the
  activations and cotangents around it)."""
  @jax.custom_batching.custom_vmap
  def kernel_grad(x, g):
    return _kernel_grad(x, g, kernel_shape, strides, pads)

  @kernel_grad.def_vmap
  def rule(axis_size, in_batched, x, g):
    x, g = (a if batched else jnp.broadcast_to(a, (axis_size,) + a.shape) for a, batched in zip((x, g), in_batched))
    kh, kw, cin, cout = kernel_shape
    dk = _kernel_grad(_fold_clients(x), _fold_clients(g), (kh, kw, cin, axis_size * cout), strides, pads,
                      groups=axis_size)
    return jnp.moveaxis(dk.reshape(kh, kw, cin, axis_size, cout), 3, 0), True

  return kernel_grad


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_folded(x, kernel, strides, pads):
  return _plain_conv(x, kernel, strides, pads)


def _conv_folded_bwd(strides, pads, residuals, g):
  x, kernel = residuals
  dx = jax.vjp(lambda a: _plain_conv(a, kernel, strides, pads), x)[1](g)[0]
  return dx, _folded_kernel_grad(kernel.shape, strides, pads)(x, g)


_conv_folded.defvjp(_conv_fwd, _conv_folded_bwd)


def conv_folded(x: jax.Array, kernel: jax.Array, strides, padding) -> jax.Array:
  """NHWC x HWIO convolution (``lax.conv_general_dilated``'s values and gradients) whose kernel gradient, under
  ``jax.vmap`` over per-client kernels, is computed as the gradient of one grouped convolution of all clients.

  Why: the engine differentiates each client's loss and vmaps the result over clients (``vmap(grad)``), and JAX's
  batching of the per-client kernel gradient gives a feature-grouped convolution over transposed activations; the
  same gradient taken through the grouped convolution (``grad`` of the clients' summed losses, as the stacked
  model pair and ``benchmarks/step_latency.py``'s ``grouped`` formulation do) is one ``batch_group_count = C``
  convolution. On an H200 the hand-grouped step ran 0.77 ms against the engine's 1.41 ms (``benchmarks/README.md``,
  "Per-step latency"); this impl brings that form to every conv net without rewriting it: the engine's step 0.80
  against 1.98 ms, a 100-round FedCAP run 24.1 against 25.7 s (``benchmarks/gpu_fedcap_speed.sh``, 2026-11-28), the
  GPU default since. Input gradients and the forward pass are JAX's; forward-mode differentiation (``jax.jvp``) is
  not defined for it.
  """
  strides = tuple(int(s) for s in strides)
  pads = _explicit_pads(padding, x.shape[1:3], kernel.shape[:2], strides)
  return _conv_folded(x, kernel, strides, pads)


def conv2d(x: jax.Array, kernel: jax.Array, strides, padding, impl: str) -> jax.Array:
  """The NHWC x HWIO convolution of every conv layer, computed the way ``impl`` (:data:`CONV_IMPLS`) says."""
  impl = resolve_conv_impl(impl)
  if impl == "patches":
    return conv_patches(x, kernel, strides, padding)
  if impl == "canonical":
    return conv_canonical(x, kernel, strides, padding)
  if impl == "folded":
    return conv_folded(x, kernel, strides, padding)
  return _plain_conv(x, kernel, tuple(strides), padding)


class TorchConv(nn.Module):
  """2-D convolution, NHWC input, HWIO kernel, PyTorch (default) or flax init.

  ``padding`` is 'VALID' (PyTorch ``padding=0``), 'SAME', an int ``p``
  (PyTorch ``padding=p``), ``(ph, pw)`` or ``((top, bottom), (left, right))``.
  ``impl``: ``'xla'`` (``lax.conv_general_dilated``) or ``'patches'``
  (im2col + matmul, :func:`conv_patches`); parameters are identical.
  """

  features: int
  kernel_size: Sequence[int]
  strides: Sequence[int] = (1, 1)
  padding: Padding = "VALID"
  use_bias: bool = True
  init_scheme: str = "torch"
  impl: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    check_conv_impl(self.impl)
    if x.ndim != 4:
      raise ValueError(f"TorchConv expects NHWC input, got shape {x.shape}")
    kh, kw = self.kernel_size
    cin = x.shape[-1]
    fan_in = kh * kw * cin
    kernel_init, bias_init = _initializers(self.init_scheme, fan_in)
    kernel = self.param("kernel", kernel_init, (kh, kw, cin, self.features),
                        jnp.float32)
    y = conv2d(x, kernel, self.strides, _conv_padding(self.padding), self.impl)
    if self.use_bias:
      bias = self.param("bias", bias_init, (self.features,), jnp.float32)
      y = y + bias
    return y


class TorchBatchNorm(nn.Module):
  """Batch normalisation over every axis but the last, as PyTorch's ``BatchNorm{1,2}d`` in training and evaluation.

  Training (``use_running_average=False``) normalises with the batch mean and biased variance of the rows where
  ``mask`` is True (``mask``: ``[B]`` bool, one flag per row of ``x``; padded rows never enter the statistics) and
  updates the running statistics as PyTorch does: ``running = momentum * running + (1 - momentum) * batch`` with
  flax's ``momentum`` convention (0.9 = PyTorch's 0.1) and, for the variance, the *unbiased* batch variance
  ``var * m / (m - 1)`` over the ``m`` real values per feature (FedCAC spec §3.3; flax's ``nn.BatchNorm`` uses the
  biased one, which at a batch of 10 rows is a 10% smaller update). Evaluation uses the running statistics. A batch
  with no real value leaves the running statistics unchanged (the engine's padded no-op steps).

  Same variables as ``flax.linen.BatchNorm`` (``params``: ``scale`` 1, ``bias`` 0; ``batch_stats``: ``mean`` 0,
  ``var`` 1, shape ``[features]``), so checkpoints and the torchvision converter are unchanged.
  """

  momentum: float = 0.9
  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x: jax.Array, use_running_average: bool = True, mask=None) -> jax.Array:
    features = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (features,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (features,), jnp.float32)
    ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((features,), jnp.float32))
    ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((features,), jnp.float32))
    if use_running_average:
      mean, var = ra_mean.value, ra_var.value
    else:
      axes = tuple(range(x.ndim - 1))
      valid = jnp.ones(x.shape, bool) if mask is None else jnp.broadcast_to(
          jnp.asarray(mask, bool).reshape((-1,) + (1,) * (x.ndim - 1)), x.shape)
      count = jnp.sum(valid, axis=axes).astype(jnp.float32)
      mean = jnp.sum(jnp.where(valid, x, 0.0), axis=axes) / jnp.maximum(count, 1.0)
      var = jnp.sum(jnp.where(valid, jnp.square(x - mean), 0.0), axis=axes) / jnp.maximum(count, 1.0)
      if not self.is_initializing():
        m = self.momentum
        any_real = count > 0
        unbiased = var * count / jnp.maximum(count - 1.0, 1.0)
        ra_mean.value = jnp.where(any_real, m * ra_mean.value + (1.0 - m) * mean, ra_mean.value)
        ra_var.value = jnp.where(any_real, m * ra_var.value + (1.0 - m) * unbiased, ra_var.value)
    return (x - mean) * lax.rsqrt(var + self.epsilon) * scale + bias


class Dropout(nn.Module):
  """``flax.linen.Dropout`` with its mask drawn by :func:`flat_random.bernoulli`: the same fields, the same
  ``dropout`` rng stream and the same masks for the same key (tested to the bit), and a mask that compiles several
  times faster on XLA:CPU. Inputs scaled by ``1 / (1 - rate)`` where kept, zero elsewhere; ``broadcast_dims``
  share one mask value along those axes (``(1, 2)`` of NHWC: PyTorch's ``Dropout2d``, whole channels)."""

  rate: float
  broadcast_dims: Sequence[int] = ()
  deterministic: Optional[bool] = None
  rng_collection: str = "dropout"

  @nn.compact
  def __call__(self, inputs: jax.Array, deterministic: Optional[bool] = None,
               rng: Optional[jax.Array] = None) -> jax.Array:
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:  # no division by a zero keep probability (its gradient would be NaN)
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    mask_shape = list(inputs.shape)
    for dim in self.broadcast_dims:
      mask_shape[dim] = 1
    mask = jnp.broadcast_to(flat_random.bernoulli(rng, keep_prob, mask_shape), inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
