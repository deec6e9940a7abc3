"""Pixel normalisation to float32.

Why per-dataset modes: the reproduced papers disagree (FedCC and FedVSA standardise
with dataset mean/std, FedCAP uses PFLlib's ``Normalize(0.5, 0.5)``, FedCAC's CIFAR
uses no normalisation), and the choice shifts accuracies, so it is a config value:

* ``True`` / ``"standard"``: ``(x / max - mean) / std`` per channel, statistics from the
  dataset's registry entry (digits: x/16 then standardise; MNIST 0.1307/0.3081, ...);
* ``"half"``: ``(x / max - 0.5) / 0.5``, values in [-1, 1];
* ``False`` / ``"none"`` / ``"unit"``: ``x / max`` only, values in [0, 1] (``ToTensor``).
"""

from __future__ import annotations

import numpy as np

from fedjax_robust.data.registry import DatasetSpec

NORMALIZE_MODES = ("standard", "half", "unit")


def normalize_mode(mode) -> str:
  """Canonical mode name of a config value (True/False/str)."""
  if mode is True:
    return "standard"
  if mode is False or mode is None:
    return "unit"
  m = str(mode).lower()
  aliases = {"standard": "standard", "true": "standard", "half": "half", "unit": "unit",
             "none": "unit", "false": "unit", "model": "model"}
  if m not in aliases:
    raise ValueError(f"normalize must be True, False, 'standard', 'half', 'none' or 'model'; got {mode!r}")
  return aliases[m]


def normalization_stats(spec: DatasetSpec, mode) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel (mean, std) applied after scaling to [0, 1] (``'model'``: the standard statistics, which the model
  applies as its first layer while the data stay in [0, 1])."""
  mode = normalize_mode(mode)
  ch = spec.image_shape[-1]
  if mode in ("standard", "model"):
    mean, std = np.asarray(spec.mean, np.float32), np.asarray(spec.std, np.float32)
    if mean.shape != (ch,) or std.shape != (ch,):
      raise ValueError(f"{spec.name}: mean/std need {ch} channel values")
    return mean, std
  if mode == "half":
    return np.full(ch, 0.5, np.float32), np.full(ch, 0.5, np.float32)
  return np.zeros(ch, np.float32), np.ones(ch, np.float32)


def normalize_images(x: np.ndarray, spec: DatasetSpec, mode=True) -> np.ndarray:
  """float32 NHWC ``((x / spec.max_value) - mean) / std`` (mode ``'model'``: ``x / spec.max_value`` only, pixels in
  [0, 1], so that adversarial perturbations are measured in pixel units; FedALC spec A10)."""
  mode = normalize_mode(mode)
  mean, std = normalization_stats(spec, "unit" if mode == "model" else mode)
  out = np.asarray(x, np.float32) * np.float32(1.0 / spec.max_value)
  out -= mean
  out /= std
  return out


def channel_stats(x: np.ndarray, max_value: float) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and std of ``x / max_value`` (to fill a new registry entry)."""
  x = np.asarray(x, np.float64) / max_value
  axes = tuple(range(x.ndim - 1))
  return x.mean(axes), x.std(axes)
