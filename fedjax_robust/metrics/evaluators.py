"""Evaluators: what a run measures at each evaluation, chosen in the config (``eval.metrics``).

An evaluator is ``fn(sim, state, global_model, inputs) -> {name: value}``, registered by name: a
traceable function of the state and the run's :class:`~fedjax_robust.simulation.RunInputs` (test
splits, attackers, triggered inputs) using the simulator's scoring kernels. Its device values are
compiled with the others into one evaluation program (or into the whole run's, ``fedjax_robust.run``)
and come to the host once, when the round's record is written. ``global_model`` is the server model
(params or variables) or ``None`` for algorithms without one (Local, FedFomo).

* ``accuracy``: the global model on the global test set and on every client's test split
  (``global_test_acc``, ``global_client_acc_weighted``, ``global_benign_acc_weighted``), and each
  client's own evaluation model (``client_acc_*``, ``benign_acc_*``, per ``eval_models``).
* ``backdoor``: the global model's attack success rate and backdoor confidence on the triggered
  global test set (needs a backdoor attack, ``attack.data.kind`` = ``backdoor`` / ``dba``).

* ``robust``: the global model's natural and robust accuracy under the attacks of ``eval.robust``
  (``robust_natural_acc``, ``robust_acc_fgsm``, ...; :mod:`fedjax_robust.adversarial.evaluation`).

* ``class_accuracy``: the global model's accuracy on each class of the global test set
  (``global_class_acc``, a list; ``nan`` for a class with no test row) and its worst class
  (``global_worst_class_acc``): what a label-skewed federation costs the classes rare on their clients.

``auto`` (the default) is ``accuracy`` plus ``backdoor`` when the run has a backdoor.
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from fedjax_robust.metrics.accuracy import count_correct_per_class

EvaluatorFn = Callable[[Any, Any, Any, Any], dict]
EVALUATORS: dict[str, EvaluatorFn] = {}
PURE_EVALUATORS: set[str] = set()


def register_evaluator(name: str, fn: EvaluatorFn, *, pure: bool = False) -> None:
  """Registers ``fn`` as evaluator ``name``.

  ``pure``: ``fn`` calls only traceable code whatever the simulator's strategy (no host loop over clients, as
  ``accuracy``'s per-client scoring has under ``sequential``). Where the strategy is not traceable the simulator
  then still compiles ``fn`` once, as one program, and reuses it at every evaluation. Left eager, its loops
  (``lax.scan`` / ``lax.map`` over fresh closures) would be compiled anew at every evaluation and the compiled code
  never freed: a FedALC round on the CPU spent ~40 s recompiling its robust evaluation, and a grid process died
  after four cells when XLA could map no more code.
  """
  if name in EVALUATORS:
    raise ValueError(f"evaluator {name!r} is already registered")
  EVALUATORS[name] = fn
  if pure:
    PURE_EVALUATORS.add(name)


def resolve_evaluators(names, has_backdoor: bool) -> tuple[str, ...]:
  """``"auto"``, a comma-separated string or a sequence -> checked evaluator names."""
  if names is None or names == "auto":
    return ("accuracy", "backdoor") if has_backdoor else ("accuracy",)
  if isinstance(names, str):
    names = [n for n in names.replace(" ", "").split(",") if n]
  names = tuple(names)
  unknown = [n for n in names if n not in EVALUATORS]
  if unknown:
    raise ValueError(f"unknown evaluator(s) {unknown}; known: {sorted(EVALUATORS)} or 'auto'")
  if "backdoor" in names and not has_backdoor:
    raise ValueError("eval.metrics asks for 'backdoor' but the run has no backdoor attack (attack.data.kind)")
  return names


def _accuracy(sim, state, global_model, inputs) -> dict:
  out: dict[str, Any] = {}
  if global_model is not None:
    out["global_test"] = sim._eval_global(global_model, *inputs.global_test)
    out["global_on_clients"] = sim._eval_global_on_clients(global_model, inputs.test)
  out["clients"] = sim.score_clients(state, inputs)
  return out


def _backdoor(sim, state, global_model, inputs) -> dict:
  del state
  if global_model is None:
    return {}
  return {"backdoor": sim._eval_backdoor(global_model, inputs.backdoor_x, inputs.backdoor_target)}


def _robust(sim, state, global_model, inputs) -> dict:
  from fedjax_robust.adversarial.evaluation import evaluate_robust, robust_eval_from_config
  from fedjax_robust.simulation import eval_key
  if global_model is None:
    raise ValueError("the robust evaluator attacks the global model; this algorithm has none")
  spec = sim.eval_options.get("robust") or robust_eval_from_config(None)
  key = eval_key(state.key, state.round)
  return evaluate_robust(sim.model, global_model, *inputs.global_test, key, spec)


def _class_accuracy(sim, state, global_model, inputs) -> dict:
  del state
  if global_model is None:
    raise ValueError("the class_accuracy evaluator scores the global model; this algorithm has none")
  correct, count = count_correct_per_class(sim.apply_fn, global_model, *inputs.global_test,
                                           batch_size=sim.eval_batch_size)
  acc = jnp.where(count > 0, correct / jnp.maximum(count, 1), jnp.nan)
  return {"global_class_acc": acc, "global_worst_class_acc": jnp.nanmin(acc)}


register_evaluator("accuracy", _accuracy)  # per-client scoring follows the strategy (a host loop under sequential)
register_evaluator("backdoor", _backdoor, pure=True)
register_evaluator("robust", _robust, pure=True)
register_evaluator("class_accuracy", _class_accuracy, pure=True)


def accuracy_record(raw: dict, benign, eval_models, client_metrics) -> dict:
  """Host-side metrics of the ``accuracy`` evaluator's raw counts (``client_metrics``: the simulator's per-client
  summary)."""
  metrics: dict[str, Any] = {}
  if "global_test" in raw:
    correct, count = raw["global_test"]
    metrics["global_test_acc"] = float(correct) / max(int(count), 1)
    correct, count = map(np.asarray, raw["global_on_clients"])
    if count.sum() == 0:  # no client holds a test split (data.train_ratio=1.0): only the global test set scores
      return metrics
    metrics["global_client_acc_weighted"] = float(correct.sum() / max(count.sum(), 1))
    if benign is not None:
      metrics["global_benign_acc_weighted"] = float(correct[benign].sum() / max(count[benign].sum(), 1))
  scored = raw["clients"]
  first = scored[eval_models[0]] if eval_models else scored
  if int(np.asarray(first[1]).sum()) == 0:  # no client test rows at all: client accuracies are undefined
    return metrics
  if eval_models:
    for name in eval_models:
      metrics.update(client_metrics(*scored[name], benign, prefix=f"{name}_"))
    scored = scored[eval_models[0]]
  metrics.update(client_metrics(*scored, benign))
  return metrics
