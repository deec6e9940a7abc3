"""The engine's XLA options (fedjax_robust/compilation.py): Eigen convolutions on CPU, same numbers."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust import compilation, flat_random


def _conv_loss(x, w):
  y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  return jnp.sum(jnp.tanh(y) ** 2)


def _same_up_to_summation_order(actual, desired, rtol: float) -> None:
  """Two convolution paths (Eigen, YNNPACK, XLA's own) sum in different orders, and how far that moves an entry
  depends on the CPU's vector width (AVX-512 or not): an entry that nearly cancels can change by more than ``rtol``
  of itself. So the tolerance is ``rtol`` of each entry plus ``rtol`` of the array's largest entry; a wrong
  convolution is off by the array's own scale."""
  actual, desired = np.asarray(actual), np.asarray(desired)
  np.testing.assert_allclose(actual, desired, rtol=rtol, atol=rtol * float(np.max(np.abs(desired))))


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
  x = flat_random.normal(jax.random.key(0), (10, 32, 32, 3))  # FedAvgCNN conv1 at B = 10
  w = 0.1 * flat_random.normal(jax.random.key(1), (5, 5, 3, 32))
  grad = jax.value_and_grad(_conv_loss, argnums=(0, 1))
  ours = compilation.jit(grad).lower(x, w).compile()
  xla_default = jax.jit(grad).lower(x, w).compile()
  assert "convolution" not in _ynn_fused_ops(ours.as_text())
  # The check above means something only if XLA's default does put convolutions in YNNPACK (jaxlib 0.10).
  assert "convolution" in _ynn_fused_ops(xla_default.as_text())
  for a, b in zip(jax.tree.leaves(ours(x, w)), jax.tree.leaves(xla_default(x, w))):
    _same_up_to_summation_order(a, b, rtol=1e-4)


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


def _grad_step(w, x):
  """One SGD step on a conv layer: its backward pass has the gradient convolutions XLA:CPU must canonicalize."""
  return w - 0.1 * jax.grad(_conv_loss, argnums=1)(x, w), _conv_loss(x, w)


def _off_eigen_convolutions(fn, *args) -> list[str]:
  """Convolutions of ``fn``'s compiled CPU program left in a layout Eigen does not take (XLA's conv
  canonicalization rewrites the entry computation only, so a gradient convolution traced inside a loop body keeps
  JAX's ``f01b_i01o->01bf`` form and runs on the naive emitter's path)."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  labels = re.findall(r"convolution\(.*?dim_labels=([^,\s]+)", text)
  assert labels, "no convolution in the program"
  return [label for label in labels if label != "b01f_01io->b01f"]


def test_full_unroll_of_one_step_is_a_plain_call_not_a_loop():
  """JAX turns ``unroll=True`` on a length-1 scan into a rolled one-trip while loop, whose gradient convolutions
  XLA:CPU leaves on its slow path (one ResNet-8 step 7x slower); ``compilation.scan`` / ``fori_loop`` call the
  body instead, with the same numbers, and leave every other case to JAX."""
  x = flat_random.normal(jax.random.key(0), (1, 4, 8, 8, 3))
  w = 0.1 * flat_random.normal(jax.random.key(1), (3, 3, 3, 4))
  ours = lambda w, x: compilation.scan(_grad_step, w, x, unroll=True)
  jaxs = lambda w, x: jax.lax.scan(_grad_step, w, x, unroll=True)
  assert _off_eigen_convolutions(jaxs, w, x), "JAX now unrolls a one-step scan itself: compilation.scan can go"
  assert not _off_eigen_convolutions(ours, w, x)
  for a, b in zip(jax.tree.leaves(jax.jit(ours)(w, x)), jax.tree.leaves(jax.jit(jaxs)(w, x))):
    assert a.shape == b.shape
    _same_up_to_summation_order(a, b, rtol=1e-6)
  # Longer scans and rolled ones are JAX's own.
  x3 = flat_random.normal(jax.random.key(2), (3, 4, 8, 8, 3))
  assert not _off_eigen_convolutions(lambda w, x: compilation.scan(_grad_step, w, x, unroll=True), w, x3)
  assert _off_eigen_convolutions(lambda w, x: compilation.scan(_grad_step, w, x, unroll=1), w, x3)
  _same_up_to_summation_order(compilation.scan(_grad_step, w, x3, unroll=True)[0],
                              jax.lax.scan(_grad_step, w, x3)[0], rtol=1e-5)
  body = lambda i, w: _grad_step(w, x[0] * (i + 1))[0]
  assert _off_eigen_convolutions(lambda w: jax.lax.fori_loop(0, 1, body, w, unroll=True), w)
  assert not _off_eigen_convolutions(lambda w: compilation.fori_loop(0, 1, body, w, unroll=True), w)
  _same_up_to_summation_order(compilation.fori_loop(2, 3, body, w, unroll=True),
                              jax.lax.fori_loop(2, 3, body, w), rtol=1e-5)


def test_one_step_local_training_of_a_conv_net_keeps_its_convolutions_on_eigen():
  """The engine's local SGD with one step (one batch, one epoch: FedCAC's reduced runs, the FedCC backdoor's
  D_mal pass) unrolled on the CPU: every convolution in the layout XLA:CPU hands to Eigen, same numbers."""
  import optax
  from fedjax_robust.client import ClientData, LocalTrainSpec, local_train
  w = 0.1 * flat_random.normal(jax.random.key(1), (3, 3, 3, 4))
  data = ClientData(flat_random.normal(jax.random.key(0), (8, 8, 8, 3)), jnp.zeros(8, jnp.int32), jnp.int32(8))
  loss = lambda p, batch: (_conv_loss(batch.x, p), batch.model_state)
  opt = optax.sgd(0.1)
  train = lambda p, unroll: local_train(loss, opt, p, opt.init(p), data, jax.random.key(2),
                                        LocalTrainSpec(epochs=1, batch_size=8, unroll=unroll), {}).params
  assert not _off_eigen_convolutions(lambda p: train(p, True), w)
  _same_up_to_summation_order(jax.jit(lambda p: train(p, True))(w), jax.jit(lambda p: train(p, 1))(w), rtol=1e-6)


def test_canonical_conv_keeps_a_rolled_loops_gradient_convolutions_on_eigen():
  """The root fix of the trap above: ``conv_impl='canonical'`` (the CPU default, ``models/layers.py``) writes the
  gradient convolutions in Eigen's order itself, so a ROLLED scan of SGD steps compiles with no convolution off
  Eigen (the ``xla`` form leaves two of them off) and gives the same parameters as JAX's unrolled gradient."""
  from fedjax_robust.models.layers import conv_canonical
  x = flat_random.normal(jax.random.key(0), (3, 4, 8, 8, 3))
  w = 0.1 * flat_random.normal(jax.random.key(1), (3, 3, 3, 4))
  canonical_loss = lambda x, w: jnp.sum(jnp.tanh(conv_canonical(x, w, (1, 1), "VALID")) ** 2)
  canonical_step = lambda w, x: (w - 0.1 * jax.grad(canonical_loss, argnums=1)(x, w), None)
  rolled = lambda w, x: jax.lax.scan(canonical_step, w, x)[0]
  assert _off_eigen_convolutions(lambda w, x: jax.lax.scan(_grad_step, w, x)[0], w, x)
  assert not _off_eigen_convolutions(rolled, w, x)
  np.testing.assert_array_equal(np.asarray(jax.jit(rolled)(w, x)),
                                np.asarray(jax.jit(lambda w, x: compilation.scan(_grad_step, w, x, unroll=True)[0])(w, x)))


