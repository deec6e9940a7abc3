"""benchmarks/step_latency.py: every formulation of the vmapped client step computes the engine's numbers.

Tiny case (2 clients, batch 2, 2 steps), all formulations in one jitted program (one compile), traced at
``highest`` matmul/conv precision so only float32 rounding separates them.
"""

from pathlib import Path

import numpy as np
import pytest

from fedjax_robust.config_files import load_module

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "step_latency.py"


@pytest.fixture(scope="module")
def sl():
  return load_module(_PATH)


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_formulations_agree_with_engine(sl):
  steps = 2
  s = sl.Setting(clients=2, batch=2, per_epoch=sl.per_epoch_for(steps, 225, 2), image=(32, 32, 3))
  params, x, y = sl.make_inputs(s, seed=1)
  labels = ["engine@1", "engine_xla@1", "vmap@1", "grouped@2", "lax_map@1", "client_loop@1", "patches@1"]
  report = sl.run_check(labels, s, params, x, y, steps, "highest", combined=True)
  assert report["engine@1"]["max_abs_update"] > 1e-4  # the steps really moved the parameters
  for label, r in report.items():
    assert r["max_abs_diff"] < 1e-6, (label, r)
    assert r["rel_update_diff"] < 1e-4, (label, r)


def test_pair_formulations_agree(sl):
  """FedCAP's / Ditto's two-model step: one vmapped pass over the stacked pair == two passes."""
  steps = 2
  s = sl.Setting(clients=2, batch=2, per_epoch=sl.per_epoch_for(steps, 225, 2), image=(32, 32, 3))
  params, x, y = sl.make_inputs(s, seed=1)
  labels = ["pair_separate@1", "pair_stacked@1", "pair_stacked_xla@1"]
  report = sl.run_check(labels, s, params, x, y, steps, "highest", combined=True)
  assert report["pair_separate@1"]["max_abs_update"] > 1e-4
  for label in labels[1:]:
    assert report[label]["max_abs_diff"] < 1e-6, report
  assert sl.is_pair("pair_stacked@5") and not sl.is_pair("engine@1")


def test_parse_and_setting_helpers(sl):
  assert [l for l, _, _ in sl.parse_formulation("engine", ("1", "5", "full"))] == ["engine@1", "engine@5",
                                                                                    "engine@full"]
  assert sl.parse_formulation("patches@25") == [("patches@25", "patches", 25)]
  with pytest.raises(ValueError):
    sl.parse_formulation("nope@1")
  assert sl.per_epoch_for(110, 225, 10) == 22  # FedCAP CIFAR-10: 5 epochs of 22 drop_last batches
  assert sl.per_epoch_for(20, 225, 10) == 20
  flops = sl.analytic_flops_per_step(sl.Setting(clients=20, batch=10, per_epoch=22, image=(32, 32, 3)))
  assert flops["forward_per_sample"] == 3_763_200 + 10_240_000 + 204_800 + 1_280
  assert np.isclose(flops["train_per_step"] / 1e9, 7.78, atol=0.01)
