"""Data poisoning: label flips, BadNets triggers, DBA parts, whole-FederatedData poisoning, attacker ids."""

import numpy as np
import pytest

from fedjax_robust import attacks
from fedjax_robust.attacks import data_poisoning as dp
from fedjax_robust.data import FederatedData


def test_choose_malicious_legacy_ids_of_fedcap():
  ids = lambda k: np.flatnonzero(attacks.choose_malicious(k, 0.3, seed=0, legacy_numpy=True)).tolist()
  assert ids(20) == [1, 8, 10, 17, 18, 19]
  assert ids(36) == [2, 10, 11, 15, 16, 20, 22, 29, 30, 31]
  assert len(ids(100)) == 30 and ids(100)[:6] == [2, 3, 6, 7, 8, 13]
  state = np.random.get_state()[1].copy()
  attacks.choose_malicious(20, legacy_numpy=True)
  np.testing.assert_array_equal(np.random.get_state()[1], state)  # global RNG untouched
  m = attacks.choose_malicious(50, 0.2, seed=3)
  assert m.dtype == bool and m.sum() == 10
  np.testing.assert_array_equal(m, attacks.choose_malicious(50, 0.2, seed=3))


def test_choose_malicious_counts_the_fraction_meant_despite_float_rounding():
  # 0.29 * 100 = 28.999999999999996 and 0.7 * 90 = 62.99999999999999 in binary floating point.
  assert attacks.choose_malicious(100, 0.29).sum() == 29 and attacks.choose_malicious(90, 0.7).sum() == 63
  assert all(attacks.choose_malicious(k, f / k).sum() == f for k in (10, 22, 23, 100) for f in range(k + 1))
  assert attacks.choose_malicious(10, 0.35).sum() == 3 and attacks.choose_malicious(10, 0.399).sum() == 3  # floor
  assert attacks.choose_malicious(20, 0.3, legacy_numpy=True).sum() == 6


def test_flip_labels_both_modes_by_hand():
  y = np.array([0, 1, 2, 9, 0, 0], np.int32)  # n = 4: the last two rows are padding
  np.testing.assert_array_equal(attacks.flip_labels(y, 4, 10, "reverse"), [9, 8, 7, 0, 0, 0])
  np.testing.assert_array_equal(attacks.flip_labels(y, 4, 10, "shift"), [1, 2, 3, 0, 0, 0])
  stack = np.array([[0, 1, 2], [3, 4, 0]])
  np.testing.assert_array_equal(attacks.flip_labels(stack, np.array([3, 2]), 5, "shift"), [[1, 2, 3], [4, 0, 0]])
  with pytest.raises(ValueError, match="mode"):
    attacks.flip_labels(y, 4, 10, "random")


def test_triggers_by_hand():
  sq = attacks.make_trigger((6, 6), "square", size=2, corner="bottom_right", offset=1)
  expected = np.zeros((6, 6), bool)
  expected[3:5, 3:5] = True
  np.testing.assert_array_equal(sq, expected)
  plus = attacks.make_trigger((5, 5), "plus", size=3, corner="top_left", offset=0)
  assert plus.sum() == 5 and plus[1, :3].all() and plus[:3, 1].all() and not plus[0, 0]
  x = np.zeros((2, 6, 6, 3), np.float32)
  xt = attacks.add_pixel_trigger(x, sq, value=[1.0, 2.0, 3.0])
  np.testing.assert_array_equal(xt[:, 3, 4], [[1, 2, 3], [1, 2, 3]])
  assert xt[:, ~sq].sum() == 0 and x.sum() == 0
  with pytest.raises(ValueError, match="fit"):
    attacks.make_trigger((4, 4), size=4, offset=1)


def test_dba_parts_partition_the_trigger():
  bars = attacks.make_trigger((12, 12), "bars", corner="top_left", offset=0)
  assert bars.sum() == 16 and bars[0, :4].all() and bars[0, 6:10].all() and bars[3, :4].all()
  parts = attacks.dba_trigger_parts(bars, 4)
  np.testing.assert_array_equal(np.logical_or.reduce(parts), bars)
  assert sum(p.sum() for p in parts) == bars.sum()  # disjoint
  np.testing.assert_array_equal(np.flatnonzero(parts[1][0]), [6, 7, 8, 9])  # one bar per part
  sq_parts = attacks.dba_trigger_parts(attacks.make_trigger((8, 8), size=3), 2)
  assert [p.sum() for p in sq_parts] == [5, 4]


def test_backdoor_poison_exact_count_and_padding():
  x = np.random.default_rng(0).normal(size=(10, 6, 6, 1)).astype(np.float32)
  y = np.array([1, 2, 3, 4, 5, 6, 7, 0, 0, 0], np.int32)
  trig = attacks.make_trigger((6, 6), size=2)
  xp, yp, idx = attacks.backdoor_poison(x, y, 7, 0.5, target_label=9, trigger=trig, value=5.0, seed=1)
  assert len(idx) == 4 and len(set(idx.tolist())) == 4 and idx.max() < 7  # round(3.5) = 4 real samples
  changed = np.flatnonzero(np.any(xp != x, axis=(1, 2, 3)))
  np.testing.assert_array_equal(changed, idx)
  assert np.all(xp[idx][:, trig] == 5.0) and np.all(yp[idx] == 9)
  rest = np.setdiff1d(np.arange(10), idx)
  np.testing.assert_array_equal(yp[rest], y[rest])
  np.testing.assert_array_equal(xp[7:], x[7:])
  assert attacks.backdoor_poison(x, y, 7, 0.3, 9, trig, seed=1)[2].size == 2  # round(2.1)
  assert dp.num_poisoned(5, 0.5) == 3 and dp.num_poisoned(4, 1.5) == 4


