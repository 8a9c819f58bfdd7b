"""The inputs and outputs of the layout cost model (:mod:`flowrl.parallel.layout_cost`): its
calibration constants, the interconnects, ``Setup`` (the model, the cluster and the batch),
``Axes`` (the expert and context axes) and ``PlanEntry`` (one layout's memory and time). Pure
code: no torch, no I/O. ``layout_cost`` re-exports every name here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.model_spec import ModelSpec

GB = 1e9

# -- constants (see "Calibration" in layout_cost's docstring) ------------------------------------

GPU_TFLOPS = 150.0
"""Sustained dense bf16 TFLOP/s per GPU: an A100 at ~48% of its 312 peak (an H100 reaches ~400)."""
HBM_GBPS = 1600.0
"""Achieved HBM bandwidth per GPU (A100-80GB: 2039 peak); bounds decoding."""
RESERVED_GB = 3.0
"""CUDA context, NCCL/cuBLAS workspaces and allocator fragmentation, per GPU."""
MEMORY_HEADROOM = 0.10
"""Fraction of each GPU left free for allocation spikes."""
DP_COMM_EXPOSED = 0.5
"""Share of the data-parallel gradient/parameter traffic not overlapped with the backward pass
(Megatron's overlap_grad_reduce hides the early buckets; the last ones and the all-gather show)."""
LONG_SEQUENCE = 16384
"""Sequences of at least this many tokens make the search try context parallelism (cp > 1)."""
MIN_LAYERS_PER_STAGE = 4
"""The search does not propose pipeline stages thinner than this (pin ``pp`` to go below): thin
stages buy nothing the cost model sees but pay p2p latency and end-stage imbalance in practice."""
TIE_TOLERANCE = 0.005
"""Step times within 0.5% count as equal; ties go to layouts without recompute, then to the
shallower pipeline, then to less communication."""
REFERENCE_BYTES = 2
"""A colocated frozen reference policy: bf16 weights in the actor's layout."""
_LOGIT_BYTES = 6  # bf16 logits + the fp32 copy inside the fused vocab-parallel cross-entropy
_GRAD_BYTES = 4  # fp32 main_grad buffers (Megatron-LM with bf16/fp16), fp32 anyway for fp32
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
OPTIMIZER_BYTES = {  # state per parameter: (with low-precision weights, with fp32 weights)
    "adam": (12, 8),  # fp32 master copy + m + v; no master copy when the weights are fp32
    "sgd": (8, 4),  # fp32 master copy + momentum
}


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    """Link speeds as NCCL bus bandwidths (GB/s per GPU) and per-collective latencies."""

    name: str
    description: str
    intra_node_gbps: float
    inter_node_gbps: float
    intra_latency_us: float
    inter_latency_us: float


INTERCONNECTS: dict[str, Interconnect] = {
    "nvlink_ib": Interconnect(
        name="nvlink_ib",
        description="NVSwitch (NVLink 4, H100-class) in a node, InfiniBand NDR 400 Gb/s per GPU between nodes",
        intra_node_gbps=360.0, inter_node_gbps=45.0, intra_latency_us=10.0, inter_latency_us=15.0,
    ),
    "ib": Interconnect(
        name="ib",
        description="NVLink (A100-class) in a node, InfiniBand HDR 200 Gb/s per GPU between nodes",
        intra_node_gbps=230.0, inter_node_gbps=22.0, intra_latency_us=10.0, inter_latency_us=20.0,
    ),
    "ethernet": Interconnect(
        name="ethernet",
        description="PCIe in a node (no NVLink), ~50 Gb/s Ethernet per GPU between nodes",
        intra_node_gbps=20.0, inter_node_gbps=6.0, intra_latency_us=20.0, inter_latency_us=60.0,
    ),
}


@dataclass(frozen=True, kw_only=True)
class PlanEntry:
    """One layout with its estimated memory (GB per GPU) and time (seconds per step)."""

    dims: ParallelDims
    for_: Literal["train", "generate"]
    layers_per_stage: tuple[int, ...]
    recompute_layers: int
    """Train: layers per stage whose activations are recomputed (0: none)."""
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    reference_gb: float
    """The colocated reference policy's weights (train with reference_model=True)."""
    activations_gb: float
    """Train: activations and logits of the fullest stage. Generate: KV cache and logits."""
    reserved_gb: float
    memory_gb: float
    """Total per GPU."""
    memory_limit_gb: float
    """What a GPU may hold: (1 - MEMORY_HEADROOM) * gpu_memory_gb."""
    compute_s: float
    bubble_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    step_s: float
    """Train: one optimizer step over global_batch_tokens. Generate: decoding that many tokens."""
    comm_gb: float
    """Bytes each GPU sends per step over all axes."""
    micro_batches: int
    """Train: micro-batches per dp rank per step. Generate: concurrent sequences per replica."""
    tokens: int
    """Tokens per step (global_batch_tokens)."""
    notes: tuple[str, ...] = ()
    ep: int = 1
    """expert_model_parallel_size: ranks the routed experts are split over."""
    etp: int = 1
    """expert_tensor_parallel_size: ranks each expert's width is split over."""
    cp: int = 1
    """context_parallel_size: ranks each sequence is split over (dims.dp * tp * pp * cp GPUs)."""
    expert_weights_gb: float = 0.0
    """The routed experts' share of weights_gb."""
    ep_comm_s: float = 0.0
    """Expert-parallel all-to-all time (part of step_s)."""
    cp_comm_s: float = 0.0
    """Context-parallel K/V exchange time (part of step_s)."""

    @property
    def num_gpus(self) -> int:
        return self.dims.world_size * self.cp

    @property
    def fits(self) -> bool:
        return self.memory_gb <= self.memory_limit_gb

    @property
    def tokens_per_s(self) -> float:
        """Whole-cluster throughput implied by step_s."""
        return self.tokens / self.step_s


@dataclass(frozen=True, kw_only=True)
class Setup:
    spec: ModelSpec
    num_gpus: int
    gpu_memory_gb: float
    link: Interconnect
    gpus_per_node: int
    seq_len: int
    micro_batch_size: int
    global_batch_tokens: int
    weight_bytes: int
    optimizer: str
    distributed_optimizer: bool
    reference_model: bool
    generate_batch_size: int
    gpu_tflops: float
    fully_sharded: bool = False
    """FSDP (``actor.strategy=fsdp``): tp = pp = 1; weights, gradients, Adam state and the
    reference all sharded over d, plus one gathered block (its weights and gradients) at a time;
    the parameters are all-gathered in forward and in backward and the gradients reduce-scattered
    for every micro-batch."""
    lora_rank: int = 0
    """LoRA (``model.lora_rank``, all-linear) under FSDP: the base weights frozen and sharded as
    above; gradients and Adam state of the adapters only
    (:func:`~flowrl.parallel.layout_cost.lora_params_per_layer`); no reference copy (the base model
    with adapters disabled); only adapter gradients reduce-scattered."""

    @property
    def memory_limit_gb(self) -> float:
        return (1 - MEMORY_HEADROOM) * self.gpu_memory_gb

    @property
    def act_bytes(self) -> int:
        return 2 if self.weight_bytes == 2 else 4


@dataclass(frozen=True)
class Axes:
    """The expert and context axes of a layout beside ``ParallelDims``' dp, tp, pp (1: unused)."""

    ep: int = 1
    etp: int = 1
    cp: int = 1

    def edp(self, dims: ParallelDims) -> int:
        """Expert data parallel size: replicas of each expert shard."""
        return dims.tp * self.cp * dims.dp // (self.ep * self.etp)


NO_AXES = Axes()
