"""ClusteredFL as a robust aggregator (Sattler et al.; FedCAP baseline, fedcap.md §3 "ClusteredFL").

Pairwise cosine distance ``1 - cos(u_i, u_j)`` (a zero / NaN cosine counts as
-1, i.e. distance 2: fedcap.md §6.20-21), agglomerative clustering with
*complete* linkage down to 2 clusters (sklearn ``AgglomerativeClustering(
n_clusters=2, linkage="complete", metric="precomputed")``), keep the **larger**
cluster and take its sample-weighted mean (``weighted=False``: uniform).

Exact merging runs as a ``fori_loop`` of ``C - 2`` steps on the ``C x C``
linkage matrix (O(C^3), negligible next to the Gram matrix). Ties:

* equal merge distances merge the pair with the smallest (row, column) index,
  as a deterministic stand-in for sklearn's order;
* equal cluster sizes: FedCAP's code keeps sklearn's label 0, an arbitrary
  label; here the cluster with the smaller diameter (max intra-cluster
  distance) is kept, then the one holding the lowest client index;
* ``n <= 2`` valid clients: nothing to split, all are kept.

``flagged`` = valid clients of the dropped cluster; ``diagnostics["cluster"]``
= 0 (kept), 1 (dropped), -1 (invalid).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_robust.aggregators.base import Aggregator, combine, finish, normalize, pairwise_cosine, prepare


def complete_linkage_two_clusters(dist: jax.Array, valid: jax.Array) -> jax.Array:
  """``[C]`` int32 cluster representatives (the smallest member index) after merging the valid points to 2 clusters."""
  c = dist.shape[0]
  eye = jnp.eye(c, dtype=bool)
  both = valid[:, None] & valid[None, :] & ~eye
  link = jnp.where(both, dist, jnp.inf)
  labels = jnp.where(valid, jnp.arange(c), -1)

  def step(_, carry):
    link, labels, active = carry
    n_active = jnp.sum(active)
    flat = jnp.argmin(link)
    a0, b0 = flat // c, flat % c
    a, b = jnp.minimum(a0, b0), jnp.maximum(a0, b0)
    go = (n_active > 2) & (a != b) & active[a] & active[b]
    merged = jnp.maximum(link[a], link[b])  # complete linkage
    new_link = link.at[a].set(merged).at[:, a].set(merged)
    new_link = new_link.at[b].set(jnp.inf).at[:, b].set(jnp.inf).at[a, a].set(jnp.inf)
    new_labels = jnp.where(labels == b, a, labels)
    new_active = active.at[b].set(False)
    return (jnp.where(go, new_link, link), jnp.where(go, new_labels, labels), jnp.where(go, new_active, active))

  _, labels, _ = jax.lax.fori_loop(0, max(c - 2, 0), step, (link, labels, valid))
  return labels


def make_clustered(weighted: bool = True, num_clients: Optional[int] = None) -> Aggregator:
  del num_clients

  def aggregate(updates, weights=None, mask=None, key=None, context=None):
    del key, context
    p = prepare(updates, weights, mask)
    dist = 1.0 - pairwise_cosine(p.updates)
    labels = complete_linkage_two_clusters(dist, p.valid)
    # the (at most) two surviving representatives: the smallest label and the largest label
    big = jnp.iinfo(jnp.int32).max
    r0 = jnp.min(jnp.where(p.valid, labels, big))
    r1 = jnp.max(jnp.where(p.valid, labels, -1))
    in0, in1 = p.valid & (labels == r0), p.valid & (labels == r1)
    size0, size1 = jnp.sum(in0), jnp.sum(in1)
    pair = in0[:, None] & in0[None, :]
    diam0 = jnp.max(jnp.where(pair, dist, -jnp.inf))
    pair = in1[:, None] & in1[None, :]
    diam1 = jnp.max(jnp.where(pair, dist, -jnp.inf))
    keep0 = (size0 > size1) | ((size0 == size1) & (diam0 <= diam1))
    keep = jnp.where(keep0, in0, in1)
    keep = jnp.where(p.n <= 2, p.valid, keep)
    coeffs = normalize(jnp.where(keep, p.weights if weighted else 1.0, 0.0))
    cluster = jnp.where(p.valid, jnp.where(keep, 0, 1), -1)
    return finish(p, combine(coeffs, p.updates), coeffs, p.valid & ~keep,
                  {"cluster": cluster})

  return Aggregator("clustered", aggregate)
