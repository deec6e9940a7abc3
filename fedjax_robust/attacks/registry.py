"""Model attacks by name: ``make_attack(name, **params)`` and ``attack_from_config(cfg)``."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from fedjax_robust.attacks import fang, model_poisoning as mp
from fedjax_robust.attacks.base import ModelAttack

ATTACKS: dict[str, Callable[..., ModelAttack]] = {
    "none": mp.identity,
    "gaussian": mp.gaussian,
    "sign_flip": mp.sign_flip,
    "model_replacement": mp.scaling,
    "scaling": mp.scaling,
    "boosting": mp.boosting,
    "lie": mp.lie,
    "ipm": mp.ipm,
    "min_max": mp.min_max,
    "min_sum": mp.min_sum,
    "fang_krum": fang.fang_krum,
    "fang_median": fang.fang_median,
    "fang_trimmed_mean": fang.fang_trimmed_mean,
}


# Attacks whose crafted vector is a function of the attacker's OWN update only (and of N): what they send
# can be computed from that update alone. The others craft one vector from the reference cohort's statistics.
OWN_UPDATE_ATTACKS = frozenset({"none", "gaussian", "sign_flip", "model_replacement", "scaling", "boosting"})


def attack_params(name: str) -> tuple[str, ...]:
  """The keyword parameters attack ``name`` accepts."""
  return tuple(inspect.signature(ATTACKS[name]).parameters)


def make_attack(name: str, **params: Any) -> ModelAttack:
  """Builds the attack ``name`` with ``params``; ValueError names the known attacks / parameters."""
  if name not in ATTACKS:
    raise ValueError(f"unknown attack {name!r}; known attacks: {sorted(ATTACKS)}")
  accepted = attack_params(name)
  unknown = sorted(set(params) - set(accepted))
  if unknown:
    raise ValueError(f"attack {name!r} got unknown parameters {unknown}; it accepts {list(accepted)}")
  attack = ATTACKS[name](**params)
  return attack._replace(name=name)


def attack_from_config(cfg: Any) -> ModelAttack:
  """From a ConfigDict / mapping ``{name: ..., **params}`` (``None`` or name ``'none'``: identity)."""
  if cfg is None:
    return mp.identity()
  d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
  if "name" not in d:
    raise ValueError(f"attack config needs a 'name'; known attacks: {sorted(ATTACKS)}")
  name = d.pop("name")
  return make_attack(name, **d)
