"""FedRoD (Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR 2022).

FedCAP baseline, spec ``specs/fedcap.md`` §3 ("FedRoD") and §4.2 (base = every
layer but the last Dense, head = the last Dense, ``params["head"]``; see
:func:`fedjax_robust.models.split_base_head`). Per mini-batch of the E local
epochs, as the FedCAP artifact's (PFLlib) ``clientrod.py`` does:

* generic model ``g = (base, head)``, starting from the global ``w^t``:
  ``rep = base(x)``, ``out_g = head(rep)``, one step on the **balanced softmax**
  loss (FedRoD's generic objective; Ren et al. 2020, Balanced Meta-Softmax) ``CE(out_g + log n_{k,·}, y)``, where
  ``n_{k,c}`` is client ``k``'s training count of class ``c``;
* personal head ``h_k`` (persistent client state, initialised from the initial
  model's head, like PFLlib's ``copy.deepcopy(model.head)``): one step on
  ``CE(stop_grad(out_g) + h_k(stop_grad(rep)), y)`` (FedRoD's personalized head; ``out_g`` and
  ``rep`` are those of the same batch, before the generic step).

Upload ``Δ_k = g − w^t``; the server is FedAvg's (sample-weighted mean) or any
robust rule, exactly as :func:`~fedjax_robust.algorithms.fedavg.make_fedavg` does
it (reused verbatim).

**Class counts.** ``log 0`` for a class the client never sees (every client
under the pathological 2-class partition) would put ``-inf`` in the logits:
PyTorch copes, but the padded rows of a batch then get an infinite loss and
``inf · 0 = NaN`` under the sample mask. The counts are therefore clamped below
at ``count_floor`` (default ``1e-8``): an absent class's logit is shifted by
``log 1e-8 ≈ −18.4``, so its softmax share, and the gradient pushing it down, are
a factor ``~1e-8`` of the rest: PFLlib's ``-inf`` behaviour to float32 precision,
with everything finite. (A floor of 1 would instead train absent classes as if
the client held one sample of each.) The counts are over the rows the loader
visits: the first ``⌊n/B⌋·B`` rows with ``drop_last`` and no shuffling (PFLlib
counts over its ``drop_last`` train loader), all ``n`` rows otherwise.

**Personalized model.** The personalized prediction is ``out_g + h_k(rep)``.
The head is linear, so this is ``rep @ (K_g + K_h) + (b_g + b_h)``: the same
architecture with the generic model's base and the summed head. ``personal_params``
returns exactly those ordinary params, so the engine scores them with its usual
``apply_fn``; ``global_params`` is the aggregated generic model. Which generic
model ``g`` carries the personal head (``personal_generic``): ``"local"``
(default) is the client's own locally updated ``g`` from its last round, as the
FedCAP artifact scores it (PFLlib's ``evaluate_personalized`` runs right after
``client.train()``, on the client's trained model; spec §3 last paragraph,
"locally-updated/personalized"); it costs a ``[K, D]`` copy on the client axis.
``"global"`` puts the head on the current global model instead. FedCAP reports
``max(global_benign_acc_weighted, benign_acc_weighted)`` (spec §3, §4.4).

Both per-batch steps are one optimizer step on the pair ``{"g", "h"}`` of the
loss ``BSM(g) + CE(stop_grad(out_g) + h(stop_grad(rep)))``: the stop-gradients
make the two gradients independent, and an element-wise optimizer (all of
:mod:`fedjax_robust.optim`) then equals two separate optimizers, so
:func:`~fedjax_robust.client.local_train` runs it with exact no-op padded steps.
The ``loss`` metric is that sum.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_robust.aggregators import Aggregator
from fedjax_robust.algorithms.base import ClientOutput, FedAlgorithm
from fedjax_robust.algorithms.fedavg import make_fedavg, tree_sub
from fedjax_robust.algorithms.ditto import training_apply
from fedjax_robust.client import Batch, ClientData, LocalTrainSpec, local_train, masked_cross_entropy, steps_per_epoch
from fedjax_robust.models.interface import Model, as_model, require_stateless
from fedjax_robust.models import merge_base_head, split_base_head

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]  # (params, x) -> logits
FeaturesFn = Callable[[PyTree, jax.Array], jax.Array]  # (params, x) -> penultimate features (head input)


def linear_head(head: PyTree, rep: jax.Array) -> jax.Array:
  """``rep @ kernel + bias``: the models' ``head`` (a TorchDense) applied to features."""
  out = jax.lax.dot_general(rep, head["kernel"], (((rep.ndim - 1,), (0,)), ((), ())))
  return out + head["bias"] if "bias" in head else out


def combine_heads(params: PyTree, personal_head: PyTree) -> PyTree:
  """The personalized model: the global base with head ``head_g + h_k`` (kernel and bias summed)."""
  base, head = split_base_head(params)
  return merge_base_head(base, jax.tree.map(jnp.add, head, personal_head))


