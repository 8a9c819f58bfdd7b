"""Shard keys of a mesh: which ranks of a ``ParallelDims`` (``flowrl.parallel.mesh``) hold the same
parameters. A mixin of ``ParallelDims``, kept apart so each module stays readable.

A rank's parameters are fixed by its shard key: ``(tp_rank, pp_rank)`` when the experts follow
the dense layout (ep = 1, etp = tp), else ``(tp_rank, pp_rank, ep_rank, etp_rank)``, the expert
coordinates as megatron-core's expert ``RankGenerator`` assigns them (etp fastest, then ep). Within
a stage the key is a function of ``rank mod L``, ``L = lcm(tp, etp * ep)``, so every key is held
by the same number of replicas, ``world / (pp * L)`` (dp when ep = 1 and etp = tp).
Pure code: no torch, no I/O.
"""

from __future__ import annotations

import math

__all__ = ["ShardKeys"]


class ShardKeys:
    """Shard-key arithmetic over ``tp``, ``pp``, ``ep``, ``expert_tp``, ``expert_keys`` and
    ``world_size`` (provided by ``ParallelDims``); caches live in the instance's ``__dict__``."""

    @property
    def key_period(self) -> int:
        """``L``: within a stage, a rank's shard key is a function of ``rank mod L`` (module doc)."""
        period = self.__dict__.get("_period")
        if period is None:
            period = math.lcm(self.tp, self.expert_tp * self.ep) if self.expert_keys else self.tp
            object.__setattr__(self, "_period", period)
        return period

    @property
    def num_replicas(self) -> int:
        """Ranks holding each shard key: world / (pp * L) (dp when ep = 1 and etp = tp)."""
        return self.world_size // (self.pp * self.key_period)

    def _key_at(self, r: int, pp_rank: int) -> tuple[int, ...]:
        if not self.expert_keys:
            return (r % self.tp, pp_rank)
        etp = self.expert_tp
        return (r % self.tp, pp_rank, (r // etp) % self.ep, r % etp)

    def shard_key(self, rank: int) -> tuple[int, ...]:
        """The shard key of a global rank (module doc): ranks with one key hold the same tensors."""
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} must be an integer in [0, {self.world_size})")
        stage = self.world_size // self.pp
        return self._key_at(rank % stage, rank // stage)

    def shard_replica(self, rank: int) -> int:
        """Which replica of its shard key ``rank`` is (0 .. num_replicas - 1, in rank order)."""
        return (rank % (self.world_size // self.pp)) // self.key_period

    @property
    def _key_residues(self) -> dict[tuple[int, ...], int]:
        """Shard key without its pp_rank -> its first rank within a stage (cached)."""
        cache = self.__dict__.get("_residues")
        if cache is None:
            cache = {}
            for r in range(self.key_period):
                key = self._key_at(r, 0)
                cache[key[:1] + key[2:]] = r
            object.__setattr__(self, "_residues", cache)
        return cache

    @property
    def _key_first(self) -> dict[tuple[int, ...], int]:
        """Shard key -> its first (replica 0) global rank (cached)."""
        cache = self.__dict__.get("_first")
        if cache is None:
            stage = self.world_size // self.pp
            cache = {self._key_at(r, p): p * stage + r
                     for p in range(self.pp) for r in range(self.key_period)}
            object.__setattr__(self, "_first", cache)
        return cache

    def shard_rank(self, key: tuple[int, ...], replica: int) -> int:
        """The global rank of replica ``replica`` of shard key ``key`` (inverse of ``shard_key``
        and ``shard_replica``)."""
        return self._key_first[key] + replica * self.key_period

    def shard_key_index(self, key: tuple[int, ...]) -> int:
        """A number per shard key, ``r0 + L * pp_rank`` (``tp_rank + tp * pp_rank`` when the keys
        carry no expert coordinates), ``r0`` the key's first rank within its stage."""
        return self._key_first[key] % (self.world_size // self.pp) + self.key_period * key[1]

    def shard_keys(self) -> list[tuple[int, ...]]:
        """Every shard key, in the order of their first ranks."""
        stage = self.world_size // self.pp
        return [self.shard_key(p * stage + r) for p in range(self.pp) for r in range(self.key_period)]
