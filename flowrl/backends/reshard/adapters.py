"""The LoRA weight sync: only the adapters travel (``model.lora_rank`` > 0 with a generation
backend that serves LoRA adapters itself, ``vllm``).

The generation engine reads the base weights once, at its start (``model.path``, the trainer's
frozen base), and after each update receives the adapters ``A``, ``B`` of every target module,
which it installs as its LoRA adapter (a new adapter id per sync:
:meth:`~flowrl.backends.generate.vllm.VLLMGenerator.load_lora`). A module peft trains whole
(``modules_to_save``, which vLLM's adapters do not take) travels with them under its plain name and
replaces the engine's base weight in place. Backends that take plain weights
only (``hf``) keep the merged weights ``W + (alpha/r) B A`` of the planned reshard
(:mod:`flowrl.backends.reshard.job`).

Transport (split placement, over the joint group ``actor+rollout``): every trainer rank gathers
the adapters whole (FSDP: an all-gather of their shards; dp: they are whole already), trainer rank
0 sends them as one flat buffer of the wire dtype to each replica's engine rank (generation ranks
``r % tp == 0``), which cuts it into tensors by :func:`~flowrl.backends.train.lora.adapter_layout`
(names and shapes derived on both ends from ``model.path`` and the LoRA settings, so no header
crosses the network). Per sync the network carries exactly the adapters' bytes per engine.

Devices: as every reshard transport (:mod:`flowrl.backends.reshard.exchange`), the flat buffer is
in host memory on both ends and travels over the gloo joint group: the sender casts its adapters
to the wire dtype on their device and copies them to the host (free on the CPU); an engine rank
receives into a host buffer and hands host tensors to its engine, whose loading copies them onto
its device (vLLM's LoRA manager takes host tensors).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from flowrl.catalog.backends import GEN_BACKENDS
from flowrl.comm.joint import JointSpec

__all__ = ["AdapterJob", "run_adapter_rank", "takes_adapters"]

ADAPTER_TAG = 1 << 21
"""Tag of the adapter messages on the joint group (the planned transport's tags are round numbers)."""


def takes_adapters(backend: str) -> bool:
    """Whether generation backend ``backend`` receives LoRA adapters rather than merged weights (its
    spec's ``adapter_sync``: it installs them itself, e.g. vLLM's ``enable_lora``)."""
    return GEN_BACKENDS.spec(backend).adapter_sync


@dataclass(frozen=True, kw_only=True)
class AdapterJob:
    """One adapter-only sync: trainer rank 0 -> every engine rank of the generation mesh."""

    model_path: str
    """The model whose adapters travel (names and shapes: ``adapter_layout``)."""
    lora: dict
    """The adapters' settings (``LoraSpec.to_dict()``)."""
    src_world_size: int
    dst_world_size: int
    dst_tp: int = 1
    """Generation tensor-parallel size: rank ``r`` holds an engine when ``r % dst_tp == 0``."""
    wire_dtype: str = "float32"
    joint: JointSpec | None = None
    """The joint group of both worker groups (its rendezvous address is filled in by the node)."""

    def __post_init__(self) -> None:
        if self.dst_tp < 1 or self.dst_world_size % self.dst_tp:
            raise ValueError(f"AdapterJob: dst_tp={self.dst_tp} must divide dst_world_size={self.dst_world_size}")
        if self.joint is not None and self.joint.world_size != self.src_world_size + self.dst_world_size:
            raise ValueError(f"AdapterJob: joint group of {self.joint.world_size} ranks; the groups have "
                             f"{self.src_world_size} + {self.dst_world_size}")

    def receivers(self) -> list[int]:
        """Joint ranks of the engine ranks (generation ranks after the trainer's)."""
        return [self.src_world_size + r for r in range(0, self.dst_world_size, self.dst_tp)]

    def layout(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        from flowrl.backends.train.lora import adapter_layout

        return adapter_layout(self.model_path, self.lora)

    def adapter_bytes(self) -> int:
        """Bytes of one copy of the adapters in the wire dtype."""
        from flowrl.backends.interfaces import torch_dtype

        return sum(_numel(shape) for _, shape in self.layout()) * torch_dtype(self.wire_dtype).itemsize


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def run_adapter_rank(job: AdapterJob, *, src_rank: int | None = None, dst_rank: int | None = None,
                     adapters: Mapping[str, Any] | None = None, pg: Any = None) -> tuple[dict[str, float], dict | None]:
    """This process's part of ``job``: trainer rank ``src_rank`` (with ``adapters``: its trained
    tensors, whole, by the trainer's peft names) or generation rank ``dst_rank``. Returns the
    reshard statistics (those of :func:`flowrl.backends.reshard.exchange.run_rank`) and, on an
    engine rank, the received tensors by :func:`~flowrl.backends.train.lora.sync_names` (None
    elsewhere)."""
    import torch

    from flowrl.backends.interfaces import torch_dtype
    from flowrl.backends.reshard.wire import HOST, check_wire

    start = time.perf_counter()
    if (src_rank is None) == (dst_rank is None):
        raise ValueError("run_adapter_rank: give exactly one of src_rank and dst_rank")
    process = src_rank if src_rank is not None else job.src_world_size + dst_rank
    pg = pg if pg is not None else _process_group(job, process)
    wire = torch_dtype(job.wire_dtype)
    layout = job.layout()
    nbytes = job.adapter_bytes()
    out = {"bytes_sent": 0, "bytes_received": 0, "bytes_local": 0, "peak_extra_bytes": 0, "bytes_min": 0,
           "model_bytes": nbytes, "process": process}
    received = None
    if src_rank == 0:
        flat = _flatten(layout, adapters or {}, wire)
        works = [pg.send([check_wire(flat, "send")], p, ADAPTER_TAG) for p in job.receivers()]
        for work in works:
            work.wait()
        out["bytes_sent"] = flat.nbytes * len(works)
        out["peak_extra_bytes"] = flat.nbytes
    elif process in job.receivers():
        flat = torch.empty(nbytes // wire.itemsize, dtype=wire, device=HOST)
        pg.recv([check_wire(flat, "receive")], 0, ADAPTER_TAG).wait()
        received, at = {}, 0
        for name, shape in layout:
            n = _numel(shape)
            received[name] = flat[at:at + n].view(shape)
            at += n
        out.update(bytes_received=flat.nbytes, bytes_min=flat.nbytes, peak_extra_bytes=flat.nbytes)
    out["seconds"] = time.perf_counter() - start
    return out, received


def _flatten(layout: tuple[tuple[str, tuple[int, ...]], ...], adapters: Mapping[str, Any], wire: Any) -> Any:
    """The adapters in ``layout`` order as one flat host tensor of dtype ``wire`` (each cast on its
    device, then copied to the host); ValueError when they are not the layout's (other names,
    other shapes)."""
    import torch

    from flowrl.backends.reshard.wire import HOST

    from flowrl.backends.train.lora import sync_names

    tensors = sync_names(adapters)
    want = dict(layout)
    if set(tensors) != set(want):
        missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
        raise ValueError(f"LoRA sync: the trainer's adapters are not those of model.path with these LoRA "
                         f"settings (missing {missing[:3]}, unexpected {extra[:3]})")
    for name, shape in layout:
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"LoRA sync: adapter {name} has shape {tuple(tensors[name].shape)}, the layout {shape}")
    return torch.cat([tensors[name].detach().reshape(-1).to(wire).to(HOST) for name, _ in layout])


def _process_group(job: AdapterJob, process: int) -> Any:
    from flowrl.comm import joint

    if job.joint is None or not job.joint.host:
        raise ValueError("AdapterJob.joint has no rendezvous address; the reshard node fills it in (nodes.reshard)")
    return joint.join(job.joint, process)
