"""Training-time data augmentation on device: random flips, rotations and crops of an NHWC batch.

Why per step, on device: a PyTorch ``DataLoader`` applies its transforms to every sample each time it yields it,
so a client sees a fresh draw every epoch. Augmenting once per round would reuse the draws across the E local
epochs, and augmenting on the host would leave the compiled round. So the pipeline is a pure function
``(x [B, H, W, C], key) -> x'`` that :func:`fedjax_robust.client.local_train` applies to every mini-batch, before
the adversarial batch transform (an attack perturbs the augmented batch, as PGD does on a DataLoader's output),
with a key derived from the step's key. Evaluation never augments (it does not go through ``local_train``).

Reproduced recipe (specs/fedcac.md §3.4, A17): FedCAC trains CIFAR-100 with
``RandomHorizontalFlip(0.5) -> RandomRotation(±15°, nearest, fill 0) -> ToTensor -> Normalize -> RandomCrop(32,
padding 4)`` (the crop's zero fill is in normalised space) and Tiny-ImageNet with the flip and rotation only:
``data.augment = "flip,rotate:15,crop:4:fill=normalized"`` and ``"flip,rotate:15"``.

Conventions (torchvision's PIL path, which FedCAC's transforms take since they run before ``ToTensor``):

* ``rotate:D``: angle uniform in [-D, D] degrees per row (``RandomRotation(D)``). A positive angle turns the
  content counter-clockwise as displayed (rows down, columns right; ``PIL.Image.rotate``), about the centre at index
  coordinates ``((H-1)/2, (W-1)/2)`` (PIL's ``(W/2, H/2)`` in its coordinates, where pixel ``i`` covers
  ``[i, i+1)``; torchvision's tensor path uses the same centre). Output pixel ``(r, c)`` reads the input at
  ``c' = cx + cos θ (c - cx) - sin θ (r - cy)``, ``r' = cy + sin θ (c - cx) + cos θ (r - cy)``, nearest neighbour
  ``floor(· + 0.5)`` (PIL's NEAREST), ``fill`` where that falls outside. At 90° this is ``np.rot90(image)`` over
  ``(H, W)``, exactly.
* ``crop:P``: ``RandomCrop(size=(H, W), padding=P)``: pad P rows/columns of ``fill`` on every side and cut an
  ``H x W`` window at row and column offsets drawn uniformly from ``{0, ..., 2P}`` (``P, P`` = identity).
* ``flip[:p]``: mirror the width axis with probability ``p`` (default 0.5; ``RandomHorizontalFlip``).

Fill values: the loaders normalise at load time (``data.normalize``), so a fill is resolved at build time into
the value of the stored rows' space, per channel (:class:`FillSpace`): ``fill=pixel`` (default) is pixel value 0
(black before ``Normalize``: ``-mean/std`` in standardised rows), ``fill=normalized`` is 0 after ``Normalize``
(the channel mean as a pixel value; FedCAC's crop), ``fill=<v>`` pixel value ``v`` in [0, 1] units.

Randomness: row ``i`` of a batch draws from ``fold_in(key, i)`` and op ``j`` of the pipeline from
``fold_in(row_key, j)``. A row's draw depends only on the step key and its slot in the batch, so a client padded
to more rows and the same client alone, mapped (vmap) or looped, augment their real rows identically.

New ops slot in with :func:`register_augmentation` (a per-image function and its declared arguments).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

# ------------------------------------------------------------------------------------------ per-image ops
# op(image [H, W, C], key, **params) -> image [H, W, C]; params are static Python values (floats, tuples).


def flip_image(image: jax.Array, key: jax.Array, p: float = 0.5) -> jax.Array:
  """Mirrors the width axis with probability ``p`` (``RandomHorizontalFlip(p)``)."""
  return jnp.where(jax.random.uniform(key) < p, image[:, ::-1, :], image)


def _channel_fill(fill, image: jax.Array) -> jax.Array:
  return jnp.broadcast_to(jnp.asarray(fill, image.dtype), image.shape[-1:])


def rotate_image_by(image: jax.Array, degrees: jax.Array, fill=0.0) -> jax.Array:
  """``image`` rotated by ``degrees`` counter-clockwise about its centre, nearest neighbour, ``fill`` (a scalar or
  one value per channel) outside (PIL / torchvision conventions: module docstring)."""
  h, w = image.shape[0], image.shape[1]
  theta = jnp.deg2rad(jnp.asarray(degrees, jnp.float32))
  cos, sin = jnp.cos(theta), jnp.sin(theta)
  cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
  r, c = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij")
  dy, dx = r - cy, c - cx
  src_c = jnp.floor(cx + cos * dx - sin * dy + 0.5).astype(jnp.int32)
  src_r = jnp.floor(cy + sin * dx + cos * dy + 0.5).astype(jnp.int32)
  inside = (src_r >= 0) & (src_r < h) & (src_c >= 0) & (src_c < w)
  out = image[jnp.clip(src_r, 0, h - 1), jnp.clip(src_c, 0, w - 1)]
  return jnp.where(inside[..., None], out, _channel_fill(fill, image))


def rotate_image(image: jax.Array, key: jax.Array, degrees: float, fill=0.0) -> jax.Array:
  """Rotation by an angle uniform in ``[-degrees, degrees]`` (``RandomRotation(degrees)``, NEAREST)."""
  angle = jax.random.uniform(key, (), jnp.float32, -degrees, degrees)
  return rotate_image_by(image, angle, fill)


def crop_image_at(image: jax.Array, top: jax.Array, left: jax.Array, padding: int, fill=0.0) -> jax.Array:
  """The ``H x W`` window at ``(top, left)`` of ``image`` padded by ``padding`` of ``fill`` on every side."""
  h, w, ch = image.shape
  canvas = jnp.broadcast_to(_channel_fill(fill, image), (h + 2 * padding, w + 2 * padding, ch))
  canvas = jax.lax.dynamic_update_slice(canvas, image, (padding, padding, 0))
  return jax.lax.dynamic_slice(canvas, (top, left, 0), (h, w, ch))


def crop_image(image: jax.Array, key: jax.Array, padding: int, fill=0.0) -> jax.Array:
  """``RandomCrop((H, W), padding)``: offsets uniform in ``{0, ..., 2 padding}``."""
  top, left = jax.random.randint(key, (2,), 0, 2 * padding + 1)
  return crop_image_at(image, top, left, padding, fill)


# ------------------------------------------------------------------------------------------ batch ops
def row_keys(key: jax.Array, rows: int) -> jax.Array:
  """One key per batch row, ``fold_in(key, i)``: a row's draw depends only on its slot, not on the batch's other
  rows (padding, vmap vs a loop)."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(rows))


