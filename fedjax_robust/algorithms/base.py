"""The algorithm interface: a NamedTuple of pure functions, in the style of optax.

A round of any algorithm is: the server ``broadcast``s a payload to the sampled
cohort; every cohort client runs ``client_update`` (written for ONE client, the
engine maps it over the client axis); the server folds the stacked uploads into
its state with ``server_update``. Per-client persistent state (personal models,
optimizer state, control variates) lives on a leading client axis and is
gathered/scattered by the engine.

Evaluation asks the algorithm for the models to score: ``global_params`` (the
server model, or ``None`` when there is none, as in Local training) and
``personal_params`` (the model client ``k`` would use on its own test split:
the global model for FedAvg, the fine-tuned one for FedAvg-FT, its own for Local).

Two opt-in extensions (NamedTuple fields with defaults, so existing algorithms
are unchanged):

* ``uses_client_ids=True``: the server addresses clients individually (FedCAP's
  customized models, FedFomo's model subsets). Then
  ``broadcast(server_state, client_ids)`` returns ``(shared, per_client)``, where
  every leaf of ``per_client`` has a leading axis of ``len(client_ids)``; client
  ``i`` receives ``(shared, per_client[i])`` as its payload (the engine maps the
  shared part with ``in_axes=None``, so a pool of K models is not copied per
  client), and ``server_update(..., client_ids)`` gets the cohort's ids.
* ``eval_models=("a", "b", ...)``: ``personal_params`` returns a dict with these
  keys, each one a model the client can be scored with (FedCAP: customized and
  personalized). The first is the primary one (``client_acc_*``); every one is
  also reported as ``<name>_client_acc_*`` / ``<name>_benign_acc_*``.
* ``sampling_mask(server_state) -> [K] bool``: the clients the cohort may be
  drawn from (FedCAP's option to stop sampling removed clients, spec §6 item 9);
  ``None`` draws from everyone.
* ``uses_context=True``: ``server_update(..., context=RoundContext)`` receives
  the typed round context (:mod:`fedjax_robust.round_context`: round, cohort,
  malicious mask, weights, server-held data), from which it computes what its
  aggregation rule declares it needs.
* ``malicious_update(payload, client_state, data, attack_data, key) ->
  ClientOutput``: what a malicious client runs instead of ``client_update`` (a
  client-side attack such as FedCC's backdoor training); the engine runs it for
  the cohort's attackers only, in a fixed number of slots, with the attack's data
  (``RunInputs.attack_data``), and keeps ``client_update``'s output for everyone else.
  ``malicious_weight(attack_data) -> n`` (optional): the attackers' sample count in
  the aggregation weights when the attack's data replaces their own (FedVSA's
  model-replacement adversary holds only its flipped sample); ``None`` keeps the
  count of their own partition.
* ``client_report`` / ``server_review`` (optional, together): a review phase at the start of the round, before
  anyone trains. Every cohort client runs ``client_report(payload, client_state, data, key) -> report`` on the
  payload it received (cheap: FedVSA's inference loss of the downloaded model); the server reads the stacked
  reports with ``server_review(server_state, reports, weights, key, context) -> (server_state, diagnostics)`` and
  may change its state (FedVSA repairs a global model its audit finds poisoned); the round's payload is then
  broadcast from the reviewed state, so the cohort trains from it, and ``server_update`` gets the reviewed state.
  ``malicious_report(payload, client_state, data, attack_data, key)`` is what an attacker reports instead (with
  ``malicious_update``; default: ``client_report`` on its own data). Upload attacks (``upload_transform``) act on
  the uploads of the training phase, not on the reports.
* ``uses_malicious=True`` (with ``uses_client_ids``): ``broadcast(server_state,
  client_ids, malicious)`` also gets the run's ``[K]`` attacker mask, for
  algorithms whose clients act out the attack inside the client kernel (FedCAP's
  poisoned customization requests, spec §2.3). The mask is an argument of the
  round, so runs with different attackers share one program.

Client x client weights. An algorithm whose clients' models mix other clients' models (FedCAP's customized
weights, FedFomo's first-order weights, FedCAC's collaborator means, FedAMP's attention) returns the round's mixing
weights among its ``server_update`` diagnostics as :data:`CLIENT_WEIGHT_MATRIX`, a ``[C, K]`` array: row ``i`` is
the round's ``i``-th cohort member (the receiver, in the order of ``cohort``), column ``j`` is client ``j`` (the
contributor), and the value is the weight of client ``j``'s model in the model receiver ``i`` got this round. One
name for every algorithm, so the run writes and plots it without knowing which algorithm made it (round records
keep scalars and 1-D vectors only; the run stores the matrix of its evaluated rounds in ``client_weights.npz``,
:mod:`fedjax_robust.client_weights`). Each algorithm's docstring says which model a row weighs and what a row of
zeros means. The matrix must be one the round computes anyway: emitting it costs a ``[C, K]`` output, nothing more.

Model state. With a model that has non-trainable state (BatchNorm's
``batch_stats``), the engine calls ``init_server(params, model_state)`` and
``init_client(params, model_state)``; algorithms that cannot carry it refuse
such a model when built. ``global_params`` / ``personal_params`` may return a
full variable dict ``{"params", "batch_stats"}`` instead of bare params
(``models.interface.as_variables``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax

from fedjax_robust.client import ClientData
# server_update's diagnostic of the round's client x client mixing weights ([C, K]; module docstring)
from fedjax_robust.client_weights import KEY as CLIENT_WEIGHT_MATRIX  # noqa: F401

PyTree = Any


class ClientOutput(NamedTuple):
  upload: PyTree  # what the server receives, e.g. {"delta": params_delta}
  state: PyTree  # the client's new persistent state
  metrics: dict  # per-client scalars (train loss, real steps)


class FedAlgorithm(NamedTuple):
  """An FL algorithm as pure functions over pytrees.

  init_server(params) -> server_state
  init_client(params) -> one client's persistent state (stacked K times by the engine)
  broadcast(server_state) -> payload sent to every cohort client
  client_update(payload, client_state, data, key) -> ClientOutput
  server_update(server_state, uploads, weights, key) -> (server_state, diagnostics)
      uploads have a leading cohort axis; weights [C] are the aggregation weights
      (sample counts for sample-weighted FedAvg, 0 for clients that must not count).
  global_params(server_state) -> params or None
  personal_params(payload, client_state, train_data, key) -> params of one client
      (a dict ``{name: params}`` when ``eval_models`` is set)
  uses_client_ids, eval_models, sampling_mask: see the module docstring.
  """

  name: str
  init_server: Callable[[PyTree], PyTree]
  init_client: Callable[[PyTree], PyTree]
  broadcast: Callable[[PyTree], PyTree]
  client_update: Callable[[PyTree, PyTree, ClientData, jax.Array], ClientOutput]
  server_update: Callable[[PyTree, PyTree, jax.Array, jax.Array], tuple[PyTree, dict]]
  global_params: Callable[[PyTree], Optional[PyTree]]
  personal_params: Callable[[PyTree, PyTree, ClientData, jax.Array], PyTree]
  uses_client_ids: bool = False
  eval_models: tuple[str, ...] = ()
  sampling_mask: Optional[Callable[[PyTree], jax.Array]] = None
  uses_context: bool = False
  uses_malicious: bool = False
  malicious_update: Optional[Callable] = None
  malicious_weight: Optional[Callable] = None
  client_report: Optional[Callable] = None
  server_review: Optional[Callable] = None
  malicious_report: Optional[Callable] = None
