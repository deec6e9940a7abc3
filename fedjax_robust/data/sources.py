"""``load_raw``: find a dataset's local files, decode them once, cache the arrays.

Source order (each attempt is logged on the ``fedjax_robust.data`` logger):
  0. built-in data (``digits`` ships with scikit-learn);
  1. the ``data_dir`` argument;
  2. ``$FEDJAX_ROBUST_DATA_DIR``;
  3. tensorflow-datasets, only if it imports: a prepared copy is read without network;
     a download is attempted only with ``allow_download=True``.
For 1 and 2 both the folder holding the files and a parent with a sub-folder named
like the dataset (``mnist/``, ``cifar10_jpeg/``, ...) are accepted. When nothing
works a :class:`DatasetNotFoundError` is raised at once, listing every source tried
and which files to put where. Why this design: CI and the compute machines are
offline, so the loader must never hang on the network and must say exactly how to
make a dataset available.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np

from fedjax_robust.data import cache as cache_lib
from fedjax_robust.data.errors import DatasetNotFoundError
from fedjax_robust.data.readers.base import ReadResult, Reader, logger
from fedjax_robust.data.readers.tfds import TfdsReader, download_with_tfds, import_tfds, tfds_data_dirs
from fedjax_robust.data.registry import DATASETS, DatasetSpec, get_spec

DATA_DIR_ENV = "FEDJAX_ROBUST_DATA_DIR"


@dataclasses.dataclass(frozen=True)
class RawDataset:
  """A dataset's official train/test arrays, images NHWC, labels int64.

  ``source`` says which source served the data (a path, ``sklearn``, ``tfds:...``,
  with ``(cached ...)`` when read from the cache). ``train_groups``/``test_groups``
  are natural-client ids for datasets that have them (FEMNIST), else None.
  """

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  source: str
  source_files: tuple[str, ...] = ()
  class_names: tuple[str, ...] | None = None
  train_groups: np.ndarray | None = None
  test_groups: np.ndarray | None = None
  group_names: tuple[str, ...] | None = None

  @property
  def spec(self) -> DatasetSpec:
    return get_spec(self.name)


def _to_raw(spec: DatasetSpec, r: ReadResult, source: str, files) -> RawDataset:
  def opt(a):
    return None if a is None else np.asarray(a, np.int64)

  return RawDataset(
      name=spec.name, x_train=r.x_train, y_train=np.asarray(r.y_train, np.int64),
      x_test=r.x_test, y_test=np.asarray(r.y_test, np.int64), num_classes=spec.num_classes,
      source=source, source_files=tuple(str(f) for f in files),
      class_names=tuple(r.class_names) if r.class_names is not None else None,
      train_groups=opt(r.train_groups), test_groups=opt(r.test_groups),
      group_names=tuple(r.group_names) if r.group_names is not None else None)


def _read(spec: DatasetSpec, reader: Reader, paths: list[Path], source: str, cache_dir,
          use_cache: bool, strict_checksums: bool) -> RawDataset:
  """Reads through the cache: a hit skips decoding; a miss decodes and writes the entry."""
  entry = None
  if use_cache and spec.cacheable and paths:
    root = Path(cache_dir).expanduser() if cache_dir else cache_lib.default_cache_dir()
    entry = cache_lib.cache_path(root, spec.name, cache_lib.cache_key(spec.name, reader.key(), paths))
    t0 = time.perf_counter()
    hit = cache_lib.load_cached(entry)
    if hit is not None:
      result, meta = hit
      logger.info("%s: loaded from cache %s in %.2fs (source: %s)", spec.name, entry,
                  time.perf_counter() - t0, meta.get("source"))
      return _to_raw(spec, result, f"{meta.get('source')} (cached {entry})", paths)
  t0 = time.perf_counter()
  result = reader.read(paths, spec, strict_checksums=strict_checksums)
  logger.info("%s: decoded from %s in %.2fs", spec.name, source, time.perf_counter() - t0)
  if entry is not None and cache_lib.save_cached(entry, result, {"source": source}):
    logger.info("%s: cached decoded arrays at %s", spec.name, entry)
  return _to_raw(spec, result, source, paths)


def candidate_dirs(root: Path, spec: DatasetSpec) -> list[Path]:
  """Dataset-named sub-folders of ``root`` that exist, then ``root`` itself."""
  subs = [root / n for n in spec.dir_names if (root / n).is_dir()]
  return subs + [root]


def load_raw(name: str, data_dir: str | os.PathLike | None = None,
             cache_dir: str | os.PathLike | None = None, allow_download: bool = False, *,
             use_cache: bool = True, strict_checksums: bool = False) -> RawDataset:
  """Loads dataset ``name`` from the first source that has it (see module docstring).

  Args:
    name: a key of :data:`DATASETS`.
    data_dir: folder with the files, or a parent with a sub-folder named like the dataset.
    cache_dir: where decoded arrays are cached (default ``$FEDJAX_ROBUST_CACHE`` or
      ``~/.cache/fedjax_robust``).
    allow_download: allow a tensorflow-datasets download (needs network and TF).
    use_cache: read/write the decoded-array cache.
    strict_checksums: raise (instead of warn) when file content differs from the
      known official md5.

  Raises:
    ValueError: unknown dataset name.
    DatasetNotFoundError: no source has the dataset.
    DatasetFormatError: files were found but are corrupted.
  """
  spec = get_spec(name)
  tried: list[str] = []

  def note(msg: str):
    tried.append(msg)
    logger.info("%s: %s", name, msg)

  kw = dict(cache_dir=cache_dir, use_cache=use_cache, strict_checksums=strict_checksums)
  for reader in spec.readers:
    if reader.builtin:
      note(f"built-in source {reader.name}")
      return _read(spec, reader, reader.locate(None) or [], getattr(reader, "source", reader.name),
                   **kw)

  file_readers = [r for r in spec.readers if not r.builtin]
  roots = [("data_dir argument", data_dir), (f"${DATA_DIR_ENV}", os.environ.get(DATA_DIR_ENV))]
  for origin, root in roots:
    if not root:
      note(f"{origin}: not set")
      continue
    root = Path(root).expanduser()
    if not root.is_dir():
      note(f"{origin} = {root}: not a directory")
      continue
    for d in candidate_dirs(root, spec):
      for reader in file_readers:
        paths = reader.locate(d)
        if paths:
          note(f"{origin}: found {reader.name} files in {d}")
          return _read(spec, reader, paths, str(paths[0] if len(paths) == 1 else d), **kw)
    looked = ", ".join(str(d) for d in candidate_dirs(root, spec))
    note(f"{origin} = {root}: no {'/'.join(r.name for r in file_readers)} files in {looked} "
         f"(sub-folders looked for: {', '.join(spec.dir_names)})")

  raw = _try_tfds(spec, data_dir, allow_download, note, kw)
  if raw is not None:
    return raw
  raise DatasetNotFoundError(_not_found_message(spec, tried))


def _try_tfds(spec: DatasetSpec, data_dir, allow_download: bool, note, kw) -> RawDataset | None:
  if spec.tfds_name is None:
    note("tensorflow_datasets: no tfds equivalent of this dataset")
    return None
  tfds = import_tfds()
  if tfds is None:
    note("tensorflow_datasets: not importable (optional extra 'tfds')")
    return None
  reader = TfdsReader(spec.tfds_name)
  dirs = tfds_data_dirs([data_dir])
  for d in dirs:
    paths = reader.locate(d)
    if paths:
      note(f"tensorflow_datasets: prepared copy at {paths[0]}")
      return _read(spec, reader, paths, f"tfds:{spec.tfds_name} ({paths[0]})", **kw)
  where = ", ".join(str(d / spec.tfds_name) for d in dirs)
  if not allow_download:
    note(f"tensorflow_datasets: no prepared copy in {where}; download not attempted "
         "(allow_download=False)")
    return None
  try:
    result = download_with_tfds(spec.tfds_name, dirs[-1])
  except Exception as e:  # noqa: BLE001 - report any tfds failure as a failed source.
    note(f"tensorflow_datasets: download of {spec.tfds_name} failed: {e.__class__.__name__}: {e}")
    return None
  note(f"tensorflow_datasets: downloaded {spec.tfds_name}")
  return _to_raw(spec, result, f"tfds:{spec.tfds_name} (downloaded)", [])


def _not_found_message(spec: DatasetSpec, tried: list[str]) -> str:
  folder = f"<DATA_DIR>/{spec.dir_names[0] if spec.dir_names else spec.name}"
  lines = [f"dataset {spec.name!r} was not found. Sources tried, in order:"]
  lines += [f"  {i}. {t}" for i, t in enumerate(tried, 1)]
  lines.append("To fix it, provide one of:")
  lines += [f"  - {r.instructions(folder)}" for r in spec.readers if not r.builtin]
  lines.append(f"then pass data_dir=<DATA_DIR> (config field data_dir) or set "
               f"{DATA_DIR_ENV}=<DATA_DIR>.")
  if spec.tfds_name:
    lines.append(f"Or, online with tensorflow-datasets installed, pass allow_download=True "
                 f"(tfds name {spec.tfds_name!r}).")
  return "\n".join(lines)


def known_datasets() -> list[str]:
  return sorted(DATASETS)
