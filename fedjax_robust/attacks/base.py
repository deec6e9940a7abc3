"""The model-poisoning interface and the helpers every attack shares.

An attack is a pure function of the cohort's stacked uploads (DESIGN: "functions
of the stacked uploads and a malicious mask"), bundled with its name like an
optax transformation::

    attack.apply(updates, malicious, key, context) -> updates

* ``updates``: any pytree whose leaves have a leading client axis ``[C, ...]``
  (the engine passes ``uploads["delta"]``);
* ``malicious``: ``[C]`` bool, which rows belong to attacker-controlled clients;
* ``key``: a PRNG key (only the randomised attacks use it);
* ``context``: an optional dict with ``"mask"`` (``[C]`` participation: rows
  with ``False`` are neither used for statistics nor modified), ``"weights"``
  (``[C]`` aggregation weights), ``"global_params"`` (one unstacked pytree with
  the structure of a single update) and ``"round"`` (int).

Every attack ravels each client's update into one vector, crafts vectors with
array code, and writes them back ONLY into the malicious participating rows, so
a cohort without malicious participants comes back unchanged (bitwise).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

PyTree = Any

KNOWLEDGE = ("full", "partial")


class ModelAttack(NamedTuple):
  """A named pure function ``apply(updates, malicious, key, context=None) -> updates``."""
  name: str
  apply: Callable[..., PyTree]


# ------------------------------------------------------------------------------------------ pytrees
def ravel_stack(tree: PyTree) -> tuple[jax.Array, Callable[[jax.Array], PyTree]]:
  """``[C, ...]``-leaved pytree -> (``[C, D]`` matrix, inverse map)."""
  first = jax.tree.map(lambda x: x[0], tree)
  _, unravel_one = ravel_pytree(first)
  flat = jax.vmap(lambda t: ravel_pytree(t)[0])(tree)
  return flat, jax.vmap(unravel_one)


def ravel_one(tree: PyTree) -> jax.Array:
  return ravel_pytree(tree)[0]


class Cohort(NamedTuple):
  """The raveled cohort and its masks (all ``[C]`` masks are bool)."""
  flat: jax.Array  # [C, D]
  unravel: Callable[[jax.Array], PyTree]
  mask: jax.Array  # participating
  mal: jax.Array  # malicious AND participating
  benign: jax.Array  # benign AND participating
  n: jax.Array  # int32: number of participants N
  m: jax.Array  # int32: number of malicious participants M
  craft_all: bool = False  # static: return the crafted vector for EVERY row (see :func:`craft`)


def prepare(updates: PyTree, malicious, context: Optional[dict]) -> Cohort:
  flat, unravel = ravel_stack(updates)
  c = flat.shape[0]
  context = context or {}
  mask = context.get("mask")
  mask = jnp.ones((c,), bool) if mask is None else jnp.asarray(mask).astype(bool).reshape(c)
  mal = jnp.asarray(malicious).astype(bool).reshape(c) & mask
  benign = mask & ~mal
  return Cohort(flat, unravel, mask, mal, benign, jnp.sum(mask).astype(jnp.int32),
                jnp.sum(mal).astype(jnp.int32), bool(context.get("craft_all", False)))


def finish(cohort: Cohort, crafted: jax.Array) -> PyTree:
  """Writes ``crafted`` (``[D]`` shared, or ``[C, D]`` per row) into the malicious rows only."""
  crafted = jnp.broadcast_to(crafted, cohort.flat.shape).astype(cohort.flat.dtype)
  if cohort.craft_all:
    return cohort.unravel(crafted)
  return cohort.unravel(jnp.where(cohort.mal[:, None], crafted, cohort.flat))


def craft(attack: ModelAttack, flat: jax.Array, malicious: jax.Array, key: jax.Array,
          context: Optional[dict] = None) -> jax.Array:
  """``[C, D]``: the vector each row WOULD send if it were malicious, from the same statistics as ``attack.apply``.

  ``apply`` only writes the malicious participating rows, so it cannot say what an attacker
  outside the cohort would craft (or what the crafted vector is when no participant is
  malicious). This runs the attack's own arithmetic with the cohort ``flat`` / ``malicious`` /
  ``context["mask"]`` as the reference (N, M and the statistics come from the participating
  rows only) and returns the crafted vector for every row, participating or not. An attack
  whose crafted vector depends on the row's own update (sign flip, scaling, Gaussian)
  returns a row-wise answer; the pool-statistics attacks (LIE, IPM, Min-Max, Min-Sum, Fang)
  the same vector in every row. Used for FedCAP's poisoned customization requests
  (spec §2.3), where the reference set is the server's pool and the request is not in it.
  """
  return attack.apply(flat, malicious, key, {**(context or {}), "craft_all": True})


def reference_set(cohort: Cohort, knowledge: str) -> jax.Array:
  """The rows whose honest updates the attacker knows: all participants ('full') or its own ('partial')."""
  if knowledge == "full":
    return cohort.mask
  if knowledge == "partial":
    return cohort.mal
  raise ValueError(f"knowledge must be one of {KNOWLEDGE}, got {knowledge!r}")


def benign_reference(cohort: Cohort, knowledge: str) -> jax.Array:
  """Stand-in for "the benign updates".

  The true benign participants ('full') or the attackers' own honest ones ('partial').
  """
  if knowledge == "full":
    return cohort.benign
  if knowledge == "partial":
    return cohort.mal
  raise ValueError(f"knowledge must be one of {KNOWLEDGE}, got {knowledge!r}")


def global_flat(context: Optional[dict], attack: str, required: bool) -> Optional[jax.Array]:
  gp = (context or {}).get("global_params")
  if gp is None:
    if required:
      raise ValueError(f"attack {attack!r} needs context['global_params'] with these settings")
    return None
  return ravel_one(gp)


# ---------------------------------------------------------------------------------------- statistics
def masked_mean(flat: jax.Array, sel: jax.Array) -> jax.Array:
  """Mean of the selected rows (0 if none is selected)."""
  w = sel.astype(flat.dtype)
  count = jnp.sum(w)
  return _column_sum(w, flat) / jnp.maximum(count, 1)


def masked_mean_std(flat: jax.Array, sel: jax.Array, ddof: int = 1) -> tuple[jax.Array, jax.Array]:
  """Coordinate-wise mean and std over the selected rows; ``std`` uses ``count - ddof`` (floored at 1).

  With fewer than ``ddof + 1`` selected rows the std is 0 (not NaN).
  """
  w = sel.astype(flat.dtype)
  count = jnp.sum(w)
  mu = _column_sum(w, flat) / jnp.maximum(count, 1)
  var = _column_sum(w, (flat - mu) ** 2) / jnp.maximum(count - ddof, 1)
  return mu, jnp.sqrt(var)


def _column_sum(w: jax.Array, flat: jax.Array) -> jax.Array:
  """``Σ_i w_i flat_i`` over the rows with ``w_i != 0`` only, as a full-precision dot.

  Unselected rows are zeroed first, because a dot reads them: ``0 * nan = nan``. Without that, an attacker
  whose own (discarded) training diverged would turn IPM's crafted ``-eps * mean(benign)`` into NaN, which
  FedCAP's artifact, reading only the benign uploads, never does. The dot itself is for speed: XLA:CPU turned
  the ``sum(w[:, None] * flat, 0)`` form, with a traced mask, into a loop ~100x slower (LIE at 100 x 100k: 2.6 s
  vs 0.03 s)."""
  return jnp.dot(w, jnp.where((w != 0)[:, None], flat, 0), precision=jax.lax.Precision.HIGHEST)


def row_sq_dists(flat: jax.Array, point: jax.Array) -> jax.Array:
  """``[C]`` squared Euclidean distances from ``point`` to every row."""
  return jnp.sum((flat - point) ** 2, axis=1)


def pairwise_sq_dists(flat: jax.Array) -> jax.Array:
  """``[C, C]`` squared distances, one row at a time (``lax.map``) so memory stays ``O(C D)``."""
  return jax.lax.map(lambda a: row_sq_dists(flat, a), flat)


# ------------------------------------------------------------------------------------- engine adapter
def as_upload_transform(attack: Optional[ModelAttack], malicious_clients, field: str = "delta",
                        context: Optional[dict] = None, fields: Optional[tuple[str, ...]] = None,
                        field_attacks: Optional[dict[str, ModelAttack]] = None):
  """Adapts ``attack`` to the engine hook ``upload_transform(uploads, cohort, key[, context]) -> uploads``.

  ``malicious_clients`` is the ``[K]`` bool mask of attacker-controlled clients
  (e.g. :func:`fedjax_robust.attacks.choose_malicious`); the cohort's rows are
  looked up in it. ``fields`` (default ``(field,)``): the upload fields ``attack`` poisons,
  each with its own key (e.g. ``("delta", "loss")``: FedVSA's model and reported loss).
  ``field_attacks``: fields poisoned by an attack of their own (``{"loss": exaggerate()}``:
  a boosted model beside an exaggerated loss, FedVSA spec §2); ``attack`` may then be
  ``None``. The engine's round context (a
  :class:`~fedjax_robust.round_context.RoundContext` or a dict; ``None`` entries are
  dropped) is merged over the static ``context`` given here.
  """
  mal_k = jnp.asarray(malicious_clients).astype(bool)
  static = dict(context or {})
  own_fields = tuple((field,) if fields is None else fields)
  if attack is not None and not own_fields:
    raise ValueError(f"attack {attack.name!r} poisons no upload field: name one in attack.fields")
  plan = [(f, attack) for f in (own_fields if attack is not None else ())]
  for f, own in (field_attacks or {}).items():
    if f in dict(plan):
      raise ValueError(f"upload field {f!r} is poisoned twice: by {attack.name!r} and by {own.name!r} (attack.fields)")
    plan.append((f, own))
  if not plan:
    raise ValueError("as_upload_transform: no attack and no field attack given")
  fields = tuple(f for f, _ in plan)

  def transform(uploads, cohort, key, round_context=None):
    if round_context is not None and hasattr(round_context, "as_dict"):
      round_context = round_context.as_dict()
    ctx = {**static, **{k: v for k, v in (round_context or {}).items() if v is not None}}
    # The round's own attacker mask when the engine gives one (an argument of the round, so seeds with different
    # attackers share one program); the mask given here otherwise.
    cohort_malicious = ctx.get("malicious")
    cohort_malicious = mal_k[cohort] if cohort_malicious is None else jnp.asarray(cohort_malicious, bool)
    missing = [f for f in fields if f not in uploads]
    if missing:
      raise ValueError(f"attack {'/'.join(a.name for _, a in plan)!r} poisons upload fields {missing}, but this "
                       f"algorithm uploads {sorted(uploads)} (attack.fields)")
    poisoned = dict(uploads)
    for i, (f, a) in enumerate(plan):  # every field reads the honest uploads, not another field's poisoned ones
      poisoned[f] = a.apply(uploads[f], cohort_malicious, jax.random.fold_in(key, i) if i else key, ctx)
    return poisoned

  transform.fields = fields  # the engine refuses a review phase whose reports carry one of them (simulation.py)
  return transform
