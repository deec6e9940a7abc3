"""md5 checks of dataset files.

Why: a truncated download or a file swapped for another dataset (MNIST files under
``fashion_mnist/``) decodes without error but silently changes every result. The
functions here turn such cases into an immediate, explicit :class:`ChecksumError`.
``MD5SUMS`` files use the ``md5sum`` output format (``<hex>  <relative path>``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

from fedjax_robust.data.errors import ChecksumError, DatasetFormatError

_CHUNK = 1 << 20


def md5_bytes(data: bytes) -> str:
  """Hex md5 of an in-memory buffer."""
  return hashlib.md5(data).hexdigest()


def md5_file(path: str | os.PathLike, decompress: bool = False) -> str:
  """Hex md5 of a file, or of its gzip-decompressed content when ``decompress``.

  The decompressed form matters because the same raw IDX content is shipped in
  differently recompressed ``.gz`` files (official vs Debian copies), whose file md5s
  differ while the content md5 is the official one.
  """
  path = Path(path)
  h = hashlib.md5()
  opener = gzip.open if decompress else open
  try:
    with opener(path, "rb") as f:
      while chunk := f.read(_CHUNK):
        h.update(chunk)
  except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError.
    raise DatasetFormatError(f"cannot read {path} to compute its md5: {e}") from e
  return h.hexdigest()


def verify_md5(path: str | os.PathLike, expected: str, decompress: bool = False) -> None:
  """Raises :class:`ChecksumError` naming the file when its md5 is not ``expected``."""
  got = md5_file(path, decompress=decompress)
  if got.lower() != expected.strip().lower():
    what = "decompressed content of " if decompress else ""
    raise ChecksumError(
        f"md5 mismatch for {what}{path}: expected {expected.strip().lower()}, got {got}. "
        "The file is truncated, corrupted or a different file; replace it with a fresh copy.")


def read_md5sums(path: str | os.PathLike) -> dict[str, str]:
  """Parses an ``md5sum``-style file into ``{relative path: md5}``."""
  out = {}
  for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    parts = line.split(None, 1)
    if len(parts) != 2 or len(parts[0]) != 32:
      raise DatasetFormatError(f"{path}:{lineno}: not an md5sum line: {line!r}")
    out[parts[1].lstrip("*").strip()] = parts[0].lower()
  return out


def verify_md5sums(md5sums_path: str | os.PathLike, root: str | os.PathLike | None = None,
                   names: list[str] | None = None) -> list[str]:
  """Checks files listed in an MD5SUMS file (relative to ``root``, default its folder).

  Args:
    md5sums_path: the MD5SUMS file.
    root: folder the listed paths are relative to.
    names: only check entries whose relative path starts with one of these prefixes.

  Returns:
    The relative paths that were checked.

  Raises:
    FileNotFoundError: a listed file is missing.
    ChecksumError: a listed file has another md5.
  """
  root = Path(root) if root is not None else Path(md5sums_path).parent
  checked = []
  for rel, expected in read_md5sums(md5sums_path).items():
    if names is not None and not any(rel.startswith(n) for n in names):
      continue
    path = root / rel
    if not path.is_file():
      raise FileNotFoundError(f"{path} is listed in {md5sums_path} but does not exist")
    verify_md5(path, expected)
    checked.append(rel)
  return checked
