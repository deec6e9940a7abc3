"""Fang et al. (USENIX Security 2020) local-model-poisoning attacks, as specified by FedCC (spec 2.2-2.3).

* :func:`fang_krum` -- the full-knowledge attack on Krum: every attacker sends
  ``w_G - lambda s``; ``lambda`` starts at Fang's upper bound ``lambda_0`` and is
  halved until Krum picks a malicious model (or ``lambda <= 1e-5``).
* :func:`fang_trimmed_mean` (alias :func:`fang_median`) -- the attack on
  coordinate-wise trimmed mean / median with the b-scaling rule; every attacker
  draws its own uniform values, so the crafted models all differ.

Direction ``s`` (``direction=``): ``'change'`` (default, Fang's definition):
``s = sign(mean_benign(w_i) - w_G) = sign(mean_benign(update))``;
``'global_sign'`` (the FedCC code): ``s = sign(w_G)``, needs ``context['global_params']``.

Uploads are updates ``u_i = w_i - w_G``. Krum is translation invariant, so the
Krum attack works on updates directly (crafted update ``-lambda s``). The
trimmed-mean rule depends on the SIGN of the model parameters, so it works in
model space ``w_i = w_G + u_i`` when ``context['global_params']`` is given
(``space='auto'``/``'model'``) and on the updates themselves otherwise
(``space='update'``, or ``'auto'`` without global params).
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.attacks.base import (ModelAttack, benign_reference, finish, global_flat, masked_mean,
                                        masked_mean_std, pairwise_sq_dists, prepare, row_sq_dists)

DIRECTIONS = ("change", "global_sign")


def _check(name, value, allowed):
  if value not in allowed:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def _k_smallest_sum(dist: jax.Array, valid: jax.Array, k: jax.Array) -> jax.Array:
  """Per row, the sum of the ``k`` smallest entries among ``valid`` ones (``k`` may be traced)."""
  srt = jnp.sort(jnp.where(valid, dist, jnp.inf), axis=1)
  csum = jnp.cumsum(jnp.where(jnp.isfinite(srt), srt, 0.0), axis=1)
  idx = jnp.clip(k - 1, 0, dist.shape[1] - 1)
  return jnp.where(k >= 1, csum[:, idx], 0.0)


def krum_scores_from_dists(dist: jax.Array, mask: jax.Array, f, compat: bool = False) -> jax.Array:
  """Krum scores given a ``[C, C]`` distance matrix (non-participants score ``+inf``).

  Standard (Blanchard et al.): ``dist`` holds SQUARED Euclidean distances and
  the score sums the ``n - f - 2`` smallest distances to the OTHER participants
  (``k`` clamped to ``[1, n - 1]``). ``compat=True`` (FedCC code): ``dist`` is
  ``sqrt(sum delta^4)`` and the ``k`` smallest entries of the row INCLUDE the
  self-distance 0.
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