def _toy_data(k=4, n_max=6):
  rng = np.random.default_rng(0)
  n = np.array([6, 5, 4, 3], np.int32)[:k]
  x = rng.normal(size=(k, n_max, 8, 8, 1)).astype(np.float32)
  y = rng.integers(0, 10, (k, n_max)).astype(np.int32)
  for i in range(k):
    x[i, n[i]:] = 0
    y[i, n[i]:] = 0
  xg = rng.normal(size=(20, 8, 8, 1)).astype(np.float32)
  yg = np.arange(20, dtype=np.int32) % 10
  return FederatedData("toy", 10, x, y, n, x[:, :2], y[:, :2], np.full(k, 2, np.int32), xg, yg)


def test_poison_federated_data_backdoor_and_dba():
  data = _toy_data()
  mal = np.array([False, True, False, True])
  cfg = {"kind": "backdoor", "fraction": 0.5, "target_label": 7, "trigger": {"size": 2}}
  out = attacks.poison_federated_data(data, mal, cfg)
  for k in [0, 2]:  # benign clients untouched
    np.testing.assert_array_equal(out.x_train[k], data.x_train[k])
    np.testing.assert_array_equal(out.y_train[k], data.y_train[k])
  trig, value = dp.backdoor_trigger(data, cfg)
  np.testing.assert_allclose(value, data.x_train.max(axis=(0, 1, 2, 3)))  # padding is 0 < max
  for k in [1, 3]:
    n = data.n_train[k]
    changed = np.flatnonzero(np.any(out.x_train[k] != data.x_train[k], axis=(1, 2, 3)))
    assert len(changed) == dp.num_poisoned(n, 0.5) and changed.max() < n
    assert np.all(out.y_train[k, changed] == 7) and np.all(out.x_train[k, changed][:, trig] == value)
    np.testing.assert_array_equal(out.x_train[k, n:], data.x_train[k, n:])
  assert out.info["poisoning"]["poisoned_samples"] == {1: 3, 3: 2}
  np.testing.assert_array_equal(out.x_test, data.x_test)
  assert data.info == {}  # input not mutated
  # DBA: the i-th attacker stamps part i mod parts of the bars trigger
  cfg = {"kind": "dba", "fraction": 1.0, "num_parts": 2, "value": 9.0,
         "trigger": {"kind": "bars", "num_bars": 2, "bar_len": 3, "gap": 1, "corner": "top_left", "offset": 0}}
  out = attacks.poison_federated_data(data, mal, cfg)
  np.testing.assert_array_equal(out.x_train[1, :5, 0, :3, 0], 9.0)
  assert not np.any(out.x_train[1, :5, 0, 4:7, 0] == 9.0)
  np.testing.assert_array_equal(out.x_train[3, :3, 0, 4:7, 0], 9.0)
  assert not np.any(out.x_train[3, :3, 0, :3, 0] == 9.0)


def test_poison_federated_data_label_flip_and_errors():
  data = _toy_data()
  mal = np.array([True, False, False, True])
  out = attacks.poison_federated_data(data, mal, {"kind": "label_flip", "flip_mode": "shift"})
  np.testing.assert_array_equal(out.y_train[0], (data.y_train[0] + 1) % 10)
  np.testing.assert_array_equal(out.y_train[3, :3], (data.y_train[3, :3] + 1) % 10)
  np.testing.assert_array_equal(out.y_train[3, 3:], 0)
  np.testing.assert_array_equal(out.y_train[1:3], data.y_train[1:3])
  assert attacks.poison_federated_data(data, mal, None).y_train is data.y_train
  with pytest.raises(ValueError, match="unknown data-poisoning"):
    attacks.poison_federated_data(data, mal, {"kind": "backdoor", "fractoin": 0.1})
  with pytest.raises(ValueError, match="kind"):
    attacks.poison_federated_data(data, mal, {"kind": "sleeper"})


def test_triggered_test_set_and_semantic_set():
  data = _toy_data()
  trig = attacks.make_trigger((8, 8), size=2)
  xt, yt = attacks.triggered_test_set(data.x_global_test, data.y_global_test, trig, 3, value=4.0)
  assert len(xt) == 18 and np.all(yt != 3) and np.all(xt[:, trig] == 4.0)
  x_mal, y_mal, y_src, y_tgt = attacks.semantic_backdoor_set(data.x_global_test, data.y_global_test, 10, r=5)
  assert y_src != y_tgt and np.all(y_mal == y_tgt) and len(x_mal) == 5
  src_images = data.x_global_test[data.y_global_test == y_src]
  assert all(any(np.array_equal(a, b) for b in src_images) for a in x_mal)
