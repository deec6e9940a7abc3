"""FedVSA's server-side baselines (spec fedvsa.md §3): DnC and Zeno++ (aggregators), FedDisco and FedLAW
(algorithms). Hand-computed examples, masking / NaN handling, errors, and short runs through the experiment."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_robust import flat_random
from fedjax_robust.aggregators import make_aggregator
from fedjax_robust.client import ClientData, LocalTrainSpec
from fedjax_robust.round_context import RoundContext, compute_needs

KEY = jax.random.PRNGKey(0)

pytestmark = pytest.mark.usefixtures("fast_compiles")  # tests/conftest.py


def close(a, b, atol=1e-5):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=atol)


def col(values):
  return jnp.asarray(values, jnp.float32)[:, None]


# ----------------------------------------------------------------------------------------- DnC


def _cloud(c=7, d=5, seed=0):
  return 0.1 * flat_random.normal(jax.random.PRNGKey(seed), (c, d))


def test_dnc_removes_an_obvious_outlier_and_averages_the_rest():
  u = {"w": _cloud().at[3].add(10.0), "b": jnp.zeros((7, 2))}
  r = jax.jit(make_aggregator("dnc", num_byzantine=1, sub_dim=4).aggregate)(u, None, None, KEY, None)
  keep = np.arange(7) != 3
  assert r.flagged.tolist() == (~keep).tolist()
  close(r.weights, keep / 6.0)
  close(r.update["w"], np.asarray(u["w"])[keep].mean(0))
  assert int(r.diagnostics["sub_dim"]) == 4 and int(r.diagnostics["num_removed"]) == 1
  assert int(jnp.argmax(r.diagnostics["scores"])) == 3


def test_dnc_scores_are_squared_projections_on_the_top_singular_vector():
  """sub_dim >= D: every coordinate is used, so the scores are those of the full centred matrix (numpy SVD)."""
  x = np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 0.5], [2.0, 2.0, -1.0], [-1.0, 0.5, 0.0], [0.3, -0.2, 0.1]], np.float32)
  r = jax.jit(make_aggregator("dnc", num_byzantine=2, c=1.0, sub_dim=100).aggregate)(jnp.asarray(x), None, None,
                                                                                         KEY, None)
  centred = x - x.mean(0)
  v = np.linalg.svd(centred)[2][0]
  scores = (centred @ v) ** 2
  scale = np.abs(centred).max() ** 2  # the rule scales the centred rows by their largest magnitude first
  close(r.diagnostics["scores"] * scale, scores, atol=1e-4)
  dropped = set(np.argsort(-scores)[:2].tolist())
  assert set(np.flatnonzero(np.asarray(r.flagged)).tolist()) == dropped
  close(r.update, x[[i for i in range(5) if i not in dropped]].mean(0))


def test_dnc_with_f_zero_is_the_mean():
  u = _cloud(6, 4, seed=3)
  w = jnp.arange(1.0, 7.0)
  r = jax.jit(make_aggregator("dnc", num_byzantine=0).aggregate)(u, w, None, KEY, None)
  close(r.update, np.asarray(u).mean(0))
  assert not bool(r.flagged.any())
  rw = jax.jit(make_aggregator("dnc", num_byzantine=0, weighted=True).aggregate)(u, w, None, KEY, None)
  close(rw.update, (np.asarray(w)[:, None] * np.asarray(u)).sum(0) / float(w.sum()))


def test_dnc_good_set_is_the_intersection_over_iterations():
  """Client 0 is an outlier on coordinate 0 only, client 1 on coordinate 1 only; each iteration samples ONE
  coordinate and removes one client, so the removed set is exactly the clients of the coordinates drawn."""
  base = np.asarray(_cloud(6, 2, seed=5)) * 0.01
  x = base.copy()
  x[0, 0] += 5.0
  x[1, 1] += 5.0
  niters = 6
  r = make_aggregator("dnc", num_byzantine=1, niters=niters, sub_dim=1).aggregate(jnp.asarray(x), None, None, KEY,
                                                                                    None)
  drawn = {int(jax.random.permutation(jax.random.fold_in(KEY, t), 2)[0]) for t in range(niters)}
  assert set(np.flatnonzero(np.asarray(r.flagged)).tolist()) == drawn  # coordinate j drawn -> client j removed
  keep = [i for i in range(6) if i not in drawn]
  close(r.update, x[keep].mean(0))


def test_dnc_masking_nan_and_errors():
  x = _cloud(7, 3).at[2].add(8.0)
  f = jax.jit(make_aggregator("dnc", num_byzantine=1, sub_dim=2).aggregate)
  mask = jnp.array([1, 1, 1, 1, 0, 1, 1], bool)
  masked = f(x.at[4].set(1e30), None, mask, KEY, None)
  sub = f(x[np.asarray(mask)], None, None, KEY, None)
  close(masked.update, sub.update)
  assert float(masked.weights[4]) == 0.0 and not bool(masked.flagged[4]) and bool(masked.flagged[2])
  bad = f(x.at[5, 1].set(jnp.nan), None, None, KEY, None)
  assert bool(jnp.all(jnp.isfinite(bad.update))) and bool(bad.flagged[5]) and bool(bad.diagnostics["nonfinite"][5])
  huge = f(x.at[2].set(1e35), None, None, KEY, None)  # finite but overflowing squares: still removed
  assert bool(huge.flagged[2]) and bool(jnp.all(jnp.isfinite(huge.update)))
  with pytest.raises(ValueError, match="key"):
    make_aggregator("dnc", num_byzantine=1).aggregate(x)
  with pytest.raises(ValueError, match="leaves nothing"):
    make_aggregator("dnc", num_byzantine=4, c=1.5, num_clients=6)
  with pytest.raises(ValueError, match="num_byzantine"):
    make_aggregator("dnc", num_byzantine=-1)


# ----------------------------------------------------------------------------------------- Zeno++


def linear_logits(params, x):
  return x @ params["w"]


def _ce(margin):
  """Cross-entropy of a 2-class row whose true logit exceeds the other by ``margin``."""
  return math.log1p(math.exp(-margin))


def _zeno_round():
  """Global w = 0 on 2 classes; the server rows are e_0 -> 0 and e_1 -> 1 (plus one padding row that must not count).
  Client k's delta is s_k * I, so its model's loss on each real row is log(1 + exp(-s_k))."""
  gp = {"w": jnp.zeros((2, 2))}
  s = np.array([1.0, -1.0, 0.5, 2.0], np.float32)
  deltas = {"w": jnp.asarray(s[:, None, None] * np.eye(2, dtype=np.float32)[None])}
  server = ClientData(jnp.array([[1.0, 0.0], [0.0, 1.0], [100.0, -100.0]]), jnp.array([0, 1, 0]), jnp.int32(2))
  ctx = RoundContext(jnp.int32(0), jnp.arange(4), None, jnp.ones(4), gp, server)
  return s, deltas, ctx


def test_zeno_server_losses_and_scores_by_hand():
  s, deltas, ctx = _zeno_round()
  ctx = compute_needs(("server_losses",), ctx, deltas, logits_fn=linear_logits)
  close(ctx["global_server_loss"], math.log(2.0))
  close(ctx["server_losses"], [_ce(v) for v in s])
  rho = 0.05
  r = jax.jit(make_aggregator("zeno", rho=rho, b=1).aggregate)(deltas, None, None, None, ctx)
  scores = [math.log(2.0) - _ce(v) - rho * 2 * v * v for v in s]  # ||s I||^2 = 2 s^2
  close(r.diagnostics["scores"], scores)  # [0.2799, -0.7201, 0.1941, 0.1662]
  assert r.flagged.tolist() == [False, True, False, False]  # the update that raises the server loss is dropped
  close(r.update["w"], np.mean([v * np.eye(2) for v in (1.0, 0.5, 2.0)], axis=0))
  # b = 2: the size penalty also drops client 3, whose loss decrease (the largest) costs rho * 8
  r2 = make_aggregator("zeno", rho=rho, b=2).aggregate(deltas, None, None, None, ctx)
  assert r2.flagged.tolist() == [False, True, False, True]
  close(r2.weights, [0.5, 0.0, 0.5, 0.0])
  # rho = 0: pure loss decrease, client 1 still the lowest
  r0 = make_aggregator("zeno", rho=0.0, b=1, weighted=True).aggregate(deltas, jnp.array([1.0, 1, 3, 1]), None, None,
                                                                      ctx)
  close(r0.weights, [0.2, 0.0, 0.6, 0.2])


def test_zeno_masking_nonfinite_and_errors():
  s, deltas, ctx = _zeno_round()
  ctx = compute_needs(("server_losses",), ctx, deltas, logits_fn=linear_logits)
  f = jax.jit(make_aggregator("zeno", b=1).aggregate)
  r = f(deltas, None, jnp.array([True, False, True, True]), None, ctx)  # the bad client masked: drop the next lowest
  assert float(r.weights[1]) == 0.0 and not bool(r.flagged[1]) and int(r.diagnostics["num_kept"]) == 2
  nan = f({"w": deltas["w"].at[0, 0, 0].set(jnp.nan)}, None, None, None, ctx)
  assert bool(nan.flagged[0]) and float(nan.weights[0]) == 0.0 and bool(jnp.all(jnp.isfinite(nan.update["w"])))
  lossnan = f(deltas, None, None, None, ctx.with_extras(server_losses=ctx["server_losses"].at[2].set(jnp.nan)))
  assert lossnan.flagged.tolist() == [False, False, True, False]  # an unmeasurable loss scores worst
  with pytest.raises(ValueError, match="server_losses"):
    make_aggregator("zeno").aggregate(deltas)
  with pytest.raises(ValueError, match="root_dataset_size"):
    compute_needs(("server_losses",), ctx._replace(server_data=None), deltas, logits_fn=linear_logits)
  with pytest.raises(ValueError, match="logits"):
    compute_needs(("server_losses",), ctx, deltas)
  with pytest.raises(ValueError, match="leaves nothing"):
    make_aggregator("zeno", b=4, num_clients=4)
  assert make_aggregator("zeno").needs == ("server_losses",)


def test_zeno_in_fedavg_server_step_uses_the_server_data():
  from fedjax_robust.algorithms.fedavg import make_fedavg
  s, deltas, ctx = _zeno_round()
  alg = make_fedavg(linear_logits, optax.sgd(0.1), LocalTrainSpec(), aggregator=make_aggregator("zeno", rho=0.05))
  state = alg.init_server({"w": jnp.zeros((2, 2))})
  new, diag = jax.jit(alg.server_update)(state, {"delta": deltas}, jnp.ones(4), KEY, context=ctx)
  assert diag["flagged"].tolist() == [False, True, False, False]
  close(new.params["w"], np.mean([v * np.eye(2) for v in (1.0, 0.5, 2.0)], axis=0))
  with pytest.raises(ValueError, match="root_dataset_size"):
    alg.server_update(state, {"delta": deltas}, jnp.ones(4), KEY, context=ctx._replace(server_data=None))


# ----------------------------------------------------------------------------------------- FedDisco


def test_feddisco_weights_by_hand():
  from fedjax_robust.algorithms.feddisco import disco_weights
  hists = jnp.array([[5.0, 5.0], [8.0, 2.0], [20.0, 0.0]])
  sizes = jnp.array([10.0, 10.0, 20.0])
  # n = (.25, .25, .5); uniform r = (.5, .5): d_l2 = (0, sqrt(.18), sqrt(.5))
  p, d = disco_weights(sizes, hists, a=0.5, b=0.1)
  close(d, [0.0, math.sqrt(0.18), math.sqrt(0.5)])
  raw = np.array([0.25 + 0.1, 0.25 - 0.5 * math.sqrt(0.18) + 0.1, 0.5 - 0.5 * math.sqrt(0.5) + 0.1])
  close(p, raw / raw.sum())  # (0.4766, 0.1878, 0.3356)
  # KL(q || uniform), normalised over the cohort (the official code)
  kl = np.array([0.0, 0.8 * math.log(1.6) + 0.2 * math.log(0.4), math.log(2.0)])
  p, d = disco_weights(sizes, hists, a=0.5, b=0.1, distance="kl")
  close(d, kl / kl.sum())
  raw = np.maximum(np.array([0.25, 0.25, 0.5]) - 0.5 * kl / kl.sum() + 0.1, 0.0)
  close(p, raw / raw.sum())
  # reference = the cohort's pooled labels (33, 7) / 40, L1 distance; a = 2 clips client 2 to 0 (ReLU)
  r = np.array([33.0, 7.0]) / 40
  l1 = np.array([np.abs(np.array(q) - r).sum() for q in ([0.5, 0.5], [0.8, 0.2], [1.0, 0.0])])
  p, d = disco_weights(sizes, hists, a=2.0, b=0.1, distance="l1", reference="cohort")
  close(d, l1)
  raw = np.maximum(np.array([0.25, 0.25, 0.5]) - 2.0 * l1 + 0.1, 0.0)
  assert raw[0] == 0.0 and raw[1] > 0  # client 0 (balanced labels) is far from this skewed cohort
  close(p, raw / raw.sum())


def test_feddisco_uniform_labels_reduce_to_size_weighting():
  from fedjax_robust.algorithms.feddisco import disco_weights
  hists = jnp.array([[3.0, 3.0, 3.0], [10.0, 10.0, 10.0], [1.0, 1.0, 1.0], [7.0, 7.0, 7.0]])
  sizes = jnp.sum(hists, axis=1)
  for distance in ("l2", "l1", "kl"):
    p, d = disco_weights(sizes, hists, a=0.5, b=0.0, distance=distance)
    close(d, np.zeros(4))
    close(p, sizes / sizes.sum())  # b = 0: exactly the size weights
  p, _ = disco_weights(sizes, hists, a=0.5, b=0.1)  # b > 0 adds the same b to every n_k
  close(p, (sizes / sizes.sum() + 0.1) / 1.4)
  # every ReLU clipped: the size weights; a zero-weight client and a non-finite histogram get 0
  p, _ = disco_weights(jnp.array([1.0, 1.0]), jnp.array([[4.0, 0.0], [0.0, 4.0]]), a=10.0, b=0.0)
  close(p, [0.5, 0.5])
  p, _ = disco_weights(jnp.array([1.0, 0.0, 2.0]), jnp.array([[1.0, 1.0], [1.0, 1.0], [jnp.nan, 1.0]]))
  close(p, [1.0, 0.0, 0.0])


def test_feddisco_client_uploads_its_label_histogram_and_server_uses_the_weights():
  from fedjax_robust.algorithms.feddisco import disco_weights, label_histogram, make_feddisco
  data = ClientData(jnp.ones((6, 2)), jnp.array([1, 1, 0, 1, 0, 0]), jnp.int32(4))  # rows 4-5 are padding
  close(label_histogram(data, 3), [1.0, 3.0, 0.0])
  alg = make_feddisco(linear_logits, optax.sgd(0.1), LocalTrainSpec(1, 2), a=0.5, b=0.1)
  params = {"w": jnp.zeros((2, 3))}
  out = alg.client_update(alg.broadcast(alg.init_server(params)), alg.init_client(params), data, KEY)
  close(out.upload["label_hist"], [1.0, 3.0, 0.0])
  assert set(out.upload) == {"delta", "label_hist"}
  hists = jnp.array([[1.0, 3.0, 0.0], [2.0, 2.0, 2.0], [0.0, 0.0, 5.0]])
  deltas = {"w": jnp.arange(18.0).reshape(3, 2, 3)}
  new, diag = alg.server_update(alg.init_server(params), {"delta": deltas, "label_hist": hists},
                                jnp.array([4.0, 6.0, 5.0]), KEY)
  p, d = disco_weights(jnp.array([4.0, 6.0, 5.0]), hists)
  close(diag["aggregation_weights"], p)
  close(diag["disco_discrepancy"], d)
  close(new.params["w"], np.tensordot(np.asarray(p), np.asarray(deltas["w"]), axes=1), atol=1e-4)
  assert not bool(diag["disco_size_fallback"])
  with pytest.raises(ValueError, match="distance"):
    make_feddisco(linear_logits, optax.sgd(0.1), LocalTrainSpec(), distance="cos")


def test_feddisco_with_its_defaults_is_fedavg_when_every_client_holds_two_labels_of_ten():
  """FedVSA's σ partitions: two equal labels of ten give d = sqrt(2 (1/2 - 1/10)^2 + 8 (1/10)^2) = sqrt(0.4)
  = 0.632, so n_k - 0.5 d_k + 0.1 < 0 for any n_k < 0.216: every ReLU clips, the round uses the size weights
  (FedAvg's), and the diagnostic says so."""
  from fedjax_robust.algorithms.feddisco import disco_terms, make_feddisco
  hists = jnp.zeros((3, 10)).at[0, :2].set(50.0).at[1, 2:4].set(100.0).at[2, 5:7].set(150.0)
  sizes = jnp.sum(hists, axis=1)  # n = (1/6, 1/3, 1/2)
  raw, n, d = disco_terms(sizes, hists)
  close(d, np.full(3, math.sqrt(0.4)))
  close(n, [1 / 6, 1 / 3, 1 / 2])
  close(raw, [0.0, 1 / 3 - 0.5 * math.sqrt(0.4) + 0.1, 0.5 - 0.5 * math.sqrt(0.4) + 0.1])  # n > 0.216 counts
  sizes6 = np.array([60.0, 70.0, 80.0, 90.0, 100.0, 100.0])  # six clients, every share <= 0.2 < 0.216
  hists6 = jnp.zeros((6, 10))
  for k, size in enumerate(sizes6):
    hists6 = hists6.at[k, (2 * k) % 10].set(size / 2).at[k, (2 * k + 1) % 10].set(size / 2)
  raw, n, _ = disco_terms(jnp.asarray(sizes6), hists6)
  close(raw, np.zeros(6))
  alg = make_feddisco(linear_logits, optax.sgd(0.1), LocalTrainSpec(1, 2))
  params = {"w": jnp.zeros((2, 3))}
  deltas = {"w": jnp.arange(36.0).reshape(6, 2, 3)}
  new, diag = alg.server_update(alg.init_server(params), {"delta": deltas, "label_hist": hists6},
                                jnp.asarray(sizes6), KEY)
  assert bool(diag["disco_size_fallback"])
  close(diag["aggregation_weights"], sizes6 / sizes6.sum())
  close(new.params["w"], np.tensordot(sizes6 / sizes6.sum(), np.asarray(deltas["w"]), axes=1), atol=1e-4)


# ----------------------------------------------------------------------------------------- FedLAW


def _fedlaw_setup():
  """2 classes; the proxy set is e_0 -> 0, e_1 -> 1 (8 rows). Client 0's model (2 I) fits it, client 1's (-2 I)
  predicts the opposite class everywhere."""
  x = jnp.tile(jnp.eye(2), (4, 1))
  proxy = ClientData(x, jnp.tile(jnp.array([0, 1]), 4), jnp.int32(8))
  gp = {"w": jnp.zeros((2, 2))}
  deltas = {"w": jnp.stack([2.0 * jnp.eye(2), -2.0 * jnp.eye(2)])}
  return proxy, gp, deltas


def test_fedlaw_model_is_gamma_times_the_lambda_mix_of_client_models():
  from fedjax_robust.algorithms.fedlaw import fedlaw_model
  gp = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])}
  deltas = {"w": jnp.stack([jnp.ones((2, 2)), -jnp.ones((2, 2)), 5 * jnp.ones((2, 2))])}
  opt = {"theta": jnp.log(jnp.array([0.2, 0.8, 0.5])), "log_gamma": jnp.log(jnp.float32(0.9))}
  w, lam, gamma = fedlaw_model(gp, deltas, jnp.array([True, True, False]), opt)
  close(lam, [0.2, 0.8, 0.0])
  close(gamma, 0.9)
  clients = np.asarray(gp["w"])[None] + np.asarray(deltas["w"])
  close(w["w"], 0.9 * (0.2 * clients[0] + 0.8 * clients[1]))


