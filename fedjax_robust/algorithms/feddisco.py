"""FedDisco (Ye et al., ICML 2023, "Federated Learning with Discrepancy-Aware Collaboration", Eq. 4-5).

FedAvg whose aggregation weights use both the data size and the discrepancy
between each client's label distribution and a reference ("global") one:

    n_k = |D_k| / sum_j |D_j|                  (over the round's valid cohort)
    d_k = dist(q_k, r)                         (q_k: client k's label distribution)
    p_k = ReLU(n_k - a d_k + b) / sum_j ReLU(n_j - a d_j + b)

Clients train exactly as FedAvg's and also upload their label histogram
(``upload["label_hist"]``: counts of ``data.y`` over the ``data.n`` real rows,
``[num_classes]``; the class count is the model's output size). The server turns
the histograms and the sample counts into ``p`` and aggregates ``delta`` with the
run's rule, passing ``p`` as its weights (the default ``mean`` rule: ``Σ p_k Δ_k``;
a rule that ignores weights, such as ``mean`` with ``weighted=False``, ignores ``p``).

Options (``config.algorithm.feddisco.*``):

* ``a`` (0.5), ``b`` (0.1): the official code's defaults (``--disco_a``, ``--disco_b``);
* ``distance``: ``l2`` (default, ``||q_k - r||_2``), ``l1``, or ``kl``
  (``KL(q_k || r)``, divided by its sum over the cohort as the official code does,
  so the ``d_k`` sum to 1; 0 when every KL is 0);
* ``reference``: ``uniform`` (``r = 1/K``, the official code's balanced test set)
  or ``cohort`` (the label distribution pooled over the round's valid clients).

Conventions (official code, MediaBrain-SJTU/FedDisco ``disco.py``; read, not
copied): ``n_k`` is normalised over the round's participants; when every
``n_k - a d_k + b`` is <= 0 the official code fails (an unset variable), here the
round falls back to the size weights ``n_k``, which makes the round FedAvg's: with
``a = 0.5, b = 0.1`` that is every round once each client holds two labels of ten
(``d_k >= 0.63`` against the uniform reference, so ``a d_k > n_k + b``), as in
FedVSA's σ partitions; the round diagnostic ``disco_size_fallback`` says when. A
client with no real rows, or with weight 0 from the engine, gets ``p_k = 0``; so
does a non-finite histogram.
Round diagnostics add ``disco_discrepancy`` [C] and ``disco_size_fallback`` (bool: every
ReLU clipped, the size weights used) to FedAvg's.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators import Aggregator
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import make_fedavg
from fedjax_robust.client import ClientData, LocalTrainSpec
from fedjax_robust.models.interface import Model, as_model

PyTree = Any

DISTANCES = ("l2", "l1", "kl")
REFERENCES = ("uniform", "cohort")


def label_histogram(data: ClientData, num_classes: int) -> jax.Array:
  """``[num_classes]`` float32 counts of the labels of the first ``data.n`` (real) rows."""
  real = (jnp.arange(data.y.shape[0]) < data.n).astype(jnp.float32)
  return jnp.sum(jax.nn.one_hot(data.y, num_classes, dtype=jnp.float32) * real[:, None], axis=0)


def disco_discrepancy(hists: jax.Array, valid: jax.Array, distance: str = "l2",
                      reference: str = "uniform") -> jax.Array:
  """``[C]`` discrepancy ``d_k`` between each valid client's label distribution and the reference (invalid: 0)."""
  hists = jnp.where(valid[:, None], jnp.asarray(hists, jnp.float32), 0.0)
  totals = jnp.sum(hists, axis=1, keepdims=True)
  q = hists / jnp.where(totals > 0, totals, 1.0)
  k = hists.shape[1]
  if reference == "uniform":
    r = jnp.full((k,), 1.0 / k, jnp.float32)
  else:
    pooled = jnp.sum(hists, axis=0)
    r = pooled / jnp.maximum(jnp.sum(pooled), 1e-30)
  if distance == "l2":
    d = jnp.sqrt(jnp.sum(jnp.square(q - r[None]), axis=1))
  elif distance == "l1":
    d = jnp.sum(jnp.abs(q - r[None]), axis=1)
  else:  # KL(q_k || r), 0 log 0 = 0; a class the reference lacks but the client has gives +inf (never with
    # the uniform or the cohort reference)
    terms = jnp.where(q > 0, q * (jnp.log(jnp.where(q > 0, q, 1.0)) - jnp.log(jnp.where(r > 0, r, 1e-30))[None]), 0.0)
    d = jnp.where(valid, jnp.sum(terms, axis=1), 0.0)
    total = jnp.sum(d)
    d = jnp.where(total > 0, d / jnp.where(total > 0, total, 1.0), 0.0)
  return jnp.where(valid, d, 0.0)


