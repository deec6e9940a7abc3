"""Client-side attacks: what a malicious client does INSTEAD of its honest local training.

Upload attacks (:mod:`fedjax_robust.attacks.base`) rewrite what attackers send; some attacks are a
different local procedure. FedCC's targeted backdoor (spec §2.4, Bhagoji et al.'s explicit boosting)
trains the attacker on its own data AND on a small mislabelled set D_mal, with a second optimizer,
before its update is boosted (the ``boosting`` upload attack). A :class:`ClientAttack` is that
procedure as one pure function; the engine runs it for the cohort's malicious members only
(``FedAlgorithm.malicious_update``, a fixed number of slots), with D_mal as an argument of the round
(``RunInputs.attack_data``), so seeds with different D_mal share one program.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_robust import compilation
from fedjax_robust.client import ClientData, LocalResult, LocalTrainSpec, local_train
from fedjax_robust.optim import make_optimizer

# train(loss_fn, client_opt, params, data, attack_data, key, spec, model_state) -> LocalResult
ClientTrain = Callable[..., LocalResult]


# make_data(data: FederatedData, seed) -> (attack_data: ClientData, backdoor: (x, target) or None): the attack's
# own data, built once per run on the host, and what the backdoor metrics are measured on.
MakeData = Callable[[Any, int], tuple]


class ClientAttack(NamedTuple):
  """``weight(attack_data) -> n``: the attacker's sample count in sample-weighted aggregation when the attack's
  data replaces its own (an adversary that holds only the attack data, FedVSA's model replacement); ``None``: the
  count of its own partition, like an honest client (FedCC's backdoor trains on its own data too)."""
  name: str
  train: ClientTrain
  make_data: MakeData
  weight: Optional[Callable[[ClientData], jax.Array]] = None


def backdoor_training(epochs: int = 6, lr: float = 5e-3, weight_decay: float = 5e-3,
                      batch_size: int = 100, samples: int = 1) -> ClientAttack:
  """FedCC's malicious local procedure (spec §2.4): ``epochs`` times, one epoch over the client's own data with
  the clients' optimizer (Adam 1e-3, weight decay 1e-3 in FedCC), then one pass over D_mal (``batch_size`` rows
  per step: one step for FedCC's r = 1..5 images) with a second optimizer, Adam(``lr``) with coupled weight decay
  ``weight_decay``. Both act on the same parameters, keep separate moments, and are fresh every round.
  Boosting the result (x5) is the ``boosting`` upload attack. D_mal = ``samples`` test images of one class labelled
  another (:func:`~fedjax_robust.attacks.semantic_backdoor_set`); the backdoor metrics are measured on it (§2.7)."""
  if epochs < 1:
    raise ValueError(f"backdoor_training: epochs must be >= 1, got {epochs}")
  attack_opt = make_optimizer("adam", lr, weight_decay=weight_decay)

  def train(loss_fn, client_opt, params, data: ClientData, attack_data: ClientData, key, spec: LocalTrainSpec,
            model_state: Any = None) -> LocalResult:
    own_epoch = spec._replace(epochs=1)
    attack_spec = LocalTrainSpec(1, int(batch_size), False, True, spec.unroll)

    def one(carry, e):
      p, s_own, s_attack, ms = carry
      k = jax.random.fold_in(key, e)
      own = local_train(loss_fn, client_opt, p, s_own, data, jax.random.fold_in(k, 0), own_epoch, ms)
      bad = local_train(loss_fn, attack_opt, own.params, s_attack, attack_data, jax.random.fold_in(k, 1),
                        attack_spec, own.model_state)
      return (bad.params, own.opt_state, bad.opt_state, bad.model_state), (own.metrics["loss"], own.metrics["steps"])

    init = (params, client_opt.init(params), attack_opt.init(params), {} if model_state is None else model_state)
    (params, opt_state, _, model_state), (losses, steps) = compilation.scan(one, init, jnp.arange(int(epochs)),
                                                                          unroll=spec.unroll)
    total = jnp.sum(steps)
    loss = jnp.sum(losses * steps) / jnp.maximum(total, 1)
    return LocalResult(params, opt_state, {"loss": loss, "steps": total.astype(jnp.int32)}, model_state)

  def make_data(data, seed: int):
    from fedjax_robust.attacks.data_poisoning import semantic_backdoor_set
    x_mal, y_mal, _, y_tgt = semantic_backdoor_set(data.x_global_test, data.y_global_test, data.num_classes,
                                                   int(samples), int(seed))
    return ClientData(x_mal, y_mal, np.int32(samples)), (x_mal, int(y_tgt))

  return ClientAttack("backdoor_training", train, make_data)


def flipped_training(epochs: int = 0, samples: int = 0, **unused) -> ClientAttack:
  """FedVSA's model-replacement adversary (spec §2, A13): it trains ``w_p`` from the global model on an IID sample
  of the pooled training data whose labels are flipped ``y -> (y + 1) mod C`` (the authors' ``DatasetSplit_Fake``),
  so the target model is wrong on every class; boosting it by ``γ = 1/p̂ = m^t`` is the ``scaling`` upload attack.
  The adversary's data is this sample only, so its weight in sample-weighted aggregation is the sample's size.
  ``samples``: rows of the sample (0 = the mean client size, ``|D| / K``: 600 for MNIST at K = 100);
  ``epochs``: its local epochs (0 = the clients' ``E``), with the clients' optimizer and batch size.
  FedVSA reports the downloaded model's loss on this flipped data (honest on poisoned data)."""
  del unused
  if epochs < 0 or samples < 0:
    raise ValueError(f"flipped_training: epochs and samples must be >= 0, got {epochs}, {samples}")

  def train(loss_fn, client_opt, params, data: ClientData, attack_data: ClientData, key, spec: LocalTrainSpec,
            model_state: Any = None) -> LocalResult:
    del data
    own = spec._replace(epochs=int(epochs) or spec.epochs)
    return local_train(loss_fn, client_opt, params, client_opt.init(params), attack_data, key, own, model_state)

  def make_data(data, seed: int):
    rows = [(k, i) for k in range(data.num_clients) for i in range(int(data.n_train[k]))]
    size = int(samples) or max(1, len(rows) // data.num_clients)
    if size > len(rows):
      raise ValueError(f"flipped_training: samples={size} exceeds the {len(rows)} training rows")
    pick = np.random.default_rng(seed).choice(len(rows), size, replace=False)
    k, i = np.asarray(rows)[pick].T
    flipped = (np.asarray(data.y_train[k, i]) + 1) % int(data.num_classes)
    return ClientData(np.asarray(data.x_train[k, i]), flipped.astype(np.int32), np.int32(size)), None

  # The adversary holds only this sample: sample-weighted rules weigh it by the sample's size (spec §2: |D| / K
  # rows, an average client), not by whatever partition its client slot was dealt.
  return ClientAttack("flipped_training", train, make_data, weight=lambda attack_data: attack_data.n)


CLIENT_ATTACKS = {"none": None, "backdoor_training": backdoor_training, "flipped_training": flipped_training}


def client_attack_from_config(cfg) -> ClientAttack | None:
  """``attack.client`` -> a :class:`ClientAttack` (``None`` for ``none``); each factory takes the block's fields
  it declares (``epochs``, ``lr``, ``weight_decay``, ``batch_size``, ``samples``)."""
  if cfg is None or cfg.get("name", "none") == "none":
    return None
  name = cfg["name"]
  if name not in CLIENT_ATTACKS:
    raise ValueError(f"unknown client attack {name!r}; known: {sorted(CLIENT_ATTACKS)}")
  # 0 (or absent) = the attack's own default for that field.
  fields = {"epochs": int, "lr": float, "weight_decay": float, "batch_size": int, "samples": int}
  return CLIENT_ATTACKS[name](**{f: cast(cfg[f]) for f, cast in fields.items() if cfg.get(f)})