def test_fedlaw_moves_lambda_toward_the_client_that_fits_the_proxy_set():
  from fedjax_robust.algorithms.fedlaw import fedlaw_optimize
  proxy, gp, deltas = _fedlaw_setup()
  valid = jnp.array([True, True])
  params, lam, gamma, _, loss = jax.jit(lambda k: fedlaw_optimize(
      linear_logits, gp, deltas, jnp.array([1.0, 1.0]), valid, proxy, k, epochs=10, lr=0.05, batch_size=4))(KEY)
  assert float(lam[0]) > 0.75 and float(lam[1]) < 0.25  # from 0.5 / 0.5
  close(jnp.sum(lam), 1.0)
  assert float(gamma) > 0
  assert float(loss) < math.log(2.0)  # the initial mix (w = 0) scores log 2
  close(params["w"], gamma * (lam[0] * 2.0 - lam[1] * 2.0) * np.eye(2))
  # initial lambda follows the data sizes: 3:1 sizes start at 0.75 / 0.25, and zero steps leave them there
  _, lam0, gamma0, _, _ = jax.jit(lambda k: fedlaw_optimize(linear_logits, gp, deltas, jnp.array([3.0, 1.0]), valid,
                                                            proxy, k, epochs=1, lr=1e-12, batch_size=8))(KEY)
  close(lam0, [0.75, 0.25], atol=1e-4)
  close(gamma0, 1.0, atol=1e-4)


