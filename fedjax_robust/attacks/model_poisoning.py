"""Untargeted model-poisoning attacks on stacked uploads: FedCAP's A2-A8 and their kin.

Definitions follow the FedCAP spec (section 2.2) and its artifact
(``system/utils/byzantine.py``); where the paper and the code disagree the
code is the default and the paper is a flag:

=================  ==========================================================  ====================================
attack             crafted upload of each malicious client                    paper-vs-code flag
=================  ==========================================================  ====================================
gaussian (A2)      ``N(0, std(own update))`` replacing the upload (code)       ``mode='add'``, fixed ``sigma``
sign_flip (A4)     ``-scale * u``                                             --
scaling / MR (A3)  ``N * u`` (N = participants this round)                    ``mode='oracle'`` (FedVSA Eq. 10)
boosting           ``alpha * u`` (FedCC / Bhagoji explicit boosting, 5)       ``alternate`` (Krum-only code quirk)
exaggerate         ``kappa * max(benign)`` per coordinate (FedVSA's loss lie)  --
lie (A5)           ``mu - z sigma`` (unbiased sigma), z from Baruch et al.    ``z`` override
ipm (A8)           ``-eps * mean(benign)``, eps = N                            --
min_max (A6)       ``mu + gamma d_p``, FedCAP's gamma search                  ``perturbation``, search constants
min_sum (A7)       same, sum of (non-squared) distances                       ``squared=True`` = paper Eq. 10
=================  ==========================================================  ====================================

``knowledge='full'`` (default; what FedCAP's artifact does) computes the
statistics over all N participating uploads, benign ones included;
``knowledge='partial'`` (the paper's stated threat model) over the malicious
clients' own honest updates only. LIE, IPM, Min-Max and Min-Sum send the SAME
vector from every malicious client.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from fedjax_robust import flat_random
from fedjax_robust.attacks.base import (ModelAttack, benign_reference, finish, masked_mean,
                                        masked_mean_std, pairwise_sq_dists, prepare, reference_set,
                                        row_sq_dists)


def _check(name: str, value, allowed) -> None:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


# ------------------------------------------------------------------------------------ simple attacks
def identity() -> ModelAttack:
  """No attack: uploads pass through unchanged."""
  return ModelAttack("none", lambda updates, malicious, key, context=None: updates)


def gaussian(sigma: Optional[float] = None, mode: str = "replace") -> ModelAttack:
  """Gaussian noise (FedCAP A2, "Random").

  ``mode='replace'`` (FedCAP A2): the upload becomes ``N(0, s^2)`` noise;
  ``mode='add'``: noise is added to the honest upload. ``sigma=None`` (A2):
  ``s`` = the population (ddof=0) std of the client's own flattened update,
  per client; a number fixes ``s``.
  """
  _check("mode", mode, ("replace", "add"))

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    if sigma is None:
      s = jnp.std(c.flat, axis=1, keepdims=True)
    else:
      s = jnp.asarray(sigma, c.flat.dtype)
    noise = s * flat_random.normal(key, c.flat.shape, c.flat.dtype)
    return finish(c, noise if mode == "replace" else c.flat + noise)

  return ModelAttack("gaussian", apply)


def sign_flip(scale: float = 1.0) -> ModelAttack:
  """Sign flipping (FedCAP A4): ``u <- -scale * u`` (scale 1 in FedCAP)."""

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    return finish(c, -scale * c.flat)

  return ModelAttack("sign_flip", apply)


def scaling(factor: Optional[float] = None, mode: str = "blind") -> ModelAttack:
  """Model replacement / scaling (FedCAP A3, FedVSA section 2).

  ``mode='blind'`` (default): ``u <- factor * u`` with ``factor=None`` meaning
  N = the number of participating uploads this round (FedCAP: ``len(uploads)``;
  FedVSA: ``gamma = 1/p_m = m^t``).

  ``mode='oracle'`` (FedVSA Eq. 10): with aggregation weights ``p`` (context
  ``"weights"`` normalised over participants, uniform if absent) each attacker
  sends ``(t_a - sum_{k benign} p_k u_k) / P_mal`` where ``t_a`` is its own honest
  update (= ``w_p - w^t``) and ``P_mal`` the attackers' total weight, so the
  weighted mean of the cohort equals the (weighted) mean of the attackers'
  targets -- exactly ``w_p`` for one attacker. ``factor`` is ignored there.
  """
  _check("mode", mode, ("blind", "oracle"))

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    if mode == "blind":
      f = c.n.astype(c.flat.dtype) if factor is None else jnp.asarray(factor, c.flat.dtype)
      return finish(c, f * c.flat)
    w = (context or {}).get("weights")
    w = jnp.ones(c.mask.shape, c.flat.dtype) if w is None else jnp.asarray(w, c.flat.dtype)
    w = jnp.where(c.mask, w, 0.0)
    p = w / jnp.maximum(jnp.sum(w), 1e-30)
    benign_part = jnp.sum(jnp.where(c.benign, p, 0.0)[:, None] * c.flat, axis=0)
    p_mal = jnp.sum(jnp.where(c.mal, p, 0.0))
    return finish(c, (c.flat - benign_part) / jnp.where(p_mal > 0, p_mal, 1.0))

  return ModelAttack("scaling", apply)


def boosting(factor: float = 5.0, alternate: bool = False) -> ModelAttack:
  """Explicit boosting (FedCC targeted attack, spec 2.4; Bhagoji et al.): ``w_sent = w_G + a (w_local - w_G)``.

  On the uploads ``u = w_local - w_G`` this is exactly ``u_sent = a u`` (``w_G``
  cancels). ``a`` = alpha_m = 5 (FedCC code; the paper gives no value).
  ``alternate=True`` reproduces the FedCC code's schedule when the aggregator is
  Krum (spec 2.4 [Q]; set it only for Krum runs): boost only when
  ``context['round']`` (0-based index of the round being played, i.e.
  ``SimState.round``; the code's ``epoch % 2 == 0``, i.e. ``(t-1) mod 2 == 0``
  for 1-based ``t``) is even, and send the unboosted update otherwise.
  Only the upload is changed: the malicious client's local training on the
  backdoor set (spec 2.4) is the engine's part.
  """

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    f = jnp.asarray(factor, c.flat.dtype)
    if alternate:
      rnd = (context or {}).get("round")
      if rnd is None:
        raise ValueError("boosting(alternate=True) needs context['round']")
      f = jnp.where(jnp.asarray(rnd) % 2 == 0, f, jnp.ones_like(f))
    return finish(c, f * c.flat)

  return ModelAttack("boosting", apply)


def exaggerate(kappa: float = 10.0) -> ModelAttack:
  """Value exaggeration (FedVSA spec §2, option "exaggerate" [R]): every attacker sends ``kappa`` times the largest
  value the participating benign clients send, coordinate by coordinate.

  Written for a scalar upload field, FedVSA's reported inference loss (``attack.fields=delta,loss=exaggerate``):
  the attacker claims a loss far above everyone else's, so value-sensitive weights (a softmax over the reports,
  clipped at their mean) give it the largest share and the mean that clips them rises with it. The spec's
  reference is the previous round's largest loss; an upload attack sees this round's cohort, not the server's
  history, so the reference here is this round's largest benign report, the same full knowledge the Fang attacks
  assume (with ``kappa = 10`` the two differ by how much the losses moved in one round). Non-finite benign values
  are skipped; a cohort without a finite benign value sends ``kappa`` times the attacker's own honest value.
  """

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    usable = c.benign[:, None] & jnp.isfinite(c.flat)
    top = jnp.max(jnp.where(usable, c.flat, -jnp.inf), axis=0)
    reference = jnp.where(jnp.any(usable, axis=0)[None, :], top[None, :], c.flat)
    return finish(c, jnp.asarray(kappa, c.flat.dtype) * reference)

  return ModelAttack("exaggerate", apply)


# ------------------------------------------------------------------------------------ LIE and IPM
def lie_z(n, m) -> jax.Array:
  """Baruch et al.'s z_max for N uploads of which M are malicious (FedCAP A5).

  ``s = floor(N/2) + 1 - M``, ``z = Phi^-1((N - M - s) / (N - M))``. The cdf
  argument is clipped to ``[1e-4, 1 - 1e-4]`` (|z| <= 3.719), which guards the
  ``s <= 0`` case (M > N/2: argument >= 1, NaN/inf unguarded) and ``N = M``.
  N=20, M=6 -> 0.36611; N=36, M=10 -> 0.39573.
  """
  n = jnp.asarray(n, jnp.float32)
  m = jnp.asarray(m, jnp.float32)
  s = jnp.floor(n / 2) + 1 - m
  arg = (n - m - s) / jnp.maximum(n - m, 1.0)
  return ndtri(jnp.clip(arg, 1e-4, 1 - 1e-4))


def lie(z: Optional[float] = None, knowledge: str = "full") -> ModelAttack:
  """A Little Is Enough (Baruch et al. 2019; FedCAP A5): every attacker sends ``mu - z * sigma``.

  ``mu``/``sigma`` (unbiased, ddof=1) are coordinate-wise over the reference
  set (``knowledge``); ``z`` defaults to :func:`lie_z` of this round's N and M.
  """
  _check("knowledge", knowledge, ("full", "partial"))

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    mu, sigma = masked_mean_std(c.flat, reference_set(c, knowledge), ddof=1)
    zz = lie_z(c.n, c.m) if z is None else jnp.asarray(z, jnp.float32)
    return finish(c, mu - zz.astype(c.flat.dtype) * sigma)

  return ModelAttack("lie", apply)


def ipm(epsilon: Optional[float] = None, knowledge: str = "full") -> ModelAttack:
  """Inner Product Manipulation (Xie et al. 2020; FedCAP A8): ``u = -eps * mean(benign)``.

  ``epsilon=None`` means N, the number of participating uploads (FedCAP).
  'full': the mean over the benign participants; 'partial': over the
  attackers' own honest updates.
  """
  _check("knowledge", knowledge, ("full", "partial"))

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    mean = masked_mean(c.flat, benign_reference(c, knowledge))
    eps = c.n.astype(c.flat.dtype) if epsilon is None else jnp.asarray(epsilon, c.flat.dtype)
    return finish(c, -eps * mean)

  return ModelAttack("ipm", apply)


# ---------------------------------------------------------------------------------- Min-Max / Min-Sum
def gamma_search(cond_fn, gamma_init: float = 2.0, step_init: Optional[float] = None, tol: float = 0.02,
                 min_step: float = 0.1, max_iter: int = 1000) -> jax.Array:
  """FedCAP's gamma search (spec 2.2), as a bounded ``lax.while_loop``::

      gamma, step, gamma_succ = gamma_init, step_init, 0     # FedCAP: 2, 1, 0
      while |gamma_succ - gamma| > tol:                     # FedCAP: 0.02
          if cond(gamma): gamma_succ = gamma; gamma += step/2
          else:           gamma -= step/2
          step = max(step/2, min_step)                      # FedCAP: 0.1
      return gamma_succ

  ``step_init=None`` means ``gamma_init / 2`` (FedCAP). Shejwalkar &
  Houmansadr's original is ``gamma_init=10, step_init=10, tol=1e-5, min_step=0``.
  ``max_iter`` only bounds pathological cases (e.g. a condition that holds for
  every gamma); the search then returns the last successful gamma.
  """
  step0 = gamma_init / 2 if step_init is None else step_init
  f32 = jnp.float32

  def cond(state):
    gamma, _, succ, it = state
    return (jnp.abs(succ - gamma) > tol) & (it < max_iter)

  def body(state):
    gamma, step, succ, it = state
    ok = cond_fn(gamma)
    succ = jnp.where(ok, gamma, succ)
    gamma = jnp.where(ok, gamma + step / 2, gamma - step / 2)
    return gamma, jnp.maximum(step / 2, f32(min_step)), succ, it + 1

  init = (f32(gamma_init), f32(step0), f32(0.0), jnp.int32(0))
  return jax.lax.while_loop(cond, body, init)[2]


PERTURBATIONS = ("std", "unit_vec", "sign")


def perturbation_direction(mu: jax.Array, sigma: jax.Array, perturbation: str) -> jax.Array:
  """The d_p of Shejwalkar & Houmansadr: ``-std`` (FedCAP), ``-mu/||mu||`` or ``-sign(mu)``."""
  if perturbation == "std":
    return -sigma
  if perturbation == "unit_vec":
    norm = jnp.linalg.norm(mu)
    return -mu / jnp.where(norm > 0, norm, 1.0)
  if perturbation == "sign":
    return -jnp.sign(mu)
  raise ValueError(f"perturbation must be one of {PERTURBATIONS}, got {perturbation!r}")


def craft_min_max_sum(flat: jax.Array, ref: jax.Array, objective: str, perturbation: str = "std",
                      squared: bool = False, **search) -> tuple[jax.Array, jax.Array]:
  """The Min-Max / Min-Sum vector over the reference rows ``ref``: returns ``(mu + gamma d_p, gamma)``.

  ``objective='max'``: ``max_i ||u - u_i|| <= max_{i<j} ||u_i - u_j||``;
  ``objective='sum'``: ``sum_i ||u - u_i|| <= max_i sum_j ||u_i - u_j||``
  (``squared=True`` squares the distances, the paper's Eq. 10). ``i, j``
  range over the reference rows. ``mu`` and the std are unbiased (ddof=1).
  """
  mu, sigma = masked_mean_std(flat, ref, ddof=1)
  dev = perturbation_direction(mu, sigma, perturbation)
  pair = pairwise_sq_dists(flat)
  if not squared:
    pair = jnp.sqrt(pair)
  both = ref[:, None] & ref[None, :]
  if objective == "max":
    off_diag = both & ~jnp.eye(ref.shape[0], dtype=bool)
    threshold = jnp.max(jnp.where(off_diag, pair, -jnp.inf))
    threshold = jnp.where(jnp.isfinite(threshold), threshold, 0.0)  # < 2 reference rows
  elif objective == "sum":
    sums = jnp.sum(jnp.where(both, pair, 0.0), axis=1)
    threshold = jnp.max(jnp.where(ref, sums, -jnp.inf))
    threshold = jnp.where(jnp.isfinite(threshold), threshold, 0.0)
  else:
    raise ValueError(f"objective must be 'max' or 'sum', got {objective!r}")

  def cond_fn(gamma):
    d = row_sq_dists(flat, mu + gamma.astype(flat.dtype) * dev)
    if not squared:
      d = jnp.sqrt(d)
    if objective == "max":
      value = jnp.max(jnp.where(ref, d, -jnp.inf))
    else:
      value = jnp.sum(jnp.where(ref, d, 0.0))
    return value <= threshold

  gamma = gamma_search(cond_fn, **search)
  return mu + gamma.astype(flat.dtype) * dev, gamma


def _min_max_sum(name: str, objective: str, perturbation: str, knowledge: str, squared: bool,
                 gamma_init: float, step_init: Optional[float], tol: float, min_step: float,
                 max_iter: int) -> ModelAttack:
  _check("perturbation", perturbation, PERTURBATIONS)
  _check("knowledge", knowledge, ("full", "partial"))
  search = dict(gamma_init=gamma_init, step_init=step_init, tol=tol, min_step=min_step, max_iter=max_iter)

  def apply(updates, malicious, key, context=None):
    c = prepare(updates, malicious, context)
    u, _ = craft_min_max_sum(c.flat, reference_set(c, knowledge), objective, perturbation, squared, **search)
    return finish(c, u)

  return ModelAttack(name, apply)


def min_max(perturbation: str = "std", knowledge: str = "full", gamma_init: float = 2.0,
            step_init: Optional[float] = None, tol: float = 0.02, min_step: float = 0.1,
            max_iter: int = 1000) -> ModelAttack:
  """Min-Max (Shejwalkar & Houmansadr 2021; FedCAP A6). See :func:`craft_min_max_sum` and :func:`gamma_search`."""
  return _min_max_sum("min_max", "max", perturbation, knowledge, False, gamma_init, step_init, tol, min_step,
                      max_iter)


def min_sum(perturbation: str = "std", knowledge: str = "full", squared: bool = False, gamma_init: float = 2.0,
            step_init: Optional[float] = None, tol: float = 0.02, min_step: float = 0.1,
            max_iter: int = 1000) -> ModelAttack:
  """Min-Sum (FedCAP A7): non-squared distances as FedCAP's code; ``squared=True`` = the paper's Eq. 10."""
  return _min_max_sum("min_sum", "sum", perturbation, knowledge, squared, gamma_init, step_init, tol, min_step,
                      max_iter)


__all__ = ["identity", "gaussian", "sign_flip", "scaling", "boosting", "lie", "lie_z", "ipm", "min_max",
           "min_sum", "gamma_search", "craft_min_max_sum", "perturbation_direction"]