def disco_terms(sizes: jax.Array, hists: jax.Array, a: float = 0.5, b: float = 0.1, distance: str = "l2",
                reference: str = "uniform") -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(raw [C], n [C], d [C])``: Eq. 5's unnormalised ``ReLU(n_k - a d_k + b)``, the size shares ``n_k`` and ``d_k``.

  A client counts when its size is finite and > 0 and its histogram is finite with a positive total; any
  other client gets 0 in all three.
  """
  sizes = jnp.asarray(sizes, jnp.float32)
  hists = jnp.asarray(hists, jnp.float32)
  valid = (jnp.isfinite(sizes) & (sizes > 0) & jnp.all(jnp.isfinite(hists), axis=1)
           & (jnp.sum(jnp.where(jnp.isfinite(hists), hists, 0.0), axis=1) > 0))
  n = jnp.where(valid, sizes, 0.0)
  n = n / jnp.maximum(jnp.sum(n), 1e-30)
  d = disco_discrepancy(jnp.where(valid[:, None], hists, 0.0), valid, distance, reference)
  raw = jnp.where(valid, jax.nn.relu(n - a * d + b), 0.0)
  return raw, n, d


def weights_from_terms(raw: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(p [C], fell_back)``: Eq. 5's normalisation of ``raw``; when every ``raw`` is 0 (all clipped by the ReLU)
  ``p`` is the size shares ``n`` and ``fell_back`` is True (False when no client counts at all)."""
  total = jnp.sum(raw)
  fell_back = (total <= 0) & (jnp.sum(n) > 0)
  return jnp.where(total > 0, raw / jnp.where(total > 0, total, 1.0), n), fell_back


def disco_weights(sizes: jax.Array, hists: jax.Array, a: float = 0.5, b: float = 0.1, distance: str = "l2",
                  reference: str = "uniform") -> tuple[jax.Array, jax.Array]:
  """``(p [C], d [C])``: FedDisco's aggregation weights (Eq. 5) from the sample counts and label histograms."""
  raw, n, d = disco_terms(sizes, hists, a, b, distance, reference)
  return weights_from_terms(raw, n)[0], d


def check_disco_options(a, b, distance: str, reference: str):
  if distance not in DISTANCES:
    raise ValueError(f"feddisco: distance must be one of {DISTANCES}, got {distance!r}")
  if reference not in REFERENCES:
    raise ValueError(f"feddisco: reference must be one of {REFERENCES}, got {reference!r}")
  if isinstance(a, (int, float)) and a < 0:
    raise ValueError(f"feddisco: a must be >= 0, got {a}")


def make_feddisco(model: Model, client_opt: optax.GradientTransformation, spec: LocalTrainSpec,
                  server_opt: Optional[optax.GradientTransformation] = None, a: float = 0.5, b: float = 0.1,
                  distance: str = "l2", reference: str = "uniform", aggregator: Optional[Aggregator] = None,
                  **fedavg_kwargs) -> FedAlgorithm:
  """FedDisco on top of :func:`~fedjax_robust.algorithms.fedavg.make_fedavg` (same clients, same server step,
  FedDisco's weights instead of the sample counts). ``fedavg_kwargs``: the FedAvg family's other options
  (``mu``, ``persist_client_opt_state``, ``client_attack``, ``objective``, ...)."""
  check_disco_options(a, b, distance, reference)
  model = as_model(model)
  base = make_fedavg(model, client_opt, spec, server_opt, aggregator=aggregator, name="feddisco", **fedavg_kwargs)

  def with_histogram(out: ClientOutput, payload, data: ClientData) -> ClientOutput:
    shapes = jax.tree.map(lambda v: jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)), (payload, data.x[:1]))
    num_classes = jax.eval_shape(model.logits, *shapes).shape[-1]  # the model's output size (static)
    return out._replace(upload={**out.upload, "label_hist": label_histogram(data, num_classes)})

  def client_update(payload, client_state, data: ClientData, key):
    return with_histogram(base.client_update(payload, client_state, data, key), payload, data)

  def malicious_update(payload, client_state, data, attack_data, key):
    return with_histogram(base.malicious_update(payload, client_state, data, attack_data, key), payload, data)

  def server_update(state, uploads, weights, key, context=None):
    uploads = dict(uploads)
    hists = uploads.pop("label_hist")
    raw, n, d = disco_terms(weights, hists, a, b, distance, reference)
    p, fell_back = weights_from_terms(raw, n)
    if context is not None:
      context = context._replace(weights=p)
    new_state, diagnostics = base.server_update(state, uploads, p, key, context=context)
    return new_state, {**diagnostics, "disco_discrepancy": d, "disco_size_fallback": fell_back}

  return base._replace(client_update=client_update, server_update=server_update,
                       malicious_update=None if base.malicious_update is None else malicious_update)
