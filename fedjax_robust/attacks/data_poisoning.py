"""Data poisoning, applied once (numpy, at set-up) to the malicious clients' padded training arrays.

* label flipping: ``(y + 1) mod C`` (FedCAP paper, FedVSA) or ``C - 1 - y`` (FedCAP code, default);
* BadNets pixel triggers (Gu et al. 2017): a pixel pattern stamped on a
  fraction of a client's real samples, relabelled to the target class;
* DBA (Xie et al. 2020): the global trigger split into parts, attacker ``i``
  (rank among the malicious clients, in id order) stamping part ``i mod parts``;
  the test-time trigger is the full pattern;
* FedCC's semantic backdoor set (test images of one class labelled another);
* :func:`choose_malicious`: the fixed attacker ids.

Arrays follow :class:`~fedjax_robust.data.FederatedData`: a client's ``x`` is
``[n_max, H, W, C]`` of which the first ``n`` rows are real; padding rows are
never touched. A trigger is a bool mask over the spatial dims ``(H, W)`` and a
``value`` (scalar or per-channel) written into every channel of the masked
pixels. Since the features are normalised, the default value is the
per-channel MAXIMUM of the real training pixels (a "white" pixel).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

FLIP_MODES = ("reverse", "shift")
POISON_KINDS = ("none", "label_flip", "backdoor", "dba")
TRIGGER_KINDS = ("square", "plus", "bars")
CORNERS = ("top_left", "top_right", "bottom_left", "bottom_right")


# ------------------------------------------------------------------------------------------ attackers
FRACTION_SLACK = 1e-9  # far above K * float eps for any K a simulation holds, far below any intended fraction


def choose_malicious(num_clients: int, fraction: float = 0.3, seed: int = 0,
                     legacy_numpy: bool = False) -> np.ndarray:
  """``[K]`` bool mask of ``floor(K * fraction)`` attacker clients, fixed by ``seed``.

  The floor forgives float rounding: ``0.29 * 100`` is ``28.999999999999996`` in binary floating point, and a plain
  ``int()`` of it would give 28 attackers for a fraction meaning 29 (4,516 such ``k / K`` pairs for K <= 500).

  ``legacy_numpy=True`` reproduces FedCAP's ``np.random.seed(seed);
  np.random.choice(K, int(K*p), replace=False)`` (legacy MT19937 stream,
  without touching numpy's global state): K=20, p=0.3 -> {1, 8, 10, 17, 18, 19}.
  Otherwise ``np.random.default_rng(seed).choice`` is used.
  """
  fraction = float(fraction)
  if not 0.0 <= fraction <= 1.0:  # also refuses NaN
    raise ValueError(f"attack.fraction must be in [0, 1], got {fraction}")
  m = int(np.floor(num_clients * fraction + FRACTION_SLACK))
  if legacy_numpy:
    ids = np.random.RandomState(seed).choice(num_clients, m, replace=False)
  else:
    ids = np.random.default_rng(seed).choice(num_clients, m, replace=False)
  mask = np.zeros(num_clients, bool)
  mask[ids] = True
  return mask


# ------------------------------------------------------------------------------------------ labels
def _valid(y: np.ndarray, n) -> np.ndarray:
  """Bool mask of real rows for ``y`` of shape ``[n_max]`` (``n`` scalar) or ``[K, n_max]`` (``n`` ``[K]``)."""
  n = np.asarray(n)
  return np.arange(y.shape[-1]) < n[..., None] if n.ndim else np.arange(y.shape[-1]) < n


def flip_labels(y: np.ndarray, n, num_classes: int, mode: str = "reverse") -> np.ndarray:
  """Flipped copy of ``y``: ``'reverse'`` ``C - 1 - y`` (FedCAP code A1) or ``'shift'`` ``(y + 1) mod C`` (paper).

  Works on one client (``y [n_max]``, ``n`` int) or a stack (``[K, n_max]``,
  ``n [K]``); padding rows keep their value.
  """
  if mode not in FLIP_MODES:
    raise ValueError(f"mode must be one of {FLIP_MODES}, got {mode!r}")
  y = np.asarray(y)
  flipped = (num_classes - 1 - y) if mode == "reverse" else (y + 1) % num_classes
  return np.where(_valid(y, n), flipped, y).astype(y.dtype)


# ----------------------------------------------------------------------------------------- triggers
def _pattern(kind: str, size: int, bar_len: int, gap: int, num_bars: int) -> np.ndarray:
  if kind == "square":
    return np.ones((size, size), bool)
  if kind == "plus":
    p = np.zeros((size, size), bool)
    p[size // 2, :] = True
    p[:, size // 2] = True
    return p
  if kind == "bars":  # DBA's layout: bars of 1 x bar_len, two per row, rows `gap` apart
    rows = (num_bars + 1) // 2
    p = np.zeros(((rows - 1) * (gap + 1) + 1, 2 * bar_len + gap if num_bars > 1 else bar_len), bool)
    for i in range(num_bars):
      r, col = (i // 2) * (gap + 1), (i % 2) * (bar_len + gap)
      p[r, col: col + bar_len] = True
    return p
  raise ValueError(f"trigger kind must be one of {TRIGGER_KINDS}, got {kind!r}")


def make_trigger(spatial_shape: Sequence[int], kind: str = "square", size: int = 3,
                 corner: str = "bottom_right", offset: int = 1, bar_len: int = 4, gap: int = 2,
                 num_bars: int = 4) -> np.ndarray:
  """Bool ``(H, W)`` trigger mask: a ``size``x``size`` square or plus, or DBA's ``num_bars`` bars.

  The pattern sits ``offset`` pixels away from the two edges of ``corner``.
  DBA's CIFAR layout is ``kind='bars', corner='top_left', offset=0`` (4 bars of
  1x4, 2 pixels apart).
  """
  if corner not in CORNERS:
    raise ValueError(f"corner must be one of {CORNERS}, got {corner!r}")
  h, w = int(spatial_shape[0]), int(spatial_shape[1])
  p = _pattern(kind, size, bar_len, gap, num_bars)
  ph, pw = p.shape
  if ph + offset > h or pw + offset > w:
    raise ValueError(f"trigger {p.shape} with offset {offset} does not fit in {(h, w)}")
  r0 = offset if corner.startswith("top") else h - offset - ph
  c0 = offset if corner.endswith("left") else w - offset - pw
  mask = np.zeros((h, w), bool)
  mask[r0: r0 + ph, c0: c0 + pw] = p
  return mask


def add_pixel_trigger(x: np.ndarray, trigger: np.ndarray, value=1.0) -> np.ndarray:
  """Copy of images ``x [..., H, W, C]`` with ``value`` (scalar or ``[C]``) written at the ``(H, W)`` mask."""
  x = np.array(x, copy=True)
  trigger = np.asarray(trigger, bool)
  if x.shape[-3:-1] != trigger.shape:
    raise ValueError(f"trigger shape {trigger.shape} does not match image shape {x.shape[-3:-1]}")
  x[..., trigger, :] = np.asarray(value, x.dtype)
  return x


def dba_trigger_parts(trigger: np.ndarray, num_parts: int) -> list[np.ndarray]:
  """Splits a trigger into ``num_parts`` disjoint masks whose union is the trigger.

  The trigger's pixels, in row-major order, are cut into ``num_parts``
  contiguous chunks (``np.array_split``): the ``bars`` layout of 4 bars gives
  one bar per part, as in DBA.
  """
  trigger = np.asarray(trigger, bool)
  rows, cols = np.nonzero(trigger)
  if num_parts < 1 or num_parts > rows.size:
    raise ValueError(f"num_parts must be in [1, {rows.size}], got {num_parts}")
  parts = []
  for chunk in np.array_split(np.arange(rows.size), num_parts):
    m = np.zeros_like(trigger)
    m[rows[chunk], cols[chunk]] = True
    parts.append(m)
  return parts


def num_poisoned(n: int, fraction: float) -> int:
  """``round(fraction * n)`` with halves rounded up, capped to ``[0, n]``."""
  return int(min(max(np.floor(fraction * n + 0.5), 0), n))


def backdoor_poison(x: np.ndarray, y: np.ndarray, n: int, fraction: float, target_label: int,
                    trigger: np.ndarray, value=1.0, seed: int | np.random.Generator = 0):
  """Stamps ``trigger`` on ``round(fraction * n)`` of one client's ``n`` real samples and relabels them.

  Returns ``(x, y, indices)`` (copies; padding rows untouched); the indices are
  drawn without replacement by ``np.random.default_rng(seed)``, sorted.
  """
  rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
  n = int(n)
  idx = np.sort(rng.choice(n, num_poisoned(n, fraction), replace=False))
  x = np.array(x, copy=True)
  y = np.array(y, copy=True)
  x[idx] = add_pixel_trigger(x[idx], trigger, value)
  y[idx] = target_label
  return x, y, idx


def triggered_test_set(x: np.ndarray, y: np.ndarray, trigger: np.ndarray, target_label: int, value=1.0):
  """The test inputs whose true label is not ``target_label``, triggered: ``(x_triggered, y_true)``.

  Attack success rate = fraction of ``x_triggered`` classified as ``target_label``.
  """
  keep = np.asarray(y) != target_label
  return add_pixel_trigger(np.asarray(x)[keep], trigger, value), np.asarray(y)[keep]


def semantic_backdoor_set(x_test: np.ndarray, y_test: np.ndarray, num_classes: int, r: int = 1, seed: int = 0,
                          return_indices: bool = False):
  """FedCC's targeted D_mal (spec 2.4): ``r`` test images of a random source class, labelled a random other class.

  A random test image fixes ``y_src``; ``y_tgt`` is uniform over the other
  classes; the ``r`` images are drawn with replacement among the test images of
  class ``y_src`` (the code's ``utils.get_mal_dataset``; paper: r = 1, code:
  ``num_mal`` = 5). Fix it once per run (one ``seed``). The same images, with
  target ``y_tgt``, measure the backdoor confidence / accuracy (spec 2.7).
  Returns ``(x_mal, y_mal, y_src, y_tgt)`` with ``y_mal == y_tgt``, and the
  test-set indices as a fifth element with ``return_indices``.

  [Q] FedCC code quirk (not reproduced by default): the malicious client's loader
  is ``DatasetSplit(train_dataset, mal_X, mal_Y)``, i.e. it trains on the TRAIN
  images at these TEST indices (images of arbitrary classes) labelled ``y_tgt``,
  while the confidence is measured on the test images. A compat run takes
  ``x_train[indices]`` as the training images.
  """
  rng = np.random.default_rng(seed)
  y_test = np.asarray(y_test)
  y_src = int(y_test[rng.integers(len(y_test))])
  y_tgt = int(rng.choice([c for c in range(num_classes) if c != y_src]))
  idx = rng.choice(np.flatnonzero(y_test == y_src), r, replace=True)
  out = (np.asarray(x_test)[idx], np.full(r, y_tgt, np.int32), y_src, y_tgt)
  return out + (idx,) if return_indices else out


# --------------------------------------------------------------------------------- whole data set
def default_poison_config() -> dict:
  """Defaults of :func:`poison_federated_data` (a plain dict; a ConfigDict with these keys works too).

  ``kind``: one of ``none | label_flip | backdoor | dba``; ``flip_mode``:
  ``reverse`` (FedCAP code, ``C-1-y``) or ``shift`` (paper, ``(y+1) mod C``);
  ``fraction``: share of each malicious client's real samples that get the
  trigger (no paper fixes it; 0.5 here); ``target_label``; ``trigger``:
  :func:`make_trigger` arguments; ``value``: trigger value (``None`` =
  per-channel max of the real training pixels); ``num_parts``: DBA parts;
  ``seed``.
  """
  return {
      "kind": "none",
      "flip_mode": "reverse",
      "fraction": 0.5,
      "target_label": 0,
      "trigger": {"kind": "square", "size": 3, "corner": "bottom_right", "offset": 1},
      "value": None,
      "num_parts": 4,
      "seed": 0,
  }


def _as_dict(cfg: Any) -> dict:
  if cfg is None:
    return {}
  return cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)


def poison_config(cfg: Any) -> dict:
  """``cfg`` merged over :func:`default_poison_config` (ValueError on unknown keys)."""
  out = default_poison_config()
  given = _as_dict(cfg)
  unknown = sorted(set(given) - set(out))
  if unknown:
    raise ValueError(f"unknown data-poisoning options {unknown}; known: {sorted(out)}")
  if "trigger" in given:
    given["trigger"] = {**out["trigger"], **_as_dict(given["trigger"])}
  out.update(given)
  if out["kind"] not in POISON_KINDS:
    raise ValueError(f"data poisoning kind must be one of {POISON_KINDS}, got {out['kind']!r}")
  return out


def trigger_value(data, value=None) -> np.ndarray:
  """``value`` as an array, or the per-channel max of the real training pixels if ``None``."""
  if value is not None:
    return np.asarray(value, np.float32)
  valid = np.arange(data.x_train.shape[1]) < np.asarray(data.n_train)[:, None]
  real = data.x_train[valid]  # [sum n, H, W, C]
  return real.reshape(-1, real.shape[-1]).max(axis=0).astype(np.float32)


def backdoor_trigger(data, cfg: Any = None) -> tuple[np.ndarray, np.ndarray]:
  """The test-time (full) trigger mask and value that :func:`poison_federated_data` uses for ``cfg``."""
  c = poison_config(cfg)
  return make_trigger(data.feature_shape[:2], **c["trigger"]), trigger_value(data, c["value"])


def poison_federated_data(data, malicious: np.ndarray, cfg: Any = None):
  """A new FederatedData whose MALICIOUS clients' training split is poisoned per ``cfg``.

  ``label_flip`` flips all real labels; ``backdoor`` stamps the full trigger
  on ``round(fraction * n_k)`` samples of each malicious client ``k`` and
  relabels them ``target_label``; ``dba`` does the same with part
  ``i mod num_parts`` for the ``i``-th malicious client. Benign clients, test
  splits and padding are untouched. A summary goes to ``info['poisoning']``.
  The per-client sample choice uses ``default_rng([seed, k])``.
  """
  c = poison_config(cfg)
  malicious = np.asarray(malicious, bool)
  if malicious.shape != (data.num_clients,):
    raise ValueError(f"malicious must be a [{data.num_clients}] bool mask, got shape {malicious.shape}")
  ids = np.flatnonzero(malicious)
  summary = {"kind": c["kind"], "malicious": ids.tolist()}
  if c["kind"] == "none" or ids.size == 0:
    return dataclasses.replace(data, info={**data.info, "poisoning": summary})
  x, y = data.x_train, data.y_train
  if c["kind"] == "label_flip":
    y = np.array(y, copy=True)
    y[ids] = flip_labels(y[ids], data.n_train[ids], data.num_classes, c["flip_mode"])
    summary["flip_mode"] = c["flip_mode"]
  else:
    trigger, value = backdoor_trigger(data, c)
    parts = dba_trigger_parts(trigger, c["num_parts"]) if c["kind"] == "dba" else [trigger]
    x, y = np.array(x, copy=True), np.array(y, copy=True)
    poisoned = {}
    for rank, k in enumerate(ids):
      x[k], y[k], idx = backdoor_poison(x[k], y[k], int(data.n_train[k]), c["fraction"], c["target_label"],
                                        parts[rank % len(parts)], value, np.random.default_rng([c["seed"], k]))
      poisoned[int(k)] = int(idx.size)
    summary.update(target_label=int(c["target_label"]), fraction=float(c["fraction"]),
                   trigger=dict(c["trigger"]), value=np.atleast_1d(value).tolist(),
                   num_parts=len(parts), poisoned_samples=poisoned)
  return dataclasses.replace(data, x_train=x, y_train=y, info={**data.info, "poisoning": summary})


__all__ = ["choose_malicious", "flip_labels", "make_trigger", "add_pixel_trigger", "dba_trigger_parts",
           "backdoor_poison", "triggered_test_set", "semantic_backdoor_set", "default_poison_config",
           "poison_config", "poison_federated_data", "backdoor_trigger", "trigger_value", "num_poisoned"]
