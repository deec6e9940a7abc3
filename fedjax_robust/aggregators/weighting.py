"""Client weightings: the weights ``p_k`` a rule averages its clients with, as one option for every rule.

``server.weighting.name``:

* ``rule`` (default): each rule's own weights (the sample-weighted ``mean``; ``weighted`` flags elsewhere);
* ``samples``: ``p_k ∝ n_k`` over the clients the rule keeps;
* ``uniform``: ``p_k = 1/|S|`` over them;
* ``value_sensitive``: FedVSA's weighting (Zeng et al., JPDC 2024; spec ``shared/specs/fedvsa.md`` §1.4, Alg. 1
  line 7, Eq. 8): ``p = softmax(min(F, c) / T)`` over the kept clients' reported inference losses ``F_k`` of the
  model they downloaded (the clients report them: ``algorithms/reported_loss.py``), ``c`` the clip (``clip_mode``
  ``mean`` [C] of the kept clients' losses, ``median``, ``fixed`` at ``clip_value``, ``none``) and ``T`` the
  temperature (1 in the paper). This is Table 9's plug-in: "the method's local rule is kept, and its averaging is
  replaced by the softmax inference-loss weighting" (spec §3).

How a rule's averaging is replaced (:func:`reweighted`) depends on what it declares in ``Aggregator.averaging``:

* ``KEPT_MEAN`` (``mean``, ``krum``, ``multi_krum``, ``zeno``, ``dnc``): the rule selects as before (its scores and
  exclusions are untouched) and its aggregate is re-taken as ``Σ_{k∈S̄} p_k Δ_k`` over the clients it kept,
  ``p`` the weighting over ``S̄`` alone. For ``value_sensitive`` the clip is the mean over ``S̄`` too: FedVSA's
  ``Aggregate(S̄, ...)`` clips and normalises over the clients kept for aggregation, whatever kept them (there its
  detection, here the rule), so a client Multi-Krum rejects cannot move the others' weights through the clip.
* ``INPUT_WEIGHTS`` (``rfa`` with ``weighted=True``): the weights given to the rule are its averaging weights.
  RFA's aggregate is the weighted geometric median ``argmin_v Σ_k α_k ||v − Δ_k||`` (Pillutla et al. 2022, Eq. 4 and
  Alg. 3), whose ``α_k`` are exactly the weights of the FedAvg average it robustifies (``n_k / n`` there); "its
  averaging replaced" is therefore ``α = p``: the smoothed Weiszfeld iterations start from ``Σ p_k Δ_k`` and every
  step weighs ``p_k / max(ν, ||v − Δ_k||)``. (Multiplying only the final Weiszfeld weights by ``p`` would not be a
  geometric median of anything; setting only the starting point would be forgotten after one step.)
* ``""`` (``median``, ``trimmed_mean``, ``bulyan``, clipping, wrappers, ...): no client average to replace; refused.
  FedVSA's Table 9 leaves Median out for this reason (spec §3: "It does not apply to FedNova, FedDisco, FedLAW or
  Median"); the algorithms among those are refused by the algorithm registry.

Clients whose reported loss is not finite are dropped before the rule sees them (weight 0) and flagged, as FedVSA's
guard does (spec §2). The losses reach the rule through the round context (``context["reported_loss"]``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import INPUT_WEIGHTS, KEPT_MEAN, AggregateResult, Aggregator, combine, prepare

WEIGHTINGS = ("rule", "samples", "uniform", "value_sensitive")
CLIP_MODES = ("mean", "median", "fixed", "none")
REPORTED_LOSS = "reported_loss"  # the round context's extra: [C] the clients' reported inference losses


# ------------------------------------------------------------------------------------------ FedVSA's weights
def clip_value_of(losses: jax.Array, members: jax.Array, clip_mode: str = "mean", clip_value: float = 0.0):
  """The upper clip ``c`` of the members' losses (``+inf`` for ``none``)."""
  if clip_mode == "none":
    return jnp.asarray(jnp.inf, losses.dtype)
  if clip_mode == "fixed":
    return jnp.asarray(clip_value, losses.dtype)
  count = jnp.maximum(jnp.sum(members), 1).astype(losses.dtype)
  if clip_mode == "mean":  # Σ F/n, not Σ F / n: a report of 1e38 must not overflow the sum
    return jnp.sum(jnp.where(members, losses / count, 0.0))
  return jnp.nanmedian(jnp.where(members, losses, jnp.nan))


