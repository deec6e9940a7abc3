"""``build_federated_data(cfg)``: from a data config to a padded :class:`FederatedData`.

Pipeline (each random step has its own seed derived from ``cfg.seed``, so changing
e.g. the partition does not change the per-class subsample):

1. ``load_raw`` the dataset (local files, cache, optional tfds);
2. choose the pool: ``'train'`` = the official train split (the global test set is the
   official test split) or ``'all'`` = train + test merged, as PFLlib/FedCAP do (the
   global test set is then the union of the clients' test splits);
3. optionally subsample ``samples_per_class`` per class, then optionally keep a uniform
   random ``pool_size`` of the pool (FedCAP's EMNIST: ~1.2k samples per client, spec §4.1);
4. partition among ``num_clients`` clients (``cfg.partition``);
5. optionally cap each client at ``max_samples_per_client``;
6. split each client into its own train/test: ``client_split='random'`` uses
   ``train_ratio`` (1.0 with pool 'train' means no client test splits);
   ``client_split='source'`` (pool 'all') keeps the dataset's own per-sample split, e.g.
   the FedCHAR per-user 75/25 split of WISDM (FedCAP spec §4.1) or LEAF's FEMNIST split;
   ``client_split='per_split'`` (pool 'train', a sampled partition: FedCAC spec §3.2) runs
   the partition twice with the SAME seed, on the official train split with
   ``partition.samples_per_client`` rows and on the official test split with
   ``partition.test_samples_per_client`` rows, so each client's test rows follow its train
   class mix (the class draw comes first in the stream);
7. normalise (``normalize``) and stack into zero-padded ``[K, n_max, H, W, C]`` arrays.

Data dynamics (``dynamics.fresh_fraction`` α > 0, FedVSA Table 5, :mod:`fedjax_robust.data.dynamics`): step 4
partitions only the base labels' rows (labels renumbered 0..C_base-1, so the σ rule sees C_base classes and the
base data); each fresh label is cut into 2N/C shards for distinct random clients; step 6 splits a client's base
and fresh rows separately (the same ``train_ratio``), and its training rows are stored base first, then fresh,
with a :class:`~fedjax_robust.data.dynamics.TrainSchedule` saying how many are revealed at each round. Client
test splits hold their fresh test rows from the start (evaluation sets do not change over the run).

Client indices stored in the result index the pool (for ``'all'``, rows
``>= len(x_train)`` are official test rows), so a partition can be saved and inspected.
"""

from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path
from typing import Any

import ml_collections
from ml_collections import config_dict
import numpy as np

from fedjax_robust.data import partition as P
from fedjax_robust.data import dynamics as D
from fedjax_robust.data.dynamics import DEFAULTS as DYNAMICS_DEFAULTS
from fedjax_robust.data.federated import FederatedData, stack_padded
from fedjax_robust.data.registry import DatasetSpec, get_spec
from fedjax_robust.data.sources import RawDataset, load_raw
from fedjax_robust.data.transforms import normalization_stats, normalize_images, normalize_mode

POOLS = ("train", "all")
CLIENT_SPLITS = ("random", "source", "per_split")
DIRICHLET_FORMS = ("per_class", "client_prior", "client_symmetric")
PARTITION_NAMES = tuple(sorted(P.PARTITIONERS))


