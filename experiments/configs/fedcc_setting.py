"""FedCC's setting (specs/fedcc.md §2, §4): 10 clients all participating, Adam 1e-3 with coupled weight decay 1e-3,
batch 100, the paper's CNNs, uniform (unweighted) aggregation, per-scenario epochs and rounds.

Not a config file to run by itself: ``fedcc_fmnist.py``, ``fedcc_cifar10.py`` and ``fedcc_cifar100.py`` call
:func:`get_config` with their dataset. Their argument is ``<scenario>[,iid][,<rule>][,dataless]``:

* scenario: ``none`` (Table II) | ``fang_krum`` | ``fang_median`` (Table III, f = 3 of 10) | ``targeted``
  (Table III, f = 1: client 0 trains on its data and on one mislabelled test image D_mal, 6 alternating epochs
  with a second Adam optimizer, and boosts its update x5; spec §2.4);
* ``iid``: the IID split (default: non-IID, per-class Dirichlet alpha = 0.2, spec §4.2);
* rule: the server's rule (default ``fedcc``): ``fedavg`` (uniform mean), ``krum``, ``median``, ``bulyan``,
  ``flare``, or ``fedcc_<similarity>`` for Table I (``fedcc_linear_cka``, ``fedcc_mmd``, ``fedcc_cosine``,
  ``fedcc_euclidean``);
* ``dataless`` (untargeted scenarios): the attacker placement of FedCC's code (spec §2.6 [R]): the f = 3 crafted
  models come from attackers without data, besides 7 benign clients drawn every round from all 10 partitions
  (:func:`use_dataless_attackers`). Without it (the default, the spec's alternative) attackers are clients 0-2,
  whose partitions never train: the same under IID, 30% of the data lost for good under non-IID.

Rounds and epochs (spec §4.4, §4.6, from the code): untargeted 30 rounds x E = 5, no attack 20 x 3, targeted 40 x 3.

The targeted attacker's procedure is ``attack.client.name=backdoor_training`` (fedjax_robust/attacks/client_attacks.py)
with the upload attack ``boosting``; its backdoor metrics are measured on D_mal (``backdoor_confidence``).
"""

import ml_collections

from fedjax_robust.experiment import default_config

DATASETS = {  # our dataset name, model, its kwargs, number of classes
    "fmnist": ("fashion_mnist", "fedcc_fmnist_cnn", {}),
    "cifar10": ("cifar10", "fedcc_cifar_cnn", {}),
    "cifar100": ("cifar100", "cifar_cnn", {}),  # LeNet at 32x32 (spec §4.3's fast variant; the paper resizes to 224)
}
SCENARIOS = {  # scenario -> (rounds, local epochs)
    "none": (20, 3),
    "fang_krum": (30, 5),
    "fang_median": (30, 5),
    "targeted": (40, 3),
}
DATALESS_SCENARIOS = ("fang_krum", "fang_median")  # the attacks whose models are crafted, needing no data of their own
RULES = ("fedcc", "fedavg", "krum", "median", "bulyan", "flare", "fedcc_linear_cka", "fedcc_mmd", "fedcc_cosine",
         "fedcc_euclidean")


def parse_argument(arg: str) -> tuple[str, bool, str, bool]:
  """``"fang_median,iid,krum,dataless"`` -> ``("fang_median", True, "krum", True)``."""
  parts = [p for p in (arg or "none").replace(" ", "").split(",") if p]
  scenario, iid, rule, dataless = parts[0], False, "fedcc", False
  for p in parts[1:]:
    if p == "iid":
      iid = True
    elif p in ("noniid", "niid"):
      iid = False
    elif p in RULES:
      rule = p
    elif p == "dataless":
      dataless = True
    else:
      raise ValueError(f"unknown FedCC config part {p!r}: 'iid', 'noniid', 'dataless' or a rule of {RULES}")
  if scenario not in SCENARIOS:
    raise ValueError(f"unknown FedCC scenario {scenario!r}; choose one of {sorted(SCENARIOS)}")
  if dataless and scenario not in DATALESS_SCENARIOS:
    raise ValueError(f"'dataless' attackers craft untargeted models {DATALESS_SCENARIOS}; scenario {scenario!r} "
                     "has none, or an attacker that trains on its own data")
  return scenario, iid, rule, dataless


