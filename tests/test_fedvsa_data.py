"""FedVSA's data side (specs/fedvsa.md §4.3, §4.6, §7 properties 19-21): σ partitions, Dirichlet, data dynamics
(fresh labels revealed over the rounds, one compiled program) and the FedAvg warm start."""

import dataclasses
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust.algorithms.fedavg import make_fedavg
from fedjax_robust.client import ClientData, LocalTrainSpec
from fedjax_robust.data import build_federated_data, default_data_config
from fedjax_robust.data import dynamics as D
from fedjax_robust.data import partition as P
from fedjax_robust.data.federated import FederatedData, stack_padded
from fedjax_robust.execution import make_strategy
from fedjax_robust.experiment import build_experiment, default_config, run_experiment
from fedjax_robust.pretrain import base_data, pretrain_config
from fedjax_robust.run import make_run
from fedjax_robust.simulation import Simulator

Y = np.repeat(np.arange(10), 600)  # balanced 10-class pool of 6000


def hist(labels, parts, c=10):
  return P.label_histograms(labels, parts, c)


def disjoint(parts):
  rows = np.concatenate(parts)
  return len(np.unique(rows)) == len(rows)


# ------------------------------------------------------------------------------------------ property 19: σ


def test_sigma_gaussian_std_slots_labels_and_disjointness():
  """Every client has exactly 2 distinct labels, each label fills 2N/C slots, no row is at two clients, per-label
  totals stay within the pool, every slot has >= n_min = B = 10 rows, σ = 0 gives equal slots of μ = ⌊|D|/2N⌋."""
  for sigma in (0.0, 60.0, 300.0):
    parts = P.sigma_label_skew(Y, 20, 1, sigma=sigma)
    h = hist(Y, parts)
    assert ((h > 0).sum(1) == 2).all()
    assert ((h > 0).sum(0) == 2 * 20 // 10).all()  # 4 slots per label
    assert disjoint(parts)
    assert (h.sum(0) <= 600).all()
    assert h[h > 0].min() >= 10
  h0 = hist(Y, P.sigma_label_skew(Y, 20, 1, sigma=0.0))
  assert set(h0[h0 > 0].tolist()) == {6000 // 40}


def test_sigma_gaussian_std_scales_a_label_down_to_its_pool():
  """σ large enough that a label's slots ask for more than it has: scaled down proportionally, never below n_min."""
  parts = P.sigma_label_skew(Y, 20, 0, sigma=400.0)
  h = hist(Y, parts)
  assert (h.sum(0) <= 600).all() and h.sum(0).max() >= 590  # some label was cut back to (about) its pool
  assert h[h > 0].min() >= 10 and disjoint(parts)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigma_realised_std_grows_with_sigma(seed):
  stats = [P.sigma_partition_stats(Y, P.sigma_label_skew(Y, 20, seed, sigma=s))
           for s in (0.0, 10.0, 30.0, 60.0, 100.0, 150.0, 300.0)]
  slot_std = [s["slot_size_std"] for s in stats]
  assert slot_std[0] == 0.0 and all(a < b for a, b in zip(slot_std, slot_std[1:])), slot_std
  assert stats[0]["client_size_std"] == 0.0 and stats[-1]["client_size_std"] > stats[1]["client_size_std"]
  assert all(s["rows_shared"] == 0 for s in stats)


def test_sigma_logs_the_realised_std(caplog):
  with caplog.at_level(logging.INFO, logger="fedjax_robust.data"):
    P.sigma_label_skew(Y, 20, 0, sigma=50.0)
  assert "realised std of slot sizes" in caplog.text and "of client sizes" in caplog.text


def test_sigma_on_a_label_subset_uses_the_present_labels():
  """With fresh labels removed the pool's labels are not 0..C-1: the slots go to the labels present (2N/C_base)."""
  keep = ~np.isin(Y, [3, 7])
  parts = P.sigma_label_skew(Y[keep], 16, 0, sigma=20.0)
  h = hist(Y[keep], parts)
  assert h[:, [3, 7]].sum() == 0 and ((h > 0).sum(0)[keep[::600]] == 4).all()


def icpp_pairs(labels, parts):
  """(major, minor) label of each client: the label it holds more (resp. fewer) rows of."""
  h = hist(labels, parts)
  return [(int(np.argmax(np.where(r > 0, r, -1))), int(np.argmin(np.where(r > 0, r, 1 << 30)))) for r in h]


def test_icpp_offset_follows_the_icpp_rule():
  """n̄ = ⌊N/K⌋ = 200: n̄/2 + σ major and n̄/2 − σ minor rows; 5 major / 5 minor labels; client i gets
  product(major, minor)[i mod 25]; every client holds n̄ distinct rows."""
  parts = P.sigma_label_skew(Y, 30, 0, sigma=40.0, sigma_mode="icpp_offset")
  h = hist(Y, parts)
  assert ((h > 0).sum(1) == 2).all() and sorted(set(h[h > 0].tolist())) == [60, 140]
  assert all(len(p) == 200 and len(np.unique(p)) == 200 for p in parts)
  pairs = icpp_pairs(Y, parts)
  majors, minors = {a for a, _ in pairs}, {b for _, b in pairs}
  assert len(majors) == 5 and len(minors) == 5 and not majors & minors
  assert len(set(pairs[:25])) == 25 and pairs[25:] == pairs[:5]  # the 25 products, then again from the start
  assert pairs[:25] == [(a, b) for a in dict.fromkeys(p[0] for p in pairs[:25]) for b in
                        [q[1] for q in pairs[:5]]]  # itertools.product order: major outer, minor inner


def test_icpp_offset_reuses_rows_once_a_pool_is_exhausted_and_is_exact_at_sigma_0():
  """Each major label serves K/5 clients with n̄/2 + σ rows: for σ > 0 its pool runs out and rows are drawn again
  (documented: not disjoint); at σ = 0 with K = 25 the 25 pairs use every row exactly once."""
  parts = P.sigma_label_skew(Y, 25, 0, sigma=30.0, sigma_mode="icpp_offset")
  assert P.sigma_partition_stats(Y, parts)["rows_shared"] > 0 and not disjoint(parts)
  assert all(len(np.unique(p)) == len(p) for p in parts)  # but no client holds a row twice
  exact = P.sigma_label_skew(Y, 25, 0, sigma=0.0, sigma_mode="icpp_offset")
  assert disjoint(exact) and len(np.concatenate(exact)) == 6000


def test_variance_offset_is_plus_minus_sqrt_sigma():
  parts = P.sigma_label_skew(Y, 30, 0, sigma=400.0, sigma_mode="variance_offset")  # √400 = 20
  h = hist(Y, parts)
  assert sorted(set(h[h > 0].tolist())) == [80, 120]


@pytest.mark.parametrize("mode,sigma", [("icpp_offset", 100.0), ("icpp_offset", 300.0),
                                        ("variance_offset", 100.0 ** 2)])
def test_offset_modes_refuse_sigma_at_or_above_half_the_client_size(mode, sigma):
  with pytest.raises(ValueError, match="n̄/2"):
    P.sigma_label_skew(Y, 30, 0, sigma=sigma, sigma_mode=mode)  # n̄ = 200


def test_sigma_mode_errors():
  with pytest.raises(ValueError, match="sigma_mode"):
    P.sigma_label_skew(Y, 20, 0, sigma=10.0, sigma_mode="variance")
  with pytest.raises(ValueError, match="classes_per_client"):
    P.sigma_label_skew(Y, 20, 0, sigma=10.0, sigma_mode="icpp_offset", classes_per_client=3)


def test_builder_passes_sigma_mode_and_records_the_realised_stats():
  c = default_data_config()
  c.update({"name": "digits", "num_clients": 10, "train_ratio": 1.0})
  c.partition.update({"name": "sigma", "sigma": 10.0})
  fd = build_federated_data(c)
  assert fd.info["partition"]["sigma_mode"] == "gaussian_std"
  assert fd.info["stats"]["sigma"]["rows_shared"] == 0 and fd.info["stats"]["sigma"]["slot_size_std"] > 0
  with c.partition.unlocked():
    c.partition.sigma_mode = "icpp_offset"
  fd = build_federated_data(c)
  assert fd.info["partition"]["sigma_mode"] == "icpp_offset" and len(set(fd.n_train.tolist())) == 1


# ------------------------------------------------------------------------------------------ property 20: Dirichlet


def entropy(h):
  p = h / h.sum(1, keepdims=True)
  return float(-(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(1).mean())


def test_dirichlet_is_an_exact_partition_with_min_size_and_skew_falling_with_beta():
  ent = []
  for beta in (0.1, 0.3, 0.5, 5.0):
    parts = P.dirichlet(Y, 20, 3, alpha=beta)
    rows = np.concatenate(parts)
    assert disjoint(parts) and len(rows) == len(Y)  # exact: every row at exactly one client
    assert min(len(p) for p in parts) >= 10
    ent.append(entropy(hist(Y, parts)))
  assert all(a < b for a, b in zip(ent, ent[1:])), ent


# ------------------------------------------------------------------------------------------ property 21: dynamics


def dynamics_data(fraction=0.3, delta=5, start=1, partition=None, ratio=1.0, seed=0, clients=10):
  c = default_data_config()
  c.update({"name": "digits", "num_clients": clients, "train_ratio": ratio, "seed": seed})
  c.partition.update(partition or {"name": "dirichlet", "alpha": 0.5})
  c.dynamics.update({"fresh_fraction": fraction, "fresh_delta": delta, "fresh_start_round": start})
  return build_federated_data(c)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("partition", [{"name": "sigma", "sigma": 20.0}, {"name": "dirichlet", "alpha": 0.1}],
                         ids=["sigma", "dirichlet"])
def test_fresh_labels_rows_and_shards(fraction, partition):
  fd = dynamics_data(fraction, partition=partition)
  dyn = fd.info["dynamics"]
  fresh = np.asarray(dyn["fresh_labels"])
  assert len(fresh) == round(fraction * 10) and len(dyn["base_labels"]) == 10 - len(fresh)
  n_base = np.asarray(fd.train_schedule.n_base)
  rows = np.concatenate(fd.client_train_indices)
  assert len(np.unique(rows)) == len(rows)  # base partition + fresh shards: still disjoint
  holders = {int(c): 0 for c in fresh}
  for k in range(fd.num_clients):
    y = fd.y_train[k, :fd.n_train[k]]
    assert not np.isin(y[:n_base[k]], fresh).any()  # base rows first ...
    assert np.isin(y[n_base[k]:], fresh).all()  # ... then fresh rows only
    for c in np.unique(y[n_base[k]:]):
      holders[int(c)] += 1
  assert set(holders.values()) == {dyn["shards_per_fresh_label"]} == {2 * 10 // 10}  # 2N/C distinct clients
  if partition["name"] == "sigma":  # the σ rule on the base labels: 2 distinct base labels per client
    base_hist = np.stack([np.bincount(fd.y_train[k, :n_base[k]], minlength=10) for k in range(fd.num_clients)])
    assert ((base_hist > 0).sum(1) == 2).all()


@pytest.mark.parametrize("delta,start", [(5, 1), (7, 3), (0, 2)])
def test_fresh_rows_absent_before_the_first_reveal_then_at_most_delta_per_round(delta, start):
  fd = dynamics_data(0.3, delta=delta, start=start)
  n_total, n_base = fd.n_train.astype(np.int64), np.asarray(fd.train_schedule.n_base, np.int64)
  assert (n_total > n_base).any()
  counts = [D.revealed_counts(n_total, fd.train_schedule, t) for t in range(0, 200)]
  for t in range(0, start):  # round 0 = pre-training / initial evaluation, then the rounds before the first reveal
    np.testing.assert_array_equal(counts[t], n_base)
  steps = np.diff(np.stack(counts), axis=0)
  assert (steps >= 0).all()  # non-decreasing
  if delta:
    assert steps.max() <= delta and (steps[start - 1] == np.minimum(delta, n_total - n_base)).all()
  else:  # Δ = 0: everything at the start round
    np.testing.assert_array_equal(counts[start], n_total)
  np.testing.assert_array_equal(counts[-1], n_total)
  # the traced version (what the engine runs) agrees
  sched = D.TrainSchedule(*(jnp.asarray(a) for a in fd.train_schedule))
  for t in (0, start, start + 2, 150):
    np.testing.assert_array_equal(np.asarray(D.revealed_counts(jnp.asarray(n_total), sched, jnp.int32(t))),
                                  counts[t])
  assert fd.info["dynamics"]["all_revealed_by_round"] == next(t for t, c in enumerate(counts)
                                                             if (c == n_total).all())


def test_dynamics_with_client_test_splits_and_off_by_default():
  fd = dynamics_data(0.3, ratio=0.75)
  n_base = np.asarray(fd.train_schedule.n_base)
  fresh = fd.info["dynamics"]["fresh_labels"]
  assert all(not np.isin(fd.y_train[k, :n_base[k]], fresh).any() for k in range(fd.num_clients))
  assert np.isin(np.concatenate([fd.y_test[k, :fd.n_test[k]] for k in range(fd.num_clients)]), fresh).any()
  plain = build_federated_data(_digits_cfg())
  assert plain.train_schedule is None and "dynamics" not in plain.info
  with pytest.raises(ValueError, match="fresh_fraction"):
    dynamics_data(0.99)
  with pytest.raises(ValueError, match="fresh_start_round"):
    dynamics_data(0.3, start=0)


def _digits_cfg():
  c = default_data_config()
  c.update({"name": "digits", "num_clients": 10})
  return c


def test_pretraining_data_is_base_only():
  fd = dynamics_data(0.3)
  base = base_data(fd)
  np.testing.assert_array_equal(base.n_train, fd.train_schedule.n_base)
  assert base.train_schedule is None
  fresh = fd.info["dynamics"]["fresh_labels"]
  assert not any(np.isin(base.y_train[k, :base.n_train[k]], fresh).any() for k in range(fd.num_clients))


# ------------------------------------------------------------------------------------------ the engine


def toy_schedule_data(seed=0):
  """4 clients, 3 classes, rows base-first; client 0 has no fresh rows, client 3 only fresh rows."""
  rng = np.random.default_rng(seed)
  sizes, base = (9, 12, 5, 7), (9, 4, 2, 0)
  xs = [rng.normal(size=(n, 4, 4, 1)).astype(np.float32) for n in sizes]
  ys = [rng.integers(0, 3, size=n).astype(np.int32) for n in sizes]
  xt = [rng.normal(size=(3, 4, 4, 1)).astype(np.float32) for _ in sizes]
  yt = [rng.integers(0, 3, size=3).astype(np.int32) for _ in sizes]
  (x, n), (y, _), (x_t, n_t), (y_t, _) = stack_padded(xs), stack_padded(ys), stack_padded(xt), stack_padded(yt)
  schedule = D.TrainSchedule(np.asarray(base, np.int32), np.int32(3), np.int32(2))
  return FederatedData("toy", 3, x, y, n, x_t, y_t, n_t, np.concatenate(xt), np.concatenate(yt),
                       train_schedule=schedule)


def truncated(data, n):
  """``data`` without a schedule, each client's rows cut to its first ``n[k]`` (the rest zeroed)."""
  keep = np.arange(data.x_train.shape[1])[None, :] < np.asarray(n)[:, None]
  return dataclasses.replace(data, x_train=data.x_train * keep[..., None, None, None], y_train=data.y_train * keep,
                             n_train=np.asarray(n, np.int32), train_schedule=None)


def toy_setup():
  import flax.linen as nn

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1)))))

  model = Net()
  params = model.init(jax.random.key(1), jnp.zeros((1, 4, 4, 1)))["params"]
  apply_fn = lambda p, x: model.apply({"params": p}, x)
  alg = make_fedavg(apply_fn, optax.sgd(0.1, momentum=0.9), LocalTrainSpec(epochs=2, batch_size=3))
  return alg, apply_fn, params