def test_fedlaw_server_step_flags_nonfinite_and_refuses_no_server_data():
  from fedjax_robust.algorithms.fedlaw import make_fedlaw
  proxy, gp, deltas = _fedlaw_setup()
  deltas = {"w": jnp.concatenate([deltas["w"], jnp.full((1, 2, 2), jnp.nan)])}
  alg = make_fedlaw(linear_logits, optax.sgd(0.1), LocalTrainSpec(), server_epochs=2, server_batch_size=4,
                    root_data=proxy)
  state = alg.init_server(gp)
  new, diag = jax.jit(alg.server_update)(state, {"delta": deltas}, jnp.ones(3), KEY)
  assert diag["flagged"].tolist() == [False, False, True]
  assert float(diag["aggregation_weights"][2]) == 0.0 and float(diag["aggregation_weights"][0]) > 0.5
  assert float(diag["fedlaw_gamma"]) > 0 and bool(jnp.all(jnp.isfinite(new.params["w"])))
  bare = make_fedlaw(linear_logits, optax.sgd(0.1), LocalTrainSpec())
  with pytest.raises(ValueError, match="root_dataset_size"):
    bare.server_update(state, {"delta": deltas}, jnp.ones(3), KEY)
  with pytest.raises(ValueError, match="server_epochs"):
    make_fedlaw(linear_logits, optax.sgd(0.1), LocalTrainSpec(), server_epochs=0)