def default_data_config() -> ml_collections.ConfigDict:
  """The data config with every field and its default.

  Fields: ``name`` (dataset), ``data_dir``, ``cache_dir``, ``allow_download`` (tfds),
  ``seed``, ``num_clients``, ``pool`` ('train' | 'all'), ``samples_per_class`` (None |
  int), ``pool_size`` (None | int: uniform random subset of the pool before partitioning),
  ``max_samples_per_client`` (None | int), ``train_ratio``, ``client_split`` ('random' =
  seeded per-client split by ``train_ratio`` | 'source' = the dataset's own train/test
  rows, pool 'all' only | 'per_split' = the partition drawn again, same seed, on the official test split: FedCAC's
  pathological_sampled / dirichlet_sampled, pool 'train' only), ``normalize`` (True | False | 'half' | 'model':
  pixels stay in [0, 1] and the
  experiment puts the dataset's mean/std inside the model, for adversarial training), ``normalize_mean`` /
  ``normalize_std`` (None = the dataset registry's statistics; per-channel tuples override them, e.g. FedCAC's
  literal CIFAR-100 statistics, also for Tiny-ImageNet: specs/fedcac.md §3.4), ``augment`` (training-time
  augmentation, ``""`` = none; read by the experiment, not here: fedjax_robust/data/augment.py), and ``partition``:
  ``name`` (iid | shards | pat | dirichlet | dirichlet_client | quantity_skew | sigma |
  natural | group | pathological_sampled | dirichlet_sampled), ``alpha``, ``classes_per_client``
  (also shards per client for 'shards'), ``min_size``, ``form`` (dirichlet: 'per_class'
  = Dir(alpha 1_K) per class; 'client_prior' = q_k ~ Dir(alpha p); 'client_symmetric'
  = q_k ~ Dir(alpha 1_C)), ``balance`` (pat). Optional extra partition fields read if
  present: ``sigma`` (for 'sigma', and log-normal quantity skew), ``dist``
  ('dirichlet' | 'lognormal' for quantity_skew), ``max_tries`` (dirichlet redraws),
  ``dominant_fraction`` and ``class_groups`` (group: FedCAP's EMNIST partition, spec §4.1), ``cap_at_mean``
  (dirichlet per_class: a client holding N/K samples gets no share of later classes, NIID-Bench's balance cap),
  ``samples_per_client`` and ``test_samples_per_client`` (pathological_sampled / dirichlet_sampled: rows drawn
  per client from the train pool and, with client_split='per_split', from the official test split; FedCAC spec
  §3.2: 500 and 100), ``sigma_mode`` (sigma: 'gaussian_std' (default) | 'icpp_offset' | 'variance_offset', FedVSA spec
  §4.3(b)). ``dynamics``: ``fresh_fraction`` (α: share of fresh labels, 0 = off), ``fresh_delta`` (Δ: fresh rows a
  client reveals per round; 0 = all at once), ``fresh_start_round`` (first FL round that reveals; FedVSA spec §4.3(d)).

  Optional fields are typed placeholders and ``normalize`` an ``object`` field, so
  command-line overrides (``--config.data.samples_per_class=600``,
  ``--config.data.normalize=half``) work even though the defaults are None / True.
  """
  partition = ml_collections.ConfigDict({
      "name": "dirichlet",
      "alpha": 0.5,
      "classes_per_client": 2,
      "min_size": 10,
      "form": "per_class",
      "balance": True,
  }, type_safe=False)
  return ml_collections.ConfigDict({
      "name": "digits",
      "data_dir": config_dict.placeholder(str),
      "cache_dir": config_dict.placeholder(str),
      "allow_download": False,
      "seed": 0,
      "num_clients": 10,
      "pool": "train",
      "samples_per_class": config_dict.placeholder(int),
      "pool_size": config_dict.placeholder(int),
      "max_samples_per_client": config_dict.placeholder(int),
      "train_ratio": 0.75,
      "client_split": "random",
      "partition": partition,
      "dynamics": ml_collections.ConfigDict(dict(DYNAMICS_DEFAULTS)),
      "normalize": config_dict.FieldReference(True, field_type=object),
      "normalize_mean": config_dict.placeholder(tuple),
      "normalize_std": config_dict.placeholder(tuple),
      "augment": "",
  }, type_safe=False)


def _get(obj: Any, name: str, default: Any = None) -> Any:
  if obj is None:
    return default
  if isinstance(obj, dict):
    return obj.get(name, default)
  try:
    return getattr(obj, name)
  except (AttributeError, KeyError):
    return default


def stage_seed(seed: int, stage: str) -> int:
  """An independent seed for one pipeline stage (so stages do not share a stream)."""
  ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(stage.encode())])
  return int(ss.generate_state(1)[0])


