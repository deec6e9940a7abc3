"""FedCC's experiment setup (specs/fedcc.md §4): configs per dataset / scenario / rule, and the grid's tables."""

import json

import pytest

from fedjax_robust.config_files import load_module
from fedjax_robust.models import count_params, get_model, init_params


def config(dataset, arg):
  return load_module(f"experiments/configs/fedcc_{dataset}.py").get_config(arg)


def test_configs_follow_the_spec_setting():
  c = config("fmnist", "fang_median")
  assert (c.rounds, c.client.epochs, c.client.batch_size) == (30, 5, 100)  # spec §4.4, §4.6
  assert (c.client.optimizer, c.client.lr, c.client.weight_decay) == ("adam", 1e-3, 1e-3)
  assert (c.data.num_clients, c.server.participation, c.data.train_ratio) == (10, 1.0, 0.8)
  assert (c.data.partition.name, c.data.partition.alpha) == ("dirichlet", 0.2)
  assert (c.attack.name, c.attack.fraction) == ("fang_median", 0.3) and c.aggregator.name == "fedcc"
  assert config("cifar10", "none,iid").data.partition.name == "iid"
  assert (config("cifar10", "none").rounds, config("cifar10", "targeted").rounds) == (20, 40)
  assert dict(config("cifar10", "none,krum").aggregator) == {"name": "krum", "num_byzantine": 0}  # Table II: f = 0
  assert dict(config("cifar10", "fang_krum,bulyan").aggregator) == {"name": "bulyan", "num_byzantine": 3,
                                                                    "strict": False}
  assert dict(config("cifar10", "none,fedavg").aggregator) == {"name": "mean", "weighted": False}
  assert dict(config("cifar10", "fang_median,fedcc_mmd").aggregator) == {"name": "fedcc", "similarity": "mmd"}
  t = config("cifar10", "targeted")
  assert (t.attack.name, t.attack.clients, t.attack.params.factor) == ("boosting", "0", 5.0)
  assert (t.attack.client.name, t.attack.client.epochs, t.attack.client.lr) == ("backdoor_training", 6, 5e-3)
  with pytest.raises(ValueError, match="scenario"):
    config("cifar10", "lie")
  with pytest.raises(ValueError, match="unknown FedCC config part"):
    config("cifar10", "none,trimmed")


def test_models_of_the_configs_have_the_papers_sizes():
  import jax
  for dataset, shape, n in (("fmnist", (28, 28, 1), 3_382_346), ("cifar10", (32, 32, 3), 109_834),
                            ("cifar100", (32, 32, 3), 69_656)):
    c = config(dataset, "none")
    model = get_model(c.model.name, 100 if dataset == "cifar100" else 10)
    params = jax.eval_shape(lambda k: init_params(model, k, shape), jax.random.key(0))
    assert count_params(params) == n, dataset


def test_tables_from_stored_cells(tmp_path):
  from experiments import fedcc_tables as t
  results = {t.cell_key("fang_median", "noniid", "fmnist", "fedcc"): {"value": 70.0, "value_std": 1.5,
                                                                      "rounds": 30, "epochs": 5, "seeds": [0, 1, 2]},
             t.cell_key("fang_median", "noniid", "fmnist", "fedavg"): {"value": 12.0, "rounds": 30, "epochs": 5}}
  path = tmp_path / "r.json"
  path.write_text(json.dumps(results))
  table = t.table_from_json(path, "table3")
  row = [line for line in table.splitlines() if line.startswith("| Fang-Med | non-IID | fMNIST")][0]
  assert "70.00 ± 1.50 / 72.76" in row and "12.00 / 16.32" in row and "— / 49.33" in row
  assert "Fang-Krum" not in table  # rows without any cell are left out
  assert len(t.cells_of("table3", ["fmnist"], ["noniid", "iid"], list(t.RULES))) == 3 * 2 * 6
  assert len(t.cells_of("table1", None, ["iid", "noniid"], None)) == 6 * 5
  assert t.cells_of("table1", None, ["noniid"], ["fedcc_mmd", "fedcc_cosine"], ["fang_median"]) == [
      ("fang_median", "noniid", "cifar10", "fedcc_mmd", ""), ("fang_median", "noniid", "cifar10", "fedcc_cosine", "")]
  assert len(t.cells_of("table4", ["fmnist", "cifar10"], ["noniid"], list(t.RULES))) == 3 * 2 * 2 * 4
  assert len(t.cells_of("table5", ["fmnist", "cifar10", "cifar100"], ["noniid"], list(t.RULES))) == 2 * 4