def fang_lambda0(flat: jax.Array, benign: jax.Array, n, f) -> jax.Array:
  """Fang's upper bound (spec 2.2), unsquared distances, on updates (``D(w_i, w_G) = ||u_i||``)::

      lambda_0 = min_{i in B} sum_{l in Gamma_i} D(u_l, u_i) / ((n - 2f - 1) sqrt(d))
                 + max_{i in B} ||u_i|| / sqrt(d)

  ``Gamma_i``: the ``n - f - 2`` benign rows nearest to row i, itself excluded
  (clamped to ``[0, |B| - 1]``); the denominator ``n - 2f - 1`` is floored at 1.
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


def fang_krum(direction: str = "change", knowledge: str = "full", lambda_min: float = 1e-5,
              krum_compat: bool = False, max_halvings: int = 200) -> ModelAttack:
  """Fang et al.'s attack on Krum (FedCC "Fang-Krum", spec 2.2).

  Every attacker uploads ``-lambda s`` (model ``w_G - lambda s``). Search:
  ``lambda = lambda_0`` (:func:`fang_lambda0` over the benign reference); while
  ``lambda > lambda_min``: if Krum (n = participants, f = malicious
  participants) over [crafted at the malicious rows, honest elsewhere] picks a
  malicious row, stop; else halve. If nothing succeeds the last lambda tried is
  used (as the code). ``knowledge='full'`` (spec default): the benign reference
  (``lambda_0``, direction) is the true benign participants and the simulated
  Krum runs on the real cohort; ``'partial'`` (Fang's partial knowledge): the
  attackers' own honest updates stand in for the benign ones, ``lambda_0`` uses
  n = 2M, and the simulated Krum runs over the M crafted + M honest attacker
  updates. ``krum_compat`` uses the FedCC code's quirky Krum distance in the
  success check.
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
    base = krum_distances(sim_flat, krum_compat)
    both_mal = sim_mal[:, None] & sim_mal[None, :]
    one_mal = sim_mal[:, None] ^ sim_mal[None, :]

    def picks_malicious(lam):
      crafted = -lam * s
      if krum_compat:
        to_crafted = jnp.sqrt(jnp.sum((sim_flat - crafted) ** 4, axis=1))
      else:
        to_crafted = row_sq_dists(sim_flat, crafted)
      other = jnp.where(sim_mal[:, None], to_crafted[None, :], to_crafted[:, None])  # the honest end's row
      dist = jnp.where(both_mal, 0.0, jnp.where(one_mal, other, base))
      return sim_mal[jnp.argmin(krum_scores_from_dists(dist, sim_mask, c.m, krum_compat))]

    def cond(state):
      lam, _, done, it = state
      return (lam > lambda_min) & ~done & (it < max_halvings)

    def body(state):
      lam, _, _, it = state
      ok = picks_malicious(lam)
      return jnp.where(ok, lam, lam / 2), lam, ok, it + 1

    _, lam_used, _, _ = jax.lax.while_loop(cond, body, (lam0, lam0, jnp.bool_(False), jnp.int32(0)))
    return finish(c, -lam_used * s)

  return ModelAttack("fang_krum", apply)


def fang_trimmed_mean(b: float = 2.0, direction: Optional[str] = None, knowledge: str = "full",
                      space: str = "auto", compat: bool = False) -> ModelAttack:
  """Fang et al.'s attack on coordinate-wise trimmed mean / median (FedCC "Fang-Med", spec 2.3).

  Full knowledge (default): per coordinate, ``w_max``/``w_min`` over the benign
  models; each attacker draws ``r ~ U(0, 1)`` per coordinate and sends

  * ``s_j = -1`` (push up): ``w_max + r (b w_max - w_max)`` if ``w_max > 0`` else
    ``w_max + r (w_max / b - w_max)`` -- in ``[w_max, b w_max]`` or ``[w_max, w_max / b]``;
  * ``s_j = +1`` (push down): ``w_min + r (w_min / b - w_min)`` if ``w_min > 0`` else
    ``w_min + r (b w_min - w_min)`` -- in ``[w_min / b, w_min]`` or ``[b w_min, w_min]``;
  * ``s_j = 0``: the coordinate is left at ``w_G`` (update 0).

  ``knowledge='partial'`` (Fang's partial-knowledge variant): mean ``mu`` and
  unbiased std ``sigma`` of the attackers' own honest models; values uniform in
  ``[mu + 3 sigma, mu + 4 sigma]`` (``s=-1``) or ``[mu - 4 sigma, mu - 3 sigma]`` (``s=+1``).

  ``compat=True`` reproduces the FedCC/NDSS-notebook bug:
  ``[s>0] * max_rand + [s>0] * min_rand`` with one shared ``r`` (coordinates with
  ``s <= 0`` get model value 0); it implies ``direction='global_sign'`` unless
  ``direction`` is given. ``b = 2`` (paper).
  """
  direction = direction or ("global_sign" if compat else "change")
  _check("direction", direction, DIRECTIONS)
  _check("knowledge", knowledge, ("full", "partial"))
  _check("space", space, ("auto", "model", "update"))

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    ref = benign_reference(c, knowledge)
    s = _direction(c, context, direction, ref, "fang_trimmed_mean")
    wg = global_flat(context, "fang_trimmed_mean", required=(space == "model"))
    if space == "update" or wg is None:
      wg = jnp.zeros(c.flat.shape[1:], c.flat.dtype)
    models = c.flat + wg
    r = jax.random.uniform(key, c.flat.shape, c.flat.dtype)
    if knowledge == "partial" and not compat:
      mu, sigma = masked_mean_std(models, ref, ddof=1)
      up = mu + (3 + r) * sigma
      down = mu - (3 + r) * sigma
    else:
      w_max = jnp.max(jnp.where(ref[:, None], models, -jnp.inf), axis=0)
      w_min = jnp.min(jnp.where(ref[:, None], models, jnp.inf), axis=0)
      up = jnp.where(w_max > 0, w_max + r * (b * w_max - w_max), w_max + r * (w_max / b - w_max))
      down = jnp.where(w_min > 0, w_min + r * (w_min / b - w_min), w_min + r * (b * w_min - w_min))
    if compat:
      crafted = jnp.where(s > 0, up + down, 0.0)
    else:
      crafted = jnp.where(s < 0, up, jnp.where(s > 0, down, wg))
    crafted = jnp.where(jnp.isfinite(crafted), crafted, wg)  # empty reference set: no change
    return finish(c, crafted - wg)

  return ModelAttack("fang_trimmed_mean", apply)


def fang_median(b: float = 2.0, direction: Optional[str] = None, knowledge: str = "full", space: str = "auto",
                compat: bool = False) -> ModelAttack:
  """Alias of :func:`fang_trimmed_mean` (Fang et al. use the same attack against the median)."""
  return fang_trimmed_mean(b, direction, knowledge, space, compat)._replace(name="fang_median")


__all__ = ["fang_krum", "fang_trimmed_mean", "fang_median", "fang_lambda0", "krum_select",
           "krum_scores_from_dists", "krum_distances"]
