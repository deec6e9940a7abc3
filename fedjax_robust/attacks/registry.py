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
    "exaggerate": mp.exaggerate,
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


# The FedCC spec's names for the Fang options (fedcc.md §2.2-2.3, §6.8-6.9), accepted as aliases by make_attack.
_FANG_MED_ALIASES = {"fang_dir": "direction", "fang_med_compat": "compat"}
PARAM_ALIASES: dict[str, dict[str, str]] = {
    "fang_krum": {"fang_dir": "direction"},
    "fang_median": _FANG_MED_ALIASES,
    "fang_trimmed_mean": _FANG_MED_ALIASES,
}


def _resolve_aliases(name: str, params: dict) -> dict:
  aliases = PARAM_ALIASES.get(name, {})
  out = dict(params)
  for alias, target in aliases.items():
    if alias in out:
      if target in out:
        raise ValueError(f"attack {name!r}: give {target!r} or its alias {alias!r}, not both")
      out[target] = out.pop(alias)
  return out


def attack_params(name: str) -> tuple[str, ...]:
  """The keyword parameters attack ``name`` accepts."""
  return tuple(inspect.signature(ATTACKS[name]).parameters)


def make_attack(name: str, **params: Any) -> ModelAttack:
  """Builds the attack ``name`` with ``params``; ValueError names the known attacks / parameters.

  The Fang attacks also take the FedCC spec's option names: ``fang_dir`` (= ``direction``) and
  ``fang_med_compat`` (= ``compat`` of ``fang_median`` / ``fang_trimmed_mean``).
  """
  if name not in ATTACKS:
    raise ValueError(f"unknown attack {name!r}; known attacks: {sorted(ATTACKS)}")
  params = _resolve_aliases(name, params)
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


def upload_fields_from_config(fields: str, field_params: Any = None) -> tuple[tuple[str, ...], dict[str, ModelAttack]]:
  """``attack.fields`` -> (the fields ``attack.name`` poisons, ``{field: the field's own attack}``).

  Comma-separated entries: ``field`` is poisoned by the run's attack (``attack.name``); ``field=name`` by the attack
  ``name``, built with the parameters in ``field_params[field]`` (``attack.field_params.<field>.*``). E.g.
  ``delta,loss=exaggerate``: FedVSA's boosted model beside an exaggerated loss report (spec §2); ``loss=exaggerate``
  alone: an attacker that trains honestly and lies about its loss."""
  params = field_params.to_dict() if hasattr(field_params, "to_dict") else dict(field_params or {})
  plain, own = [], {}
  for entry in (e for e in str(fields or "").replace(" ", "").split(",") if e):
    field, sep, name = entry.partition("=")
    if not field or (sep and not name):
      raise ValueError(f"attack.fields entry {entry!r}: expected 'field' or 'field=attack'")
    if field in plain or field in own:
      raise ValueError(f"attack.fields names upload field {field!r} twice ({fields!r})")
    if name:
      own[field] = attack_from_config({"name": name, **dict(params.get(field) or {})})
    else:
      plain.append(field)
  stray = sorted(set(params) - set(own))
  if stray:
    raise ValueError(f"attack.field_params has parameters for {stray}, which attack.fields does not attack with an "
                     f"attack of their own ({fields!r}: write 'field=attack')")
  return tuple(plain), own