def test_setup_note_describes_only_the_cells_the_table_shows():
  """A Table II cell loaded beside Table III's (30 rounds, 2 seeds) must not put its setup under Table III, nor an
  untargeted cell under Fig. 4's."""
  from experiments import fedcc_tables as t
  results = {t.cell_key("fang_median", "noniid", "fmnist", "fedcc"): {"value": 70.0, "rounds": 15, "epochs": 2},
             t.cell_key("targeted", "noniid", "fmnist", "fedcc"): {
                 "value": 60.0, "rounds": 4, "epochs": 3, "backdoor_confidence_per_round": [0.4, 0.3, 0.2, 0.1]},
             t.cell_key("none", "noniid", "fmnist", "fedavg"): {"value": 75.0, "value_std": 1.0, "rounds": 30,
                                                               "epochs": 5, "seeds": [0, 1]}}
  note = lambda text: [line for line in text.splitlines() if line.startswith("Cells ran with")][0]
  assert note(t.table3(results)) == ("Cells ran with: 15 rounds x E = 2, all samples per class, 1 seed(s); "
                                     "4 rounds x E = 3, all samples per class, 1 seed(s).")
  assert note(t.table2(results)) == "Cells ran with: 30 rounds x E = 5, all samples per class, 2 seed(s)."
  assert note(t.fig4(results)) == "Cells ran with: 4 rounds x E = 3, all samples per class, 1 seed(s)."


def test_fig4_reads_the_targeted_cells_backdoor_confidence_curves(tmp_path):
  from experiments import fedcc_tables as t
  curve = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625]
  results = {t.cell_key("targeted", "noniid", "cifar10", "fedcc"): {
                 "value": 30.0, "rounds": 6, "epochs": 2, "backdoor_confidence_per_round": curve,
                 "backdoor_asr": 0.0, "detection_tpr": 1.0, "detection_fpr": 0.0},
             t.cell_key("targeted", "noniid", "cifar10", "fedavg"): {  # a seeds cell: the seeds' mean curve
                 "value": 25.0, "value_std": 1.0, "rounds": 6, "epochs": 2, "seeds": [0, 1],
                 "per_seed": {"0": {"backdoor_confidence_per_round": [0.2, 0.4, 0.6, 0.8, 0.9, 1.0]},
                              "1": {"backdoor_confidence_per_round": [0.0, 0.2, 0.4, 0.6, 0.7, 0.8]}}},
             t.cell_key("fang_median", "noniid", "cifar10", "fedcc"): {"value": 29.0, "rounds": 6, "epochs": 2}}
  path = tmp_path / "r.json"
  path.write_text(json.dumps(results))
  rows = {line.split(" | ")[2]: line for line in t.table_from_json(path, "fig4").splitlines()
          if line.startswith("| non-IID")}
  assert set(rows) == {"FedAvg", "FedCC"}  # the untargeted cell has no curve: not a Fig. 4 row
  # rounds 1, 2 (6/3), 4 (2*6/3) and 6; FedCC's final value beside Table I's 0.0118
  assert "1: 0.500, 2: 0.250, 4: 0.062, 6: 0.016 | 0.500 | 0.0156 / 0.0118 | 0.00 | 1.00 / 0.00 |" in rows["FedCC"]
  assert "25.00 ± 1.00 | 1: 0.100, 2: 0.300, 4: 0.700, 6: 0.900 | 0.900 | 0.9000 / — | — | — |" in rows["FedAvg"]
  t.fig4_figure(results, tmp_path / "fig4.png")
  assert (tmp_path / "fig4.png").stat().st_size > 0 and (tmp_path / "fig4.svg").exists()
  assert len(t.cells_of("fig4", ["cifar10"], ["noniid"], list(t.RULES))) == 6