def close(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6, rtol=1e-6)


def test_round_t_trains_on_exactly_the_first_n_t_rows():
  """Each round with a schedule equals the same round of a simulator whose data are cut to that round's n_t
  (schedule: Δ = 3 from round 2), and differs from training on every row while rows are still hidden."""
  data = toy_schedule_data()
  alg, apply_fn, params = toy_setup()
  sim = Simulator(alg, data, apply_fn, cohort_size=3)
  plain = Simulator(alg, dataclasses.replace(data, train_schedule=None), apply_fn, cohort_size=3)
  plain_step = jax.jit(plain.round_step)  # one program for every cut: the data are its argument
  state = sim.init(params, seed=4)
  for t in range(1, 7):
    n_t = D.revealed_counts(data.n_train, data.train_schedule, t)
    cut = truncated(data, n_t)
    new, metrics = sim.run_round(state)
    want, want_metrics = plain_step(state, plain.inputs._replace(train=ClientData(
        jnp.asarray(cut.x_train), jnp.asarray(cut.y_train), jnp.asarray(cut.n_train))))
    close(new.server, want.server)
    assert float(metrics["train_loss"]) == pytest.approx(float(want_metrics["train_loss"]), rel=1e-6)
    assert int(metrics["local_steps"]) == int(want_metrics["local_steps"])
    cohort = np.asarray(metrics["cohort"])
    other, _ = plain_step(state, plain.inputs)
    hidden = (n_t < data.n_train)[cohort].any()
    same = all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(other.server), jax.tree.leaves(new.server)))
    assert same != hidden, t  # rows still hidden in the cohort change the round; none hidden, nothing changes
    state = new
  assert (D.revealed_counts(data.n_train, data.train_schedule, 6) == data.n_train).all()


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
@pytest.mark.parametrize("strategy", ["shard_map", "sequential"])
def test_schedule_strategies_and_scan_agree(strategy):
  data = toy_schedule_data(1)
  alg, apply_fn, params = toy_setup()
  ref = Simulator(alg, data, apply_fn, make_strategy("vmap"), cohort_size=3)
  other = Simulator(alg, data, apply_fn, make_strategy(strategy), cohort_size=3)
  a = b = ref.init(params, seed=2)
  for _ in range(4):
    a, ma = ref.run_round(a)
    b, mb = other.run_round(b)
    close(a.server, b.server)
  if strategy == "sequential":  # the whole run in lax.scan (one program) equals stepping it
    scanned, trace = jax.jit(make_run(ref, 4, 2))(ref.init(params, seed=2), ref.inputs)
    close(scanned.server, a.server)


