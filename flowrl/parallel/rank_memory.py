"""A trainer rank's GPU memory from a run's config: ``flowrl parallel-plan``'s memory model
(``layout_cost.train_memory``) applied to the layout the config names, and the keys that would
make it fit. Pure: no torch, no I/O (the model's shape and the GPU's memory are given).

What is counted, per GPU of the actor's fullest stage, during its update (the peak of the step):
the weights, gradients and optimizer state as ``train_memory`` counts them for the backend's
sharding (``TrainBackendSpec.fully_sharded``: every state over dp, one block gathered; else
megatron's layout: weights and gradients over tp x pp, the optimizer over dp too with
``use_distributed_optimizer``), the colocated reference's weights when a reference rank shares
the GPU (unless ``ref.fsdp_config.param_offload`` / ``ref.megatron.param_offload`` keeps them on
the host outside its forward), the activations of one micro-batch (``ppo_micro_batch_size_per_gpu`` sequences of
``data.max_prompt_length + rollout.response_length`` tokens, or ``ppo_max_token_len_per_gpu``
tokens with ``use_dynamic_bsz``; every layer's input only with
``model.enable_gradient_checkpointing``), the logits and ``RESERVED_GB``. FSDP2's
``fsdp_config.offload_policy`` keeps the sharded state on the host: only the gathered block
stays. ``param_offload`` / ``optimizer_offload`` move state between phases, not during the update,
so they lower what the generation engine shares, not this peak. bf16 weights count 2 bytes with
the fp32 master in the optimizer (megatron's layout; FSDP2 keeps fp32 shards and fp32 Adam
moments: 16 bytes a parameter where this counts 18, on the safe side).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from flowrl.parallel.layout_cost import (
    _LOGIT_BYTES,
    GB,
    GPU_TFLOPS,
    INTERCONNECTS,
    RESERVED_GB,
    Setup,
    lora_params_per_layer,
    train_memory,
)
from flowrl.parallel.mesh import ParallelDims, balanced_stages, padded_vocab_size
from flowrl.parallel.model_spec import ModelSpec, format_count

__all__ = ["Capabilities", "TrainerLayout", "TrainerMemory", "estimate", "memory_fixes", "memory_problem"]

_WEIGHT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_PARTS = ("weights", "grads", "optimizer", "reference", "activations")


@dataclass(frozen=True, kw_only=True)
class TrainerLayout:
    """What the memory model reads of one trainer group's config (``section``: its config key)."""

    section: str = "actor"
    dims: ParallelDims
    seq_len: int
    micro_batch_size: int
    """Sequences of ``seq_len`` tokens in one micro-batch (with a token budget: budget / seq_len)."""
    micro_batch_key: str
    """The key that sets it: ``ppo_micro_batch_size_per_gpu`` or ``ppo_max_token_len_per_gpu``."""
    micro_batch_value: int = 0
    """That key's value (for messages)."""
    global_batch_tokens: int
    dtype: str
    """The plan's compute dtype: bfloat16, float16 or float32."""
    fully_sharded: bool = False
    distributed_optimizer: bool = False
    state_on_host: bool = False
    """FSDP2's CPUOffloadPolicy (``fsdp_config.offload_policy``)."""
    reference: bool = False
    """A reference rank shares this rank's GPU and keeps its weights there (not offloaded)."""
    recompute: bool = False
    lora_rank: int = 0
    value_head: bool = False
    """A value model (the critic): a one-output head instead of the vocabulary's, no logits."""


@dataclass(frozen=True)
class TrainerMemory:
    """One rank's estimate: GB of each part, the total (with RESERVED_GB) and what a GPU holds."""

    parts_gb: dict[str, float]
    total_gb: float
    limit_gb: float

    @property
    def fits(self) -> bool:
        return self.total_gb <= self.limit_gb

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.parts_gb.items() if v)
        return f"{self.total_gb:.1f} GB ({parts}, reserved {RESERVED_GB:g})"


