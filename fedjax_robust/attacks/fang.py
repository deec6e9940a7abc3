"""Fang et al. (USENIX Security 2020) local-model-poisoning attacks, as specified by FedCC (spec 2.2-2.3).

* :func:`fang_krum` -- the full-knowledge attack on Krum: every attacker sends
  the model ``w_G - lambda s``; ``lambda`` starts at Fang's upper bound
  ``lambda_0`` and is halved while ``lambda > 1e-5`` until Krum picks a
  malicious model; if none of the lambdas does, the last one tried is sent.
* :func:`fang_trimmed_mean` (alias :func:`fang_median`) -- the attack on
  coordinate-wise trimmed mean / median with the b-scaling rule; every attacker
  draws its own uniform values, so the crafted models all differ.

Direction ``s`` (``direction=``, the spec's ``fang_dir``): ``'change'`` (default,
Fang's definition): ``s = sign(mean_benign(w_i) - w_G) = sign(mean_benign(u_i))``;
``'global_sign'`` (the FedCC code): ``s = sign(w_G)``, needs ``context['global_params']``.

Models vs updates. The spec defines both attacks on full models ``w_i``; the
engine hands the attack the uploads ``u_i = w_i - w_G`` and aggregates updates.
The arithmetic below is the models' arithmetic, rewritten where ``w_G`` cancels:

* Fang-Krum: every distance is a difference of two models, so
  ``D(w_l, w_i) = ||u_l - u_i||``, ``D(w_i, w_G) = ||u_i||``, the crafted model
  ``w_G - lambda s`` is the update ``-lambda s`` and Krum (a function of pairwise
  distances only) picks the same index on models and on updates. ``lambda_0``,
  the search and the sent model are therefore exactly those of the spec. Only
  ``direction='global_sign'`` needs ``w_G`` itself.
* Fang-Med: the ``[w_max, b w_max]`` / ``[w_max, w_max / b]`` rules depend on the
  SIGN of the model values, which an update does not know. The attack works in
  model space ``w_i = w_G + u_i`` whenever ``context['global_params']`` is given
  (``space='auto'``, the engine always gives it; ``space='model'`` requires it)
  and returns ``crafted model - w_G``. ``space='update'`` (or ``'auto'`` without
  global params) applies the same rule to the updates themselves: that is Fang's
  gradient-space variant, NOT the spec's model-space attack.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_robust import flat_random
from fedjax_robust.attacks.base import (ModelAttack, benign_reference, finish, global_flat, masked_mean,
                                        masked_mean_std, pairwise_sq_dists, prepare)

DIRECTIONS = ("change", "global_sign")


def _check(name, value, allowed):
  if value not in allowed:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def _k_smallest_sum(dist: jax.Array, valid: jax.Array, k: jax.Array) -> jax.Array:
  """Per row, the sum of the ``k`` smallest entries among ``valid`` ones (``k`` may be traced)."""
  srt = jnp.sort(jnp.where(valid, dist, jnp.inf), axis=-1)
  csum = jnp.cumsum(jnp.where(jnp.isfinite(srt), srt, 0.0), axis=-1)
  idx = jnp.clip(k - 1, 0, dist.shape[-1] - 1)
  return jnp.where(k >= 1, csum[..., idx], 0.0)


def krum_scores_from_dists(dist: jax.Array, mask: jax.Array, f, compat: bool = False) -> jax.Array:
  """Krum scores given a ``[C, C]`` distance matrix (non-participants score ``+inf``).

  Standard (Blanchard et al.; spec 3): ``dist`` holds SQUARED Euclidean
  distances and the score sums the ``n - f - 2`` smallest distances to the OTHER
  participants (``k`` clamped to ``[1, n - 1]``). ``compat=True`` (FedCC code,
  ``aggregate.krum``): ``dist`` is ``sqrt(sum delta^4)`` and the ``k`` smallest
  entries of the row INCLUDE the self-distance 0 (so ``k - 1`` neighbours count).
  """
  c = dist.shape[0]
  n = jnp.sum(mask).astype(jnp.int32)
  k = jnp.clip(n - jnp.asarray(f, jnp.int32) - 2, 1, jnp.maximum(n - 1, 1))
  valid = mask[None, :] & mask[:, None]
  if not compat:
    valid = valid & ~jnp.eye(c, dtype=bool)
  scores = _k_smallest_sum(dist, valid, k)
  return jnp.where(mask, scores, jnp.inf)


def krum_distances(flat: jax.Array, compat: bool = False) -> jax.Array:
  """``[C, C]`` Krum distances: squared Euclidean, or ``sqrt(sum delta^4)`` with ``compat``."""
  if not compat:
    return pairwise_sq_dists(flat)
  return jax.lax.map(lambda a: jnp.sqrt(jnp.sum((flat - a) ** 4, axis=1)), flat)


def krum_select(flat: jax.Array, mask: jax.Array, f, compat: bool = False) -> jax.Array:
  """Index of the row Krum selects (a small local Krum for the attack's search and the tests)."""
  return jnp.argmin(krum_scores_from_dists(krum_distances(flat, compat), mask, f, compat))


def _direction(c, context, direction: str, ref: jax.Array, attack: str) -> jax.Array:
  if direction == "change":
    return jnp.sign(masked_mean(c.flat, ref))
  return jnp.sign(global_flat(context, attack, required=True))


# ------------------------------------------------------------------------------------------- Fang-Krum
def fang_lambda0(flat: jax.Array, benign: jax.Array, n, f) -> jax.Array:
  """Fang's upper bound (spec 2.2) with UNSQUARED Euclidean distances, on updates::

      lambda_0 = min_{i in B} sum_{l in Gamma_i} D(w_l, w_i) / ((n - 2f - 1) sqrt(d))
                 + max_{i in B} D(w_i, w_G) / sqrt(d)

  with ``D(w_l, w_i) = ||u_l - u_i||`` and ``D(w_i, w_G) = ||u_i||`` (``w_G``
  cancels). ``Gamma_i``: the ``n - f - 2`` benign rows nearest to row ``i``,
  itself excluded (clamped to ``[0, |B| - 1]``, which only bites when the
  benign set is smaller than ``n - f``). ``n`` = all models Krum sees, ``f`` =
  attackers. The denominator ``n - 2f - 1`` is floored at 1 [R]: the spec's
  formula (and the FedCC code, ``n_benign - n_attackers - 1``) divides by zero
  at ``n = 2f + 1`` and flips the sign of ``lambda`` beyond.
  """
  c, d = flat.shape
  dist = jnp.sqrt(pairwise_sq_dists(flat))
  nb = jnp.sum(benign).astype(jnp.int32)
  k = jnp.clip(jnp.asarray(n, jnp.int32) - jnp.asarray(f, jnp.int32) - 2, 0, jnp.maximum(nb - 1, 0))
  valid = benign[:, None] & benign[None, :] & ~jnp.eye(c, dtype=bool)
  nearest = _k_smallest_sum(dist, valid, k)
  first = jnp.min(jnp.where(benign, nearest, jnp.inf))
  denom = jnp.maximum(jnp.asarray(n, jnp.float32) - 2 * jnp.asarray(f, jnp.float32) - 1, 1.0)
  second = jnp.max(jnp.where(benign, jnp.sqrt(jnp.sum(flat ** 2, axis=1)), -jnp.inf))
  return (first / (denom * math.sqrt(d)) + second / math.sqrt(d)).astype(flat.dtype)


def _crafted_distance_coeffs(flat: jax.Array, s: jax.Array, compat: bool) -> jax.Array:
  """``[C, P]``: the distance from row ``x_i`` to the crafted ``-lambda s`` as a polynomial in ``lambda``.

  Standard: ``||x + lambda s||^2 = sum x^2 + 2 lambda sum x s + lambda^2 sum s^2``;
  compat (before the square root): ``sum (x + lambda s)^4`` expanded binomially.
  The power sums are computed once (``O(C d)``), so every lambda of the search costs ``O(C)``.
  """
  s = s[None, :]
  if not compat:
    terms = [flat * flat, 2 * flat * s, jnp.broadcast_to(s * s, flat.shape)]
  else:
    terms = [flat ** 4, 4 * flat ** 3 * s, 6 * flat ** 2 * s ** 2, 4 * flat * s ** 3,
             jnp.broadcast_to(s ** 4, flat.shape)]
  return jnp.stack([jnp.sum(t, axis=1) for t in terms], axis=1)


def _crafted_distances(coeffs: jax.Array, lam: jax.Array, compat: bool) -> jax.Array:
  powers = lam ** jnp.arange(coeffs.shape[1], dtype=coeffs.dtype)
  d = jnp.maximum(jnp.sum(coeffs * powers, axis=1), 0.0)
  return jnp.sqrt(d) if compat else d


class FangKrumSearch(NamedTuple):
  lam: jax.Array  # the lambda whose crafted models are sent
  lam0: jax.Array  # Fang's upper bound
  success: jax.Array  # bool: Krum picks a malicious model at ``lam``
  num_tried: jax.Array  # int32: lambdas the spec's sequential loop evaluates (up to and including ``lam``)


def fang_krum_search(flat: jax.Array, malicious: jax.Array, mask: jax.Array, s: jax.Array, lam0: jax.Array, f,
                     lambda_min: float = 1e-5, krum_compat: bool = False, max_halvings: int = 200,
                     batch_size: int = 32) -> FangKrumSearch:
  """The halving search of spec 2.2, vectorised over the precomputed ``lambda_j = lambda_0 2^-j``.

  The spec's loop: ``lambda = lambda_0``; while ``lambda > lambda_min``: if Krum
  (``f`` attackers) over [``-lambda s`` at the ``malicious`` rows, ``flat``
  elsewhere] picks a malicious row, stop; else halve. With no success the last
  lambda tried is sent (the FedCC code); if ``lambda_0 <= lambda_min`` nothing
  is tried and ``lambda_0`` is sent. Here all ``j < max_halvings`` (a static
  bound: 200 halvings cover the float32 range) are evaluated at once and the
  first success is taken, which is what the sequential loop returns
  (``lambda_0 2^-j`` is exact in floating point, as repeated halving is).
  """
  base = krum_distances(flat, krum_compat)
  both_mal = malicious[:, None] & malicious[None, :]
  one_mal = malicious[:, None] ^ malicious[None, :]
  coeffs = _crafted_distance_coeffs(flat, s.astype(flat.dtype), krum_compat)

  def picks_malicious(lam):
    to_crafted = _crafted_distances(coeffs, lam, krum_compat)
    other = jnp.where(malicious[:, None], to_crafted[None, :], to_crafted[:, None])  # the honest end's row
    dist = jnp.where(both_mal, 0.0, jnp.where(one_mal, other, base))
    return malicious[jnp.argmin(krum_scores_from_dists(dist, mask, f, krum_compat))]

  lams = lam0 * jnp.exp2(-jnp.arange(max_halvings, dtype=flat.dtype))
  tried = lams > lambda_min  # a prefix: lambda_j decreases with j
  ok = jax.lax.map(picks_malicious, lams, batch_size=min(batch_size, max_halvings)) & tried
  n_tried = jnp.sum(tried).astype(jnp.int32)
  first = jnp.argmax(ok).astype(jnp.int32)
  success = jnp.any(ok)
  idx = jnp.where(success, first, jnp.maximum(n_tried - 1, 0))
  lam = jnp.where(success | (n_tried > 0), lams[idx], lam0)
  return FangKrumSearch(lam, lam0, success, jnp.where(success, first + 1, n_tried))


def fang_krum(direction: str = "change", knowledge: str = "full", lambda_min: float = 1e-5,
              krum_compat: bool = False, max_halvings: int = 200) -> ModelAttack:
  """Fang et al.'s attack on Krum (FedCC "Fang-Krum" / Table I "Fang-mKrum", spec 2.2).

  Every attacker sends the same model ``w_G - lambda s`` (update ``-lambda s``).
  ``lambda`` = the first of ``lambda_0, lambda_0/2, ...`` (while ``> lambda_min``)
  at which Krum with ``n`` = participants and ``f`` = malicious participants
  selects a malicious index (:func:`fang_krum_search`, :func:`fang_lambda0` over
  the benign reference); the last one tried if none does.

  ``knowledge='full'`` (spec default): ``lambda_0`` and the direction come from
  the true benign participants and the simulated Krum runs on the real cohort;
  ``'partial'`` (Fang's partial knowledge): the attackers' own honest updates
  stand in for the benign ones, ``lambda_0`` uses n = 2M, and the simulated Krum
  runs over the M crafted + M honest attacker updates. ``krum_compat`` uses the
  FedCC code's Krum in the success check (``sqrt(sum delta^4)`` distance, self
  included in the k smallest). ``direction``: module docstring.
  """
  _check("direction", direction, DIRECTIONS)
  _check("knowledge", knowledge, ("full", "partial"))

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    ref = benign_reference(c, knowledge)
    s = _direction(c, context, direction, ref, "fang_krum").astype(c.flat.dtype)
    if knowledge == "full":  # simulate the real Krum: crafted rows + the true benign uploads
      sim_flat, sim_mal, sim_mask, n_sim = c.flat, c.mal, c.mask, c.n
    else:  # Fang's partial knowledge: Krum over the crafted rows + the attackers' own honest updates
      sim_flat = jnp.concatenate([c.flat, c.flat])
      sim_mal = jnp.concatenate([c.mal, jnp.zeros_like(c.mal)])
      sim_mask = jnp.concatenate([c.mal, c.mal])
      n_sim = 2 * c.m
    lam0 = fang_lambda0(c.flat, ref, n_sim, c.m)
    search = fang_krum_search(sim_flat, sim_mal, sim_mask, s, lam0, c.m, lambda_min, krum_compat, max_halvings)
    return finish(c, -search.lam * s)

  return ModelAttack("fang_krum", apply)


# -------------------------------------------------------------------------------------------- Fang-Med
def fang_trimmed_mean(b: float = 2.0, direction: Optional[str] = None, knowledge: str = "full",
                      space: str = "auto", compat: bool = False) -> ModelAttack:
  """Fang et al.'s attack on coordinate-wise trimmed mean / median (FedCC "Fang-Med", spec 2.3).

  Full knowledge (default): per coordinate ``j``, ``w_max``/``w_min`` over the
  benign models; each attacker ``k`` draws its own ``u_kj ~ U(0, 1)`` and sends

  * ``s_j = -1`` (push up): ``w_max + u (b w_max - w_max)`` if ``w_max > 0`` else
    ``w_max + u (w_max / b - w_max)`` -- in ``[w_max, b w_max]`` or ``[w_max, w_max / b]``;
  * ``s_j = +1`` (push down): ``w_min + u (w_min / b - w_min)`` if ``w_min > 0`` else
    ``w_min + u (b w_min - w_min)`` -- in ``[w_min / b, w_min]`` or ``[b w_min, w_min]``;
  * ``s_j = 0`` (not in the spec): the coordinate is left at ``w_G`` (update 0),
    as Fang's gradient-space rule leaves a zero-change coordinate unchanged.

  ``b = 2`` (paper). ``knowledge='partial'`` (Fang's partial-knowledge variant):
  mean ``mu`` and unbiased std ``sigma`` of the attackers' own honest models;
  values uniform in ``[mu + 3 sigma, mu + 4 sigma]`` (``s=-1``) or
  ``[mu - 4 sigma, mu - 3 sigma]`` (``s=+1``). ``space``: module docstring.

  ``compat=True`` (the spec's ``fang_med_compat``) reproduces the FedCC code,
  inherited from the NDSS'21 notebook (``get_malicious_updates_untargeted_med``)::

      max_rand = w_max + u (max_far - w_max)      # max_far = b w_max or w_max / b
      min_rand = min_far + u (w_min - min_far)    # min_far = w_min / b or b w_min
      sent     = [s > 0] max_rand + [s > 0] min_rand

  with the deviation indicator ``s > 0`` in BOTH terms (coordinates with
  ``s <= 0`` get model value 0) and ONE ``u`` per attacker and coordinate shared
  by ``max_rand`` and ``min_rand`` (note ``min_rand`` runs from the far end at
  ``u = 0``). It implies ``direction='global_sign'`` (the code's ``sign(w_G)``)
  unless ``direction`` is given, and ignores ``knowledge``.
  """
  direction = direction or ("global_sign" if compat else "change")
  _check("direction", direction, DIRECTIONS)
  _check("knowledge", knowledge, ("full", "partial"))
  _check("space", space, ("auto", "model", "update"))

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    ref = c.benign if compat else benign_reference(c, knowledge)
    s = _direction(c, context, direction, ref, "fang_trimmed_mean")
    wg = global_flat(context, "fang_trimmed_mean", required=(space == "model"))
    if space == "update" or wg is None:
      wg = jnp.zeros(c.flat.shape[1:], c.flat.dtype)
    models = c.flat + wg
    u = flat_random.uniform(key, c.flat.shape, c.flat.dtype)  # one draw per attacker row and coordinate
    if knowledge == "partial" and not compat:
      mu, sigma = masked_mean_std(models, ref, ddof=1)
      up = mu + (3 + u) * sigma
      down = mu - (3 + u) * sigma
    else:
      w_max = jnp.max(jnp.where(ref[:, None], models, -jnp.inf), axis=0)
      w_min = jnp.min(jnp.where(ref[:, None], models, jnp.inf), axis=0)
      max_far = jnp.where(w_max > 0, b * w_max, w_max / b)
      min_far = jnp.where(w_min > 0, w_min / b, b * w_min)
      up = w_max + u * (max_far - w_max)
      down = w_min + u * (min_far - w_min)
    if compat:
      crafted = jnp.where(s > 0, up + (min_far + u * (w_min - min_far)), 0.0)
    else:
      crafted = jnp.where(s < 0, up, jnp.where(s > 0, down, wg))
    crafted = jnp.where(jnp.isfinite(crafted), crafted, wg)  # empty reference set: no change
    return finish(c, crafted - wg)

  return ModelAttack("fang_trimmed_mean", apply)


def fang_median(b: float = 2.0, direction: Optional[str] = None, knowledge: str = "full", space: str = "auto",
                compat: bool = False) -> ModelAttack:
  """Alias of :func:`fang_trimmed_mean` (Fang et al. use the same attack against the median)."""
  return fang_trimmed_mean(b, direction, knowledge, space, compat)._replace(name="fang_median")


__all__ = ["fang_krum", "fang_krum_search", "FangKrumSearch", "fang_trimmed_mean", "fang_median", "fang_lambda0",
           "krum_select", "krum_scores_from_dists", "krum_distances"]
