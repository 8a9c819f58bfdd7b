"""The hybrid engine (``cluster.placement=hybrid``): one process per rank holds the trainer, the
generation engine and the reference, as verl's ``ActorRolloutRefWorker`` does.

:class:`HybridRole` builds the parts the run's group specs name (``actor``: ``PolicyRole``,
``rollout``: ``RolloutRole``, ``ref``: ``ReferenceRole``) in this one process. The run reaches
them through views of the fused worker group (``WorkerGroup.view``: the ``rollout`` view's
``generate`` is ``role.rollout.generate`` here), so the graph families call ``rollout``,
``actor`` and ``ref`` as ever, and every call of the three runs in the order the graph reserved.

Weights, by layout:

- **the same layout** (a train engine whose ``generation_module()`` is a full HF module, e.g.
  ``dp``, and an in-place generation backend of the same shard style, e.g. ``hf``): the
  generation engine generates with the training module itself. There is no second copy of the
  weights and the weight sync moves nothing (``reshard/bytes`` 0, no copy at all);
- **different layouts** (megatron TP/PP shards, FSDP's sharded parameters -> a full HF model):
  the generation engine holds its own weights, and the reshard runs colocated over the group's
  own process group: local slices copied in place, only what this rank lacks received from the
  other ranks (``flowrl.parallel.reshard_plan.micro_dp_placement``).

Each call of a part first sets ``torch.set_num_threads`` to the rank's thread budget (every
core the rank's share of the machine has), so each phase, generation or training, uses them all.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from typing import TYPE_CHECKING, Any, Iterator

import torch

from flowrl.backends.interfaces import HasGenerationModule
from flowrl.catalog.backends import GEN_BACKENDS, ReshardMode, ShardStyle
from flowrl.registry import import_string
from flowrl.roles.memory import rss_bytes
from flowrl.roles.rollout import RolloutRole

if TYPE_CHECKING:
    from flowrl.backends.reshard import AdapterJob, ReshardJob

__all__ = ["HybridRole", "SharedRollout"]


class PhaseMemory:
    """The most memory each phase of this rank (``rollout``: generation, ``actor``: training and
    its log-probs, ``ref``, ``sync``: the weight sync) reached since the last report: on a GPU the
    larger of torch's peak allocation during the call and the device's use at its end (vLLM's
    pools included); on the CPU the process's resident memory at the call's end (the OS keeps only
    a lifetime peak). Reported with each weight sync as ``perf/hybrid_<phase>_peak_mem_bytes``."""

    def __init__(self, device: str) -> None:
        self.cuda = str(device).startswith("cuda")
        self.peaks: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            self.peaks[name] = max(self.peaks.get(name, 0), self._now())

    def _now(self) -> int:
        if self.cuda:
            free, total = torch.cuda.mem_get_info()
            return max(torch.cuda.max_memory_allocated(), total - free)
        return rss_bytes()

    def metrics(self) -> dict[str, float]:
        """The phases' peaks since the last report (then forgotten)."""
        out = {f"perf/hybrid_{name}_peak_mem_bytes": float(v) for name, v in sorted(self.peaks.items())}
        self.peaks = {}
        return out


class _Phase:
    """A part of the hybrid role whose method calls first give torch the rank's thread budget,
    and count toward the part's memory peak."""

    def __init__(self, role: Any, num_threads: int, memory: PhaseMemory | None = None, name: str = "") -> None:
        self.inner = role
        self._num_threads = num_threads
        self._memory, self._name = memory, name

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            torch.set_num_threads(self._num_threads)
            if self._memory is None:
                return attr(*args, **kwargs)
            with self._memory.phase(self._name):
                return attr(*args, **kwargs)

        return call


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """``module`` in eval mode (no dropout) for the block, its training mode restored after."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


class SharedRollout(RolloutRole):
    """A ``RolloutRole`` whose engine generates with the trainer's own module (the same layout):
    the weights are the training parameters, so loading or resharding them is a no-op."""

    def __init__(self, *, module: torch.nn.Module, engine_kwargs: dict | None = None, **kwargs: Any) -> None:
        super().__init__(engine_kwargs={**(engine_kwargs or {}), "model": module}, **kwargs)
        self.module = module

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with _eval_mode(self.module):
            return super().generate(*args, **kwargs)

    def compute_logprobs(self, *args: Any, **kwargs: Any) -> Any:
        with _eval_mode(self.module):
            return super().compute_logprobs(*args, **kwargs)

    def load_hf_state(self, state: dict) -> None:
        """Nothing to load: the generation weights are the trainer's (restored by its checkpoint)."""


def shares_layout(train_engine: Any, backend: str, tensor_model_parallel_size: int) -> torch.nn.Module | None:
    """The trainer's live HF module when generation can run on it (its ``generation_module()``
    returns one whose parameters are whole on this rank, the generation backend writes weights
    in place in the same shard style and generation is not tensor parallel); None: the
    generation engine needs weights of its own."""
    spec = GEN_BACKENDS.spec(backend)
    if (not isinstance(train_engine, HasGenerationModule) or spec.reshard is not ReshardMode.IN_PLACE
            or tensor_model_parallel_size != 1):
        return None
    module = train_engine.generation_module()
    if module is None or spec.shard_style is not ShardStyle.HF:
        return None
    from torch.distributed.tensor import DTensor

    # every parameter whole on this rank (FSDP's sharded DTensors are not: it gathers in a reshard)
    return None if any(isinstance(p, DTensor) for p in module.parameters()) else module