def use_dataless_attackers(c) -> None:
  """FedCC's code's attacker placement (spec §2.6 [R]): every round's n = round(participation x K) participants are
  f = round(attack.fraction x n) crafted models from attackers without data and n - f benign clients drawn from all
  K partitions (``attack.dataless``; the engine samples both parts). Call it after the setting's K, participation
  and fraction are final (Table IV: K = 100, n = 10 / 30 / 50, f = 3 / 9 / 15; Fig. 5: fraction = f / 10)."""
  n = max(1, int(round(float(c.server.participation) * int(c.data.num_clients))))
  c.attack.dataless = max(1, int(round(float(c.attack.fraction) * n)))
  c.sampler.name = "uniform"  # not the fixed-attacker stratified draw: the dataless attackers bring their own


def rule_config(rule: str, scenario: str) -> dict:
  """The aggregator block of ``rule``; f = the scenario's attacker count for the rules that need it (0 without an
  attack: Table II runs Krum and Bulyan with f = 0, spec §4.7)."""
  f = {"none": 0, "fang_krum": 3, "fang_median": 3, "targeted": 1}[scenario]
  if rule == "fedavg":
    return {"name": "mean", "weighted": False}  # FedCC's FedAvg is the uniform mean (spec §3)
  if rule == "krum":
    return {"name": "krum", "num_byzantine": f}
  if rule == "median":
    return {"name": "median"}
  if rule == "bulyan":
    return {"name": "bulyan", "num_byzantine": f, "strict": False}  # n >= 4f + 3 fails at f = 3 (spec §3)
  if rule == "flare":
    return {"name": "flare"}
  if rule.startswith("fedcc_"):
    return {"name": "fedcc", "similarity": rule[len("fedcc_"):]}
  return {"name": "fedcc"}


def get_config(dataset: str, arg: str = "none"):
  scenario, iid, rule, dataless = parse_argument(arg)
  data_name, model_name, model_kwargs = DATASETS[dataset]
  rounds, epochs = SCENARIOS[scenario]
  c = default_config()
  # Every round is evaluated (spec §2.7: accuracy, backdoor confidence and success rate per round; Fig. 4); a
  # table cell is still the FINAL round's accuracy.
  c.rounds, c.eval_every = rounds, 1
  c.data.name = data_name
  c.data.num_clients = 10
  c.data.pool = "train"
  c.data.train_ratio = 0.8  # the first 80% of each client's shuffled samples train (spec §4.2 [R])
  if iid:
    c.data.partition.name = "iid"
  else:
    c.data.partition.name, c.data.partition.alpha, c.data.partition.min_size = "dirichlet", 0.2, 10
  c.model = ml_collections.ConfigDict({"name": model_name, **model_kwargs})
  c.algorithm.name = "fedavg"
  c.client.optimizer, c.client.lr, c.client.weight_decay = "adam", 1e-3, 1e-3  # coupled L2, as PyTorch Adam
  c.client.batch_size, c.client.epochs, c.client.drop_last, c.client.shuffle = 100, epochs, False, True
  c.server.participation = 1.0
  c.aggregator = ml_collections.ConfigDict(rule_config(rule, scenario))
  if scenario in ("fang_krum", "fang_median"):
    c.attack.name, c.attack.fraction = scenario, 0.3
  elif scenario == "targeted":  # client 0 trains on D_mal too (E_mal = 6, Adam 5e-3), then boosts x5 (spec §2.4)
    c.attack.name, c.attack.clients = "boosting", "0"
    c.attack.params = ml_collections.ConfigDict({"factor": 5.0})
    c.attack.client.name, c.attack.client.epochs, c.attack.client.samples = "backdoor_training", 6, 1
    c.attack.client.lr, c.attack.client.weight_decay, c.attack.client.batch_size = 5e-3, 5e-3, 100
  if dataless:
    use_dataless_attackers(c)
  c.output.name = f"fedcc_{dataset}_{scenario}_{'iid' if iid else 'noniid'}_{rule}" + ("_dataless" if dataless else "")
  return c
