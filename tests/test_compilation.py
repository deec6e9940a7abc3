"""The engine's XLA options (fedjax_robust/compilation.py): Eigen convolutions on CPU, same numbers."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust import compilation


def _conv_loss(x, w):
  y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  return jnp.sum(jnp.tanh(y) ** 2)


def _ynn_fused_ops(hlo_text: str) -> set[str]:
  """The ops inside the computations that XLA:CPU hands to YNNPACK."""
  ops = set()
  for name in re.findall(r'kind=kCustom, calls=(%[\w.\-]+)', hlo_text):
    body = re.search(re.escape(name) + r" [^{]*\{(.*?)\n\}", hlo_text, re.S)
    ops |= set(re.findall(r"= \S+ ([a-z][\w-]*)\(", body.group(1))) if body else set()
  return ops


def test_cpu_default_moves_convolutions_out_of_ynnpack_and_keeps_the_numbers(monkeypatch):
  monkeypatch.delenv(compilation.CPU_CONV_ENV, raising=False)
  assert jax.default_backend() == "cpu"
  options = compilation.compiler_options()
  assert options is not None, "this jaxlib refused the option: see the warning logged by compilation._supported"
  x = jax.random.normal(jax.random.key(0), (10, 32, 32, 3))  # FedAvgCNN conv1 at B = 10
  w = 0.1 * jax.random.normal(jax.random.key(1), (5, 5, 3, 32))
  grad = jax.value_and_grad(_conv_loss, argnums=(0, 1))
  ours = compilation.jit(grad).lower(x, w).compile()
  xla_default = jax.jit(grad).lower(x, w).compile()
  assert "convolution" not in _ynn_fused_ops(ours.as_text())
  # The check above means something only if XLA's default does put convolutions in YNNPACK (jaxlib 0.10).
  assert "convolution" in _ynn_fused_ops(xla_default.as_text())
  for a, b in zip(jax.tree.leaves(ours(x, w)), jax.tree.leaves(xla_default(x, w))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)  # float32 summation order


def test_env_restores_xla_default_and_refuses_unknown_values(monkeypatch):
  monkeypatch.setenv(compilation.CPU_CONV_ENV, "ynnpack")
  assert compilation.compiler_options() is None
  monkeypatch.setenv(compilation.CPU_CONV_ENV, "EIGEN")
  assert compilation.compiler_options() is not None
  monkeypatch.setenv(compilation.CPU_CONV_ENV, "onednn")
  with pytest.raises(ValueError, match="FEDJAX_ROBUST_CPU_CONV"):
    compilation.compiler_options()


def test_unsupported_option_is_detected_and_dropped(caplog):
  assert not compilation._supported((("xla_cpu_experimental_ynn_fusion_type", "NOT_A_FUSION_TYPE"),))
  assert "not supported" in caplog.text


def test_an_engine_program_called_inside_another_traced_program_compiles_with_the_outer_options():
  """JAX refuses compiler_options on a nested jit; the engine's evaluation kernels are also called inside the
  scanned seeds program, so a nested call falls back to a plain jit."""
  inner = compilation.jit(lambda a: jnp.tanh(a) * 2.0)
  a = jnp.arange(6.0)
  expected = np.tanh(np.arange(6.0)) * 2.0
  np.testing.assert_allclose(inner(a), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(inner)(a), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(inner)(a[None]), expected[None], rtol=1e-6)
  carry, _ = jax.lax.scan(lambda c, _: (inner(c), None), a, None, length=2)
  np.testing.assert_allclose(carry, np.tanh(expected) * 2.0, rtol=1e-6)
  assert inner.lower(a).compile() is not None
