"""Aggregation rules: pure functions of stacked updates ``[C, ...]``, weights ``[C]`` and a validity mask ``[C]``.

``weighted_mean(updates, weights)`` is the bare FedAvg kernel. Robust rules are
:class:`Aggregator` objects (``make_aggregator(name, num_clients=None, **params)``
/ ``aggregator_from_config(cfg)``) whose ``aggregate(updates, weights, mask, key,
context)`` returns an :class:`AggregateResult` (update, per-client weights,
flagged clients, diagnostics). Conventions (validity, NaN/Inf screening): ``base.py``. ``weighting.py``: the
run's ``server.weighting`` (samples, uniform, FedVSA's value-sensitive softmax) replaces the client average of the
rules that declare one (``Aggregator.averaging``: mean, krum, multi_krum, zeno, dnc; weighted rfa).

| name | params (default) | paper-code flags (spec section) |
|---|---|---|
| mean | weighted (True) | weighted=False: FedCC's uniform FedAvg (fedcc §3) |
| median | even ("mean") | even="lower": torch.median, FedCC code (fedcc §3) |
| trimmed_mean | beta xor num_trimmed | FedCAP: num_trimmed=floor(M/2) (fedcap §3) |
| krum | num_byzantine | distance="fedcc" sqrt(sum d^4), count_self=True (fedcc §3) |
| multi_krum | num_byzantine, m (n-f), weighted (False) | distance, count_self as krum |
| bulyan | num_byzantine | strict=False clamps beta>=1 (fedcc §3), count_self |
| rfa / geometric_median | max_iter (100), tol (1e-6), smoothing (1e-6), weighted (True) | per_layer=True, weighted=False: FedCAP artifact (fedcap §3, §6.17) |
| centered_clipping | tau (10), iters (1), weighted (False) | reference: context["reference"] (else 0) |
| norm_clipping | max_norm, weighted (True) | |
| fltrust | eps (0) | eps=1e-9: FedCAP code's denominator (fedcap §3); needs context["reference_update"] |
| clustered | weighted (True) | (FedCAP's ClusteredFL: complete linkage, larger cluster, fedcap §3) |
| flare | neighbor_frac (0.5), temperature (1), gamma (median heuristic), unbiased (True) | port_k_minus_one (fedcc §3); needs context["features"] |
| fedcc | similarity ("kernel_cka"), sigma (1), bandwidth ("nonzero_median"), debiased, mmd_gamma (1), tie_break, variant ("v2"), layer, weighted (False) | variant="v3_layerwise" (fedcc §1.9), compat_drop_zero_scores (§1.5), compat_benign_only (§1.10); needs context["penultimate_weights"] unless layer= |
| bucketing | inner, s (2) | fixed_seed: FedCAP's same permutation every round (fedcap §3) |
| gas | inner, p (1000), num_byzantine (inner's), permute (True) | |
| dnc | num_byzantine, c (1.0), niters (1), sub_dim (10000), weighted (False) | needs a key (coordinate sampling; fedvsa §3) |
| zeno | rho (5e-4), b (1), weighted (False) | synchronous Zeno++ (fedvsa §3); needs context["server_losses"] (server-held data) |
"""

from fedjax_robust.aggregators.base import AggregateResult, Aggregator, sanitize
from fedjax_robust.aggregators.clipping import make_centered_clipping, make_norm_clipping
from fedjax_robust.aggregators.clustered import make_clustered
from fedjax_robust.aggregators.coordinate import make_median, make_trimmed_mean
from fedjax_robust.aggregators.fedcc import make_fedcc
from fedjax_robust.aggregators.flare import make_flare
from fedjax_robust.aggregators.fltrust import make_fltrust
from fedjax_robust.aggregators.geometric_median import make_rfa
from fedjax_robust.aggregators.krum import make_bulyan, make_krum, make_multi_krum
from fedjax_robust.aggregators.mean import make_mean, weighted_mean
from fedjax_robust.aggregators.registry import AGGREGATORS, aggregator_from_config, make_aggregator
from fedjax_robust.aggregators.wrappers import make_bucketing, make_gas

__all__ = [
    "AGGREGATORS", "AggregateResult", "Aggregator", "aggregator_from_config", "make_aggregator", "make_bucketing",
    "make_bulyan", "make_centered_clipping", "make_clustered", "make_fedcc", "make_flare", "make_fltrust", "make_gas",
    "make_krum", "make_mean", "make_median", "make_multi_krum", "make_norm_clipping", "make_rfa", "make_trimmed_mean",
    "sanitize", "weighted_mean",
]
