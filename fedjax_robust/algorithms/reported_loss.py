"""Clients report the loss of the model they received; the server hands the reports to its aggregation rule.

FedVSA's client (Zeng et al., JPDC 2024, Alg. 2 line 1; spec ``shared/specs/fedvsa.md`` §1.3) scores the global
model it downloaded on its own training set, in eval mode and before training: the *inference loss*
``F_k^t = ℓ(w^t, D_k)`` (:func:`inference_loss`), uploaded beside its update (``upload["loss"]``, M + 1 floats,
Table 11). FedVSA's server reads it itself (``algorithms/fedvsa.py``); for the other algorithms,
:func:`with_client_weighting` is the algorithm half of ``server.weighting`` (``aggregators/weighting.py``): the
clients report, the server moves the reports from the uploads into the round context (``context["reported_loss"]``)
and the run's rule, wrapped by :func:`~fedjax_robust.aggregators.weighting.reweighted`, weighs its clients by them.
The algorithm's own client rule and server-state updates are untouched (FedVSA Table 9: "the method's local rule is
kept, and its averaging is replaced by the softmax inference-loss weighting", spec §3); every per-client quantity it
averages with the rule's effective weights (SCAFFOLD's ``Δc``, FedDyn's ``h``, FedDC's ``c``, BatchNorm statistics)
follows the new weights, since those are the rule's effective weights now.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators.weighting import REPORTED_LOSS, ClientWeighting
from fedjax_robust.algorithms.base import FedAlgorithm
from fedjax_robust.client import ClientData
from fedjax_robust.round_context import RoundContext

PyTree = Any

INFERENCE_LOSSES = ("ce", "mse", "l1")
REDUCTIONS = ("mean", "sum", "sum_batch_means")


def per_sample_loss(kind: str, logits: jax.Array, y: jax.Array) -> jax.Array:
  """``[B]`` losses: cross-entropy, or the mean over classes of the squared / absolute difference between the
  softmax and the one-hot label (PyTorch's ``MSELoss`` / ``L1Loss`` on probabilities, spec §1.3 [R])."""
  if kind == "ce":
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)
  diff = jax.nn.softmax(logits) - jax.nn.one_hot(y, logits.shape[-1], dtype=logits.dtype)
  return jnp.mean(jnp.square(diff) if kind == "mse" else jnp.abs(diff), axis=-1)


def inference_loss(logits_fn, variables: PyTree, data: ClientData, kind: str = "ce", reduction: str = "mean",
                   batch_size: int = 256, loader_batch: int = 10) -> jax.Array:
  """``ℓ(w, D_k)`` over the first ``data.n`` rows, in eval mode, batch by batch (spec §1.3, A1).

  ``mean``: per-sample mean; ``sum``: per-sample sum (Eq. 1, ``= n · mean``); ``sum_batch_means``: the sum over
  consecutive loader batches of ``loader_batch`` rows of each batch's mean (the ICPP code; ``= sum / B`` when
  ``B`` divides ``n``)."""
  total = int(data.y.shape[0])
  b = max(1, min(int(batch_size), total))
  num = -(-total // b)
  pad = num * b - total
  xb = jnp.pad(data.x, [(0, pad)] + [(0, 0)] * (data.x.ndim - 1)).reshape((num, b) + data.x.shape[1:])
  yb = jnp.pad(data.y, (0, pad)).reshape(num, b)
  rows = jax.lax.map(lambda a: per_sample_loss(kind, logits_fn(variables, a[0]), a[1]), (xb, yb)).reshape(-1)[:total]
  idx = jnp.arange(total)
  n = jnp.asarray(data.n, jnp.int32)
  rows = jnp.where(idx < n, rows, 0.0)
  if reduction == "mean":
    return jnp.sum(rows) / jnp.maximum(n, 1).astype(rows.dtype)
  if reduction == "sum":
    return jnp.sum(rows)
  start = (idx // loader_batch) * loader_batch
  size = jnp.clip(n - start, 1, loader_batch).astype(rows.dtype)
  return jnp.sum(rows / size)


def check_report_options(kind: str, reduction: str, who: str = "fedvsa") -> None:
  if kind not in INFERENCE_LOSSES:
    raise ValueError(f"{who}: inference_loss must be one of {INFERENCE_LOSSES}, got {kind!r}")
  if reduction not in REDUCTIONS:
    raise ValueError(f"{who}: inference_reduction must be one of {REDUCTIONS}, got {reduction!r}")


def reporting_loss(alg: FedAlgorithm, report: Callable[[PyTree, ClientData], jax.Array],
                   received_model: Callable[[PyTree], PyTree] = lambda payload: payload) -> FedAlgorithm:
  """``alg`` whose clients also upload ``loss = report(received_model(payload), data)``: the loss of the model
  they received. An attacker (``malicious_update``) reports it on the data it trains on: honest on poisoned data,
  hence high (spec §2 [R])."""

  def client_update(payload, client_state, data: ClientData, key):
    out = alg.client_update(payload, client_state, data, key)
    return out._replace(upload={**out.upload, "loss": report(received_model(payload), data)})

  def attacker_update(payload, client_state, data, attack_data, key):
    out = alg.malicious_update(payload, client_state, data, attack_data, key)
    return out._replace(upload={**out.upload, "loss": report(received_model(payload), attack_data)})

  return alg._replace(client_update=client_update,
                      malicious_update=None if alg.malicious_update is None else attacker_update)


def losses_to_rule(alg: FedAlgorithm) -> FedAlgorithm:
  """``alg`` whose server takes the ``loss`` field out of the uploads and gives it to its rule as
  ``context["reported_loss"]`` (also logged as the round's ``reported_loss``)."""

  def server_update(state, uploads, weights, key, context: Optional[RoundContext] = None):
    uploads = dict(uploads)
    losses = jnp.asarray(uploads.pop("loss"), jnp.float32)
    if context is None:  # called directly (tests)
      c = weights.shape[0]
      context = RoundContext(jnp.zeros((), jnp.int32), jnp.arange(c), jnp.zeros((c,), bool), weights)
    new_state, diagnostics = alg.server_update(state, uploads, weights, key,
                                               context=context.with_extras(**{REPORTED_LOSS: losses}))
    return new_state, {**diagnostics, "reported_loss": losses}

  return alg._replace(server_update=server_update, uses_context=True)


def with_client_weighting(alg: FedAlgorithm, weighting: Optional[ClientWeighting], model,
                          received_model: Callable[[PyTree], PyTree], loader_batch: int = 10) -> FedAlgorithm:
  """The algorithm half of ``weighting`` (module docstring); ``alg`` unchanged when the weighting needs no
  reports. ``model``: a :class:`~fedjax_robust.models.Model` (its eval-mode ``logits``); ``loader_batch``: the
  clients' batch size (``sum_batch_means``)."""
  if weighting is None or not weighting.needs_loss:
    return alg
  o = weighting.options
  kind, reduction = str(o.get("inference_loss", "ce")), str(o.get("inference_reduction", "mean"))
  check_report_options(kind, reduction, "server.weighting")
  batch = int(o.get("inference_batch_size", 256))

  def report(variables, data):
    return inference_loss(model.logits, variables, data, kind, reduction, batch, loader_batch)

  return losses_to_rule(reporting_loss(alg, report, received_model))
