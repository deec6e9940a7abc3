"""Training-time augmentation (issue 32, specs/fedcac.md §3.4): the ops' conventions, fills in the stored space,
per-row keys, the config parser, and the engine: applied in local training only, padded == unpadded,
vmap == sequential."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust.client import ClientData, LocalTrainSpec, local_train, masked_cross_entropy, plain_loss
from fedjax_robust.data import augment as A
from fedjax_robust.experiment import build_experiment
from test_engine import assert_trees_close, setup
from test_experiment import digits_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

RNG = np.random.default_rng(0)
IMG = RNG.normal(size=(6, 6, 2)).astype(np.float32)
BATCH = RNG.normal(size=(5, 6, 6, 2)).astype(np.float32)
UNIT = A.FillSpace((0.0, 0.0), (1.0, 1.0), (0.0, 0.0), (1.0, 1.0))


# ------------------------------------------------------------------------------------------ ops
def test_flip_mirrors_exactly_the_width_axis_and_twice_is_identity():
  key = jax.random.key(0)
  flipped = np.asarray(A.random_flip(BATCH, key, p=1.0))
  np.testing.assert_array_equal(flipped, BATCH[:, :, ::-1, :])
  np.testing.assert_array_equal(np.asarray(A.random_flip(flipped, key, p=1.0)), BATCH)
  np.testing.assert_array_equal(np.asarray(A.random_flip(BATCH, key, p=0.0)), BATCH)


def test_rotation_by_zero_is_identity_and_by_90_is_rot90_counter_clockwise():
  rotate = jax.jit(A.rotate_image_by)
  np.testing.assert_array_equal(np.asarray(rotate(IMG, 0.0)), IMG)
  np.testing.assert_array_equal(np.asarray(rotate(IMG, 90.0)), np.rot90(IMG, 1, axes=(0, 1)))
  np.testing.assert_array_equal(np.asarray(rotate(IMG, -90.0)), np.rot90(IMG, -1, axes=(0, 1)))
  odd = IMG[:5, :5]  # odd size: the centre is a pixel
  np.testing.assert_array_equal(np.asarray(A.rotate_image_by(odd, 180.0)), odd[::-1, ::-1])
  np.testing.assert_array_equal(np.asarray(A.random_rotation(BATCH, jax.random.key(1), 0.0)), BATCH)


def test_rotation_fills_outside_per_channel():
  ones = np.ones((7, 7, 2), np.float32)
  out = np.asarray(A.rotate_image_by(ones, 45.0, fill=(-2.0, 3.0)))
  np.testing.assert_array_equal(out[0, 0], [-2.0, 3.0])  # corners come from outside the image
  np.testing.assert_array_equal(out[3, 3], [1.0, 1.0])
  assert set(np.unique(out[..., 0])) == {-2.0, 1.0}


def test_rotation_matches_pil_rotate_nearest():
  """torchvision's RandomRotation on a PIL image (FedCAC's order: before ToTensor) is ``Image.rotate(angle,
  NEAREST, fillcolor=0)``: same sign, centre and rounding (only exact half-pixel ties may differ)."""
  Image = pytest.importorskip("PIL.Image")
  img = RNG.integers(1, 256, (32, 32, 3)).astype(np.uint8)
  for angle in (13.7, -15.0, 7.3):
    ref = np.asarray(Image.fromarray(img).rotate(angle, resample=Image.NEAREST, fillcolor=(0, 0, 0)))
    ours = np.asarray(A.rotate_image_by(img.astype(np.float32), angle, 0.0)).astype(np.uint8)
    assert (ref == ours).all(-1).mean() > 0.99, angle


def test_crop_at_the_centre_is_identity_and_at_zero_shifts_in_the_fill():
  p = 2
  np.testing.assert_array_equal(np.asarray(A.crop_image_at(IMG, p, p, p, 0.0)), IMG)
  out = np.asarray(A.crop_image_at(IMG, 0, 0, p, fill=(7.0, -1.0)))
  np.testing.assert_array_equal(out[p:, p:], IMG[:-p, :-p])
  for band in (out[:p], out[:, :p]):
    np.testing.assert_array_equal(band[..., 0], 7.0)
    np.testing.assert_array_equal(band[..., 1], -1.0)
  crops = np.asarray(A.random_crop(np.repeat(IMG[None], 64, 0), jax.random.key(0), p))
  assert any(np.array_equal(c, IMG) for c in crops) and not all(np.array_equal(c, IMG) for c in crops)


def test_rows_draw_independently_and_the_same_key_repeats():
  aug = jax.jit(A.parse_augmentation("flip,rotate:30,crop:2", UNIT))
  same = np.repeat(IMG[None], 8, 0)
  out = np.asarray(aug(same, jax.random.key(3)))
  assert len({o.tobytes() for o in out}) > 4  # different rows, different draws
  np.testing.assert_array_equal(np.asarray(aug(same, jax.random.key(3))), out)
  assert not np.array_equal(np.asarray(aug(same, jax.random.key(4))), out)
  # a row's draw depends only on its slot: the first rows of a longer batch augment as the short batch does
  np.testing.assert_array_equal(np.asarray(aug(same[:3], jax.random.key(3))), out[:3])


# ------------------------------------------------------------------------------------------ config
def test_parser_resolves_fills_into_the_stored_space():
  mean, std = (0.507, 0.487, 0.441), (0.267, 0.256, 0.276)
  standard = A.fill_space({"mode": "standard", "mean": mean, "std": std}, 3)
  aug = A.parse_augmentation("flip,rotate:15,crop:4:fill=normalized", standard)
  (flip, flipping), (rot, rotation), (crop, cropping) = aug.ops
  assert (flip, flipping, rot, crop) == ("flip", (("p", 0.5),), "rotate", "crop")
  assert dict(rotation)["degrees"] == 15.0
  np.testing.assert_allclose(dict(rotation)["fill"], [-m / s for m, s in zip(mean, std)])  # pixel 0, normalised
  assert dict(cropping) == {"padding": 4, "fill": (0.0, 0.0, 0.0)}  # 0 in normalised space
  model = A.fill_space({"mode": "model", "mean": mean, "std": std}, 3)  # rows in [0, 1], the model normalises
  assert model.pixel(0.0) == (0.0, 0.0, 0.0)
  np.testing.assert_allclose(model.normalized(0.0), mean)
  unit = A.fill_space({"mode": "unit", "mean": (0.0,), "std": (1.0,)}, 1)
  assert unit.pixel(0.5) == unit.normalized(0.5) == (0.5,)
  assert A.parse_augmentation(["flip:p=1", "crop:padding=1:fill=0.25"], unit).ops == (
      ("flip", (("p", 1.0),)), ("crop", (("padding", 1), ("fill", (0.25,)))))
  assert A.parse_augmentation("", unit) is None and A.augmentation_from_config("", (4,)) is None
  assert aug == A.parse_augmentation("flip, rotate:15, crop:4:fill=normalized", standard)  # hashable, by value
  assert hash(aug) == hash(A.parse_augmentation("flip,rotate:15,crop:4:fill=normalised", standard))


@pytest.mark.parametrize("spec, message", [
    ("flip,blur:3", "unknown augmentation 'blur'; known: crop, flip, rotate"),
    ("rotate", "rotate needs degrees"),
    ("crop:4:fill=grey", "bad fill"),
    ("crop:4:size=3", "unknown argument 'size'"),
    ("flip:0.5:1", "at most 1 arguments"),
    ("flip:2", "p must be in"),
    ("crop:-1", "padding must be >= 0"),
])
def test_parser_refuses_bad_items(spec, message):
  with pytest.raises(ValueError, match=message):
    A.parse_augmentation(spec, UNIT)


def test_augmentation_needs_image_rows():
  with pytest.raises(ValueError, match=r"needs image rows \[H, W, C\]"):
    A.augmentation_from_config("flip", (64,))


# ------------------------------------------------------------------------------------------ engine
def test_local_training_augments_padded_and_unpadded_clients_alike():
  data, params, apply_fn = setup()
  loss_fn = plain_loss(lambda p, x, y, m: masked_cross_entropy(apply_fn(p, x), y, m))
  aug = A.parse_augmentation("flip,rotate:20,crop:1", A.fill_space(None, 1))
  spec = LocalTrainSpec(epochs=2, batch_size=3, augment=aug)
  opt = optax.sgd(0.1, momentum=0.9)
  n, key = int(data.n_train[0]), jax.random.key(3)
  x, y = data.x_train[0], data.y_train[0]
  tight = ClientData(jnp.asarray(x[:n]), jnp.asarray(y[:n]), jnp.int32(n))
  padded = ClientData(jnp.pad(jnp.asarray(x), ((0, 20 - x.shape[0]),) + ((0, 0),) * 3, constant_values=9.0),
                      jnp.pad(jnp.asarray(y), (0, 20 - x.shape[0])), jnp.int32(n))
  a = local_train(loss_fn, opt, params, opt.init(params), tight, key, spec)
  b = local_train(loss_fn, opt, params, opt.init(params), padded, key, spec)
  assert_trees_close(a.params, b.params, atol=1e-6)
  plain = local_train(loss_fn, opt, params, opt.init(params), tight, key, spec._replace(augment=None))
  assert not np.allclose(np.asarray(plain.params["Dense_0"]["kernel"]), np.asarray(a.params["Dense_0"]["kernel"]))


def test_augmentation_runs_before_the_batch_transform_and_is_the_clean_batch():
  """Augment, then attack: the transform perturbs the augmented batch and ``x_clean`` (TRADES' reference) is the
  augmented batch, so flipping every row on the fly trains as the pre-flipped data does."""
  data, params, apply_fn = setup()
  ce = lambda p, x, b: masked_cross_entropy(apply_fn(p, x), b.y, b.mask)
  loss_fn = lambda p, b: (ce(p, b.x, b) + ce(p, b.x_clean, b), b.model_state)
  shift = lambda variables, x, y, mask, key: x + 0.1 * x[:, :, :1, :]  # does not commute with a flip
  opt, key, n = optax.sgd(0.1), jax.random.key(5), int(data.n_train[1])
  x, y = jnp.asarray(data.x_train[1]), jnp.asarray(data.y_train[1])
  spec = LocalTrainSpec(epochs=1, batch_size=4, augment=A.parse_augmentation("flip:1", A.fill_space(None, 1)))
  on_the_fly = local_train(loss_fn, opt, params, opt.init(params), ClientData(x, y, jnp.int32(n)), key, spec,
                           batch_transform=shift)
  flipped = ClientData(x[:, :, ::-1, :], y, jnp.int32(n))
  pre = local_train(loss_fn, opt, params, opt.init(params), flipped, key, spec._replace(augment=None),
                    batch_transform=shift)
  assert_trees_close(on_the_fly.params, pre.params, atol=1e-6)


def _digits_rounds(strategy, augment, rounds=2):
  exp = build_experiment(digits_config(rounds=rounds, **{"data.num_clients": 4, "data.augment": augment,
                                                         "engine.strategy": strategy, "client.batch_size": 16}))
  state = exp.init_state()
  for _ in range(rounds):
    state, _ = exp.simulator.run_round(state)
  return exp, state


def test_fedavg_with_augmentation_vmap_equals_sequential_changes_training_not_evaluation():
  spec = "flip,rotate:15,crop:2"
  on_vmap, state = _digits_rounds("vmap", spec)
  _, state_seq = _digits_rounds("sequential", spec)
  assert_trees_close(state.server.params, state_seq.server.params, atol=2e-5)
  off, state_off = _digits_rounds("vmap", "")
  diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), state.server.params, state_off.server.params)
  assert max(jax.tree.leaves(diff)) > 1e-3  # the augmentation is applied in training
  # evaluation scores un-augmented test rows: the same state scores the same with augmentation on or off
  assert on_vmap.simulator.evaluate(state) == off.simulator.evaluate(state)


# ------------------------------------------------------------------------------------------ configs
def test_fedcac_configs_follow_spec_preprocessing():
  """specs/fedcac.md §3.4 / A17: CIFAR-10 nothing; CIFAR-100 flip, rotation (pixel 0 fill), crop (normalised 0
  fill) and the code's literal statistics; Tiny-ImageNet flip and rotation, CIFAR-100's statistics."""
  from test_experiment import load_config
  c10, c100, tiny = (load_config(f"fedcac_{d}") for d in ("cifar10", "cifar100", "tiny_imagenet"))
  assert (c10.data.augment, c10.data.normalize, c10.data.normalize_mean) == ("", False, None)
  stats = ((0.507, 0.487, 0.441), (0.267, 0.256, 0.276))
  for c in (c100, tiny):
    assert c.data.normalize is True and (c.data.normalize_mean, c.data.normalize_std) == stats
  assert (c100.data.augment, tiny.data.augment) == ("flip,rotate:15,crop:4:fill=normalized", "flip,rotate:15")
  norm = {"mode": "standard", "mean": stats[0], "std": stats[1]}
  ops = dict(A.augmentation_from_config(c100.data.augment, (32, 32, 3), norm).ops)
  np.testing.assert_allclose(dict(ops["rotate"])["fill"], [-m / s for m, s in zip(*stats)])
  assert dict(ops["crop"])["fill"] == (0.0, 0.0, 0.0)


def test_normalisation_statistics_override_the_registry():
  from fedjax_robust.data import build_federated_data
  cfg = digits_config().data
  base = build_federated_data(cfg)
  cfg.normalize_mean, cfg.normalize_std = (0.5,), (0.25,)
  over = build_federated_data(cfg)
  assert over.info["normalize"]["mean"] == [0.5] and over.info["normalize"]["std"] == [0.25]
  pixels = base.x_train * 0.37605 + 0.30526  # the registry's digits statistics undone
  real = np.arange(base.x_train.shape[1])[None, :] < base.n_train[:, None]
  np.testing.assert_allclose(over.x_train[real], ((pixels - 0.5) / 0.25)[real], atol=1e-4)
  cfg.normalize_mean = (0.5, 0.5, 0.5)
  with pytest.raises(ValueError, match="need 1 values each"):
    build_federated_data(cfg)
