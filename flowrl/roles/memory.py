"""What a rank holds in memory: tensor bytes by kind, each storage counted once, and the RSS.

Used to compare placements (``cluster.placement=hybrid`` against one process per role): the
trainer's parameters, gradients and optimizer state; the generation engine's own weights (none
when it generates with the training parameters); the reference's weights. A storage reachable
from two places (a generator sharing the trainer's module) is counted once, under the first kind
that reaches it, in the order above.
"""

from __future__ import annotations

import contextlib
import resource
import time
from typing import Any, Callable, Iterable, Iterator

import torch

from flowrl.backends.interfaces import HasModel, HasOptimizer, OffloadsState
from flowrl.metrics import names as metric_names

__all__ = ["Residency", "peak_rss_bytes", "role_memory_bytes", "rss_bytes"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _modules(engine: Any) -> list[torch.nn.Module]:
    """The modules an engine holds (``model``: a module or a list of modules, e.g. megatron's
    virtual pipeline chunks)."""
    model = engine.model if isinstance(engine, HasModel) else None
    if isinstance(model, torch.nn.Module):
        return [model]
    if isinstance(model, (list, tuple)):
        return [m for m in model if isinstance(m, torch.nn.Module)]
    return []


def _optimizer_tensors(engine: Any) -> Iterable[torch.Tensor]:
    optimizer = engine.optimizer if isinstance(engine, HasOptimizer) else None
    state = getattr(optimizer, "state", None)
    if not isinstance(state, dict):
        return []
    return [v for per_param in state.values() for v in per_param.values() if isinstance(v, torch.Tensor)]


class _Counter:
    def __init__(self) -> None:
        self.seen: set[int] = set()

    def bytes(self, tensors: Iterable[torch.Tensor]) -> int:
        total = 0
        for t in tensors:
            t = _local(t.detach())
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if t.numel() == 0 or key in self.seen:
                continue
            self.seen.add(key)
            total += storage.nbytes()
        return total


def role_memory_bytes(policy: Any = None, rollout: Any = None, ref: Any = None) -> dict[str, int]:
    """Tensor bytes of a rank's roles (any may be None): ``params``, ``grads``, ``optim`` of the
    policy's engine, ``generation`` (the rollout engine's weights not already counted), ``ref``."""
    count = _Counter()
    engine = getattr(policy, "engine", None)
    modules = _modules(engine)
    out = {
        "params": count.bytes(p for m in modules for p in m.parameters()),
        "grads": count.bytes(p.grad for m in modules for p in m.parameters() if p.grad is not None),
        "optim": count.bytes(_optimizer_tensors(engine)),
    }
    gen = getattr(rollout, "engine", None)
    out["generation"] = count.bytes(p for m in _modules(gen) for p in m.parameters())
    out["ref"] = count.bytes(p for m in _modules(getattr(ref, "engine", None)) for p in m.parameters())
    return out


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``getrusage``: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Residency:
    """When a trainer's state is on its device: only inside its own phases, when its engine
    offloads (verl's hybrid-engine pattern: ``load_fsdp_model_to_gpu`` before ``update_actor``,
    ``compute_log_prob`` and the weight export, ``offload_fsdp_model_to_cpu`` after them), so in
    the colocated and hybrid placements the generation engine on the same GPU has the memory.

    The state leaves the device once built (:meth:`release`), comes back for a phase
    (``with residency.resident(optimizer=...)``: the optimizer state only for an update) and
    leaves again after it; nested phases move nothing more. An engine that does not offload (or
    with both switches off) is never called. :meth:`take_metrics` gives the seconds spent moving
    (``perf/actor_offload_s``, ``perf/actor_onload_s``) since it was last asked."""

    def __init__(self, engine: Any, *, clock: Callable[[], float] = time.perf_counter,
                 names: tuple[str, str] = (metric_names.ACTOR_OFFLOAD_S, metric_names.ACTOR_ONLOAD_S)) -> None:
        self.engine = engine
        self.active = isinstance(engine, OffloadsState) and bool(engine.offloads)
        self._clock, self._names = clock, names
        self._depth = 0
        self._seconds = [0.0, 0.0]  # offload, onload

    def _timed(self, which: int, fn: Callable[[], None]) -> None:
        start = self._clock()
        fn()
        self._seconds[which] += self._clock() - start

    def release(self) -> None:
        """Outside any phase: the state to the host (after the engine is built or restored)."""
        if self.active and self._depth == 0:
            self._timed(0, self.engine.offload_state)

    @contextlib.contextmanager
    def resident(self, *, optimizer: bool = False) -> Iterator[None]:
        """The state on the device for the block (the optimizer state too with ``optimizer``)."""
        if not self.active or self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._timed(1, lambda: self.engine.onload_state(optimizer=optimizer))
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            self._timed(0, self.engine.offload_state)

    def take_metrics(self) -> dict[str, float]:
        """The moving seconds since the last call, by metric name; empty when nothing offloads."""
        if not self.active:
            return {}
        out = dict(zip(self._names, self._seconds))
        self._seconds = [0.0, 0.0]
        return out
