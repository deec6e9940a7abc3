"""Security metrics: benign-client accuracy, backdoor success / confidence, detection rates.

All functions take numpy or jax arrays and return jax scalars (jit-able).
Empty denominators give NaN (never 0), so "undefined" cannot be mistaken for
a perfect or a failed score: e.g. the FNR of a run with no malicious client.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp


def _ratio(num, den):
  num = jnp.asarray(num, jnp.float32)
  den = jnp.asarray(den, jnp.float32)
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), jnp.nan)


def benign_accuracy(correct, count, malicious, weighted: bool = True) -> jax.Array:
  """Accuracy over the ground-truth BENIGN clients only (FedCAP's TAcc, spec 4.4).

  ``weighted=True``: ``sum_benign correct / sum_benign count`` (micro, sample
  weighted). ``weighted=False``: the plain mean of per-client accuracies over
  benign clients with ``count > 0``. NaN when there is nothing to average.
  """
  correct = jnp.asarray(correct, jnp.float32)
  count = jnp.asarray(count, jnp.float32)
  benign = ~jnp.asarray(malicious).astype(bool)
  if weighted:
    return _ratio(jnp.sum(jnp.where(benign, correct, 0.0)), jnp.sum(jnp.where(benign, count, 0.0)))
  scored = benign & (count > 0)
  per_client = correct / jnp.where(count > 0, count, 1.0)
  return _ratio(jnp.sum(jnp.where(scored, per_client, 0.0)), jnp.sum(scored))


def attack_success_rate(preds, target, valid: Optional[jax.Array] = None) -> jax.Array:
  """Fraction of (valid) triggered inputs predicted as ``target`` (NaN if none). ``target`` may be per-sample."""
  hit = jnp.asarray(preds) == jnp.asarray(target)
  valid = jnp.ones(hit.shape, bool) if valid is None else jnp.asarray(valid).astype(bool)
  return _ratio(jnp.sum(hit & valid), jnp.sum(valid))


def backdoor_confidence(logits, target, valid: Optional[jax.Array] = None) -> jax.Array:
  """FedCC's attack confidence: mean over the inputs of ``softmax(logits)[target]`` (uniform logits -> 1/C)."""
  probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  target = jnp.broadcast_to(jnp.asarray(target, jnp.int32), probs.shape[:-1])
  p = jnp.take_along_axis(probs, target[..., None], axis=-1)[..., 0]
  valid = jnp.ones(p.shape, bool) if valid is None else jnp.asarray(valid).astype(bool)
  return _ratio(jnp.sum(jnp.where(valid, p, 0.0)), jnp.sum(valid))


def detection_rates(flagged, malicious, mask: Optional[jax.Array] = None) -> dict[str, jax.Array]:
  """Detection confusion counts and rates over the clients with ``mask`` (all if None).

  Positive = malicious. ``tpr = TP/(TP+FN)``, ``fnr = FN/(TP+FN)``,
  ``fpr = FP/(FP+TN)``, ``tnr = TN/(FP+TN)``, ``accuracy = (TP+TN)/total``
  (FedCAP's DAcc); every rate is a fraction in [0, 1], NaN when its
  denominator is 0 (e.g. ``tpr``/``fnr`` with no malicious client).
  """
  flagged = jnp.asarray(flagged).astype(bool)
  malicious = jnp.asarray(malicious).astype(bool)
  mask = jnp.ones(flagged.shape, bool) if mask is None else jnp.asarray(mask).astype(bool)
  tp = jnp.sum(flagged & malicious & mask)
  fp = jnp.sum(flagged & ~malicious & mask)
  tn = jnp.sum(~flagged & ~malicious & mask)
  fn = jnp.sum(~flagged & malicious & mask)
  return {
      "tp": tp, "fp": fp, "tn": tn, "fn": fn,
      "tpr": _ratio(tp, tp + fn), "fnr": _ratio(fn, tp + fn),
      "fpr": _ratio(fp, fp + tn), "tnr": _ratio(tn, fp + tn),
      "accuracy": _ratio(tp + tn, tp + fp + tn + fn),
  }


__all__ = ["benign_accuracy", "attack_success_rate", "backdoor_confidence", "detection_rates"]