class HybridRole:
    """One rank of the fused ``actor_rollout_ref`` group. ``parts``: part name -> (role class by
    import string, its keyword arguments), as the separate groups' specs would build them.
    The run places the parts themselves (each part's kwargs carry the rank's ``device`` and
    dtype); a ``device`` or ``dtype`` given here instead (None: not given) goes to every part."""

    def __init__(self, *, rank: int, world_size: int, parts: dict[str, tuple[str, dict]], num_threads: int = 1,
                 device: str | None = None, dtype: str | None = None) -> None:
        self.rank, self.world_size, self.num_threads = rank, world_size, max(1, int(num_threads))
        placed = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
        parts = {name: (cls, {**kwargs, **placed}) for name, (cls, kwargs) in parts.items()}
        torch.set_num_threads(self.num_threads)
        missing = {"actor", "rollout"} - set(parts)
        if missing:
            raise ValueError(f"HybridRole needs the actor and rollout parts, missing {sorted(missing)}")
        rollout_cls, rollout_kwargs = parts["rollout"]
        spec = GEN_BACKENDS.spec(rollout_kwargs.get("backend", "hf"))
        if spec.library is not None:  # its code is not the engine's memory
            importlib.import_module(spec.library)
        self._rss_base = rss_bytes()
        """The process's resident memory with its libraries loaded and nothing built (CPU)."""
        policy = self._build(parts["actor"])
        module = shares_layout(policy.engine, rollout_kwargs.get("backend", "hf"),
                               rollout_kwargs.get("tensor_model_parallel_size", 1))
        if module is not None:
            rollout = SharedRollout(rank=rank, world_size=world_size, module=module, **rollout_kwargs)
        elif spec.joins_trainer_group and not spec.in_process:  # vLLM: its tp group of these processes
            rollout = self._build((rollout_cls, {**rollout_kwargs, "in_trainer_group": True}))
        else:
            rollout = self._build(parts["rollout"])
        self.shared = module is not None
        """Whether generation runs on the training parameters themselves (no copy, no sync)."""
        self.memory = PhaseMemory(getattr(rollout, "device", "cpu"))
        self.actor = _Phase(policy, self.num_threads, self.memory, "actor")
        self.rollout = _Phase(rollout, self.num_threads, self.memory, "rollout")
        self.ref = _Phase(self._build(parts["ref"]), self.num_threads, self.memory, "ref") if "ref" in parts else None

    def _build(self, part: tuple[str, dict]) -> Any:
        role_cls, kwargs = part
        return import_string(role_cls)(rank=self.rank, world_size=self.world_size, **kwargs)

    # ----------------------------------------------------------------- weight sync
    def reshard(self, job: "ReshardJob", fingerprint: bool = False) -> dict:
        """The weight sync of a colocated ``job`` (trainer shards -> this group's generation
        engines; this rank is process ``rank``): nothing to do when generation reads the training
        parameters, else this rank's part of the plan over the group's own process group. Given
        a split job, this group is the sending side, as a ``PolicyRole`` group is. ``fingerprint``:
        with this rank's fingerprints of both sides (``trainer.checks.weight_sync``) and its engine's
        probe log-probs (``trainer.checks.engine_moved``)."""
        torch.set_num_threads(self.num_threads)
        stats = self._sync(job, fingerprint)
        engine = getattr(self.rollout.inner, "engine", None)
        written = getattr(job, "placement", None) is None or job.placement.kind == "colocated"  # this engine took it
        if fingerprint and written and engine is not None and not self.shared:  # trainer.checks.engine_moved
            from flowrl.checks.sync import probe_logp

            stats["probe_logp"] = probe_logp(engine)
        return stats

    def _sync(self, job: "ReshardJob | AdapterJob", fingerprint: bool) -> dict:
        if not hasattr(job, "placement"):  # an AdapterJob: LoRA into the engine in this process
            return self._adapters(job, fingerprint)
        placement = job.placement
        if placement.kind != "colocated":
            return self.actor.reshard(job, fingerprint=fingerprint)
        if getattr(self.rollout.inner, "in_trainer_group", False):
            from flowrl.backends.interfaces import torch_dtype
            from flowrl.backends.reshard.engine_load import load_into_engine

            rollout = self.rollout.inner
            # the trainer's offloaded state (fsdp_config / megatron param_offload) on its device for the load
            with self.memory.phase("sync"), self.actor.inner.residency.resident():
                stats = load_into_engine(job, rank=self.rank, world_size=self.world_size, train_engine=self.actor.inner.engine,
                                         engine=rollout.engine, dtype=torch_dtype(rollout.dtype),
                                         device=rollout.device)
            return {**stats, **self.budget_metrics(), **self.memory.metrics()}
        if self.shared:
            start = time.perf_counter()
            return {"bytes_sent": 0, "bytes_received": 0, "bytes_local": 0, "peak_extra_bytes": 0,
                    "bytes_min": job.min_bytes(self.rank), "model_bytes": job.specs()[1].num_params * job.bytes_per_element,
                    "process": self.rank, "seconds": time.perf_counter() - start}
        from flowrl.backends.reshard import run_rank
        from flowrl.checks import fingerprint as fp

        src_rank = placement.src.index(self.rank) if self.rank in placement.src else None
        dst_rank = placement.dst.index(self.rank) if self.rank in placement.dst else None
        with self.actor.inner.residency.resident():  # the source's shards on the device for the send
            src, dst = self.actor.inner.engine.reshard_source(), self.rollout.inner.engine.reshard_target()
            stats = run_rank(job, src_rank=src_rank, dst_rank=dst_rank, src=src, dst=dst)
            if not fingerprint:
                return stats
            return fp.attach(stats, fp.source_report(job, src_rank, src) if src_rank is not None else None,
                             fp.target_report(job, dst_rank, dst, engine=self.rollout.inner.engine)
                             if dst_rank is not None else None)

    def _adapters(self, job: "AdapterJob", fingerprint: bool) -> dict:
        """LoRA with the engine in this process (vLLM's external launcher): every rank takes the
        trainer's adapters whole (FSDP gathers them, every rank calls) and installs them in its own
        engine shard, which slices them for its tensor-parallel rank; nothing crosses processes.
        Modules peft trains whole (``modules_to_save``) replace the engine's plain weights."""
        from flowrl.backends.train.lora import sync_names
        from flowrl.checks import fingerprint as fp
        from flowrl.models.lora import is_adapter

        start = time.perf_counter()
        with self.memory.phase("sync"), self.actor.inner.residency.resident():
            adapters = sync_names(self.actor.inner.adapters_whole())
            engine = self.rollout.inner.engine
            whole = {k: v for k, v in adapters.items() if not is_adapter(k)}
            if whole:
                engine.load_hf_state(whole)
            engine.load_lora({k: v for k, v in adapters.items() if is_adapter(k)})
        nbytes = sum(t.numel() * t.element_size() for t in adapters.values())
        stats = {"bytes_sent": 0, "bytes_received": 0, "bytes_local": nbytes, "peak_extra_bytes": nbytes,
                 "bytes_min": 0, "model_bytes": job.adapter_bytes(), "process": self.rank,
                 "seconds": time.perf_counter() - start, **self.budget_metrics(), **self.memory.metrics()}
        if not fingerprint:
            return stats
        src = fp.adapter_source_report(job, adapters) if self.rank == 0 else None
        dst = fp.report("dst", self.rank, self.rank // job.dst_tp, fp.state_fingerprints(adapters),
                        dtype=job.wire_dtype)
        return fp.attach(stats, src, dst)

    def reshard_done(self) -> None:
        """The rollout side's turn of a hybrid weight sync: :meth:`reshard` (on the actor's
        turn) already wrote the generation weights in this process."""

    # ----------------------------------------------------------------- memory
    def budget_metrics(self) -> dict[str, float]:
        """This rank's peak since the last report against what the hybrid engine must hold: the
        trainer's state (parameters, gradients, optimizer) plus the engine's KV cache.
        ``perf/hybrid_peak_over_state_and_kv``: the largest phase peak (on the CPU less the
        process's memory before anything was built, libraries loaded) over that sum; the engine's
        own weights and workspaces, the staging and activations are the excess. With the parts,
        ``perf/hybrid_trainer_state_bytes`` and ``perf/hybrid_kv_cache_bytes`` (tensor bytes,
        each storage once). Empty before any phase ran or for an engine that does not report
        its memory."""
        from flowrl.parallel.hybrid_memory import BUDGET_METRICS
        from flowrl.roles.memory import role_memory_bytes

        engine = getattr(self.rollout.inner, "engine", None)
        report = getattr(engine, "memory_bytes", None)
        if not self.memory.peaks or not callable(report):
            return {}
        engine_bytes = report()
        held = role_memory_bytes(self.actor.inner)
        trainer = held["params"] + held["grads"] + held["optim"]
        peak = max(self.memory.peaks.values()) - (0 if self.memory.cuda else self._rss_base)
        budget = trainer + engine_bytes["kv_cache"]
        state, kv, ratio = BUDGET_METRICS
        return {state: float(trainer), kv: float(engine_bytes["kv_cache"]),
                ratio: peak / budget if budget else float("nan")}

    def memory_bytes(self) -> dict[str, int]:
        """Tensor bytes this rank holds, by kind, each storage counted once (shared generation
        weights are the parameters): ``params``, ``grads``, ``optim`` (the trainer's),
        ``generation`` (the generation engine's own weights: 0 when shared), ``ref``."""
        from flowrl.roles.memory import role_memory_bytes

        return role_memory_bytes(self.actor.inner, self.rollout.inner, self.ref.inner if self.ref else None)

    def close(self) -> None:
        for part in (self.rollout, self.ref, self.actor):
            if part is not None:
                part.close()