def test_table5_shows_its_cells_backdoor_metrics_below_the_accuracies():
  from experiments import fedcc_tables as t
  results = {t.cell_key("targeted", "noniid", "cifar10", "fedcc", "e6"): {
                 "value": 31.5, "rounds": 3, "epochs": 4, "backdoor_confidence_per_round": [0.3, 0.2, 0.1],
                 "backdoor_asr": 0.0, "detection_tpr": 1.0, "detection_fpr": 0.0},
             t.cell_key("targeted", "noniid", "cifar10", "fedcc"): {  # Table III's cell: not a Table V row
                 "value": 20.0, "rounds": 3, "epochs": 2, "backdoor_confidence_per_round": [0.9, 0.9, 0.9]}}
  text = t.table5(results)
  accuracy, backdoor = text.split("Backdoor metrics of the same cells")
  assert "| CIFAR10 | — / 53.85 | — / 49.18 | — / 21.61 | 31.50 / 54.94 |" in accuracy
  lines = [line for line in backdoor.splitlines() if line.startswith("| non-IID")]
  # rounds 1, 2 (2*3/3 rounds to 2) and 3; no paper value beside it (Table I's 0.0118 is at Table III's epochs)
  assert lines == ["| non-IID | CIFAR10 | FedCC | 31.50 | 1: 0.300, 2: 0.200, 3: 0.100 | 0.300 | 0.1000 / — | "
                   "0.00 | 1.00 / 0.00 |"]
  del results[t.cell_key("targeted", "noniid", "cifar10", "fedcc", "e6")]
  assert "Backdoor metrics" not in t.table5(results)  # no Table V cell: no empty backdoor table


def test_table1_adds_the_targeted_cells_final_backdoor_confidence_beside_the_papers():
  from experiments import fedcc_tables as t
  results = {t.cell_key("fang_median", "noniid", "cifar10", "fedcc_mmd"): {"value": 29.0, "rounds": 6, "epochs": 2}}
  assert "backdoor confidence" not in t.table1(results)  # no targeted cell: the accuracy table alone
  results[t.cell_key("targeted", "noniid", "cifar10", "fedcc_mmd")] = {
      "value": 23.61, "rounds": 6, "epochs": 2, "backdoor_confidence_per_round": [0.1, 0.05, 0.0173]}
  text = t.table1(results)
  assert "| MMD | — / 63.39 | 29.00 / 40.90 | — / 69.69 | — / 32.27 | — / 70.85 | 23.61 / 50.51 |" in text
  assert "| MMD | — / 1e-09 | 0.0173 / 9e-05 |" in text  # Table I's MMD row: IID 1e-09, NIID 9e-05
  assert "| Linear CKA |" not in text.split("backdoor confidence")[1]  # rows without a targeted cell are left out
  assert t.PAPER_FEDCC_BACKDOOR_CONFIDENCE == {"iid": 6e-07, "noniid": 0.0118}


def test_table4_and_table5_cells_configure_the_paper_variants():
  from experiments import fedcc_tables as t
  import argparse
  args = argparse.Namespace(rounds=0, epochs=0, seed=0, seeds="", data_dir=None, checkpoint_every=0, resume=False,
                            strategy="", set=[])
  c = t.cell_config("fang_median", "noniid", "cifar10", "fedcc", "k100_p0.3", args)
  assert (c.data.num_clients, c.server.participation, c.attack.fraction, c.rounds) == (100, 0.3, 0.3, 30)
  assert c.sampler.name == "stratified"
  c = t.cell_config("targeted", "noniid", "fmnist", "median", "e6", args)
  assert (c.client.epochs, c.attack.client.epochs, c.rounds) == (6, 12, 40)


