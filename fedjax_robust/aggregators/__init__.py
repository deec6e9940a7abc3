"""Aggregation rules: pure functions of stacked updates ``[C, ...]``, weights ``[C]`` and a validity mask ``[C]``.

``weighted_mean(updates, weights)`` is the bare FedAvg kernel. Robust rules are
:class:`Aggregator` objects (``make_aggregator(name, **params)`` /
``aggregator_from_config(cfg)``) whose ``aggregate(updates, weights, mask, key,
context)`` returns an :class:`AggregateResult` (update, per-client weights,
flagged clients, diagnostics). See ``base.py`` for the shared conventions
(validity, NaN/Inf screening) and each module for its rule and paper-code flags.
"""

from fedjax_robust.aggregators.base import AggregateResult, Aggregator, sanitize
from fedjax_robust.aggregators.clipping import make_centered_clipping, make_norm_clipping
from fedjax_robust.aggregators.clustered import make_clustered
from fedjax_robust.aggregators.coordinate import make_median, make_trimmed_mean
from fedjax_robust.aggregators.flare import make_flare
from fedjax_robust.aggregators.fltrust import make_fltrust
from fedjax_robust.aggregators.geometric_median import make_rfa
from fedjax_robust.aggregators.krum import make_bulyan, make_krum, make_multi_krum
from fedjax_robust.aggregators.mean import make_mean, weighted_mean
from fedjax_robust.aggregators.registry import AGGREGATORS, aggregator_from_config, make_aggregator
from fedjax_robust.aggregators.wrappers import make_bucketing, make_gas

__all__ = [
    "AGGREGATORS", "AggregateResult", "Aggregator", "aggregator_from_config", "make_aggregator", "make_bucketing",
    "make_bulyan", "make_centered_clipping", "make_clustered", "make_flare", "make_fltrust", "make_gas", "make_krum",
    "make_mean", "make_median", "make_multi_krum", "make_norm_clipping", "make_rfa", "make_trimmed_mean", "sanitize",
    "weighted_mean",
]
