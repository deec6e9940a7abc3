"""Client/server optimizers from config (fedjax_robust/optim.py): hand-computed steps for gradient clipping."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust.optim import make_optimizer, optimizer_from_config


def _step(opt, params, grads):
  updates, _ = opt.update(grads, opt.init(params), params)
  return {k: np.asarray(v) for k, v in updates.items()}


def test_grad_clip_norm_rescales_the_raw_gradient_to_the_global_norm_before_weight_decay():
  # global norm of (3, 4) and (0,) is 5; clipped to 1 it is (0.6, 0.8); decay 0.1 x params (1, 1) and (2,) is
  # added after clipping (PyTorch's clip_grad_norm_ before optimizer.step), then sgd(lr=0.5) negates and scales.
  params = {"a": jnp.array([1.0, 1.0]), "b": jnp.array([2.0])}
  grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([0.0])}
  up = _step(make_optimizer("sgd", 0.5, weight_decay=0.1, grad_clip_norm=1.0), params, grads)
  np.testing.assert_allclose(up["a"], [-0.5 * (0.6 + 0.1), -0.5 * (0.8 + 0.1)], rtol=1e-6)
  np.testing.assert_allclose(up["b"], [-0.5 * 0.2], rtol=1e-6)


def test_a_gradient_inside_the_clip_norm_and_the_default_zero_leave_the_step_unchanged():
  params = {"a": jnp.array([1.0, 1.0])}
  grads = {"a": jnp.array([3.0, 4.0])}
  plain = _step(make_optimizer("sgd", 0.1), params, grads)
  np.testing.assert_allclose(plain["a"], [-0.3, -0.4], rtol=1e-6)
  np.testing.assert_allclose(_step(make_optimizer("sgd", 0.1, grad_clip_norm=5.0), params, grads)["a"], plain["a"],
                             rtol=1e-6)
  np.testing.assert_allclose(_step(make_optimizer("sgd", 0.1, grad_clip_norm=0.0), params, grads)["a"], plain["a"],
                             rtol=1e-6)


def test_adam_and_adamw_see_the_clipped_gradient():
  params = {"a": jnp.array([1.0, 1.0])}
  # Adam's first step is lr * g / (|g| + eps) per coordinate, the same for g and any positive rescaling of g, so
  # compare against Adam fed the already-clipped gradient with a large eps where the scale shows.
  for name in ("adam", "adamw"):
    clipped = _step(make_optimizer(name, 0.1, eps=1.0, grad_clip_norm=1.0), params, {"a": jnp.array([3.0, 4.0])})
    by_hand = _step(make_optimizer(name, 0.1, eps=1.0), params, {"a": jnp.array([0.6, 0.8])})
    np.testing.assert_allclose(clipped["a"], by_hand["a"], rtol=1e-6)


def test_the_client_config_carries_grad_clip_norm_off_by_default():
  from fedjax_robust.experiment import default_config
  client = default_config().client
  assert client.grad_clip_norm == 0.0
  client.grad_clip_norm = 1.0
  up = _step(optimizer_from_config(client), {"a": jnp.zeros(2)}, {"a": jnp.array([30.0, 40.0])})
  np.testing.assert_allclose(up["a"], [-client.lr * 0.6, -client.lr * 0.8], rtol=1e-6)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_negative_or_non_finite_clip_norm_is_refused(bad):
  with pytest.raises(ValueError, match="grad_clip_norm"):
    make_optimizer("sgd", 0.1, grad_clip_norm=bad)
