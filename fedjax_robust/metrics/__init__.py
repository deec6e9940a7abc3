"""Metrics computed on device: accuracy over padded client test splits and global test sets."""

from fedjax_robust.metrics.accuracy import count_correct

__all__ = ["count_correct"]