def test_fig5_cells_configure_f_attackers_and_reuse_table3_at_f3():
  from experiments import fedcc_tables as t
  import argparse
  from fedjax_robust.attacks import choose_malicious
  args = argparse.Namespace(rounds=0, epochs=0, seed=0, seeds="", data_dir=None, checkpoint_every=0, resume=False,
                            strategy="", set=[])
  for f in t.FIG5_ATTACKERS:
    c = t.cell_config("fang_krum", "noniid", "cifar10", "median", t.fig5_variant(f), args)
    assert int(choose_malicious(c.data.num_clients, c.attack.fraction, 0).sum()) == f
    assert (c.data.num_clients, c.server.participation, c.rounds) == (10, 1.0, 30)
  assert t.fig5_variant(3) == "" and t.cell_key("fang_krum", "noniid", "cifar10", "median", t.fig5_variant(3)) == \
      "fang_krum__noniid__cifar10__median"  # Table III's cell
  cells = t.cells_of("fig5", ["fmnist", "cifar10", "cifar100"], ["noniid"], list(t.RULES), list(t.ATTACKS))
  assert len(cells) == 2 * 2 * 4 * 4  # no CIFAR-100 (Tables IV-V's datasets), no targeted, Table IV's four rules
  assert len(t.cells_of("fig5", ["cifar10"], ["noniid"], ["fedcc"], ["fang_median"], (1, 2, 4))) == 3
  assert t.attackers_of("1, 2,4") == (1, 2, 4)
  with pytest.raises(SystemExit, match="attackers"):
    t.attackers_of("5")
  with pytest.raises(SystemExit, match="draws no figure"):
    t.figure_of("table3")


def test_fig5_table_checks_the_papers_two_claims_by_hand(tmp_path):
  from experiments import fedcc_tables as t
  acc = {"fedcc": (40.0, 39.0, 38.0, 37.0), "median": (41.0, 35.0, 30.0, 20.0), "fedavg": (10.0, 10.0, 10.0, 10.0)}
  results = {}
  for rule, values in acc.items():
    for f, v in zip(t.FIG5_ATTACKERS, values):
      results[t.cell_key("fang_median", "noniid", "cifar10", rule, t.fig5_variant(f))] = {
          "value": v, "rounds": 15, "epochs": 2}
  results[t.cell_key("fang_median", "noniid", "cifar10", "fedcc", "f2")]["value_std"] = 0.5
  results[t.cell_key("fang_krum", "noniid", "cifar10", "fedcc")] = {"value": 33.0, "rounds": 15, "epochs": 2}
  path = tmp_path / "r.json"
  path.write_text(json.dumps(results))
  text = t.table_from_json(path, "fig5")
  assert "| Fang-Med | CIFAR10 | FedCC | 40.00 | 39.00 ± 0.50 | 38.00 | 37.00 |" in text
  assert "| Fang-Med | CIFAR10 | Coomed | 41.00 | 35.00 | 30.00 | 20.00 |" in text
  assert "Fang-Krum" not in text.split("The paper's")[0]  # a Table III cell alone (f = 3) is no Fig. 5 curve
  # Coomed beats FedCC at f = 1 only; it drops 21 points, FedCC 3.
  assert "- FedCC highest at every f (Fang-Med, CIFAR10): NOT met (best at f = 2, 3, 4)." in text
  assert ("- Coomed falls the most of the defenses from f = 1 to 4 (Fang-Med, CIFAR10): met (drops: Coomed 21.00, "
          "FedCC 3.00).") in text
  assert "15 rounds x E = 2" in text
  t.fig5_figure(results, tmp_path / "fig5.png")
  assert (tmp_path / "fig5.png").stat().st_size > 0 and (tmp_path / "fig5.svg").exists()
  assert t.fig5({}).startswith("(no Fig. 5 cell")


