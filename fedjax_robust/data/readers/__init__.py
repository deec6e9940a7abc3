"""Readers: one class per on-disk layout (IDX, CIFAR pickles, image folders, LEAF, sklearn, WISDM raw)."""

from fedjax_robust.data.readers.base import ReadResult, Reader
from fedjax_robust.data.readers.cifar_pickle import CifarPickleReader
from fedjax_robust.data.readers.idx import IdxReader, parse_idx
from fedjax_robust.data.readers.image_folder import ImageFolderReader
from fedjax_robust.data.readers.leaf import LeafJsonReader
from fedjax_robust.data.readers.sklearn_digits import SklearnDigitsReader
from fedjax_robust.data.readers.wisdm import WISDM_ACTIVITIES, WisdmRawReader, parse_wisdm_lines

__all__ = ["ReadResult", "Reader", "CifarPickleReader", "IdxReader", "parse_idx",
           "ImageFolderReader", "LeafJsonReader", "SklearnDigitsReader", "WISDM_ACTIVITIES",
           "WisdmRawReader", "parse_wisdm_lines"]
