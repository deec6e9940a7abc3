"""Metrics computed on device: accuracy over padded client test splits and global test sets."""

from fedjax_robust.metrics.accuracy import count_correct, count_correct_per_class

__all__ = ["count_correct", "count_correct_per_class"]
