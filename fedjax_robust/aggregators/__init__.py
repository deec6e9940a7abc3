"""Aggregation rules: pure functions of stacked updates ``[C, ...]`` and weights."""

from fedjax_robust.aggregators.mean import weighted_mean

__all__ = ["weighted_mean"]
