"""Poisoned requests: the run's model attack acting on what a client SENDS TO ASK, not on its upload.

FedCAP (spec §2.3, the artifact's behaviour) lets a client outside the server's
pool send a request update ``r_k`` to get its customized model; a malicious
client poisons that request with the round's model attack before asking. The
algorithm only needs "what would this attacker send instead of ``r_k``": this
module builds that from the run's :class:`~fedjax_robust.attacks.ModelAttack`,
so the algorithm never imports an attack.

* Own-update attacks (sign flip, scaling, Gaussian, ...) act on the client's own
  request: :meth:`RequestPoisoner.own`.
* Pool-statistics attacks (LIE, IPM, Min-Max, Min-Sum, Fang) send the vector
  crafted from the server's valid calibrated pool, the pool's malicious members
  counted as the attackers (N, M counted there): :meth:`RequestPoisoner.from_pool`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_robust.attacks.base import ModelAttack, craft
from fedjax_robust.attacks.registry import OWN_UPDATE_ATTACKS


class RequestPoisoner(NamedTuple):
  """How a malicious client poisons a flat request vector.

  own(request [D], reference_params, key) -> [D]: an own-update attack on the client's own request.
  from_pool(pool [K, D], pool_valid [K], malicious [K], reference_params) -> [D]: the vector crafted from the pool.
  ``uses_own_request`` says which of the two the attack is.
  """

  name: str
  uses_own_request: bool
  own: Callable[[jax.Array, object, jax.Array], jax.Array]
  from_pool: Callable[[jax.Array, jax.Array, jax.Array, object], jax.Array]


def request_poisoner(attack: Optional[ModelAttack]) -> Optional[RequestPoisoner]:
  """The :class:`RequestPoisoner` of ``attack`` (``None`` for no attack or ``none``)."""
  if attack is None or attack.name == "none":
    return None

  def own(request, reference, key):
    return craft(attack, request[None], jnp.ones((1,), bool), key, {"global_params": reference})[0]

  def from_pool(pool, pool_valid, malicious, reference):
    flat = jnp.concatenate([pool, jnp.zeros_like(pool[:1])])
    mask = jnp.concatenate([pool_valid, jnp.zeros((1,), bool)])  # the request row is not in the reference
    mal = jnp.concatenate([jnp.asarray(malicious, bool), jnp.ones((1,), bool)])
    # The pool-statistics attacks are deterministic, so a fixed key is enough.
    return craft(attack, flat, mal, jax.random.key(0), {"mask": mask, "global_params": reference})[-1]

  return RequestPoisoner(attack.name, attack.name in OWN_UPDATE_ATTACKS, own, from_pool)