def _per_row(image_op: Callable, x: jax.Array, key: jax.Array, **params) -> jax.Array:
  return jax.vmap(lambda image, k: image_op(image, k, **params))(x, row_keys(key, x.shape[0]))


def random_flip(x: jax.Array, key: jax.Array, p: float = 0.5) -> jax.Array:
  """Per-row horizontal flips of an NHWC batch."""
  return _per_row(flip_image, x, key, p=p)


def random_rotation(x: jax.Array, key: jax.Array, max_degrees: float, fill=0.0) -> jax.Array:
  """Per-row rotations by angles uniform in ``[-max_degrees, max_degrees]`` (nearest neighbour, ``fill`` outside)."""
  return _per_row(rotate_image, x, key, degrees=max_degrees, fill=fill)


def random_crop(x: jax.Array, key: jax.Array, padding: int, fill=0.0) -> jax.Array:
  """Per-row random crops of the ``padding``-padded images back to their size."""
  return _per_row(crop_image, x, key, padding=padding, fill=fill)


# ------------------------------------------------------------------------------------------ fill values
class FillSpace(NamedTuple):
  """Where pixel values (``ToTensor``'s [0, 1]) and normalised values (after ``Normalize``) sit in the stored rows.

  ``stored = (pixel - load_mean) / load_std`` (the loader's normalisation; 0 / 1 when rows stay in [0, 1]) and
  ``normalised = (pixel - norm_mean) / norm_std`` (what the model's first layer sees, whether the loader or the
  model normalises; 0 / 1 with no normalisation at all, e.g. FedCAC's CIFAR-10)."""

  load_mean: tuple[float, ...]
  load_std: tuple[float, ...]
  norm_mean: tuple[float, ...]
  norm_std: tuple[float, ...]

  def pixel(self, value: float) -> tuple[float, ...]:
    """Stored value of pixel value ``value`` per channel."""
    return tuple((value - m) / s for m, s in zip(self.load_mean, self.load_std))

  def normalized(self, value: float) -> tuple[float, ...]:
    """Stored value of normalised value ``value`` per channel."""
    return tuple(((value * ns + nm) - m) / s
                 for m, s, nm, ns in zip(self.load_mean, self.load_std, self.norm_mean, self.norm_std))


def fill_space(norm: Optional[dict], channels: int, model_stats=None) -> FillSpace:
  """The :class:`FillSpace` of a dataset built with ``info["normalize"] = norm`` (mode, mean, std); ``model_stats``:
  the ``(mean, std)`` the model applies first under ``data.normalize='model'`` (``experiment.input_normalization``)."""
  norm = norm or {}
  mode = norm.get("mode", "unit")
  zeros, ones = (0.0,) * channels, (1.0,) * channels
  stats = (tuple(map(float, norm.get("mean", zeros))), tuple(map(float, norm.get("std", ones))))
  if mode == "model":  # rows in [0, 1]; the model normalises
    mean, std = model_stats if model_stats is not None else stats
    return FillSpace(zeros, ones, tuple(map(float, mean)), tuple(map(float, std)))
  if mode == "unit":
    return FillSpace(zeros, ones, zeros, ones)
  return FillSpace(*stats, *stats)


# ------------------------------------------------------------------------------------------ registry
class AugmentOp(NamedTuple):
  """A named augmentation: ``apply(image, key, **params)`` and its arguments, in positional order, as
  ``(name, kind, default)`` with kind ``float`` | ``int`` | ``"fill"`` and default ``None`` = required."""

  apply: Callable[..., jax.Array]
  args: tuple[tuple[str, Any, Any], ...]
  check: Callable[[dict], Optional[str]] = lambda params: None  # a message when the values are invalid


