"""fedjax_robust.flat_random and the layers built on it: jax.random's numbers, drawn flat (and so compiled fast)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust import flat_random
from fedjax_robust.models.layers import Dropout, variance_scaling_init

# Multi-axis draws compile slowly through jax.random (the point of the module): few shapes, one per kind.
SHAPES = [(84, 10), (2, 1, 3), (7,), ()]
DRAWS = {
    "uniform": (lambda k, s: flat_random.uniform(k, s, jnp.float32, -0.3, 0.7),
                lambda k, s: jax.random.uniform(k, s, jnp.float32, -0.3, 0.7)),
    "normal": (lambda k, s: flat_random.normal(k, s), lambda k, s: jax.random.normal(k, s)),
    "truncated_normal": (lambda k, s: flat_random.truncated_normal(k, -2.0, 2.0, s),
                         lambda k, s: jax.random.truncated_normal(k, -2.0, 2.0, s)),
    "bernoulli": (lambda k, s: flat_random.bernoulli(k, 0.3, s), lambda k, s: jax.random.bernoulli(k, 0.3, s)),
}


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_every_draw_is_jax_randoms_to_the_bit(draw, impl):
  ours, theirs = DRAWS[draw]
  key = jax.random.key(11, impl=impl)
  for shape in SHAPES if impl == "threefry2x32" else [(6, 4)]:  # the default implementation gets every kind
    np.testing.assert_array_equal(ours(key, shape), theirs(key, shape), err_msg=f"{draw} {shape}")


def test_equal_without_partitionable_threefry_under_jit_and_under_vmap_over_keys():
  ours, theirs = DRAWS["normal"]
  keys = jax.random.split(jax.random.key(2), 3)
  with jax.threefry_partitionable(False):
    np.testing.assert_array_equal(ours(keys[0], (6, 4)), theirs(keys[0], (6, 4)))
  np.testing.assert_array_equal(jax.jit(lambda k: ours(k, (6, 4)))(keys[0]), theirs(keys[0], (6, 4)))
  np.testing.assert_array_equal(jax.vmap(lambda k: ours(k, (3, 5, 2)))(keys),
                                jax.vmap(lambda k: theirs(k, (3, 5, 2)))(keys))


def test_a_multi_axis_draw_is_one_flat_draw_reshaped():
  """What makes it compile fast: the generator sees a one-axis shape (a 64-bit iota per axis is what XLA:CPU
  compiles slowly)."""
  jaxpr = str(jax.make_jaxpr(lambda k: flat_random.uniform(k, (84, 10)))(jax.random.key(0)))
  assert "shape=(840,)" in jaxpr and "shape=(84, 10)" not in jaxpr.split("reshape")[0]


@pytest.mark.parametrize("mode,distribution", [("fan_in", "truncated_normal"), ("fan_out", "normal"),
                                               ("fan_in", "normal"), ("fan_out", "truncated_normal")])
def test_variance_scaling_init_is_flaxs_to_the_bit(mode, distribution):
  ours, theirs = variance_scaling_init(2.0, mode, distribution), nn.initializers.variance_scaling(2.0, mode, distribution)
  key = jax.random.key(4)
  for shape in [(3, 3, 16, 32), (84, 10)]:
    np.testing.assert_array_equal(ours(key, shape), theirs(key, shape), err_msg=str(shape))
  np.testing.assert_array_equal(variance_scaling_init(1.0, "fan_in", "truncated_normal")(key, (20, 50)),
                                nn.initializers.lecun_normal()(key, (20, 50)))


def test_variance_scaling_init_refuses_what_it_does_not_implement():
  with pytest.raises(ValueError, match="mode"):
    variance_scaling_init(1.0, "fan_avg", "normal")
  with pytest.raises(ValueError, match="distribution"):
    variance_scaling_init(1.0, "fan_in", "uniform")
  with pytest.raises(ValueError, match="two or more axes"):
    variance_scaling_init(1.0, "fan_in", "normal")(jax.random.key(0), (5,))


class _Net(nn.Module):
  """One dropout layer named as the models name theirs, from either implementation."""
  layer: type
  rate: float
  broadcast_dims: tuple = ()

  @nn.compact
  def __call__(self, x, train):
    x = nn.Dense(6, name="fc")(x)
    return self.layer(self.rate, broadcast_dims=self.broadcast_dims, name="dropout")(x, deterministic=not train)


@pytest.mark.parametrize("rate,broadcast_dims", [(0.5, ()), (0.25, (1,)), (0.0, ()), (1.0, ())])
def test_dropout_is_flaxs_to_the_bit(rate, broadcast_dims):
  x = jax.random.normal(jax.random.key(0), (4, 3, 5))
  ours, theirs = _Net(Dropout, rate, broadcast_dims), _Net(nn.Dropout, rate, broadcast_dims)
  variables = theirs.init(jax.random.key(1), x, False)
  rngs = {"dropout": jax.random.key(7)}
  out = ours.apply(variables, x, True, rngs=rngs)
  np.testing.assert_array_equal(out, theirs.apply(variables, x, True, rngs=rngs))
  np.testing.assert_array_equal(ours.apply(variables, x, False), theirs.apply(variables, x, False))
  grads = [jax.grad(lambda v: jnp.sum(net.apply(v, x, True, rngs=rngs) ** 2))(variables) for net in (ours, theirs)]
  jax.tree.map(np.testing.assert_array_equal, grads[0], grads[1])
  if 0 < rate < 1:  # a real mask: some units dropped, the kept ones scaled by 1 / (1 - rate)
    dense = nn.Dense(6).apply({"params": variables["params"]["fc"]}, x)
    kept = out != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(out[kept], dense[kept] / (1 - rate), rtol=1e-6)