def estimate(spec: ModelSpec, layout: TrainerLayout, gpu_memory_gb: float) -> TrainerMemory:
    """The GB one rank of ``layout`` needs for ``spec`` on a GPU of ``gpu_memory_gb``."""
    d = layout.dims
    if layout.value_head:  # no output layer over the vocabulary (counted once, as a tied model's)
        spec = dataclasses.replace(spec, tie_word_embeddings=True)
    stages = tuple(balanced_stages(spec.num_layers, d.pp))
    weight_bytes = _WEIGHT_BYTES[layout.dtype]
    setup = Setup(
        spec=spec, num_gpus=d.world_size, gpu_memory_gb=gpu_memory_gb, link=INTERCONNECTS["ib"],
        gpus_per_node=max(d.world_size, 1), seq_len=layout.seq_len, micro_batch_size=layout.micro_batch_size,
        global_batch_tokens=layout.global_batch_tokens, weight_bytes=weight_bytes, optimizer="adam",
        distributed_optimizer=layout.distributed_optimizer, reference_model=layout.reference,
        generate_batch_size=1, gpu_tflops=GPU_TFLOPS, fully_sharded=layout.fully_sharded, lora_rank=layout.lora_rank,
    )
    parts = list(train_memory(setup, d, stages, max(stages) if layout.recompute else 0)[:-1])
    if layout.value_head:  # train_memory's logits of the last stage: a value per token instead
        parts[4] -= _LOGIT_BYTES * layout.seq_len * layout.micro_batch_size * padded_vocab_size(spec.vocab_size, d.tp) / d.tp
    if layout.fully_sharded and layout.state_on_host:  # only the gathered block on the GPU
        block = spec.params_per_layer
        block_grads = lora_params_per_layer(spec, layout.lora_rank) if layout.lora_rank else block
        parts[:3] = [block * weight_bytes, block_grads * 4, 0.0]
    parts_gb = {name: value / GB for name, value in zip(_PARTS, parts)}
    return TrainerMemory(parts_gb, sum(parts_gb.values()) + RESERVED_GB, setup.memory_limit_gb)


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What the trainer's backend can change, from its spec: tensor parallelism, the distributed
    optimizer, gradient checkpointing; ``sharded_strategy``: a strategy that shards every state
    over dp (None: none)."""

    tensor_parallel: bool = False
    distributed_optimizer: bool = False
    checkpointing: bool = False
    sharded_strategy: str | None = None
    reference_offload: str | None = None
    """The key that keeps a reference's weights on the host outside its forward (None: none)."""


def memory_fixes(spec: ModelSpec, layout: TrainerLayout, gpu_memory_gb: float, can: Capabilities) -> list[str]:
    """The single changes that lower ``layout``'s estimate, each with the estimate it gives."""
    s = layout.section
    candidates: list[tuple[str, Callable[[TrainerLayout], TrainerLayout]]] = []
    if layout.micro_batch_size > 1:
        one = 1 if layout.micro_batch_key == "ppo_micro_batch_size_per_gpu" else layout.seq_len
        candidates.append((f"{s}.{layout.micro_batch_key}={one}", lambda x: dataclasses.replace(x, micro_batch_size=1)))
    if not layout.recompute and can.checkpointing:
        candidates.append(("model.enable_gradient_checkpointing=true", lambda x: dataclasses.replace(x, recompute=True)))
    if layout.fully_sharded and not layout.state_on_host:
        candidates.append((f"{s}.fsdp_config.offload_policy=true", lambda x: dataclasses.replace(x, state_on_host=True)))
    if layout.reference and can.reference_offload:
        candidates.append((f"{can.reference_offload}=true", lambda x: dataclasses.replace(x, reference=False)))
    if can.distributed_optimizer and not (layout.fully_sharded or layout.distributed_optimizer) and layout.dims.dp > 1:
        candidates.append((f"{s}.use_distributed_optimizer=true",
                           lambda x: dataclasses.replace(x, distributed_optimizer=True)))
    t = layout.dims.tp * 2
    if can.tensor_parallel and spec.num_attention_heads % t == 0:
        candidates.append((f"{s}.tensor_model_parallel_size={t} (x2 GPUs)",
                           lambda x: dataclasses.replace(x, dims=dataclasses.replace(x.dims, tp=t))))
    if not layout.fully_sharded and can.sharded_strategy and layout.dims.tp * layout.dims.pp == 1:
        candidates.append((f"{s}.strategy={can.sharded_strategy}", lambda x: dataclasses.replace(x, fully_sharded=True)))
    out = []
    for key, change in candidates:
        after = estimate(spec, change(layout), gpu_memory_gb)
        out.append(f"{key} -> {after.total_gb:.1f} GB{' (fits)' if after.fits else ''}")
    return out


def memory_problem(spec: ModelSpec, layout: TrainerLayout, gpu_memory_gb: float, can: Capabilities) -> str | None:
    """None when ``layout`` fits a GPU of ``gpu_memory_gb``; else one message: what was computed
    and the keys that lower it (:func:`memory_fixes`)."""
    est = estimate(spec, layout, gpu_memory_gb)
    if est.fits:
        return None
    d = layout.dims
    head = (f"each {layout.section} rank (dp {d.dp} x tp {d.tp} x pp {d.pp}, {layout.dtype}) needs about "
            f"{est.describe()} to train {format_count(spec.num_params)} parameters ({spec.name}) on "
            f"{layout.micro_batch_size} x {layout.seq_len} tokens per micro-batch, and a GPU of {gpu_memory_gb:g} GB "
            f"holds {est.limit_gb:.1f} (flowrl parallel-plan's memory model)")
    fixes = memory_fixes(spec, layout, gpu_memory_gb, can)
    return head + "; lower it with " + "; ".join([*fixes, "GPUs with more memory"])