AUGMENTATIONS: dict[str, AugmentOp] = {}


def register_augmentation(name: str, op: AugmentOp) -> None:
  AUGMENTATIONS[name] = op


register_augmentation("flip", AugmentOp(flip_image, (("p", float, 0.5),),
                                        lambda a: None if 0.0 <= a["p"] <= 1.0 else "p must be in [0, 1]"))
register_augmentation("rotate", AugmentOp(rotate_image, (("degrees", float, None), ("fill", "fill", "pixel")),
                                          lambda a: None if a["degrees"] >= 0 else "degrees must be >= 0"))
register_augmentation("crop", AugmentOp(crop_image, (("padding", int, None), ("fill", "fill", "pixel")),
                                        lambda a: None if a["padding"] >= 0 else "padding must be >= 0"))


# ------------------------------------------------------------------------------------------ pipeline
@dataclasses.dataclass(frozen=True)
class Augmentation:
  """A pipeline of registered ops with resolved, static parameters: ``augmentation(x, key) -> x'`` on an NHWC
  batch. Hashable and compared by value, so it can sit in :class:`~fedjax_robust.client.LocalTrainSpec`."""

  ops: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]

  def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
    if x.ndim != 4:
      raise ValueError(f"augmentation needs an NHWC batch, got shape {x.shape}")

    def one(image, k):
      for j, (name, params) in enumerate(self.ops):
        image = AUGMENTATIONS[name].apply(image, jax.random.fold_in(k, j), **dict(params))
      return image

    return jax.vmap(one)(x, row_keys(key, x.shape[0]))

  def __str__(self) -> str:
    return ",".join(name + "".join(f":{k}={v}" for k, v in params) for name, params in self.ops)


def _parse_fill(text: str, space: FillSpace) -> tuple[float, ...]:
  if text == "pixel":
    return space.pixel(0.0)
  if text in ("normalized", "normalised"):
    return space.normalized(0.0)
  value = float(text)  # a pixel value in [0, 1] units
  if not math.isfinite(value):
    raise ValueError(f"fill must be finite, got {text!r}")
  return space.pixel(value)


def _parse_op(item: str, space: FillSpace) -> tuple[str, tuple[tuple[str, Any], ...]]:
  name, *fields = [f.strip() for f in item.split(":")]
  if name not in AUGMENTATIONS:
    raise ValueError(f"unknown augmentation {name!r}; known: {', '.join(sorted(AUGMENTATIONS))}")
  op = AUGMENTATIONS[name]
  names = [a[0] for a in op.args]
  given: dict[str, str] = {}
  for pos, field in enumerate(fields):
    key, eq, value = field.partition("=")
    if not eq:
      if pos >= len(names):
        raise ValueError(f"augmentation {item!r}: {name} takes at most {len(names)} arguments ({', '.join(names)})")
      key, value = names[pos], field
    if key not in names:
      raise ValueError(f"augmentation {item!r}: unknown argument {key!r}; {name} takes {', '.join(names)}")
    given[key] = value
  params = {}
  for arg, kind, default in op.args:
    text = given.get(arg, default)
    if text is None:
      raise ValueError(f"augmentation {item!r}: {name} needs {arg} (e.g. {name}:{arg}=...)")
    try:
      params[arg] = _parse_fill(str(text), space) if kind == "fill" else kind(text)
    except ValueError as e:
      raise ValueError(f"augmentation {item!r}: bad {arg} {text!r} ({e})") from None
  problem = op.check(params)
  if problem:
    raise ValueError(f"augmentation {item!r}: {problem}")
  return name, tuple(params.items())


def parse_augmentation(spec: str | Sequence[str] | None, space: FillSpace) -> Optional[Augmentation]:
  """``"flip,rotate:15,crop:4:fill=normalized"`` (or a list of items) -> :class:`Augmentation`, applied left to
  right; ``""`` / ``None`` -> ``None`` (no augmentation). Item grammar: ``name[:arg...]`` with positional or
  ``key=value`` arguments (``flip[:p]``, ``rotate:degrees[:fill]``, ``crop:padding[:fill]``)."""
  if spec is None:
    return None
  items = spec.split(",") if isinstance(spec, str) else list(spec)
  ops = tuple(_parse_op(item.strip(), space) for item in items if item and item.strip())
  return Augmentation(ops) if ops else None


def augmentation_from_config(spec, feature_shape: Sequence[int], norm: Optional[dict] = None,
                             model_stats=None) -> Optional[Augmentation]:
  """``data.augment`` for a dataset whose rows have ``feature_shape`` and ``info["normalize"] = norm``; refuses
  rows that are not images ``[H, W, C]``."""
  if not spec:
    return None
  shape = tuple(int(d) for d in feature_shape)
  if len(shape) != 3:
    raise ValueError(f"data.augment={spec!r} needs image rows [H, W, C]; this dataset's rows have shape {shape}")
  return parse_augmentation(spec, fill_space(norm, shape[-1], model_stats))