def digits_run_config(**overrides):
  c = default_config()
  c.rounds = 3
  c.data.name = "digits"
  c.data.num_clients = 10
  c.data.partition.name = "dirichlet"
  c.data.partition.alpha = 0.5
  c.server.participation = 0.5
  c.output.progress = False
  c.update_from_flattened_dict(overrides)
  return c


DYN = {"data.dynamics.fresh_fraction": 0.3, "data.dynamics.fresh_delta": 20}


def rows(path):
  return [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
          for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_dynamics_run_resumes_from_a_checkpoint_at_the_right_round(tmp_path):
  whole = run_experiment(digits_run_config(**DYN), tmp_path / "whole")
  first = digits_run_config(rounds=2, **DYN, **{"output.checkpoint_every": 1})
  run_experiment(first, tmp_path / "resumed")
  more = digits_run_config(**DYN, **{"output.checkpoint_every": 1, "output.resume": True})
  resumed = run_experiment(more, tmp_path / "resumed")
  assert resumed["resumed_from_round"] == 2
  assert rows(tmp_path / "resumed") == rows(tmp_path / "whole")
  assert whole["final"]["global_test_acc"] == resumed["final"]["global_test_acc"]
  part = json.loads((tmp_path / "whole" / "partition.json").read_text())
  assert len(part["info"]["dynamics"]["fresh_labels"]) == 3


@pytest.mark.fast_compiles  # measured 2026-11-28: passes unoptimized, faster (tests/conftest.py)
def test_dynamics_seeds_in_one_program_equal_separate_runs(tmp_path):
  c = digits_run_config(rounds=2, **DYN)
  c.seeds = "0,1"
  run_experiment(c, tmp_path / "seeds")
  for seed in (0, 1):
    run_experiment(digits_run_config(rounds=2, seed=seed, **DYN, **{"data.seed": seed, "attack.seed": seed}),
                   tmp_path / f"single_{seed}")
    for a, b in zip(rows(tmp_path / "seeds" / f"seed_{seed}"), rows(tmp_path / f"single_{seed}")):
      assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5, abs=1e-6)
      assert a["global_test_acc"] == pytest.approx(b["global_test_acc"], abs=1e-6)


