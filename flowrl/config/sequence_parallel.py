"""The config rule of Ulysses sequence parallelism (``ulysses_sequence_parallel_size`` of actor,
ref and critic): a whole number that divides the group's ranks, on a strategy whose spec splits
sequences (``sequence_parallel`` in :mod:`flowrl.catalog.backends`). The engines are
``flowrl.backends.train.ulysses``'s."""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import BackendRegistry, either
from flowrl.config.errors import ConfigError

__all__ = ["MEGATRON_CP_REASON", "check_ulysses", "sequence_parallel_problem"]

MEGATRON_CP_REASON = (
    "megatron-core 0.16's context parallelism runs only inside Transformer Engine's attention "
    "(DotProductAttention with cp_comm_type; its local attention asserts context_parallel_size == 1), "
    "and Transformer Engine is not installed"
)
"""Why megatron's ``context_parallel_size`` is not built (verl's key is refused with it)."""


def sequence_parallel_problem(section: str, size: Any, strategy: str, data_parallel_size: int,
                              registry: BackendRegistry) -> tuple[str, str] | None:
    """``(problem, fix)`` for a group's ``ulysses_sequence_parallel_size``, or None: it is fine."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return "must be an integer >= 1", f"set {section}.ulysses_sequence_parallel_size=1 (off) or e.g. 2"
    if size == 1:
        return None
    splitting = registry.names_where(lambda s: s.sequence_parallel)
    if not registry.spec(strategy).sequence_parallel:
        return (f"Ulysses sequence parallelism runs in the {either(splitting)} strategies, not {strategy} "
                f"(megatron's context_parallel_size is not built either: {MEGATRON_CP_REASON})",
                f"set the strategy to {either(splitting)}, or {section}.ulysses_sequence_parallel_size=1")
    if data_parallel_size % size:
        return (f"must divide {section}.data_parallel_size={data_parallel_size} (groups of that many ranks split "
                "each sequence; verl: dp = world / sp)",
                f"set {section}.data_parallel_size to a multiple of {size}")
    return None


def check_ulysses(section: str, size: Any, strategy: str, data_parallel_size: int, registry: BackendRegistry,
                  key_prefix: str = "") -> None:
    """Raise :class:`ConfigError` for :func:`sequence_parallel_problem`; the key under ``key_prefix``
    (a section's own check: none, the loader places it)."""
    problem = sequence_parallel_problem(section, size, strategy, data_parallel_size, registry)
    if problem is not None:
        raise ConfigError(f"{key_prefix}ulysses_sequence_parallel_size", size, *problem)
