"""``rollout.free_cache_engine=auto`` (the default; verl's default is ``true``), resolved from the
config alone (pure: no I/O, no torch) before any worker starts, printed at start as batching
``auto`` is (:func:`describe_free_cache`).

``auto`` frees the engine's memory between generation and training (vLLM sleep: the KV cache
released, the weights parked; woken for the next weight sync and generation) exactly where the
engine shares the trainer's device memory and nothing needs it awake:

1. **An explicit value stays** (``true`` on an engine that cannot sleep, or with generation
   overlapping the update, is refused by the section's and the run's checks).
2. The generation backend can sleep (its spec's ``sleeps``: vllm; hf has nothing to free): else off.
3. The rollout group shares the trainer's devices: it is in the actor's pool (``hybrid``,
   ``colocated``, or declared pools that put them together): else off, the engine has devices of
   its own (``split``).
4. Generation does not overlap the update (``trainer.staleness`` 0 and ``async_mode`` not
   ``stream``): else off, the engine generates while the trainer runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS

__all__ = ["AUTO", "describe_free_cache", "free_cache_engine", "resolve_free_cache", "with_free_cache_resolved"]

AUTO = "auto"


def resolve_free_cache(cfg: Any) -> tuple[bool, str]:
    """``(free_cache_engine, why)`` of a ``RunConfig``: why is ``"set"`` for an explicit value,
    else ``"auto: <reason>"`` (see the module docstring)."""
    value = cfg.rollout.free_cache_engine
    if value != AUTO:
        return bool(value), "set"
    if not GEN_BACKENDS.spec(cfg.rollout.name).sleeps:
        return False, f"auto: rollout.name={cfg.rollout.name} has no engine memory to free"
    if not _shares_trainer_devices(cfg):
        return False, f"auto: placement {cfg.placement} gives the rollout devices of its own"
    t = cfg.trainer
    if t.staleness > 0 or t.async_mode == "stream":
        return False, "auto: generation overlaps the update (trainer.staleness / async_mode)"
    return True, f"auto: placement {cfg.placement} shares the trainer's devices with the engine"


def free_cache_engine(cfg: Any) -> bool:
    """The run's ``rollout.free_cache_engine`` with ``auto`` resolved."""
    return resolve_free_cache(cfg)[0]


def with_free_cache_resolved(cfg: Any) -> Any:
    """``cfg.rollout`` with ``free_cache_engine`` resolved to a bool (what the engines receive)."""
    value = free_cache_engine(cfg)
    return cfg.rollout if cfg.rollout.free_cache_engine is value else dataclasses.replace(
        cfg.rollout, free_cache_engine=value)


def describe_free_cache(cfg: Any) -> str:
    """The start line: ``rollout.free_cache_engine=True (auto: placement hybrid shares ...)``."""
    value, why = resolve_free_cache(cfg)
    return f"rollout.free_cache_engine={value}" + ("" if why == "set" else f" ({why})")


def _shares_trainer_devices(cfg: Any) -> bool:
    """The rollout group is in the actor's pool (one pool's groups share its devices:
    ``flowrl.config.devices.group_layouts``)."""
    from flowrl.config.pools import resolve_pools

    if cfg.placement == "hybrid":
        return True
    cluster = dataclasses.replace(cfg.cluster, placement=cfg.placement)
    pool_of = {g: p.name for p in resolve_pools(cluster, dict(cfg.worker_group_sizes)) for g in p.groups}
    return "rollout" in pool_of and pool_of.get("rollout") == pool_of.get("actor")
