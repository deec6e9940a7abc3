"""Security metrics by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_robust.metrics import security as sm


def test_benign_accuracy_weighted_and_unweighted():
  correct = np.array([8, 1, 0, 30])
  count = np.array([10, 10, 5, 40])
  mal = np.array([False, True, False, False])
  assert float(sm.benign_accuracy(correct, count, mal)) == pytest.approx(38 / 55)
  assert float(sm.benign_accuracy(correct, count, mal, weighted=False)) == pytest.approx((0.8 + 0 + 0.75) / 3)
  # FedCAP P20: adding a malicious client with 0% accuracy does not change it
  assert float(sm.benign_accuracy(np.r_[correct, 0], np.r_[count, 100], np.r_[mal, True])) == pytest.approx(38 / 55)
  assert np.isnan(float(sm.benign_accuracy(correct, count, np.ones(4, bool))))
  assert float(jax.jit(sm.benign_accuracy)(correct, count, mal)) == pytest.approx(38 / 55)


def test_attack_success_rate_and_backdoor_confidence():
  assert float(sm.attack_success_rate(np.array([3, 3, 1, 3]), 3)) == pytest.approx(0.75)
  assert float(sm.attack_success_rate(np.array([3, 3, 1, 3]), 3, valid=np.array([1, 0, 1, 0]))) == pytest.approx(0.5)
  assert float(sm.backdoor_confidence(np.zeros((7, 10)), 2)) == pytest.approx(0.1)  # uniform logits -> 1/C
  logits = np.array([[0.0, np.log(3.0)], [np.log(3.0), 0.0]])  # softmax: [.25, .75], [.75, .25]
  assert float(sm.backdoor_confidence(logits, 1)) == pytest.approx(0.5)
  assert float(sm.backdoor_confidence(logits, np.array([1, 0]))) == pytest.approx(0.75)
  assert np.isnan(float(sm.attack_success_rate(np.zeros(0), 1)))


def test_detection_rates_by_hand():
  flagged = np.array([1, 1, 0, 0, 1, 0], bool)
  mal = np.array([1, 0, 1, 0, 0, 0], bool)
  r = sm.detection_rates(flagged, mal)
  assert (int(r["tp"]), int(r["fp"]), int(r["tn"]), int(r["fn"])) == (1, 2, 2, 1)
  assert float(r["tpr"]) == 0.5 and float(r["fnr"]) == 0.5
  assert float(r["fpr"]) == pytest.approx(0.5) and float(r["tnr"]) == pytest.approx(0.5)
  assert float(r["accuracy"]) == pytest.approx(0.5)
  r = sm.detection_rates(flagged, mal, mask=jnp.asarray([1, 1, 1, 0, 0, 0], bool))
  assert (int(r["tp"]), int(r["fp"]), int(r["tn"]), int(r["fn"])) == (1, 1, 0, 1)
  # FedCAP P22: CIFAR-10 LIE pattern (nothing flagged, 6 of 20 malicious): DAcc 70%, FNR 100%
  mal20 = np.zeros(20, bool)
  mal20[[1, 8, 10, 17, 18, 19]] = True
  r = sm.detection_rates(np.zeros(20, bool), mal20)
  assert float(r["accuracy"]) == pytest.approx(0.7) and float(r["fnr"]) == 1.0 and float(r["fpr"]) == 0.0
  # no malicious client: TPR/FNR undefined -> NaN
  r = jax.jit(sm.detection_rates)(np.zeros(5, bool), np.zeros(5, bool))
  assert np.isnan(float(r["tpr"])) and np.isnan(float(r["fnr"])) and float(r["tnr"]) == 1.0
