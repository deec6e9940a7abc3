"""FedCAP's EMNIST setting on the offline LEAF FEMNIST sample: a stand-in for Table I / III's EMNIST rows.

    python experiments/run.py --config experiments/configs/fedcap_femnist.py:ipm --config.data.data_dir=../shared/data
    python experiments/fedcap_tables.py --dataset femnist --data_dir ../shared/data --scenarios none,scaling

No EMNIST ByClass copy is available offline (``fedcap_emnist.py`` needs one). LEAF's FEMNIST is built from the
same NIST handwriting (the same 62 classes: digits 0-9, uppercase 10-35, lowercase 36-61), and a partial 5% sample
of it is in the shared data. This config is ``fedcap_emnist.get_config(scenario)`` with only the data swapped:
every sample of the partial copy (18,796: its train and test shards, writers ignored) is pooled and re-partitioned by
the spec's "group" partition over the same 100 clients, 20% participation, EMNISTCNN, the artifact's EMNIST
(alpha, phi, lambda) per scenario. What differs from the paper's setting: about 188 samples per client instead of
~1,190 (6x less data, so expect lower accuracy), and LEAF's images are black on white (the half normalization maps
them to [-1, 1] either way). It exercises what the CIFAR-10 rows cannot: partial participation, request updates,
clients new to the pool, poisoned requests, and detection of attackers that are sampled only now and then.
"""

from fedjax_robust.config_files import sibling


HYPERPARAMETERS = sibling(__file__, "fedcap_emnist").HYPERPARAMETERS


def get_config(scenario: str = "none"):
  c = sibling(__file__, "fedcap_emnist").get_config(scenario)
  c.data.name = "femnist"
  c.data.pool_size = None  # the whole offline sample (18,796), far below the 119,000 EMNIST subset
  c.output.name = f"femnist_fedcap_{scenario}"
  c.output.reference = sibling(__file__, "fedcap_paper").table3_reference(
      "emnist", scenario, "FedCAP paper, Table III, EMNIST row (a stand-in: different data)")
  return c