# ----------------------------------------------------------------------------------------- end to end


def _config(**overrides):
  from fedjax_robust.experiment import default_config
  c = default_config()
  c.rounds, c.eval_every = 2, 2
  c.data.name, c.data.num_clients, c.data.partition.name = "digits", 6, "iid"
  c.output.progress = False
  c.update_from_flattened_dict(overrides)
  return c


@pytest.mark.parametrize("overrides", [
    {"aggregator.name": "zeno", "attack.name": "sign_flip", "attack.clients": "2", "server.root_dataset_size": 40},
    {"algorithm.name": "fedlaw", "algorithm.fedlaw.server_epochs": 2, "server.root_dataset_size": 40},
], ids=["zeno", "fedlaw"])
def test_runs_end_to_end_with_server_data(tmp_path, overrides):
  import json
  from fedjax_robust.experiment import build_experiment, run_experiment
  cfg = _config(**overrides)
  assert build_experiment(cfg).simulator.server_data is not None  # the run holds its server set
  summary = run_experiment(cfg, tmp_path / "run")
  assert math.isfinite(summary["final"]["train_loss"]) and summary["final"]["global_test_acc"] > 0.2
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  if "aggregator.name" in overrides:  # Zeno++ drops b = 1 client per round: the sign-flipping attacker
    assert all(row["flagged_clients"] == [2] for row in rows)
  else:
    assert all(row["fedlaw_gamma"] > 0 for row in rows)


def test_feddisco_runs_from_config_and_fedlaw_refuses_no_server_data(tmp_path):
  from fedjax_robust.algorithms.feddisco import disco_weights
  from fedjax_robust.experiment import build_experiment
  cfg = _config(**{"algorithm.name": "feddisco", "data.partition.name": "dirichlet",
                   "algorithm.feddisco.distance": "kl"})
  exp = build_experiment(cfg)
  state, metrics = exp.simulator.run_round(exp.init_state())
  cohort = np.asarray(metrics["cohort"])
  y, n = np.asarray(exp.data.y_train)[cohort], np.asarray(exp.data.n_train)[cohort]
  hists = np.stack([np.bincount(y[i, :n[i]], minlength=exp.data.num_classes) for i in range(len(cohort))])
  p, _ = disco_weights(jnp.asarray(n, jnp.float32), jnp.asarray(hists, jnp.float32), distance="kl")
  close(metrics["aggregation_weights"], p)
  with pytest.raises(ValueError, match="root_dataset_size"):
    build_experiment(_config(**{"algorithm.name": "fedlaw", "server.root_dataset_size": 0}))
