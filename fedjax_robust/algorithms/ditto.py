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

``pair_forward`` chooses how the two forward/backward passes are executed, not what
they compute: ``separate`` runs ``apply_fn`` twice; ``stacked`` stacks ``w`` and
``v`` on a leading axis and runs one ``vmap``-ed pass on the shared batch (the
first conv becomes one conv with twice the output channels, later ones a grouped
conv). Same loss and gradients up to float rounding; which one is faster depends on
the backend (a latency-bound GPU step launches half the kernels with ``stacked``;
XLA:CPU runs grouped convs slowly), so it is an engine option
(``engine.pair_forward``), measured in ``benchmarks/step_latency.py``. ``auto`` (the
default) picks by backend, :func:`resolve_pair_forward`.

Evaluation: ``global_params`` = ``w`` (→ ``global_*`` metrics) and
``personal_params`` = ``v_k`` (→ ``client_acc_*`` / ``benign_acc_*``). FedCAP
reports ``max(global_benign_acc_weighted, benign_acc_weighted)`` (spec §3, last
paragraph; §4.4). Under partial participation a client not sampled keeps its
stale ``v_k``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators import Aggregator
from fedjax_robust.hparams import check, may_be_nonzero, scalar
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import make_fedavg, squared_distance, tree_sub
from fedjax_robust.client import Batch, ClientData, LocalTrainSpec, local_train, masked_cross_entropy
from fedjax_robust.models.interface import Model, as_model, require_stateless, train_logits

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]  # (params, x) -> logits


PAIR_FORWARDS = ("separate", "stacked")


def check_pair_forward(pair_forward: str, allow_auto: bool = False) -> str:
  allowed = PAIR_FORWARDS + (("auto",) if allow_auto else ())
  if pair_forward not in allowed:
    raise ValueError(f"pair_forward must be one of {allowed}, got {pair_forward!r}")
  return pair_forward


def resolve_pair_forward(pair_forward: str, backend: str | None = None) -> str:
  """``auto`` -> ``separate`` on the CPU, ``stacked`` elsewhere; any other value is itself.

  Measured (``benchmarks/README.md``, "Per-step latency"): on an H200 one vmapped FedCAP CIFAR-10 step of the
  pair takes 1.57 ms stacked against 2.48 ms separate, and a 100-round FedCAP run 26.0 s against 40.3 s. On the
  2-core CPU the stacked pair was 5.8x slower with ``model.conv_impl=xla`` (grouped convolutions inside a loop, on
  XLA:CPU's slow path) and is on par with the CPU's default canonical conv (109 against 107 ms a step at 4
  clients), so the CPU keeps the plain form. TPUs are unmeasured and follow the GPU (latency bound at these sizes).
  """
  if check_pair_forward(pair_forward, allow_auto=True) != "auto":
    return pair_forward
  return "separate" if (backend or jax.default_backend()) == "cpu" else "stacked"


def pair_logits(apply_fn: ApplyFn, pair_forward: str = "separate"):
  """``(params_w, params_v, x) -> (logits_w, logits_v)``: two models on one batch (module docstring)."""
  check_pair_forward(pair_forward)

  def separate(w, v, x):
    return apply_fn(w, x), apply_fn(v, x)

  def stacked(w, v, x):
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), w, v)
    logits = jax.vmap(apply_fn, in_axes=(0, None))(both, x)
    return logits[0], logits[1]

  return stacked if pair_forward == "stacked" else separate


def training_apply(model: Model | ApplyFn, key: jax.Array) -> ApplyFn:
  """``(params, x) -> logits`` in training mode with dropout key ``key`` (stateless models only)."""
  model = as_model(model)
  return lambda params, x: train_logits(model, params, {}, x, key, None)[0]


def ditto_pair_loss(model: Model | ApplyFn, anchor: PyTree, lamda: float, pair_forward: str = "separate"):
  """Loss on ``{"v", "w"}`` whose gradient is the two per-batch steps of spec §1.5 (anchor = frozen w^t).
  Both models see the same dropout key (so ``separate`` and ``stacked`` stay equal)."""
  model = as_model(model)
  require_stateless(model, "ditto's pair loss")

  def loss_fn(params, batch: Batch):
    forward = pair_logits(training_apply(model, batch.key), pair_forward)
    logits_w, logits_v = forward(params["w"], params["v"], batch.x)
    loss = masked_cross_entropy(logits_w, batch.y, batch.mask) + masked_cross_entropy(logits_v, batch.y, batch.mask)
    if may_be_nonzero(lamda):
      loss = loss + 0.5 * lamda * squared_distance(params["v"], anchor)
    return loss, batch.model_state

  return loss_fn


def make_ditto(
    apply_fn: Model | ApplyFn,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    server_opt: optax.GradientTransformation | None = None,
    lamda: float = 1.0,
    aggregator: Aggregator | None = None,
    root_data: ClientData | None = None,
    pair_forward: str = "separate",
    name: str = "ditto",
) -> FedAlgorithm:
  """Ditto (module docstring). ``lamda``: the prox weight λ of ``h_k`` (spec §3: CIFAR benign 1.0).

  ``server_opt``, ``aggregator``, ``root_data``: as in :func:`make_fedavg`, whose
  server half (init, broadcast, aggregation, global model) is reused verbatim.
  ``lamda = 0`` makes ``v`` plain local SGD continued across rounds (Local
  training that restarts nowhere), while ``w`` is always FedAvg's client.
  ``pair_forward``: how the pair's two passes run (module docstring); same numbers.
  """
  check(lamda, lambda v: v >= 0, f"ditto: lamda must be >= 0, got {lamda}")
  lamda = scalar(lamda)
  check_pair_forward(pair_forward)
  require_stateless(as_model(apply_fn), name)
  server = make_fedavg(apply_fn, client_opt, spec, server_opt, aggregator=aggregator, root_data=root_data)

  def init_client(params):
    return {"v": params}  # v_k^0 = w^0

  def client_update(global_params, client_state, data: ClientData, key):
    params = {"v": client_state["v"], "w": global_params}
    trained, _, metrics, _ = local_train(ditto_pair_loss(apply_fn, global_params, lamda, pair_forward), client_opt, params,
                                      client_opt.init(params), data, key, spec)
    return ClientOutput({"delta": tree_sub(trained["w"], global_params)}, {"v": trained["v"]}, metrics)

  def personal_params(global_params, client_state, data: ClientData, key):
    del global_params, data, key
    return client_state["v"]

  return FedAlgorithm(name, server.init_server, init_client, server.broadcast, client_update, server.server_update,
                      server.global_params, personal_params, uses_context=True)
