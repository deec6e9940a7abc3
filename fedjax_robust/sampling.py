"""Cohort samplers: which clients take part in a round (pluggable, traced, static cohort size).

A sampler is an object with ``sample(key, round, num_clients, cohort_size, eligible) -> [C] sorted ids``,
called inside the jitted round. ``eligible`` ([K] bool or None) comes from the algorithm's
``sampling_mask`` (FedCAP's option to stop drawing removed clients).

* :class:`UniformSampler` — a uniformly random subset (all clients when ``C = K``).
* :class:`ForcedSampler` — the same, but the clients listed for a round are always in it (FedVSA's
  model-replacement adversary forced in at rounds 10, 25, 50; spec §2): ``{round: ids}`` with 1-indexed
  rounds as the papers count them, the other slots drawn uniformly from the rest.
* :class:`StratifiedSampler` — exactly ``m`` attackers and ``C - m`` benign clients every round, each part
  uniform (FedCC's code: f = 30% of every round's participants, spec §2.6), from the run's attacker mask
  (``malicious``, an argument of the round like the data).

``sampler_from_config(cfg)`` builds one from ``config.sampler`` (``name``: ``uniform`` | ``forced`` |
``stratified``, ``forced``: ``"10:3,25:3"`` = client 3 at rounds 10 and 25, ``exclusive``: only then,
``attackers``: attackers per
round of ``stratified``, -1 = ``round(attack.fraction * C)``).
"""

from __future__ import annotations

from typing import Mapping, Optional, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def sample_cohort(key: jax.Array, num_clients: int, cohort_size: int,
                  eligible: Optional[jax.Array] = None, forced: Optional[jax.Array] = None) -> jax.Array:
  """A sorted, uniformly random subset of ``cohort_size`` client ids (all clients when equal).

  ``eligible`` ([K] bool): draw uniformly among these clients instead; when fewer than ``cohort_size`` are
  eligible, all of them are taken and the remaining slots go to ineligible clients (the cohort size is static).
  ``forced`` ([K] bool): these clients are in the cohort whatever ``eligible`` says (at most ``cohort_size``).
  """
  if cohort_size == num_clients:
    return jnp.arange(num_clients)
  if eligible is None and forced is None:
    return jnp.sort(jax.random.choice(key, num_clients, (cohort_size,), replace=False))
  # The top-k of i.i.d. noise is a uniform subset; the offset ranks every eligible client above every ineligible
  # one (Gumbel noise stays far inside ±1e4), so the ineligible are only filler, themselves drawn at random.
  noise = jax.random.gumbel(key, (num_clients,))
  score = noise
  if eligible is not None:
    score = score - 1e4 * (~jnp.asarray(eligible, bool))
  if forced is not None:
    score = score + 1e5 * jnp.asarray(forced, bool)
  return jnp.sort(jax.lax.top_k(score, cohort_size)[1])


class CohortSampler(Protocol):
  name: str

  def sample(self, key, round_index, num_clients: int, cohort_size: int, eligible=None,
             malicious=None) -> jax.Array:
    ...


class UniformSampler:
  """Uniform without replacement (the default)."""

  name = "uniform"

  def sample(self, key, round_index, num_clients: int, cohort_size: int, eligible=None,
             malicious=None) -> jax.Array:
    del round_index, malicious
    return sample_cohort(key, num_clients, cohort_size, eligible)


class StratifiedSampler:
  """``attackers`` malicious and ``C - attackers`` benign clients every round, each drawn uniformly.

  With fewer eligible clients of a kind than its slots, the rest of its slots go to the other kind (static
  cohort size). Without a malicious mask it is uniform."""

  name = "stratified"

  def __init__(self, attackers: int, cohort_size: int):
    if not 0 <= int(attackers) <= int(cohort_size):
      raise ValueError(f"stratified sampler: attackers per round must be in [0, {cohort_size}], got {attackers}")
    self.attackers = int(attackers)

  def sample(self, key, round_index, num_clients: int, cohort_size: int, eligible=None,
             malicious=None) -> jax.Array:
    del round_index
    if malicious is None or cohort_size == num_clients:
      return sample_cohort(key, num_clients, cohort_size, eligible)
    mal = jnp.asarray(malicious, bool)
    noise = jax.random.gumbel(key, (num_clients,))
    if eligible is not None:
      noise = noise - 1e4 * (~jnp.asarray(eligible, bool))
    # Rank every attacker first for the attacker slots, every benign client first for the others.
    take_mal = jax.lax.top_k(noise + 1e5 * mal, self.attackers)[1] if self.attackers else jnp.zeros((0,), jnp.int32)
    chosen = jnp.zeros((num_clients,), bool).at[take_mal].set(True)
    rest = jax.lax.top_k(noise + 1e5 * (~mal) - 1e6 * chosen, cohort_size - self.attackers)[1]
    return jnp.sort(jnp.concatenate([take_mal, rest]))