def partition_from_config(pcfg: Any, labels: np.ndarray, num_clients: int | None, seed: int,
                          groups: np.ndarray | None = None, num_classes: int | None = None,
                          samples_per_client: int | None = None) -> tuple[list[np.ndarray], dict]:
  """Runs the partition described by ``pcfg``; returns the index lists and the params used.

  ``num_classes`` (the dataset's) and ``samples_per_client`` (replacing ``pcfg.samples_per_client``, e.g. the test
  split's count) are read by the sampled partitions only."""
  d = default_data_config().partition
  name = _get(pcfg, "name", d.name)
  alpha = float(_get(pcfg, "alpha", d.alpha))
  cpc = int(_get(pcfg, "classes_per_client", d.classes_per_client))
  min_size = int(_get(pcfg, "min_size", d.min_size))
  form = _get(pcfg, "form", d.form)
  balance = bool(_get(pcfg, "balance", d.balance))
  if name != "natural" and num_clients is None:
    raise ValueError(f"partition {name!r} needs num_clients")
  if name == "iid":
    params = {}
  elif name == "shards":
    params = {"shards_per_client": cpc}
  elif name == "pat":
    params = {"classes_per_client": cpc, "balance": balance, "min_size": min_size}
  elif name in ("dirichlet", "dirichlet_client"):
    if form not in DIRICHLET_FORMS:
      raise ValueError(f"unknown dirichlet form {form!r}; known forms: {list(DIRICHLET_FORMS)}")
    if name == "dirichlet_client" and form == "per_class":
      form = "client_prior"
    if form == "per_class":
      params = {"alpha": alpha, "min_size": min_size}
      if _get(pcfg, "max_tries") is not None:
        params["max_tries"] = int(_get(pcfg, "max_tries"))
      if _get(pcfg, "cap_at_mean"):  # NIID-Bench's balance cap (FedALC spec §4.2)
        params["cap_at_mean"] = True
    else:
      name = "dirichlet_client"
      params = {"alpha": alpha, "form": form.split("_", 1)[1], "min_size": min_size}
  elif name == "quantity_skew":
    params = {"alpha": alpha, "dist": _get(pcfg, "dist", "dirichlet"),
              "sigma": float(_get(pcfg, "sigma", 1.0)), "min_size": min_size}
  elif name == "sigma":
    sigma = _get(pcfg, "sigma")
    if sigma is None:
      raise ValueError("partition 'sigma' needs a partition.sigma field (std of slot sizes)")
    params = {"sigma": float(sigma), "classes_per_client": cpc, "min_size": min_size,
              "sigma_mode": str(_get(pcfg, "sigma_mode", "gaussian_std"))}
  elif name == "natural":
    params = {"groups": groups, "min_size": max(1, min_size)}
  elif name in P.SAMPLED_PARTITIONS:
    m = samples_per_client if samples_per_client is not None else _get(pcfg, "samples_per_client")
    params = {"samples_per_client": None if m is None else int(m), "num_classes": num_classes}
    if name == "pathological_sampled":
      params["classes_per_client"] = cpc
    else:
      params["alpha"] = alpha
  elif name == "group":
    params = {"dominant_fraction": float(_get(pcfg, "dominant_fraction", 0.8))}
    if _get(pcfg, "class_groups") is not None:
      params["class_groups"] = [list(g) for g in _get(pcfg, "class_groups")]
  else:
    raise ValueError(f"unknown partition {name!r}; known partitions: {list(PARTITION_NAMES)}")
  parts = P.partition_by_name(name, labels, num_clients, seed, **params)
  used = {"name": name, **{k: v for k, v in params.items() if k != "groups"}}
  if name in ("dirichlet", "dirichlet_client"):
    used["form"] = form
  return parts, used


def _summary(counts: np.ndarray) -> dict:
  counts = np.asarray(counts)
  if counts.size == 0:
    return {"min": 0, "max": 0, "mean": 0.0, "total": 0}
  return {"min": int(counts.min()), "max": int(counts.max()), "mean": float(counts.mean()),
          "total": int(counts.sum())}


