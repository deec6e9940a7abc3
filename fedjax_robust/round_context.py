"""The typed round context: what the server step, aggregation rules and attacks know about a round.

One :class:`RoundContext` replaces the dicts that were passed around before
(``{"global_params", "weights", "round"}`` for attacks, ``{"global_params",
"reference_update", "features"}`` for rules). It is a NamedTuple of arrays, so it
crosses ``jit`` boundaries, and it keeps ``get(name, default)`` so a rule reads
``context.get("features")`` whether it got a context or a plain dict (hand-written
tests).

Declared needs. A rule says what it needs beyond the uploads in its
``Aggregator.needs`` (e.g. FLARE ``("features",)``, FLTrust
``("reference_update",)``, FedCC ``("penultimate_weights",)``); the server step
calls :func:`compute_needs`, which computes exactly those on device and puts them
in ``context.extras``:

* ``reference_update``: the server's own update from the global model on its
  server-held data (FLTrust's root set), trained with the clients' optimizer and
  schedule;
* ``features``: each client model's penultimate activations on the server-held
  data, ``[C, m, d]`` (FLARE's PLRs);
* ``penultimate_weights``: each client model's penultimate Dense kernel
  ``[C, d_in, d_out]`` and the global one under ``global_penultimate_weights``;
* ``server_losses``: the mean cross-entropy (eval mode) on the server-held data of
  each client model ``[C]`` and of the global model under ``global_server_loss``
  (Zeno++'s scores).

One extra is no need but an upload: ``reported_loss`` [C], the clients' reported inference losses, which
``server.weighting=value_sensitive`` (``algorithms/reported_loss.py``) moves out of the uploads for the rule's
client weights (``aggregators/weighting.py``).

Server-held data (FLTrust's root set, FedVSA's validation set) is an argument of
the jitted round (``Simulator(server_data=...)``), never a constant closed over
by a compiled function, so it can change between runs (seeds) without a recompile.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_robust.metrics.evaluation import score_models, score_one

PyTree = Any

NEEDS = ("reference_update", "features", "penultimate_weights", "server_losses")
# The needs computed on server-held data: a rule declaring one of these makes the run build it.
SERVER_DATA_NEEDS = ("reference_update", "features", "server_losses")


class RoundContext(NamedTuple):
  round: jax.Array  # int32: rounds completed before this one
  cohort: jax.Array  # [C] client ids
  # [C] bool: attacker-controlled cohort members of the run's mask; None when the run declares none (an upload
  # transform then uses the mask it was built with)
  malicious: Optional[jax.Array]
  weights: jax.Array  # [C] float32 aggregation weights (sample counts; 0 = must not count)
  global_params: PyTree = None  # the server model the cohort started from (None when there is none)
  server_data: Any = None  # ClientData held by the server, or None
  extras: dict = {}  # declared needs, computed on device (module docstring)

  def get(self, name: str, default=None):
    """A field or an extra by name (``None`` fields count as missing), like ``dict.get``."""
    if name in self._fields and name != "extras":
      value = getattr(self, name)
      return default if value is None else value
    return self.extras.get(name, default)

  def __getitem__(self, item):
    """``context["features"]`` like a dict (a missing name raises ``KeyError``); integers index the tuple."""
    if isinstance(item, str):
      value = self.get(item)
      if value is None:
        raise KeyError(item)
      return value
    return tuple.__getitem__(self, item)

  def with_extras(self, **extras) -> "RoundContext":
    return self._replace(extras={**self.extras, **extras})

  def as_dict(self) -> dict:
    """Every non-None field and extra as a plain dict (for attacks, which spread it with ``{**ctx}``)."""
    out = {k: getattr(self, k) for k in self._fields if k != "extras" and getattr(self, k) is not None}
    return {**out, **self.extras}


def check_needs(needs, who: str) -> tuple[str, ...]:
  needs = tuple(needs)
  unknown = [n for n in needs if n not in NEEDS]
  if unknown:
    raise ValueError(f"{who} declares unknown needs {unknown}; the engine computes {NEEDS}")
  return needs


def penultimate_kernel(params: PyTree, layer: str) -> jax.Array:
  if layer not in params or "kernel" not in params[layer]:
    raise ValueError(f"penultimate_weights: the model has no Dense layer {layer!r} with a kernel")
  return params[layer]["kernel"]


def compute_needs(needs, context: RoundContext, deltas: PyTree, *, features_fn: Optional[Callable] = None,
                  penultimate: Optional[str] = None, reference_update: Optional[Callable] = None,
                  max_server_rows: int = 256, logits_fn: Optional[Callable] = None) -> RoundContext:
  """Fills ``context.extras`` with what ``needs`` asks for, from the cohort's ``deltas`` ``[C, ...]``.

  Client ``i``'s model is ``global_params + deltas[i]`` (uploads after attacks, so a poisoned upload is what the
  rule judges). ``features_fn(params, x) -> [m, d]``; ``penultimate``: the layer name (``model.penultimate``);
  ``reference_update(global_params, server_data, key-free) -> update``; ``logits_fn(params, x) -> logits``
  (eval mode). ``features`` and ``server_losses`` use at most ``max_server_rows`` real rows of the server data
  (FLARE's auxiliary set and Zeno++'s server batch are small).
  """
  extras = {}
  needs = tuple(needs)
  if not needs:
    return context
  gp = context.global_params
  if gp is None:
    raise ValueError(f"needs {needs} require a global model; this algorithm has none")
  if "reference_update" in needs:
    if context.server_data is None or reference_update is None:
      raise ValueError("the rule needs a reference update: give the run server-held data "
                       "(server.root_dataset_size > 0)")
    extras["reference_update"] = reference_update(gp, context.server_data)
  if "features" in needs:
    if context.server_data is None or features_fn is None:
      raise ValueError("the rule needs client features: give the run server-held data "
                       "(server.root_dataset_size > 0) and a model with a `features` method")
    data = context.server_data
    rows = min(int(data.y.shape[0]), int(max_server_rows))
    x = data.x[:rows]
    real = jnp.arange(rows) < data.n
    feats = jax.lax.map(lambda d: features_fn(jax.tree.map(jnp.add, gp, d), x), deltas)  # one client at a time
    # Rows past n are padding: repeat the first real row's features so sets stay the same size (static shapes).
    extras["features"] = jnp.where(real[None, :, None], feats, feats[:, :1])
  if "penultimate_weights" in needs:
    if penultimate is None:
      raise ValueError("the rule needs penultimate weights: the model must name its `penultimate` layer")
    g = penultimate_kernel(gp, penultimate)
    extras["penultimate_weights"] = g[None] + penultimate_kernel(deltas, penultimate)
    extras["global_penultimate_weights"] = g
  if "server_losses" in needs:
    if context.server_data is None:
      raise ValueError("the rule needs server losses (Zeno++) on server-held data, and the run gives none: "
                       "set server.root_dataset_size > 0")
    if logits_fn is None:
      raise ValueError("the rule needs server losses (Zeno++): this algorithm passes no logits function")
    data = context.server_data
    rows = min(int(data.y.shape[0]), int(max_server_rows))
    x, y, n = data.x[:rows], data.y[:rows], jnp.minimum(data.n, rows)
    own = lambda d, xb: logits_fn(jax.tree.map(jnp.add, gp, d), xb)  # client model = global + delta
    extras["server_losses"] = score_models(own, deltas, x, y, n, model_chunk=1).mean_loss  # one client at a time
    extras["global_server_loss"] = score_one(logits_fn, gp, x, y, n).mean_loss
  return context.with_extras(**extras)
