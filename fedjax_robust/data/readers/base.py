"""The reader protocol: how one on-disk layout of a dataset becomes numpy arrays.

Why split ``locate`` from ``read``: locating is a few ``stat`` calls, so the loader can
probe every candidate folder quickly, and compute the cache key from the located
files without decoding anything; ``read`` (the slow part) runs only on a cache miss.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fedjax_robust.data.errors import ChecksumError

logger = logging.getLogger("fedjax_robust.data")


@dataclasses.dataclass
class ReadResult:
  """Decoded arrays of one dataset: images NHWC (uint8 or float), labels int64.

  ``train_groups``/``test_groups`` are optional per-sample natural-client ids (e.g. the
  writer of a FEMNIST character); ``group_names`` maps an id to its original name.
  """

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  class_names: Sequence[str] | None = None
  train_groups: np.ndarray | None = None
  test_groups: np.ndarray | None = None
  group_names: Sequence[str] | None = None


class Reader:
  """One local file layout of a dataset.

  Subclasses set ``name`` (short id used in logs and cache keys) and implement
  :meth:`locate`, :meth:`read` and :meth:`instructions`. ``builtin`` readers need no
  folder (data shipped inside an installed package).
  """

  name: str = "reader"
  builtin: bool = False

  def locate(self, directory: Path | None) -> list[Path] | None:
    """The files this reader would decode from ``directory``, or None if absent."""
    raise NotImplementedError

  def read(self, paths: list[Path], spec: Any, strict_checksums: bool = False) -> ReadResult:
    """Decodes the located files. Raises DatasetFormatError for broken files."""
    raise NotImplementedError

  def instructions(self, folder: str) -> str:
    """A one-line description of which files to put into ``folder``."""
    raise NotImplementedError

  def key(self) -> str:
    """Identity of this reader's output format, part of the cache key."""
    return self.name


def check_known_md5(label: str, got: str, expected: str | None, strict: bool) -> None:
  """Compares a content md5 with a known official one: warn, or raise when ``strict``."""
  if expected is None or got == expected:
    return
  msg = (f"md5 of {label} is {got}, not the official {expected}: the file is a different "
         "or modified copy")
  if strict:
    raise ChecksumError(msg)
  logger.warning("%s (pass strict_checksums=True to make this an error)", msg)