def value_weights(losses: jax.Array, members: jax.Array, clip_mode: str = "mean", temperature: float = 1.0,
                  clip_value: float = 0.0) -> jax.Array:
  """FedVSA's aggregation weights ``p = softmax(min(F, c) / T)`` over ``members`` ([C] bool), 0 elsewhere.

  Max-subtracted, so any finite report (1e30, −1e30) gives finite weights that sum to 1; no members: all 0."""
  members = jnp.asarray(members, bool)
  safe = jnp.where(members, losses, 0.0)
  clipped = jnp.minimum(safe, clip_value_of(safe, members, clip_mode, clip_value))
  z = jnp.where(members, clipped / temperature, -jnp.inf)
  top = jnp.max(jnp.where(members, z, -jnp.inf))
  e = jnp.where(members, jnp.exp(z - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
  total = jnp.sum(e)
  return jnp.where(total > 0, e / jnp.where(total > 0, total, 1.0), 0.0)


# ------------------------------------------------------------------------------------------ the option
class ClientWeighting(NamedTuple):
  """``coefficients(sizes [C], members [C] bool, losses [C] or None) -> p [C]`` (sums to 1 over ``members``, 0
  elsewhere); ``needs_loss``: the clients must report their inference loss."""
  name: str
  coefficients: Callable[[jax.Array, jax.Array, Optional[jax.Array]], jax.Array]
  needs_loss: bool = False
  options: dict = {}  # the config block it was built from (the clients' inference-loss options included)


def _normalized(v: jax.Array) -> jax.Array:
  total = jnp.sum(v)
  return jnp.where(total > 0, v / jnp.where(total > 0, total, 1.0), 0.0)


def weighting_config():
  """``server.weighting``: ``name`` and ``value_sensitive``'s options (the clip and temperature of the server's
  softmax, and how clients compute the loss they report: ``algorithms/reported_loss.py``)."""
  import ml_collections
  return ml_collections.ConfigDict({
      "name": "rule",  # rule | samples | uniform | value_sensitive (FedVSA's Table 9 plug-in)
      "clip_mode": "mean",  # value_sensitive: mean | median | fixed (clip_value) | none
      "clip_value": 0.0,
      "temperature": 1.0,  # softmax temperature T_s (1 in the paper)
      "inference_loss": "ce",  # ce | mse | l1 (FedVSA Table 8)
      "inference_reduction": "mean",  # mean | sum | sum_batch_means (spec A1)
      "inference_batch_size": 256,
  })


def make_client_weighting(name: str = "rule", clip_mode: str = "mean", temperature: float = 1.0,
                          clip_value: float = 0.0, **client_options) -> Optional[ClientWeighting]:
  """The weighting ``name`` (``None`` for ``rule``: nothing replaced). ``client_options``: how the clients compute
  the loss they report (``inference_loss``, ``inference_reduction``, ``inference_batch_size``), kept in
  ``options`` for the algorithm side."""
  if name not in WEIGHTINGS:
    raise ValueError(f"server.weighting.name must be one of {WEIGHTINGS}, got {name!r}")
  if clip_mode not in CLIP_MODES:
    raise ValueError(f"server.weighting.clip_mode must be one of {CLIP_MODES}, got {clip_mode!r}")
  if not float(temperature) > 0:
    raise ValueError(f"server.weighting.temperature must be > 0, got {temperature}")
  options = dict(client_options, clip_mode=clip_mode, temperature=float(temperature), clip_value=float(clip_value))
  if name == "rule":
    return None
  if name == "samples":
    return ClientWeighting(name, lambda sizes, members, losses: _normalized(jnp.where(members, sizes, 0.0)),
                           options=options)
  if name == "uniform":
    return ClientWeighting(name, lambda sizes, members, losses: _normalized(members.astype(jnp.float32)),
                           options=options)
  return ClientWeighting(name, lambda sizes, members, losses: value_weights(
      losses, members, clip_mode, float(temperature), float(clip_value)), needs_loss=True, options=options)


def weighting_from_config(config: Any) -> Optional[ClientWeighting]:
  """``config.server.weighting`` (a whole experiment config); ``None`` when absent or ``rule``."""
  server = config.get("server") if hasattr(config, "get") else None
  block = None if server is None else server.get("weighting")
  if block is None:
    return None
  block = block.to_dict() if hasattr(block, "to_dict") else dict(block)
  return make_client_weighting(**block)


# ------------------------------------------------------------------------------------------ the rule wrapper
def reweighted(inner: Aggregator, weighting: ClientWeighting) -> Aggregator:
  """``inner`` with its client average replaced by ``weighting`` (module docstring); refuses a rule with none."""
  if inner.averaging not in (KEPT_MEAN, INPUT_WEIGHTS):
    hint = " (rfa: set aggregator.weighted=True)" if inner.name in ("rfa", "geometric_median") else ""
    raise ValueError(
        f"server.weighting.name={weighting.name!r} replaces the average a rule takes of its clients; rule "
        f"{inner.name!r} takes none{hint}. FedVSA spec §3: Table 9's plug-in does not apply to FedNova, FedDisco, "
        "FedLAW or Median")

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    context = {} if context is None else context
    losses = context.get(REPORTED_LOSS) if weighting.needs_loss else None
    if weighting.needs_loss and losses is None:
      raise ValueError(f"server.weighting.name={weighting.name!r} needs context[{REPORTED_LOSS!r}], the clients' "
                       "reported losses (algorithms/reported_loss.py puts them there)")
    p = prepare(updates, weights, mask)
    sizes = p.weights
    lost = jnp.zeros((p.num_clients,), bool)
    if losses is not None:
      losses = jnp.asarray(losses, jnp.float32).reshape(p.num_clients)
      lost = p.valid & ~jnp.isfinite(losses)  # FedVSA's guard: a non-finite report drops the client
      sizes = jnp.where(lost, 0.0, sizes)
      losses = jnp.where(jnp.isfinite(losses), losses, 0.0)
    if inner.averaging == INPUT_WEIGHTS:
      result = inner.aggregate(updates, weighting.coefficients(sizes, sizes > 0, losses), mask, key, context)
    else:
      result = inner.aggregate(updates, sizes, mask, key, context)
      q = weighting.coefficients(sizes, (result.weights > 0) & (sizes > 0), losses)
      result = result._replace(update=combine(q, p.updates), weights=q)
    diagnostics = {**result.diagnostics, "nonfinite": result.diagnostics["nonfinite"] | lost}
    return AggregateResult(result.update, result.weights, result.flagged | lost, diagnostics)

  return inner._replace(aggregate=aggregate)