def test_fig5_from_several_files_shows_table3s_f3_cell_beside_the_sweep(tmp_path):
  from experiments import fedcc_tables as t
  sweep = {t.cell_key("fang_median", "noniid", "cifar10", "fedcc", t.fig5_variant(f)): {
      "value": v, "rounds": 15, "epochs": 2} for f, v in ((1, 31.0), (2, 30.0), (4, 28.0))}
  table3 = {t.cell_key("fang_median", "noniid", "cifar10", "fedcc"): {"value": 29.0, "rounds": 15, "epochs": 2}}
  paths = [tmp_path / "sweep.json", tmp_path / "table3.json"]
  for path, cells in zip(paths, (sweep, table3)):
    path.write_text(json.dumps(cells))
  text = t.table_from_json(",".join(map(str, paths)), "fig5")
  assert "| Fang-Med | CIFAR10 | FedCC | 31.00 | 30.00 | 29.00 | 28.00 |" in text


def test_dataless_placement_configures_the_codes_attackers():
  """Spec §2.6 [R]: f = 30% of each round's n participants are crafted models of attackers without data, the other
  n - f drawn from all K partitions; the config part ``dataless`` and ``--placement dataless`` set it."""
  from experiments import fedcc_tables as t
  import argparse
  c = config("cifar10", "fang_median,noniid,krum,dataless")
  assert (c.attack.dataless, c.data.num_clients, c.server.participation, c.sampler.name) == (3, 10, 1.0, "uniform")
  assert c.output.name.endswith("_dataless") and config("cifar10", "fang_median").attack.dataless == 0
  for bad in ("none,dataless", "targeted,dataless"):
    with pytest.raises(ValueError, match="untargeted"):
      config("cifar10", bad)
  args = argparse.Namespace(rounds=0, epochs=0, seed=0, seeds="", data_dir=None, checkpoint_every=0, resume=False,
                            strategy="", set=[], placement="dataless")
  # Table IV: n = 10 / 30 / 50 of K = 100 partitions, f = 3 / 9 / 15 per round; Fig. 5: f of 10.
  for variant, f in (("k100_p0.1", 3), ("k100_p0.3", 9), ("k100_p0.5", 15), ("f1", 1), ("f4", 4), ("", 3)):
    cell = t.cell_config("fang_krum", "noniid", "cifar10", "fedcc", variant, args)
    assert cell.attack.dataless == f, variant
  with pytest.raises(SystemExit, match="untargeted"):
    t.cell_config("targeted", "noniid", "cifar10", "fedcc", "", args)
  args.placement = "wherever"
  with pytest.raises(SystemExit, match="placement"):
    t.placement_of(args)


def test_placement_table_sets_dataless_cells_beside_fixed_ones(tmp_path):
  from experiments import fedcc_tables as t
  base = t.cell_key("fang_median", "noniid", "cifar10", "fedcc")
  k100 = t.cell_key("fang_krum", "noniid", "cifar10", "median", "k100_p0.3")
  results = {base: {"value": 29.0, "rounds": 15, "epochs": 2},
             base + t.DATALESS_SUFFIX: {"value": 33.5, "value_std": 0.5, "rounds": 15, "epochs": 2},
             k100 + t.DATALESS_SUFFIX: {"value": 12.0, "rounds": 15, "epochs": 2}}
  path = tmp_path / "r.json"
  path.write_text(json.dumps(results))
  text = t.table_from_json(path, "placement")
  assert "| Fang-Med | non-IID | CIFAR10 | FedCC | — | 29.00 | 33.50 ± 0.50 | +4.50 | 42.37 |" in text
  assert "| Fang-Krum | non-IID | CIFAR10 | Coomed | k100_p0.3 | — | 12.00 | — | 12.59 |" in text  # Table IV's
  assert "(no cell stored" in t.placement({base: results[base]})


