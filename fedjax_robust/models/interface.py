"""One model type for the whole simulator: variables, train/eval mode, rng, masked batch statistics.

Every part that runs a network — local training, every algorithm, evaluation,
attacks that need gradients, adversarial batch transforms and the plain-loop
references — goes through a :class:`Model`:

    model = make_model(get_model("bn_cnn", num_classes=10))
    variables = model.init(key, sample_x)            # {"params": ..., "batch_stats": ...}
    logits, new_state = model.apply(variables, x, train=True, rng=key, mask=row_mask)
    logits, _ = model.apply(variables, x)            # eval mode: running statistics, no dropout
    feats = model.features(variables, x)             # penultimate layer (input of ``head``)

``variables`` is a flax variable dict: ``"params"`` (trainable, what optimizers,
aggregation rules and attacks see) plus non-trainable collections such as
``"batch_stats"`` (BatchNorm running statistics), the *model state*.
:func:`split_variables` / :func:`merge_variables` move between the two.

Why a mask: clients hold padded arrays (``DESIGN.md`` invariant 3), so a batch
may contain padding rows. In training, BatchNorm computes its batch statistics
over the real rows only (``layers.TorchBatchNorm(mask=...)``), which is what a PyTorch
``DataLoader`` loop that never sees the padding computes; the engine also
selects the model state back on padded steps, like params and optimizer state.

Why ``rng``: dropout (the MLP's ``dropout_rate``) is applied in training with a
per-step key from :func:`fedjax_robust.client.local_train`, and off at evaluation.

Evaluation receives "the model to score" from an algorithm as either bare
``params`` or a full ``variables`` dict (algorithms with BatchNorm state return
the latter); :func:`as_variables` tells them apart by the ``"params"`` key, which
no parameter tree of the zoo has at its top level.

A plain ``(params, x) -> logits`` function still works wherever a model is
expected (:func:`as_model` wraps it as a stateless, dropout-free model), so
hand-written test models need no flax module.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple, Optional

import jax

PyTree = Any
Variables = dict


class Model(NamedTuple):
  """A classifier as pure functions (optax style).

  init(key, sample_x) -> variables
  apply(variables, x, *, train=False, rng=None, mask=None) -> (logits, model_state)
      ``model_state``: the non-trainable collections after the call (updated
      running statistics in training, unchanged in eval mode; ``{}`` when none).
  features(variables, x, *, train=False, rng=None, mask=None) -> penultimate activations [B, d]
  state_collections: names of the non-trainable collections (``("batch_stats",)``), empty when stateless.
  module: the flax module (None for a wrapped function).
  """

  init: Callable[..., Variables]
  apply: Callable[..., tuple[jax.Array, PyTree]]
  features: Optional[Callable[..., jax.Array]]
  state_collections: tuple[str, ...] = ()
  module: Any = None

  @property
  def stateful(self) -> bool:
    return bool(self.state_collections)

  def logits(self, variables_or_params: PyTree, x: jax.Array) -> jax.Array:
    """Eval-mode logits of a model given as params or variables (the evaluation convention)."""
    return self.apply(as_variables(variables_or_params), x)[0]


def as_variables(tree: PyTree) -> Variables:
  """``tree`` if it is a flax variable dict (has ``"params"``), else ``{"params": tree}``."""
  if isinstance(tree, dict) and "params" in tree:
    return tree
  return {"params": tree}


def split_variables(variables: Variables) -> tuple[PyTree, dict]:
  """``(params, model_state)``: the trainable collection and every other one."""
  variables = as_variables(variables)
  return variables["params"], {k: v for k, v in variables.items() if k != "params"}


def merge_variables(params: PyTree, model_state: Optional[dict] = None) -> Variables:
  return {"params": params, **(model_state or {})}


def _accepts(fn: Callable, name: str) -> bool:
  try:
    return name in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def make_model(module: Any, state_collections: Optional[tuple[str, ...]] = None) -> Model:
  """Wraps a flax module whose ``__call__(x, train=False[, mask=None])`` returns logits.

  ``state_collections`` defaults to every non-``params`` collection ``module.init`` creates
  (found lazily at ``init``; pass it to know statefulness before any init: ``make_model``
  probes the module once on a tiny input otherwise). A module that takes ``mask`` gets the
  batch's real-row mask in training (masked BatchNorm statistics).
  """
  takes_mask = _accepts(type(module).__call__, "mask")
  features_take_mask = hasattr(module, "features") and _accepts(type(module).features, "mask")
  if state_collections is None:
    state_collections = tuple(getattr(module, "state_collections", ()))

  def init(key: jax.Array, sample_x: jax.Array) -> Variables:
    variables = dict(module.init(key, sample_x))
    found = tuple(k for k in variables if k != "params")
    if found != tuple(state_collections):
      raise ValueError(f"model {type(module).__name__} created collections {found}, expected {state_collections}; "
                       "declare them with a `state_collections` class attribute")
    return variables

  def _call(variables, x, train, rng, mask, method, accepts_mask):
    kwargs = {"train": train}
    if accepts_mask and mask is not None and train:
      kwargs["mask"] = mask
    rngs = {"dropout": rng} if (train and rng is not None) else None
    if train and state_collections:
      out, updates = module.apply(variables, x, rngs=rngs, mutable=list(state_collections), method=method, **kwargs)
      return out, dict(updates)
    out = module.apply(variables, x, rngs=rngs, method=method, **kwargs)
    return out, {k: v for k, v in variables.items() if k != "params"}

  def apply(variables, x, *, train: bool = False, rng=None, mask=None):
    return _call(as_variables(variables), x, train, rng, mask, None, takes_mask)

  def features(variables, x, *, train: bool = False, rng=None, mask=None):
    return _call(as_variables(variables), x, train, rng, mask, "features", features_take_mask)[0]

  return Model(init, apply, features if hasattr(module, "features") else None, tuple(state_collections), module)


def as_model(model_or_fn: Any) -> Model:
  """A :class:`Model`, a flax module, or a plain ``(params, x) -> logits`` function, as a :class:`Model`."""
  if isinstance(model_or_fn, Model):
    return model_or_fn
  if hasattr(model_or_fn, "init") and hasattr(model_or_fn, "apply") and not isinstance(model_or_fn, tuple):
    return make_model(model_or_fn)
  if not callable(model_or_fn):
    raise TypeError(f"expected a Model, a flax module or a (params, x) -> logits function, got {model_or_fn!r}")
  fn = model_or_fn

  def apply(variables, x, *, train: bool = False, rng=None, mask=None):
    del train, rng, mask
    return fn(as_variables(variables)["params"], x), {}

  def init(key, sample_x):
    raise TypeError("a model wrapped from a plain apply function has no init; build params yourself")

  return Model(init, apply, None, (), None)


def stateless_apply(model: Model, who: str) -> Callable[[PyTree, jax.Array], jax.Array]:
  """``(params, x) -> logits`` in eval mode, for algorithms that carry no model state (they refuse BatchNorm)."""
  require_stateless(model, who)
  return lambda params, x: model.apply({"params": params}, x)[0]


def require_stateless(model: Model, who: str) -> None:
  if model.stateful:
    raise ValueError(f"{who} does not handle models with non-trainable state {model.state_collections} "
                     "(BatchNorm) yet; use a model without BatchNorm, or the fedavg family (fedavg, fedprox, "
                     "fedavg_ft, fedbn, local)")


def train_logits(model: Model, params: PyTree, model_state: dict, x: jax.Array, key: Optional[jax.Array],
                 mask: Optional[jax.Array]) -> tuple[jax.Array, dict]:
  """Training-mode forward pass: dropout with ``key``, batch statistics over the ``mask`` rows."""
  return model.apply(merge_variables(params, model_state), x, train=True, rng=key, mask=mask)



def with_input_normalization(model: Model, mean, std) -> Model:
  """``model`` preceded by the fixed layer ``(x - mean) / std`` (per channel, last axis).

  Adversarial training and evaluation perturb inputs in [0, 1] pixel units (FedALC spec A10), so a dataset's
  normalisation moves inside the model (``data.normalize='model'``); parameters are unchanged.
  """
  import jax.numpy as jnp
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)
  norm = lambda x: (x - mean) / std

  def init(key, sample_x):
    return model.init(key, norm(sample_x))

  def apply(variables, x, **kwargs):
    return model.apply(variables, norm(x), **kwargs)

  features = None
  if model.features is not None:
    features = lambda variables, x, **kwargs: model.features(variables, norm(x), **kwargs)
  return Model(init, apply, features, model.state_collections, model.module)