def test_has_conv_keys_on_four_dimensional_parameters():
  assert compilation.has_conv({"dense": {"kernel": jnp.zeros((3, 2))}, "conv": {"kernel": jnp.zeros((3, 3, 1, 2))}})
  assert not compilation.has_conv({"dense": {"kernel": jnp.zeros((3, 2)), "bias": jnp.zeros(2)}})
  assert not compilation.has_conv({})


def test_map_of_one_element_is_a_plain_call_and_equals_lax_map():
  """Robust evaluation attacks its rows batch by batch with ``compilation.map``: one batch (the reduced runs'
  500 rows) must not be a one-trip loop whose gradient convolutions leave Eigen."""
  w = 0.1 * flat_random.normal(jax.random.key(1), (3, 3, 3, 4))
  f = lambda x: _grad_step(w, x)
  for n in (1, 3):
    xs = flat_random.normal(jax.random.key(n), (n, 4, 8, 8, 3))
    for a, b in zip(jax.tree.leaves(compilation.map(f, xs)), jax.tree.leaves(jax.lax.map(f, xs))):
      assert a.shape == b.shape
      _same_up_to_summation_order(a, b, rtol=1e-5)
  x1 = flat_random.normal(jax.random.key(1), (1, 4, 8, 8, 3))
  assert _off_eigen_convolutions(lambda x: jax.lax.map(f, x), x1)
  assert not _off_eigen_convolutions(lambda x: compilation.map(f, x), x1)


def test_attack_loops_unroll_on_cpu_for_conv_nets_only_and_keep_their_numbers(monkeypatch):
  from fedjax_robust.adversarial import attacks
  assert attacks.attack_unroll(conv=True) is True and attacks.attack_unroll(conv=False) == 1
  params = {"w": 0.3 * flat_random.normal(jax.random.key(1), (3, 3, 1, 4)), "d": flat_random.normal(jax.random.key(2),
                                                                                                      (144, 3))}
  logits = lambda p, x: jnp.tanh(jax.lax.conv_general_dilated(
      x, p["w"], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))).reshape(x.shape[0], -1) @ p["d"]
  x = flat_random.uniform(jax.random.key(3), (6, 8, 8, 1))
  y = jnp.arange(6) % 3
  run = lambda: (attacks.pgd(logits, params, x, y, jax.random.key(4), attacks.LinfParams(0.1, 0.02, 3)),
                 attacks.cw_l2(logits, params, x, y, None, attacks.CWParams(c=5.0, steps=10, lr=0.05)))
  unrolled = jax.jit(run)()
  assert not _off_eigen_convolutions(lambda p: attacks.cw_l2(logits, p, x, y, None, attacks.CWParams(steps=10)),
                                     params)
  monkeypatch.setenv("FEDJAX_ROBUST_ATTACK_UNROLL", "false")
  rolled = jax.jit(run)()
  for a, b in zip(unrolled, rolled):
    _same_up_to_summation_order(a, b, rtol=1e-5)