# ------------------------------------------------------------------------------------------ §4.6 pre-training


def test_pretraining_starts_the_run_from_a_fedavg_run_of_that_many_rounds(tmp_path):
  """init.pretrain_rounds = 2 under FedProx: the initial model is the global model of the 2-round FedAvg run of
  the same config; the run's own rounds are numbered from 1."""
  c = digits_run_config(rounds=2, **{"algorithm.name": "fedprox", "algorithm.fedprox.mu": 0.1,
                                      "init.pretrain_rounds": 2, "server.lr": 0.5})
  exp = build_experiment(c)
  fedavg = build_experiment(digits_run_config(rounds=2))
  state = fedavg.init_state()
  for _ in range(2):
    state, _ = fedavg.simulator.run_round(state)
  close(exp.params, fedavg.algorithm.global_params(state.server))
  assert not np.allclose(jax.tree.leaves(exp.params)[0], jax.tree.leaves(fedavg.params)[0])
  summary = run_experiment(c, tmp_path / "run")
  assert [r["round"] for r in rows(tmp_path / "run")] == [1, 2] and summary["rounds"] == 2
  pre = json.loads((tmp_path / "run" / "pretrain.json").read_text())
  assert pre["rounds"] == 2 and [r["round"] for r in pre["records"]] == [1, 2]
  # the run's first evaluation already sees the warm start
  cold = run_experiment(digits_run_config(rounds=2, **{"algorithm.name": "fedprox", "algorithm.fedprox.mu": 0.1,
                                                       "server.lr": 0.5}), tmp_path / "cold")
  assert rows(tmp_path / "run")[0]["train_loss"] < rows(tmp_path / "cold")[0]["train_loss"]
  del cold


def test_pretraining_is_plain_fedavg_on_base_labels_only():
  c = digits_run_config(**DYN, **{"init.pretrain_rounds": 1, "attack.name": "sign_flip", "aggregator.name": "median",
                                  "server.momentum": 0.9})
  pc = pretrain_config(c, 1)
  assert (pc.algorithm.name, pc.aggregator.name, pc.attack.name, pc.server.lr, pc.server.momentum,
          pc.init.pretrain_rounds) == ("fedavg", "mean", "none", 1.0, 0.0, 0)
  assert pc.client == c.client and pc.data == c.data and pc.seed == c.seed
  exp = build_experiment(c)
  # the same warm start as a 1-round FedAvg run on the data cut to the base rows
  base_cfg = digits_run_config(rounds=1)
  ref = build_experiment(base_cfg, data=base_data(exp.data))
  state, _ = ref.simulator.run_round(ref.init_state())
  close(exp.params, ref.algorithm.global_params(state.server))
  with pytest.raises(ValueError, match="pretrain_rounds"):
    build_experiment(digits_run_config(**{"init.pretrain_rounds": -1}))
