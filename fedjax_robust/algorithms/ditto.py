"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021).

FedCAP baseline, spec ``specs/fedcap.md`` §3 ("Ditto") with the client loop of §1.5
(ŵ := w^t, the received global model, kept frozen). Client ``k`` keeps a
personalized model ``v_k`` (persistent client state, initialised to ``w^0``).
In round ``t`` it receives ``w^t`` and runs, on EVERY mini-batch of its E local
epochs (Ditto's Alg. 1 with the FedCAP artifact's ``clientditto.py`` interleaving):

    (a) v ← v − η (∇CE(v) + λ (v − w^t))   # descent on F_k(v) + λ/2‖v − w^t‖²: FedCAP Eq. 7, ŵ := w^t
    (b) w ← w − η ∇CE(w)                      # plain local SGD from w^t, as in FedAvg

and uploads ``Δ_k = w − w^t``. The server is FedAvg's (spec §3 "FedAvg":
``w^{t+1} = w^t + Σ n_k Δ_k / Σ n_k``), or any robust rule from
:mod:`fedjax_robust.aggregators` exactly as :func:`make_fedavg` applies it
(FLTrust root data, ``flagged`` / ``aggregation_weights`` diagnostics), which
gives "Ditto + AGR" (FedCAP Fig. 8, spec §5.6).

Implementation: the two steps share the batch and do not interact, so they are
ONE optimizer step on the pair ``{"v": v, "w": w}`` with loss
``CE(w) + CE(v) + λ/2 ‖v − w^t‖²`` (``w^t`` a constant): its gradient is
``(∇CE(v) + λ(v − w^t), ∇CE(w))``, and an element-wise optimizer (every optax
optimizer of :mod:`fedjax_robust.optim`: SGD with or without momentum, Adam,
AdamW, L2 weight decay) updates each half exactly as two separate optimizers
would. So :func:`~fedjax_robust.client.local_train` runs it unchanged, and its
padded steps are exact no-ops for both models. (An optimizer that couples
leaves, e.g. global-norm clipping, would couple the two models; none is used.)
The reported ``loss`` metric is the mean over real steps of that pair loss,
i.e. ``CE(w) + CE(v) + prox`` — not comparable with FedAvg's ``train_loss``.

Evaluation: ``global_params`` = ``w`` (→ ``global_*`` metrics) and
``personal_params`` = ``v_k`` (→ ``client_acc_*`` / ``benign_acc_*``). FedCAP
reports ``max(global_benign_acc_weighted, benign_acc_weighted)`` (spec §3, last
paragraph; §4.4). Under partial participation a client not sampled keeps its
stale ``v_k``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from fedjax_robust.aggregators import Aggregator
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import make_fedavg, squared_distance, tree_sub
from fedjax_robust.client import ClientData, LocalTrainSpec, local_train, masked_cross_entropy

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]  # (params, x) -> logits


def ditto_pair_loss(apply_fn: ApplyFn, anchor: PyTree, lamda: float):
  """Loss on ``{"v", "w"}`` whose gradient is the two per-batch steps of spec §1.5 (anchor = frozen w^t)."""

  def loss_fn(params, x, y, mask):
    loss = masked_cross_entropy(apply_fn(params["w"], x), y, mask)
    loss = loss + masked_cross_entropy(apply_fn(params["v"], x), y, mask)
    if lamda:
      loss = loss + 0.5 * lamda * squared_distance(params["v"], anchor)
    return loss

  return loss_fn


def make_ditto(
    apply_fn: ApplyFn,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    server_opt: optax.GradientTransformation | None = None,
    lamda: float = 1.0,
    aggregator: Aggregator | None = None,
    root_data: ClientData | None = None,
    name: str = "ditto",
) -> FedAlgorithm:
  """Ditto (module docstring). ``lamda``: the prox weight λ of ``h_k`` (spec §3: CIFAR benign 1.0).

  ``server_opt``, ``aggregator``, ``root_data``: as in :func:`make_fedavg`, whose
  server half (init, broadcast, aggregation, global model) is reused verbatim.
  ``lamda = 0`` makes ``v`` plain local SGD continued across rounds (Local
  training that restarts nowhere), while ``w`` is always FedAvg's client.
  """
  if lamda < 0:
    raise ValueError(f"ditto: lamda must be >= 0, got {lamda}")
  lamda = float(lamda)
  server = make_fedavg(apply_fn, client_opt, spec, server_opt, aggregator=aggregator, root_data=root_data)

  def init_client(params):
    return {"v": params}  # v_k^0 = w^0

  def client_update(global_params, client_state, data: ClientData, key):
    params = {"v": client_state["v"], "w": global_params}
    trained, _, metrics = local_train(ditto_pair_loss(apply_fn, global_params, lamda), client_opt, params,
                                      client_opt.init(params), data, key, spec)
    return ClientOutput({"delta": tree_sub(trained["w"], global_params)}, {"v": trained["v"]}, metrics)

  def personal_params(global_params, client_state, data: ClientData, key):
    del global_params, data, key
    return client_state["v"]

  return FedAlgorithm(name, server.init_server, init_client, server.broadcast, client_update, server.server_update,
                      server.global_params, personal_params)
