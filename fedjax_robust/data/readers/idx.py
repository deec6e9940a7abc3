"""IDX (``*-ubyte[.gz]``) files: MNIST, Fashion-MNIST, EMNIST.

Format: big-endian header ``00 00 <dtype> <ndim>``, then ``ndim`` uint32 sizes, then the
data. Validating the header against the file length catches truncated downloads,
which would otherwise fail far away (reshape errors) or not at all.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from fedjax_robust.data.checksums import md5_bytes
from fedjax_robust.data.errors import DatasetFormatError
from fedjax_robust.data.readers.base import ReadResult, Reader, check_known_md5

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_maybe_gzip(path: Path) -> bytes:
  """File bytes, gunzipped when the file starts with the gzip magic (any suffix)."""
  path = Path(path)
  with open(path, "rb") as f:
    data = f.read()
  if data[:2] != b"\x1f\x8b":
    return data
  try:
    return gzip.decompress(data)
  except (OSError, EOFError, zlib.error) as e:
    raise DatasetFormatError(
        f"{path}: corrupted or truncated gzip file ({e}); replace it with a fresh copy") from e


def parse_idx(data: bytes, path: Path | str, expected_ndim: int | None = None) -> np.ndarray:
  """Decodes IDX bytes, checking magic, dimensionality and exact length."""
  if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] not in IDX_DTYPES:
    magic = data[:4].hex() if len(data) >= 4 else data.hex()
    raise DatasetFormatError(
        f"{path}: not an IDX file (magic 0x{magic}; expected 0x00000803 for images or "
        "0x00000801 for labels)")
  dtype = np.dtype(IDX_DTYPES[data[2]])
  ndim = data[3]
  if expected_ndim is not None and ndim != expected_ndim:
    raise DatasetFormatError(
        f"{path}: IDX file has {ndim} dimensions, expected {expected_ndim} "
        f"({'images' if expected_ndim == 3 else 'labels'}); are images and labels swapped?")
  header = 4 + 4 * ndim
  if len(data) < header:
    raise DatasetFormatError(f"{path}: truncated IDX header ({len(data)} bytes)")
  dims = struct.unpack(">" + "I" * ndim, data[4:header])
  expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
  if len(data) != expected:
    raise DatasetFormatError(
        f"{path}: size mismatch: header says shape {dims} ({expected} bytes decompressed) "
        f"but the content has {len(data)} bytes; the file is truncated or corrupted")
  return np.frombuffer(data, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


class IdxReader(Reader):
  """Four IDX files (train/test images/labels), each plain or ``.gz``.

  Args:
    files: base names (without ``.gz``) of train images, train labels, test images,
      test labels.
    raw_md5: optional ``{base name: md5 of the decompressed content}`` of official
      files; a mismatch is a warning, or an error with ``strict_checksums``.
    transpose: swap rows/cols (EMNIST stores images transposed).
    label_offset: added to labels (EMNIST ``letters`` labels start at 1).
    source: where the official files come from, quoted in the missing-files message.
  """

  name = "idx"

  def __init__(self, files=("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
               raw_md5: dict[str, str] | None = None, transpose: bool = False,
               label_offset: int = 0, source: str | None = None):
    self.files = tuple(files)
    self.source = source
    self.raw_md5 = dict(raw_md5 or {})
    self.transpose = transpose
    self.label_offset = label_offset

  def key(self) -> str:
    return f"idx:{','.join(self.files)}:t{int(self.transpose)}:o{self.label_offset}"

  def locate(self, directory):
    if directory is None:
      return None
    found = []
    for base in self.files:
      for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
          found.append(candidate)
          break
      else:
        return None
    return found

  def _load(self, path: Path, ndim: int, strict: bool) -> np.ndarray:
    data = read_maybe_gzip(path)
    base = path.name[:-3] if path.name.endswith(".gz") else path.name
    check_known_md5(f"the content of {path}", md5_bytes(data), self.raw_md5.get(base), strict)
    return parse_idx(data, path, expected_ndim=ndim)

  def read(self, paths, spec, strict_checksums=False):
    arrays = []
    for split in (0, 2):
      img_path, lab_path = paths[split], paths[split + 1]
      x = self._load(img_path, 3, strict_checksums)
      y = self._load(lab_path, 1, strict_checksums).astype(np.int64) + self.label_offset
      if len(x) != len(y):
        raise DatasetFormatError(
            f"{img_path} holds {len(x)} images but {lab_path} holds {len(y)} labels")
      if self.transpose:
        x = x.transpose(0, 2, 1)
      if tuple(x.shape[1:]) != tuple(spec.image_shape[:2]):
        raise DatasetFormatError(
            f"{img_path}: images are {x.shape[1:]}, expected {spec.image_shape[:2]} for {spec.name}")
      if len(y) and (y.min() < 0 or y.max() >= spec.num_classes):
        raise DatasetFormatError(
            f"{lab_path}: labels span [{y.min()}, {y.max()}], expected [0, {spec.num_classes})")
      arrays += [np.ascontiguousarray(x[..., None]), y]
    return ReadResult(*arrays)

  def instructions(self, folder):
    names = ", ".join(f"{b}.gz" for b in self.files)
    origin = f" (from {self.source})" if self.source else ""
    return f"IDX files {names} (gzipped or not){origin} in {folder}/"
