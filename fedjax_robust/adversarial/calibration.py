"""FedALC's logits calibration (Qiao et al. 2024, Eqs. 5-7; specs/fedalc.md §1.4) and CalFAT's additive prior.

FedALC rescales the logits of the adversarial examples, class by class, by a weight computed from the class
counts of the current mini-batch, inside the training cross-entropy only (not in the attack, not at test time):

    n_j = #{b real : y_b = j},  N = #real rows,  f_j = n_j / N
    w_j = f_j^(-1/2) = sqrt(N / n_j)   (default 'inv_sqrt_freq'; classes absent from the batch: w_j = 1)
    ẑ_{b,j} = w_j · z_{b,j}            (class axis: every sample's j-th logit; spec A2)

The paper's Eq. 5 as printed (``n_j / sqrt(N)``) contradicts its five textual statements (spec A1); it and the
other readings are variants here, for ablations. The weights depend on labels only and are constants for
autodiff. Padded rows (``mask`` False) change neither the counts nor the loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_robust.client import masked_cross_entropy

# variant -> (weight of a present class from (n_j, N), weight of an absent class under absent='auto')
CALIB_VARIANTS = ("inv_sqrt_freq", "eq5_literal", "sqrt_freq", "inv_freq", "none")
CALIB_AXES = ("class", "sample")
ABSENT_RULES = ("auto", "one", "zero", "as_one")
NORMALIZE_RULES = ("none", "mean")


def check_calibration(variant: str, axis: str = "class", absent: str = "auto", normalize: str = "none") -> None:
  for value, allowed, what in ((variant, CALIB_VARIANTS, "calib_variant"), (axis, CALIB_AXES, "calib_axis"),
                               (absent, ABSENT_RULES, "absent"), (normalize, NORMALIZE_RULES, "normalize")):
    if value not in allowed:
      raise ValueError(f"FedALC {what} must be one of {allowed}, got {value!r}")


def class_counts(y: jax.Array, mask: jax.Array, num_classes: int) -> jax.Array:
  """``[C]`` counts of the real rows' labels (float32)."""
  return jnp.sum(jax.nn.one_hot(y, num_classes) * mask.astype(jnp.float32)[:, None], axis=0)


def _present_weight(variant: str, counts: jax.Array, total: jax.Array) -> jax.Array:
  n = jnp.maximum(counts, 1.0)
  if variant == "inv_sqrt_freq":
    return jnp.sqrt(total / n)
  if variant == "inv_freq":
    return total / n
  if variant == "sqrt_freq":
    return jnp.sqrt(n / total)
  if variant == "eq5_literal":
    return n / jnp.sqrt(total)
  return jnp.ones_like(counts)


def calibration_weights(y: jax.Array, mask: jax.Array, num_classes: int, variant: str = "inv_sqrt_freq",
                        absent: str = "auto", normalize: str = "none") -> jax.Array:
  """``[C]`` weights ``w_j`` of one mini-batch (spec §1.4 table; golden values in tests/test_adversarial.py).

  ``absent``: weight of a class with no real row: 'one' (logit unchanged, spec A3), 'zero', 'as_one' (the
  formula with ``n_j = 1``, the largest weight), or 'auto' = 0 for 'eq5_literal' / 'sqrt_freq' (their formulas'
  value) and 1 otherwise. ``normalize='mean'`` divides by the mean weight of the present classes (spec A21,
  an ablation; the paper does not normalise).
  """
  check_calibration(variant, "class", absent, normalize)
  counts = class_counts(y, mask, num_classes)
  total = jnp.maximum(jnp.sum(counts), 1.0)
  present = counts > 0
  weights = _present_weight(variant, counts, total)
  if variant == "none":
    return weights
  if absent == "auto":
    absent = "zero" if variant in ("eq5_literal", "sqrt_freq") else "one"
  if absent != "as_one":  # 'as_one' keeps the formula's value at n_j = 1 (counts clamped to 1 above)
    weights = jnp.where(present, weights, 0.0 if absent == "zero" else 1.0)
  if normalize == "mean":
    mean = jnp.sum(jnp.where(present, weights, 0.0)) / jnp.maximum(jnp.sum(present), 1)
    weights = weights / jnp.where(mean > 0, mean, 1.0)
  return weights


def calibrate_logits(logits: jax.Array, y: jax.Array, weights: jax.Array, axis: str = "class") -> jax.Array:
  """Eq. 6: ``ẑ = z · w`` column-wise (``axis='class'``) or ``ẑ_b = w_{y_b} · z_b`` (``'sample'``, spec A2)."""
  weights = jax.lax.stop_gradient(weights)
  if axis == "class":
    return logits * weights[None, :]
  if axis == "sample":
    return logits * weights[y][:, None]
  raise ValueError(f"calib_axis must be one of {CALIB_AXES}, got {axis!r}")


def calibrated_cross_entropy(logits: jax.Array, y: jax.Array, mask: jax.Array, variant: str = "inv_sqrt_freq",
                             axis: str = "class", absent: str = "auto", normalize: str = "none") -> jax.Array:
  """Eq. 7: the mean over real rows of CE on the calibrated logits. ``variant='none'`` is plain CE, bit for bit."""
  if variant == "none":
    return masked_cross_entropy(logits, y, mask)
  weights = calibration_weights(y, mask, logits.shape[-1], variant, absent, normalize)
  return masked_cross_entropy(calibrate_logits(logits, y, weights, axis), y, mask)


def log_prior_logits(logits: jax.Array, class_totals: jax.Array, scale: float = 10.0, tau: float = 0.1) -> jax.Array:
  """CalFAT's additive calibration with the client's class counts (spec §3.2): ``s · (z + τ log(n_c + 1e-7))``,
  classes the client does not hold counted as 1."""
  prior = jnp.log(jnp.where(class_totals > 0, class_totals, 1.0) + 1e-7)
  return scale * (logits + tau * jax.lax.stop_gradient(prior)[None, :])
