"""Per-class accuracy of the global model (``class_accuracy`` evaluator): hand-computed counts, batching and the
real-row prefix, and through the simulator its agreement with ``global_test_acc``."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust.algorithms.fedavg import make_fedavg
from fedjax_robust.execution import make_strategy
from fedjax_robust.metrics import count_correct, count_correct_per_class
from fedjax_robust.simulation import Simulator
from test_engine_v2 import SPEC, bn_setup


def _fixed_predictions(predicted, num_classes=4):
  """An ``apply_fn`` whose argmax for row ``i`` is ``predicted[i]`` (x holds the row index)."""
  table = jax.nn.one_hot(jnp.asarray(predicted), num_classes)
  return lambda params, x: table[x.astype(jnp.int32)]


@pytest.mark.parametrize("batch_size", [1024, 2, 3])  # one call; a lax.map over padded batches (7 rows)
def test_per_class_counts_by_hand(batch_size):
  y = jnp.array([0, 0, 1, 1, 1, 2, 3])
  predicted = [0, 1, 1, 1, 0, 2, 0]  # class 0: 1/2, class 1: 2/3, class 2: 1/1, class 3: 0/1
  x = jnp.arange(7)
  apply_fn = _fixed_predictions(predicted)
  correct, count = count_correct_per_class(apply_fn, None, x, y, batch_size=batch_size)
  np.testing.assert_array_equal(correct, [1, 2, 1, 0])
  np.testing.assert_array_equal(count, [2, 3, 1, 1])
  # only the first n rows are real: rows 5, 6 (classes 2, 3) are padding
  correct, count = count_correct_per_class(apply_fn, None, x, y, n=5, batch_size=batch_size)
  np.testing.assert_array_equal(correct, [1, 2, 0, 0])
  np.testing.assert_array_equal(count, [2, 3, 0, 0])
  total, scored = count_correct(apply_fn, None, x, y, n=5, batch_size=batch_size)
  assert (int(total), int(scored)) == (3, 5)


@pytest.mark.fast_compiles  # tests/conftest.py (an equality test of MLP / LeNet programs: both sides alike)
def test_class_accuracy_evaluator_agrees_with_global_accuracy():
  """Class-count-weighted mean of ``global_class_acc`` is ``global_test_acc``; the worst class is its minimum;
  the same values under ``sequential`` (where the pure evaluator is compiled once) and ``vmap``."""
  data, model, variables = bn_setup()
  alg = make_fedavg(model, optax.sgd(0.05), SPEC)
  records = {}
  for strategy in ("sequential", "vmap"):
    sim = Simulator(alg, data, model, make_strategy(strategy), evaluators=("accuracy", "class_accuracy"))
    state, _ = sim.run_round(sim.init(variables, seed=0))
    records[strategy] = sim.evaluate(state)
  rec = records["sequential"]
  acc = np.asarray(rec["global_class_acc"], float)
  counts = np.bincount(np.asarray(data.y_global_test), minlength=acc.size)
  assert acc.size == 3 and (counts > 0).all()
  assert float(np.sum(acc * counts) / counts.sum()) == pytest.approx(rec["global_test_acc"], abs=1e-6)
  assert rec["global_worst_class_acc"] == pytest.approx(acc.min())
  np.testing.assert_allclose(records["vmap"]["global_class_acc"], acc, atol=1e-6)


def test_class_accuracy_marks_a_class_without_test_rows_and_needs_a_global_model():
  from fedjax_robust.metrics.evaluators import EVALUATORS, PURE_EVALUATORS
  assert "class_accuracy" in PURE_EVALUATORS
  from types import SimpleNamespace
  sim = SimpleNamespace(apply_fn=_fixed_predictions([0, 1, 2], 3), eval_batch_size=1024)
  inputs = SimpleNamespace(global_test=(jnp.arange(3), jnp.array([0, 0, 2])))  # class 0: 1/2, 1: no row, 2: 1/1
  out = EVALUATORS["class_accuracy"](sim, None, {"params": {}}, inputs)
  acc = np.asarray(out["global_class_acc"])
  assert acc[0] == 0.5 and np.isnan(acc[1]) and acc[2] == 1.0
  assert float(out["global_worst_class_acc"]) == 0.5  # the worst class among those with test rows
  with pytest.raises(ValueError, match="global model"):
    EVALUATORS["class_accuracy"](None, None, None, None)
