"""Exceptions of the data layer.

Why dedicated types: callers (the experiment runner, tests) must tell "the files are
not there" (actionable: put them somewhere, or point ``data_dir`` at them) apart from
"the files are there but broken" (re-download them), and both apart from bad
arguments (plain ``ValueError``).
"""

from __future__ import annotations


class DatasetNotFoundError(FileNotFoundError):
  """No source could serve a dataset; the message lists every source tried and the fix."""


class DatasetFormatError(ValueError):
  """A dataset file exists but is truncated, corrupted or not in the expected format."""


class ChecksumError(DatasetFormatError):
  """A file's md5 differs from the expected one."""