def with_statistics(spec: DatasetSpec, mean, std) -> DatasetSpec:
  """``spec`` with the normalisation statistics ``data.normalize_mean`` / ``normalize_std`` (None keeps the
  registry's). A paper's code may normalise with rounded literals or another dataset's statistics (FedCAC's
  Tiny-ImageNet uses CIFAR-100's, specs/fedcac.md §3.4)."""
  if mean is None and std is None:
    return spec
  mean = spec.mean if mean is None else tuple(float(v) for v in mean)
  std = spec.std if std is None else tuple(float(v) for v in std)
  channels = spec.image_shape[-1]
  if len(mean) != channels or len(std) != channels or min(std) <= 0:
    raise ValueError(f"data.normalize_mean / normalize_std for {spec.name} need {channels} values each (std > 0); "
                     f"got {mean} / {std}")
  return dataclasses.replace(spec, mean=mean, std=std)


def build_federated_data(cfg: Any, raw: RawDataset | None = None) -> FederatedData:
  """Builds the federated dataset described by ``cfg`` (see :func:`default_data_config`).

  Args:
    cfg: a ConfigDict, dict or any attribute object; missing fields take defaults.
    raw: already loaded data to use instead of calling ``load_raw`` (tests, reuse).

  Raises:
    ValueError: unknown dataset / pool / partition, or invalid parameters.
    DatasetNotFoundError, DatasetFormatError: from ``load_raw``.
  """
  d = default_data_config()
  g = lambda name: _get(cfg, name, d[name])  # noqa: E731
  name, seed, pool = g("name"), int(g("seed")), g("pool")
  spec = with_statistics(get_spec(name), g("normalize_mean"), g("normalize_std"))
  mode = normalize_mode(g("normalize"))
  if pool not in POOLS:
    raise ValueError(f"unknown pool {pool!r}; use one of {list(POOLS)}")
  ratio = float(g("train_ratio"))
  client_split = g("client_split")
  if client_split not in CLIENT_SPLITS:
    raise ValueError(f"unknown client_split {client_split!r}; use one of {list(CLIENT_SPLITS)}")
  if client_split == "source" and pool != "all":
    raise ValueError("client_split='source' keeps the dataset's own train/test rows per client, so it needs "
                     f"pool='all' (got pool={pool!r})")
  pname = _get(g("partition"), "name", d.partition.name)
  if client_split == "per_split" and (pool != "train" or pname not in P.SAMPLED_PARTITIONS):
    raise ValueError("client_split='per_split' draws each client's train rows from the official train split and its "
                     "test rows from the official test split with the same sampled partition, so it needs "
                     f"pool='train' and partition.name in {list(P.SAMPLED_PARTITIONS)} (got pool={pool!r}, "
                     f"partition {pname!r})")
  if ratio == 1.0 and pool == "all" and client_split == "random":
    raise ValueError("train_ratio=1.0 with pool='all' leaves no global test set")
  if not (0.0 < ratio < 1.0 or ratio == 1.0):
    raise ValueError(f"train_ratio must be in (0, 1) (or exactly 1.0 with pool='train'), got {ratio}")
  num_clients = g("num_clients")
  num_clients = None if num_clients in (None, 0) else int(num_clients)

  if raw is None:
    raw = load_raw(name, data_dir=g("data_dir"), cache_dir=g("cache_dir"),
                   allow_download=bool(g("allow_download")))
  n_official_train = len(raw.y_train)
  if pool == "train":
    pool_x, pool_y, groups = raw.x_train, raw.y_train, raw.train_groups
  else:
    pool_x = np.concatenate([raw.x_train, raw.x_test])
    pool_y = np.concatenate([raw.y_train, raw.y_test])
    groups = (None if raw.train_groups is None
              else np.concatenate([raw.train_groups, raw.test_groups]))

  candidates = np.arange(len(pool_y))
  spc = g("samples_per_class")
  if spc is not None:
    candidates = P.subsample_per_class(pool_y, int(spc), stage_seed(seed, "subsample"))
  pool_size = g("pool_size")
  if pool_size is not None:
    pool_size = int(pool_size)
    if not 1 <= pool_size <= len(candidates):
      raise ValueError(f"pool_size must be in [1, {len(candidates)}] (the pool has {len(candidates)} samples), "
                       f"got {pool_size}")
    rng = np.random.default_rng(stage_seed(seed, "pool_size"))
    candidates = np.sort(rng.choice(candidates, pool_size, replace=False))
  dyn = D.dynamics_from_config(g("dynamics"))
  if dyn is not None and (client_split != "random" or pname in P.SAMPLED_PARTITIONS
                          or g("max_samples_per_client") is not None):
    raise ValueError("data.dynamics (fresh labels) needs client_split='random', a partition other than "
                     f"{list(P.SAMPLED_PARTITIONS)} and no max_samples_per_client (got client_split={client_split!r}, "
                     f"partition {pname!r}, max_samples_per_client={g('max_samples_per_client')})")
  fresh_parts = None
  if dyn is None:
    parts, used = partition_from_config(
        g("partition"), pool_y[candidates], num_clients, stage_seed(seed, "partition"),
        groups=None if groups is None else groups[candidates], num_classes=spec.num_classes)
  else:  # FedVSA §4.3(d): the base labels' rows partitioned as usual, the fresh labels' rows in shards
    cand_y = pool_y[candidates]
    classes = np.unique(cand_y)
    fresh_labels = D.choose_fresh_labels(classes, dyn.fresh_fraction, stage_seed(seed, "fresh_labels"))
    base_labels = np.setdiff1d(classes, fresh_labels)
    base_rows = np.flatnonzero(~np.isin(cand_y, fresh_labels))
    parts, used = partition_from_config(
        g("partition"), np.searchsorted(base_labels, cand_y[base_rows]), num_clients, stage_seed(seed, "partition"),
        groups=None if groups is None else groups[candidates][base_rows], num_classes=len(base_labels))
    parts = [base_rows[p] for p in parts]
    fresh_parts, per_label = D.fresh_shards(cand_y, fresh_labels, len(parts), len(classes),
                                            stage_seed(seed, "fresh_shards"))
    fresh_parts = [candidates[p] for p in fresh_parts]
  parts = [candidates[p] for p in parts]
  cap = g("max_samples_per_client")
  if cap is not None:
    parts = P.cap_samples_per_client(parts, int(cap), stage_seed(seed, "cap"))
  test_x, test_y = pool_x, pool_y  # where the clients' test indices point
  if client_split == "per_split":  # FedCAC spec §3.2: the same procedure and seed on the official test split
    train_idx = parts
    test_m = _get(g("partition"), "test_samples_per_client")
    test_idx, test_used = partition_from_config(
        g("partition"), raw.y_test, num_clients, stage_seed(seed, "partition"), num_classes=spec.num_classes,
        samples_per_client=None if test_m is None else int(test_m))
    used["test_samples_per_client"] = test_used["samples_per_client"]
    test_x, test_y = raw.x_test, raw.y_test
  elif client_split == "source":
    train_idx = [p[p < n_official_train] for p in parts]
    test_idx = [p[p >= n_official_train] for p in parts]
    empty = [k for k, t in enumerate(train_idx) if len(t) == 0]
    if empty:
      raise ValueError(f"client_split='source': clients {empty[:10]} have no row of the dataset's train split")
  elif ratio < 1.0:
    train_idx, test_idx = P.train_test_split_per_client(parts, ratio, stage_seed(seed, "split"))
  else:
    rng = np.random.default_rng(stage_seed(seed, "split"))
    train_idx = [rng.permutation(p) for p in parts]
    test_idx = [np.zeros(0, np.int64) for _ in parts]
  schedule = None
  if fresh_parts is not None:  # base rows first, then the fresh rows in reveal order (a prefix per round)
    if ratio < 1.0:
      fresh_train, fresh_test = P.train_test_split_per_client(fresh_parts, ratio, stage_seed(seed, "fresh_split"))
    else:
      fresh_train, fresh_test = fresh_parts, [np.zeros(0, np.int64) for _ in fresh_parts]
    n_base = np.asarray([len(t) for t in train_idx], np.int64)
    n_fresh = np.asarray([len(f) for f in fresh_train], np.int64)
    train_idx = [np.concatenate([t, f]) for t, f in zip(train_idx, fresh_train)]
    test_idx = [np.concatenate([t, f]) for t, f in zip(test_idx, fresh_test)]
    schedule = D.make_schedule(n_base, dyn, n_base + n_fresh)

  def gather(index_lists, source_x, source_y):
    xs = [normalize_images(source_x[i], spec, mode) for i in index_lists]
    x, n = stack_padded(xs, np.float32)
    y, _ = stack_padded([source_y[i].astype(np.int32) for i in index_lists], np.int32)
    return x, y, n

  x_train, y_train, n_train = gather(train_idx, pool_x, pool_y)
  x_test, y_test, n_test = gather(test_idx, test_x, test_y)
  if pool == "train":
    x_global = normalize_images(raw.x_test, spec, mode)
    y_global = raw.y_test.astype(np.int32)
  else:
    all_test = np.concatenate(test_idx)
    x_global = normalize_images(pool_x[all_test], spec, mode)
    y_global = pool_y[all_test].astype(np.int32)

  mean, std = normalization_stats(spec, mode)
  hist = P.label_histograms(pool_y, train_idx, spec.num_classes)
  info = {
      "dataset": name,
      "source": raw.source,
      "source_files": list(raw.source_files),
      "class_names": list(raw.class_names) if raw.class_names is not None else None,
      "seed": seed,
      "pool": pool,
      "pool_size": int(len(pool_y)),
      "pool_indexing": ("train indices index the official train split, test indices the official test split"
                        if client_split == "per_split" else
                        "indices index the official train split" if pool == "train" else
                        f"indices index concat(train, test); rows >= {n_official_train} are "
                        "official test rows"),
      "raw_sizes": {"train": int(n_official_train), "test": int(len(raw.y_test))},
      "samples_per_class": None if spc is None else int(spc),
      "pool_size": pool_size,
      "max_samples_per_client": None if cap is None else int(cap),
      "train_ratio": ratio,
      "client_split": client_split,
      "num_clients": len(parts),
      "partition": used,
      "normalize": {"mode": mode, "mean": mean.tolist(), "std": std.tolist(),
                    "max_value": spec.max_value},
      "stats": {
          "n_train": _summary(n_train),
          "n_test": _summary(n_test),
          "classes_per_client_mean": float((hist > 0).sum(1).mean()) if len(hist) else 0.0,
          "global_test_size": int(len(y_global)),
      },
  }
  if schedule is not None:
    info["dynamics"] = D.dynamics_summary(dyn, fresh_labels, base_labels, per_label, n_base, n_fresh)
  if used["name"] == "sigma":  # FedVSA §4.3(b): the realised spread (base-label rows only with dynamics)
    info["stats"]["sigma"] = P.sigma_partition_stats(pool_y, parts)
  return FederatedData(
      name=name, num_classes=spec.num_classes, x_train=x_train, y_train=y_train,
      n_train=n_train, x_test=x_test, y_test=y_test, n_test=n_test,
      x_global_test=x_global, y_global_test=y_global,
      client_train_indices=[np.asarray(i, np.int64) for i in train_idx],
      client_test_indices=[np.asarray(i, np.int64) for i in test_idx], info=info, train_schedule=schedule)


def save_federated_partition(path: str | Path, data: FederatedData) -> Path:
  """Writes ``data``'s client indices, label histograms and ``info`` with
  :func:`~fedjax_robust.data.partition.save_partition` (``.json`` or ``.npz``)."""
  return P.save_partition(
      path, data.client_train_indices, data.client_test_indices,
      label_histograms=data.label_histograms("train"),
      test_label_histograms=data.label_histograms("test"),
      meta={"dataset": data.name, "num_classes": data.num_classes,
            "n_train": data.n_train.tolist(), "n_test": data.n_test.tolist(), "info": data.info})
