"""How far the attackers' recovered models drift, and how much weight benign clients give them (Table IV cells).

Without calibration and detection (Table IV ① and ④) the attackers stay in FedCAP's pool. Under IPM their six
uploads are identical, so (cosine 1) each attacker's customized model is built almost only from the other
attackers' recovered models, which move by the crafted update every round. The benign clients' customized models
take a small softmax weight on those rows (Eq. 5, a negative cosine times alpha). This script runs one ablation
cell round by round and prints, from the server's pools after each round, what those two quantities are:

* ``att_drift``: mean L2 distance of the attackers' recovered models from the benign clients' mean recovered model
  (``ben_spread``: the same for the benign clients);
* ``w_ben_att_max`` / ``_mean``: the total customization weight (Eq. 5 with the self-weight, as
  :func:`fedjax_robust.algorithms.fedcap.customization_weights` computes it) a benign client puts on the attackers,
  and ``w_ben_att_argmax`` the benign client that puts the most;
* ``cos_ben_att_mean`` / ``_max``: cosine of the benign pool updates with the attackers';
* ``benign_train_loss`` and the attackers' and benign clients' mean pool-update norms.

  python experiments/fedcap_drift.py --data_dir ../shared/data --variant v1 --scenario ipm --rounds 30

One JSON object per round on stdout (and in ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments import fedcap_tables  # noqa: E402
from fedjax_robust.algorithms.fedcap import cosine_rows, customization_weights  # noqa: E402
from fedjax_robust.experiment import build_experiment  # noqa: E402


def pool_report(server, malicious: np.ndarray, alpha: float, phi: float) -> dict:
  """The drift and weight statistics of one FedCAP server state (every client in the pool, as under full
  participation without detection)."""
  models, updates, valid = server.pool_models, server.pool_updates, server.pool_valid
  k = models.shape[0]
  ids = jnp.arange(k)
  weights = np.asarray(customization_weights(updates, ids, valid, updates, valid, alpha, phi))
  cos = np.asarray(cosine_rows(updates, updates))
  models, norms = np.asarray(models), np.linalg.norm(np.asarray(updates), axis=1)
  ben, mal = ~malicious, malicious
  benign_mean = models[ben].mean(0)
  w_ben_att = weights[ben][:, mal].sum(1)
  return {"att_drift": float(np.linalg.norm(models[mal] - benign_mean, axis=1).mean()),
          "ben_spread": float(np.linalg.norm(models[ben] - benign_mean, axis=1).mean()),
          "w_ben_att_max": float(w_ben_att.max()), "w_ben_att_mean": float(w_ben_att.mean()),
          "w_ben_att_argmax": int(np.flatnonzero(ben)[np.argmax(w_ben_att)]),
          "cos_ben_att_mean": float(cos[ben][:, mal].mean()), "cos_ben_att_max": float(cos[ben][:, mal].max()),
          "att_update_norm": float(norms[mal].mean()), "ben_update_norm": float(norms[ben].mean())}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--variant", default="v1", help="a FedCAP Table IV variant: v1, v3, v4, v5")
  parser.add_argument("--scenario", default="ipm", help="an attack of Table IV: lie, min_max, min_sum, ipm")
  parser.add_argument("--rounds", type=int, default=30)
  parser.add_argument("--strategy", default="sequential")
  parser.add_argument("--out", default=None, help="also write the JSON lines here")
  args = parser.parse_args()
  if args.variant == "v2":
    raise SystemExit("v2 is Ditto: it has no customization pool to report on")
  config = fedcap_tables.ablation_config(args.variant, args.scenario)
  if config.attack.name == "none":
    raise SystemExit("the benign scenario has no attackers to report on")
  config.data.data_dir = args.data_dir
  config.engine.strategy = args.strategy
  exp = build_experiment(config)
  malicious = np.asarray(exp.malicious, bool)
  fedcap = config.algorithm.fedcap
  out = open(args.out, "w") if args.out else None
  state = exp.init_state()
  for _ in range(args.rounds):
    start = time.time()
    state, metrics = exp.simulator.run_round(state)
    record = {"round": int(state.round), "benign_train_loss": float(metrics["benign_train_loss"]),
              **pool_report(state.server, malicious, float(fedcap.alpha), float(fedcap.phi)),
              "seconds": round(time.time() - start, 1)}
    line = json.dumps(record)
    print(line, flush=True)
    if out:
      out.write(line + "\n")
      out.flush()


if __name__ == "__main__":
  main()