def class_counts(data: ClientData, num_classes: int, spec: LocalTrainSpec) -> jax.Array:
  """``[C]`` counts of the labels among the training rows the loader visits (module docstring)."""
  n = data.n
  if spec.drop_last and not spec.shuffle:
    n = steps_per_epoch(data.n, spec.batch_size, True) * spec.batch_size
  real = jnp.arange(data.y.shape[0]) < n
  return jnp.sum(jax.nn.one_hot(data.y, num_classes) * real[:, None], axis=0)


def balanced_softmax_loss(logits: jax.Array, labels: jax.Array, mask: jax.Array, counts: jax.Array,
                          count_floor: float = 1e-8) -> jax.Array:
  """Balanced softmax (Ren et al. 2020; FedRoD's generic loss).

  Masked mean CE of ``logits + log(max(counts, count_floor))``.
  """
  return masked_cross_entropy(logits + jnp.log(jnp.maximum(counts, count_floor)), labels, mask)


def fedrod_pair_loss(apply_fn: Model | ApplyFn, features_fn: FeaturesFn | None, counts: jax.Array,
                     count_floor: float):
  """Loss on ``{"g": generic params, "h": personal head}`` whose gradient is FedRoD's two per-batch steps.

  ``features_fn`` given: the rep is computed once (eval-mode features: dropout is not applied on that path);
  otherwise two training-mode passes with the step's dropout key."""
  model = as_model(apply_fn)
  require_stateless(model, "fedrod")

  def loss_fn(params, batch: Batch):
    x, y, mask = batch.x, batch.y, batch.mask
    apply_fn = training_apply(model, batch.key)
    g, h = params["g"], params["h"]
    if features_fn is not None:
      rep = features_fn(g, x)
      out_g = linear_head(g["head"], rep)
      out_p = linear_head(h, jax.lax.stop_gradient(rep))
    else:  # only apply_fn: h(rep_g) is the model with base_g and head h (a second forward pass of the base)
      out_g = apply_fn(g, x)
      out_p = apply_fn(merge_base_head(jax.lax.stop_gradient(split_base_head(g)[0]), h), x)
    generic = balanced_softmax_loss(out_g, y, mask, counts, count_floor)
    personal = masked_cross_entropy(jax.lax.stop_gradient(out_g) + out_p, y, mask)
    return generic + personal, batch.model_state

  return loss_fn


def make_fedrod(
    apply_fn: Model | ApplyFn,
    client_opt: optax.GradientTransformation,
    spec: LocalTrainSpec,
    server_opt: optax.GradientTransformation | None = None,
    features_fn: FeaturesFn | None = None,
    count_floor: float = 1e-8,
    aggregator: Aggregator | None = None,
    root_data: ClientData | None = None,
    personal_generic: str = "local",
    name: str = "fedrod",
) -> FedAlgorithm:
  """FedRoD (module docstring).

  ``features_fn(params, x)``: the model's penultimate features (the input of
  ``head``), e.g. ``model.apply({"params": p}, x, method="features")``; the base
  then runs once per batch. Without it the personal head's logits come from a
  second forward pass ``apply_fn({base_g, head: h}, x)``, equal by linearity.
  Params must be a dict whose ``"head"`` entry is the last Dense
  (``{"kernel", "bias"}``), as for every model of :mod:`fedjax_robust.models`.
  """
  if not count_floor > 0:
    raise ValueError(f"fedrod: count_floor must be > 0, got {count_floor}")
  if personal_generic not in ("local", "global"):
    raise ValueError(f"fedrod: personal_generic must be 'local' or 'global', got {personal_generic!r}")
  keep_generic = personal_generic == "local"
  count_floor = float(count_floor)
  require_stateless(as_model(apply_fn), name)
  server = make_fedavg(apply_fn, client_opt, spec, server_opt, aggregator=aggregator, root_data=root_data)

  def init_client(params):
    state = {"head": split_base_head(params)[1]}  # h_k^0 = the initial head
    return {**state, "generic": params} if keep_generic else state  # a never-sampled client holds w^0

  def client_update(global_params, client_state, data: ClientData, key):
    num_classes = global_params["head"]["kernel"].shape[-1]
    counts = class_counts(data, num_classes, spec)
    params = {"g": global_params, "h": client_state["head"]}
    trained, _, metrics, _ = local_train(fedrod_pair_loss(apply_fn, features_fn, counts, count_floor), client_opt,
                                      params, client_opt.init(params), data, key, spec)
    state = {"head": trained["h"], "generic": trained["g"]} if keep_generic else {"head": trained["h"]}
    return ClientOutput({"delta": tree_sub(trained["g"], global_params)}, state, metrics)

  def personal_params(global_params, client_state, data: ClientData, key):
    del data, key
    return combine_heads(client_state["generic"] if keep_generic else global_params, client_state["head"])

  return FedAlgorithm(name, server.init_server, init_client, server.broadcast, client_update, server.server_update,
                      server.global_params, personal_params, uses_context=True)