class ForcedSampler:
  """Uniform, with given clients forced into the cohort at given (1-indexed) rounds.

  ``exclusive``: the scheduled clients take part ONLY in their rounds (FedVSA's adversary, which attacks at
  rounds 10, 25, 50 and is otherwise absent, spec §2 [R]); otherwise they are also drawn like anyone else."""

  name = "forced"

  def __init__(self, schedule: Mapping[int, Sequence[int]], num_clients: int, cohort_size: int,
               exclusive: bool = False):
    self.exclusive = bool(exclusive)
    schedule = {int(r): sorted({int(i) for i in ids}) for r, ids in schedule.items()}
    bad_rounds = [r for r in schedule if r < 1]
    if bad_rounds:
      raise ValueError(f"forced sampler: rounds are 1-indexed, got {bad_rounds}")
    for r, ids in schedule.items():
      if any(not 0 <= i < num_clients for i in ids):
        raise ValueError(f"forced sampler: round {r} forces ids {ids}, not all in [0, {num_clients})")
      if len(ids) > cohort_size:
        raise ValueError(f"forced sampler: round {r} forces {len(ids)} clients into a cohort of {cohort_size}")
    self.schedule = schedule
    last = max(schedule, default=0)
    table = np.zeros((last + 1, num_clients), bool)  # row t: clients forced into round t (1-indexed)
    for r, ids in schedule.items():
      table[r, ids] = True
    self._table = table

  def sample(self, key, round_index, num_clients: int, cohort_size: int, eligible=None,
             malicious=None) -> jax.Array:
    del malicious
    table = jnp.asarray(self._table)
    t = jnp.asarray(round_index, jnp.int32) + 1  # round_index = completed rounds; this is round t
    forced = jnp.where(t < table.shape[0], table[jnp.minimum(t, table.shape[0] - 1)], False)
    if cohort_size == num_clients:
      return jnp.arange(num_clients)
    if self.exclusive:  # scheduled clients are not drawn outside their rounds
      absent = jnp.asarray(table.any(axis=0)) & ~forced
      eligible = ~absent if eligible is None else jnp.asarray(eligible, bool) & ~absent
    return sample_cohort(key, num_clients, cohort_size, eligible, forced)


SAMPLERS = ("uniform", "forced", "stratified")


def parse_schedule(text: str) -> dict[int, list[int]]:
  """``"10:3,25:3+7"`` -> ``{10: [3], 25: [3, 7]}``."""
  schedule: dict[int, list[int]] = {}
  for item in str(text or "").replace(" ", "").split(","):
    if not item:
      continue
    try:
      r, ids = item.split(":")
      schedule.setdefault(int(r), []).extend(int(i) for i in ids.split("+") if i)
    except ValueError:
      raise ValueError(f"sampler.forced must look like '10:3,25:3+7' (round:id+id,...), got {text!r}") from None
  return schedule


def sampler_from_config(cfg, num_clients: int, cohort_size: int, attack_fraction: float = 0.0):
  """``cfg``: ``{name: uniform|forced|stratified, forced: "round:ids,...", attackers: int}`` (or None: uniform);
  ``attack_fraction``: the run's share of attackers (``stratified`` with ``attackers=-1`` takes
  ``round(attack_fraction * cohort_size)`` per round)."""
  if cfg is None:
    return UniformSampler()
  name = str(cfg.get("name", "uniform"))
  if name == "uniform":
    if cfg.get("forced"):
      raise ValueError("sampler.forced is set but sampler.name='uniform'; use sampler.name='forced'")
    return UniformSampler()
  if name == "forced":
    schedule = parse_schedule(cfg.get("forced", ""))
    if not schedule:
      raise ValueError("sampler.name='forced' needs sampler.forced, e.g. '10:3,25:3'")
    return ForcedSampler(schedule, num_clients, cohort_size, exclusive=bool(cfg.get("exclusive", False)))
  if name == "stratified":
    attackers = int(cfg.get("attackers", -1))
    if attackers < 0:
      attackers = int(round(float(attack_fraction) * cohort_size))
    return StratifiedSampler(attackers, cohort_size)
  raise ValueError(f"unknown sampler {name!r}; choose one of {SAMPLERS}")
