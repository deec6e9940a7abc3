"""FedCC (Jeong et al., IEEE Access; arXiv 2212.01976 v2): kernel CKA of penultimate-layer weights, 1-D 2-means,
the majority cluster averaged. Spec: ``fedcc.md`` §1.

Per round, on the cohort's uploads (deltas ``u_i``; client model ``w_i = w_G + u_i``):

1. ``W_i`` = the client's penultimate Dense kernel, ``W_G`` the global model's, both as (out, in) rows (§1.2; the
   flax (in, out) kernel is transposed by :func:`~fedjax_robust.metrics.similarity.as_rows`). By default they come
   from the round context, ``context["penultimate_weights"]`` [C, in, out] and
   ``context["global_penultimate_weights"]``, which the engine computes because the rule declares
   ``needs=("penultimate_weights",)`` (``round_context.compute_needs``, layer = the model's ``penultimate``).
   With ``layer="fc1"`` the rule takes them from the uploads themselves (``context.global_params[layer]["kernel"]
   + updates[layer]["kernel"]``, or ``[layer]`` alone when that is a bare kernel leaf) and needs nothing from the
   engine; that also works inside bucketing, whose inner
   rule sees bucket means instead of clients.
2. ``s_i = similarity(W_G, W_i)`` for all clients in one batched call (``metrics/similarity.py``; default RBF kernel
   CKA with FedCC's median bandwidth, §1.3); NaN scores become 0 (§1.3 step 7).
3. Exact 1-D 2-means on the valid clients' scores (§1.4, :func:`two_means_1d`): sort, evaluate the SSE of every
   split between two *different* consecutive sorted scores, take the smallest SSE (smallest split on ties). The
   split never separates equal scores, so the clustering is permutation-invariant; with fewer than two distinct
   scores (one client, all scores equal within ``equal_tol``) there is one cluster and nobody is a suspect. This is
   the global optimum sklearn's ``KMeans(2)`` reaches when it converges there (Lloyd's iterations are not needed:
   there is nothing to terminate on ties).
4. Suspects = the smaller cluster (§1.5). Equal sizes: ``tie_break`` excludes ``"lower_mean"`` or
   ``"higher_mean"`` scores; the default excludes the cluster *less similar* to the global model (lower mean for
   similarities, higher mean for the distances ``mmd`` / ``euclidean``), the spec's deterministic choice.
5. ``variant="v2"`` (default, the paper): the plain unweighted mean of every leaf over the non-suspects
   (``weighted=True``: sample-weighted instead, not in the paper). ``variant="v3_layerwise"`` (the later revision
   in the official code, §1.9; never the default): ``p = softmax(s)`` over all valid clients, the penultimate
   layer (kernel and bias) gets ``p`` renormalised over the non-suspects, every other layer ``p`` over everyone,
   suspects included. Its layer is ``layer`` or, when not given, the only top-level entry of the update whose
   kernel has the shape of the engine's penultimate kernel.

Paper-vs-code switches (fedcc.md §1.5 and §1.10 "[Q]", off by default): ``compat_drop_zero_scores`` also drops
non-suspects whose score is exactly 0 (the old code keeps client i only if ``scale[i] != 0``);
``compat_benign_only`` hands FedCC only the benign clients, as the official untargeted notebook does (the
attackers' uploads never reach the rule; they get weight 0 and are flagged); it reads ``context["malicious"]``.

NaN/Inf: an upload with a non-finite entry, or a non-finite penultimate kernel in the context, is excluded and
flagged (``diagnostics["nonfinite"]``) like in every rule; it takes no part in the clustering. ``flagged`` =
suspects (and non-finite clients). ``diagnostics``: ``scores`` [C] (0 for invalid clients), ``suspects`` [C],
``low_cluster`` [C], ``single_cluster`` (bool), ``split`` (size of the low cluster; 0 with one cluster);
``penultimate_coeffs`` [C] for ``v3_layerwise``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import Aggregator, check_positive, combine, finish, normalize, prepare
import fedjax_robust.metrics.similarity as sim  # module import: similarity imports aggregators.order

VARIANTS = ("v2", "v3_layerwise")
TIE_BREAKS = ("lower_mean", "higher_mean")


def two_means_1d(scores: jax.Array, valid: Optional[jax.Array] = None, equal_tol: float = 1e-12):
  """Exact 2-means of the valid 1-D ``scores`` [C] (fedcc.md §1.4).

  Returns ``(low, high, single, split)``: [C] bool masks of the cluster of lower and of higher scores (both within
  ``valid``), whether there is only one cluster (then ``low`` is empty and ``high`` = every valid client), and the
  size of ``low``. Splits are only considered between two different consecutive sorted scores; among them the one
  with the smallest within-cluster sum of squares, the smallest on ties.
  """
  scores = jnp.asarray(scores, jnp.float32)
  c = scores.shape[0]
  valid = jnp.ones((c,), bool) if valid is None else jnp.asarray(valid, bool)
  n = jnp.sum(valid)
  order = jnp.argsort(jnp.where(valid, scores, jnp.inf), stable=True)
  ss = jnp.where(valid, scores, jnp.inf)[order]  # valid ascending, then +inf
  pos = jnp.arange(c)
  inside = pos < n
  nf = jnp.maximum(n, 1).astype(jnp.float32)
  x = jnp.where(inside, ss, 0.0)
  x = jnp.where(inside, x - jnp.sum(x) / nf, 0.0)  # centred: the SSEs below see differences, not 0.95 +- 1e-3
  k = jnp.arange(1, max(c, 2))  # left cluster size of each candidate split (static length c - 1)
  cs = jnp.cumsum(x)
  left_sum = cs[jnp.minimum(k - 1, c - 1)]
  kf = k.astype(jnp.float32)
  mu_l = left_sum / kf
  mu_r = (jnp.sum(x) - left_sum) / jnp.maximum(nf - kf, 1.0)
  dev = jnp.where(pos[None, :] < k[:, None], x[None, :] - mu_l[:, None], x[None, :] - mu_r[:, None])
  sse = jnp.sum(jnp.where(inside[None, :], dev * dev, 0.0), axis=1)
  nxt = ss[jnp.minimum(k, c - 1)]
  prev = ss[jnp.minimum(k - 1, c - 1)]
  boundary = (k < n) & (nxt > prev)
  sse = jnp.where(boundary, sse, jnp.inf)
  split = jnp.argmin(sse) + 1
  lo = jnp.min(jnp.where(valid, scores, jnp.inf))
  hi = jnp.max(jnp.where(valid, scores, -jnp.inf))
  single = ~jnp.any(boundary) | (hi - lo <= equal_tol)
  low_sorted = (pos < split) & ~single
  low = jnp.zeros((c,), bool).at[order].set(low_sorted) & valid
  return low, valid & ~low, single, jnp.where(single, 0, split).astype(jnp.int32)


def select_suspects(scores: jax.Array, low: jax.Array, high: jax.Array, single: jax.Array,
                    exclude_on_tie: str) -> jax.Array:
  """[C] bool: the smaller cluster; on equal sizes the one with the ``exclude_on_tie`` (lower/higher) mean."""
  if exclude_on_tie not in TIE_BREAKS:
    raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {exclude_on_tie!r}")
  n_low, n_high = jnp.sum(low), jnp.sum(high)
  # `low` holds the lower scores by construction, so its mean is the lower one.
  exclude_low = (n_low < n_high) | ((n_low == n_high) & (exclude_on_tie == "lower_mean"))
  return jnp.where(single, False, jnp.where(exclude_low, low, high))


def _kernel_of(tree, layer: str, what: str) -> jax.Array:
  """``tree[layer]["kernel"]``, or ``tree[layer]`` itself when that is an array (a bare kernel leaf)."""
  node = tree.get(layer) if isinstance(tree, Mapping) else None
  if isinstance(node, Mapping):
    node = node.get("kernel")
  if node is None:
    raise ValueError(f"fedcc: {what} has no layer {layer!r} with a 'kernel' (nor a leaf of that name)")
  return jnp.asarray(node, jnp.float32)


def _penultimate_from_updates(updates, global_params, layer: str):
  g = _kernel_of(global_params, layer, "context['global_params']")
  return g[None] + _kernel_of(updates, layer, "the update"), g


def _find_layer(updates, kernel_shape) -> str:
  if not isinstance(updates, Mapping):
    raise ValueError("fedcc v3_layerwise: the update is not a dict of layers; pass layer=...")
  found = [k for k, v in updates.items()
           if isinstance(v, Mapping) and "kernel" in v and tuple(jnp.shape(v["kernel"])[1:]) == tuple(kernel_shape)]
  if len(found) != 1:
    raise ValueError(f"fedcc v3_layerwise: cannot tell the penultimate layer from the kernel shape {kernel_shape} "
                     f"(candidates {found}); pass layer=...")
  return found[0]


def make_fedcc(similarity: str = "kernel_cka", sigma: float = 1.0, bandwidth: str = "nonzero_median",
               debiased: bool = False, mmd_gamma: float = 1.0, tie_break: Optional[str] = None,
               variant: str = "v2", layer: Optional[str] = None, weighted: bool = False, equal_tol: float = 1e-12,
               compat_drop_zero_scores: bool = False, compat_benign_only: bool = False,
               num_clients: Optional[int] = None) -> Aggregator:
  """FedCC (module docstring). ``similarity``: a name of ``metrics.similarity.SIMILARITIES`` (kernel_cka,
  linear_cka, mmd, cosine, euclidean); ``sigma`` / ``bandwidth`` / ``debiased``: kernel CKA's bandwidth multiplier,
  median rule and estimator (``debiased`` also for linear CKA); ``mmd_gamma``: MMD's RBF gamma."""
  del num_clients
  measure = sim.get_similarity(similarity)
  sigma = check_positive("fedcc: sigma", sigma)
  mmd_gamma = check_positive("fedcc: mmd_gamma", mmd_gamma)
  if bandwidth not in sim.BANDWIDTHS:
    raise ValueError(f"fedcc: bandwidth must be one of {sim.BANDWIDTHS}, got {bandwidth!r}")
  if variant not in VARIANTS:
    raise ValueError(f"fedcc: variant must be one of {VARIANTS}, got {variant!r}")
  if tie_break is None:
    tie_break = "lower_mean" if measure.higher_is_similar else "higher_mean"
  if tie_break not in TIE_BREAKS:
    raise ValueError(f"fedcc: tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
  if float(equal_tol) < 0:
    raise ValueError(f"fedcc: equal_tol must be >= 0, got {equal_tol}")
  all_params = {"sigma": sigma, "bandwidth": bandwidth, "debiased": bool(debiased), "gamma": mmd_gamma}
  params = {k: v for k, v in all_params.items() if k in measure.params}

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key
    context = context if context is not None else {}
    c = jax.tree.leaves(updates)[0].shape[0]
    if layer is not None:
      if context.get("global_params") is None:
        raise ValueError("fedcc with layer=... needs context['global_params'] (the global model)")
      kernels, g_kernel = _penultimate_from_updates(updates, context["global_params"], layer)
    else:
      if context.get("penultimate_weights") is None or context.get("global_penultimate_weights") is None:
        raise ValueError("fedcc needs context['penultimate_weights'] [C, in, out] and "
                         "context['global_penultimate_weights'] (the engine computes them for a model with a "
                         "`penultimate` layer), or layer=... with context['global_params']")
      kernels = jnp.asarray(context["penultimate_weights"], jnp.float32)
      g_kernel = jnp.asarray(context["global_penultimate_weights"], jnp.float32)
      if kernels.shape[0] != c or kernels.shape[1:] != g_kernel.shape:
        raise ValueError(f"fedcc: context['penultimate_weights'] {kernels.shape} does not match C={c} clients and "
                         f"the global kernel {g_kernel.shape} (inside a wrapper such as bucketing, pass layer=...)")
    base_mask = jnp.ones((c,), bool) if mask is None else jnp.asarray(mask, bool).reshape(c)
    if weights is not None:
      w = jnp.asarray(weights, jnp.float32).reshape(c)
      base_mask = base_mask & jnp.isfinite(w) & (w > 0)
    kernel_ok = jnp.all(jnp.isfinite(kernels.reshape(c, -1)), axis=1)
    p = prepare(updates, weights, base_mask & kernel_ok)
    p = p._replace(nonfinite=p.nonfinite | (base_mask & ~kernel_ok))  # a non-finite kernel counts as non-finite

    w_g = sim.as_rows(g_kernel)
    keep = p.valid.reshape((c,) + (1,) * (kernels.ndim - 1))
    w_c = jax.vmap(sim.as_rows)(jnp.where(keep, kernels, g_kernel[None]))  # invalid rows: finite placeholders
    raw = measure.batched(w_g, w_c, **params)
    scores = jnp.where(p.valid, jnp.nan_to_num(raw, nan=0.0, posinf=0.0, neginf=0.0), 0.0)

    pool = p.valid
    excluded = jnp.zeros((c,), bool)
    if compat_benign_only:
      malicious = context.get("malicious")
      if malicious is None:
        raise ValueError("fedcc compat_benign_only needs context['malicious'] (the round's attacker mask)")
      excluded = p.valid & jnp.asarray(malicious, bool).reshape(c)
      pool = p.valid & ~excluded

    low, high, single, split = two_means_1d(scores, pool, equal_tol)
    suspects = select_suspects(scores, low, high, single, tie_break)
    selected = pool & ~suspects
    if compat_drop_zero_scores:
      selected = selected & (scores != 0)
    flagged = (suspects | excluded | (pool & ~selected)) & p.valid
    diag = {"scores": scores, "suspects": suspects, "low_cluster": low, "single_cluster": single, "split": split}

    if variant == "v2":
      coeffs = selected.astype(jnp.float32) * (p.weights if weighted else 1.0)
      coeffs = normalize(coeffs)
      return finish(p, combine(coeffs, p.updates), coeffs, flagged, diag)

    # v3_layerwise (§1.9): softmax of the scores over the pool; the penultimate layer over the selected only.
    soft = jax.nn.softmax(jnp.where(pool, scores, -jnp.inf))
    soft = jnp.where(pool, soft, 0.0)
    q = normalize(jnp.where(selected, soft, 0.0))
    name = layer if layer is not None else _find_layer(updates, g_kernel.shape)
    if not isinstance(updates, Mapping) or name not in updates:
      raise ValueError(f"fedcc v3_layerwise: the update has no layer {name!r}")
    update = {k: combine(q if k == name else soft, v) for k, v in p.updates.items()}
    if not isinstance(p.updates, dict):
      update = type(p.updates)(update)
    diag["penultimate_coeffs"] = q
    return finish(p, update, soft, flagged, diag)

  return Aggregator("fedcc", aggregate, needs=() if layer is not None else ("penultimate_weights",))
