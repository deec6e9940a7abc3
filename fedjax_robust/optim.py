"""Client and server optimizers from config, via optax.

``grad_clip_norm > 0`` rescales each step's gradient to at most that global L2 norm before weight decay and the
optimizer see it (``optax.clip_by_global_norm``): PyTorch's ``clip_grad_norm_`` between ``backward()`` and
``step()``, as FedDC's official code does (``max_norm=10``). Off (0) by default.

The server optimizer treats the negated aggregated update as a pseudo-gradient
(Reddi et al., "Adaptive Federated Optimization", Alg. 2): plain SGD with lr 1
is FedAvg's averaging, momentum gives FedAvgM, ``adam`` gives FedAdam.
"""

from __future__ import annotations

import optax

OPTIMIZERS = ("sgd", "adam", "adamw")


def make_optimizer(name: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                   nesterov: bool = False, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-8, grad_clip_norm: float = 0.0) -> optax.GradientTransformation:
  """An optax optimizer by name; ``weight_decay`` is L2 added to the gradient for SGD/Adam (PyTorch semantics),
  after the raw gradient is clipped to global norm ``grad_clip_norm`` when that is > 0."""
  import math
  from fedjax_robust.hparams import check
  check(lr, lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v > 0,
        f"learning rate must be a finite number > 0, got {lr!r}")
  for field, value in (("momentum", momentum), ("weight_decay", weight_decay), ("grad_clip_norm", grad_clip_norm)):
    if not (math.isfinite(value) and value >= 0):
      raise ValueError(f"{field} must be a finite number >= 0, got {value!r}")
  if name == "sgd":
    opt = optax.sgd(lr, momentum=momentum or None, nesterov=nesterov)
  elif name == "adam":
    opt = optax.adam(lr, b1=b1, b2=b2, eps=eps)
  elif name == "adamw":
    opt = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  else:
    raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
  if weight_decay and name != "adamw":
    opt = optax.chain(optax.add_decayed_weights(weight_decay), opt)
  if grad_clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(grad_clip_norm), opt)
  return opt


def optimizer_from_config(cfg, lr=None) -> optax.GradientTransformation:
  """Builds an optimizer from a ConfigDict with ``optimizer``, ``lr`` and optional extras (``lr`` given here, e.g.
  a traced grid value, replaces the config's)."""
  return make_optimizer(
      cfg.optimizer,
      cfg.lr if lr is None else lr,
      momentum=cfg.get("momentum", 0.0),
      weight_decay=cfg.get("weight_decay", 0.0),
      nesterov=cfg.get("nesterov", False),
      b1=cfg.get("b1", 0.9),
      b2=cfg.get("b2", 0.999),
      eps=cfg.get("eps", 1e-8),
      grad_clip_norm=cfg.get("grad_clip_norm", 0.0),
  )
