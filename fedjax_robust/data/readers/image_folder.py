"""Image-folder copies: ``train/<class>/*.{jpg,png}`` and ``test/<class>/*``.

Accepted as an extracted folder or a ``.tar.gz`` read as a stream (random access
into a gzip'd tar is slow). The label is the index of the class folder name in
sorted order, which is CIFAR's own class order and torchvision ImageFolder's rule.
Samples are ordered by (class, relative path), so the arrays do not depend on the
order of archive members or of ``os.listdir``.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image, UnidentifiedImageError

from fedjax_robust.data.errors import DatasetFormatError
from fedjax_robust.data.readers.base import ReadResult, Reader, logger

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")


class ImageFolderReader(Reader):
  """Reads class-folder images.

  Args:
    archives: glob patterns of archives to accept in a folder (e.g.
      ``("cifar10_jpeg.tar.gz",)``); the first match is used.
    train_dir: name of the train split folder.
    test_dirs: accepted names of the test split folder (first found wins).
  """

  name = "image_folder"

  def __init__(self, archives: tuple[str, ...] = (), train_dir: str = "train",
               test_dirs: tuple[str, ...] = ("test", "val")):
    self.archives = tuple(archives)
    self.train_dir = train_dir
    self.test_dirs = tuple(test_dirs)

  def key(self):
    return f"image_folder:{self.train_dir}:{','.join(self.test_dirs)}"

  def locate(self, directory):
    if directory is None:
      return None
    if (directory / self.train_dir).is_dir():
      for t in self.test_dirs:
        if (directory / t).is_dir():
          return [directory / self.train_dir, directory / t]
    for pattern in self.archives:
      matches = sorted(p for p in directory.glob(pattern) if p.is_file())
      if matches:
        return [matches[0]]
    return None

  # -- collecting (split, class, relative path, bytes) ---------------------------------

  def _split_of(self, parts: tuple[str, ...]) -> tuple[str, int] | None:
    for i, part in enumerate(parts):
      if part == self.train_dir:
        return "train", i
      if part in self.test_dirs:
        return "test", i
    return None

  def _from_archive(self, archive: Path) -> list[tuple[str, str, str, bytes]]:
    items = []
    seen_test = set()
    try:
      with tarfile.open(archive, "r|*") as tf:
        for m in tf:
          if not m.isfile() or not m.name.lower().endswith(IMAGE_EXTENSIONS):
            continue
          parts = PurePosixPath(m.name).parts
          where = self._split_of(parts)
          if where is None or len(parts) < where[1] + 3:
            continue
          split, i = where
          if split == "test":
            seen_test.add(parts[i])
          items.append((split, parts[i + 1], "/".join(parts[i + 2:]), tf.extractfile(m).read()))
    except (tarfile.TarError, OSError, EOFError) as e:
      raise DatasetFormatError(f"{archive}: corrupted or truncated archive ({e})") from e
    if len(seen_test) > 1:
      raise DatasetFormatError(f"{archive}: several test folders {sorted(seen_test)}; keep one")
    return items

  def _from_folders(self, train: Path, test: Path) -> list[tuple[str, str, str, bytes]]:
    items = []
    for split, root in (("train", train), ("test", test)):
      for cls in sorted(os.listdir(root)):
        cdir = root / cls
        if not cdir.is_dir():
          continue
        for dirpath, _, files in os.walk(cdir):
          for f in files:
            if f.lower().endswith(IMAGE_EXTENSIONS):
              p = Path(dirpath) / f
              items.append((split, cls, p.relative_to(cdir).as_posix(), p.read_bytes()))
    return items

  # -- decoding ----------------------------------------------------------------------

  def read(self, paths, spec, strict_checksums=False):
    source = paths[0] if len(paths) == 1 else paths[0].parent
    items = self._from_archive(paths[0]) if len(paths) == 1 else self._from_folders(*paths)
    classes = sorted({c for s, c, _, _ in items if s == "train"})
    if not classes:
      raise DatasetFormatError(f"{source}: no images under {self.train_dir}/<class>/")
    if len(classes) != spec.num_classes:
      raise DatasetFormatError(
          f"{source}: found {len(classes)} class folders under {self.train_dir}/, "
          f"expected {spec.num_classes} for {spec.name}")
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({c for s, c, _, _ in items if s == "test"} - set(index))
    if unknown:
      raise DatasetFormatError(f"{source}: test class folders {unknown[:5]} have no train folder")
    items.sort(key=lambda it: (it[0], index[it[1]], it[2]))
    h, w, ch = spec.image_shape
    mode = "L" if ch == 1 else "RGB"
    out = []
    for split in ("train", "test"):
      sel = [it for it in items if it[0] == split]
      if not sel:
        raise DatasetFormatError(f"{source}: no {split} images found")
      x = np.empty((len(sel), h, w, ch), np.uint8)
      y = np.empty(len(sel), np.int64)
      for j, (_, cls, rel, blob) in enumerate(sel):
        try:
          img = np.asarray(Image.open(io.BytesIO(blob)).convert(mode))
        except (UnidentifiedImageError, OSError, ValueError) as e:
          raise DatasetFormatError(f"{source}: cannot decode {split}/{cls}/{rel}: {e}") from e
        if img.shape[:2] != (h, w):
          raise DatasetFormatError(
              f"{source}: {split}/{cls}/{rel} is {img.shape[1]}x{img.shape[0]}, expected {w}x{h}")
        x[j] = img.reshape(h, w, ch)
        y[j] = index[cls]
      out += [x, y]
    logger.info("%s: decoded %d train + %d test images from %s", spec.name, len(out[1]),
                len(out[3]), source)
    return ReadResult(*out, class_names=classes)

  def instructions(self, folder):
    arch = " or ".join(self.archives) if self.archives else "a .tar.gz"
    tests = "|".join(self.test_dirs)
    return (f"class folders {folder}/{self.train_dir}/<class>/*.png|jpg and "
            f"{folder}/{{{tests}}}/<class>/*, or {arch} holding them, in {folder}/")