def test_scores_table_counts_the_rounds_the_attackers_stand_apart_by_hand():
  from experiments import fedcc_tables as t
  split = {"value": 16.9, "detection_tpr": 1.0, "detection_fpr": 0.0,
           "benign_score_range_per_round": [[0.90, 0.95], [0.92, 0.96], [0.91, 0.99]],
           "attacker_score_range_per_round": [[0.97, 0.99], [0.80, 0.85], [0.95, 0.97]]}
  results = {
      "fang_krum__iid__cifar10__fedcc": split,
      # a Table I similarity: its scores, the same counting; the per-round detection counts: an attacker kept in
      # rounds 2 and 3 (fn > 0), a benign client dropped in round 3 (fp > 0)
      "fang_krum__iid__cifar10__fedcc_mmd": {**split, "detection_fn_per_round": [0, 1, 2],
                                             "detection_fp_per_round": [0, 0, 1]},
      "targeted__noniid__cifar10__fedcc@scores": {
          "value": 10.0, "benign_score_range_per_round": [[0.5, 0.6], [0.4, 0.7]],
          "attacker_score_range_per_round": [None, [0.9, 0.9]]},
      "fang_krum__iid__cifar10__krum": split,  # Krum's ranges are distances, not similarities: left out
      "targeted__iid__cifar10__fedcc": {"value": 20.0}}  # no ranges kept: left out
  text = t.scores(results)
  # round 1 above (0.97 > 0.95), round 2 below (0.85 < 0.92), round 3 inside
  assert "| fang_krum__iid__cifar10__fedcc | [0.9000, 0.9900] | [0.8000, 0.9900] | 1 / 1 / 1 | — | 1.00 | 0.00 | 16.90 |" in text
  assert "| fang_krum__iid__cifar10__fedcc_mmd | [0.9000, 0.9900] | [0.8000, 0.9900] | 1 / 1 / 1 | 2 / 1 |" in text
  assert ("| targeted__noniid__cifar10__fedcc@scores | [0.4000, 0.7000] | [0.9000, 0.9000] | 1 / 0 / 0 | — | — | — | 10.00 |"
          in text)
  assert "__krum" not in text and "targeted__iid__cifar10__fedcc " not in text
  assert len([line for line in text.splitlines() if line.startswith("| ") and "__" in line]) == 3
  assert t.rule_of("fang_krum__iid__cifar10__fedcc@scores") == "fedcc" and t.rule_of("unscored") is None
  assert t.scores({"fang_krum__iid__cifar10__krum": split}).startswith("(no stored FedCC run")


def test_scores_table_gives_each_pooled_seed_its_own_row(tmp_path):
  """Two one-seed runs of one cell in two files pool into one seeds cell (``grid.load_pooled``); the per-round
  ranges are per run, so the table shows each seed's counts, not a mean of them."""
  from experiments import fedcc_tables as t
  from experiments.grid import load_pooled

  def run(seed, attackers):
    return {"value": 40.0 + seed, "detection_tpr": 1.0, "detection_fpr": 0.0, "config": {"seed": seed},
            "rounds": 2, "epochs": 2, "benign_score_range_per_round": [[0.90, 0.95], [0.90, 0.95]],
            "attacker_score_range_per_round": attackers}

  paths = []
  for seed, attackers in ((1, [[0.97, 0.99], [0.96, 0.98]]), (2, [[0.80, 0.85], [0.91, 0.94]])):
    paths.append(tmp_path / f"s{seed}.json")
    paths[-1].write_text(json.dumps({"fang_krum__iid__cifar10__fedcc": run(seed, attackers)}))
  text = t.scores(load_pooled(paths))
  assert "| fang_krum__iid__cifar10__fedcc (seed 1) | [0.9000, 0.9500] | [0.9600, 0.9900] | 2 / 0 / 0 | — | 1.00 | 0.00 | 41.00 |" in text
  assert "| fang_krum__iid__cifar10__fedcc (seed 2) | [0.9000, 0.9500] | [0.8000, 0.9400] | 0 / 1 / 1 | — | 1.00 | 0.00 | 42.00 |" in text
  assert t.scores({"unscored": {"value": 20.0}}).startswith("(no stored FedCC run kept")
