"""The layout cost model: per-GPU memory and step time of one (dp, tp, pp) layout of a model.

``train_entry`` / ``generate_entry`` estimate one layout for a ``Setup`` (the model, the cluster
and the batch); ``layout_search.plan_parallelism`` enumerates and ranks the layouts. Pure code:
no torch, no I/O.

Letters: s sequence length, b micro-batch size, h hidden, f ffn, L layers, V padded vocabulary,
P parameters, d/t/p the dp/tp/pp sizes, m = ceil(tokens / (s*b*d)) micro-batches per dp rank.

Memory, per GPU of the fullest pipeline stage (parameters of a stage divided by t):
- weights 2 bytes/param (bf16), gradients 4 (Megatron-LM keeps fp32 ``main_grad`` buffers),
  Adam 12 (fp32 master + m + v; 8 for fp32 weights) divided by d with the distributed optimizer:
  Megatron's "6 + 12/d bytes per parameter"; plus 2 bytes/param for the frozen reference policy
  that HybridFlow/verl colocate with the actor in the same layout (``reference_model=True``).
- activations per layer and micro-batch (flash attention, no dropout, sequence parallel when
  t > 1): ``2*s*b*(5h + q + 2*kv*dh + 3f)/t`` bytes for a gated MLP (``2f`` for a plain one),
  Korthikanti et al. 2022's 34*s*b*h less dropout masks and the s^2 term. 1F1B keeps
  ``min(p - stage, m)`` micro-batches in flight, so the first stage holds L layers' worth whatever
  p is. Recomputing k layers per stage (Megatron's recompute_method=block) keeps only their input,
  ``2*s*b*h/t``, and runs their forward twice; "auto" uses the fewest k that fit.
- logits on the last stage, ``6*s*b*V/t`` (bf16 logits + the fp32 copy inside the fused loss);
  ``RESERVED_GB`` (CUDA context, NCCL/cuBLAS workspaces, fragmentation); a layout fits when the
  total is at most ``(1 - MEMORY_HEADROOM) * gpu_memory_gb``.

Time of one optimizer step over ``global_batch_tokens``:
- compute ``6*P_stage + 6*s*h*L_stage`` FLOP per token (causal attention) on the slowest stage,
  divided by t and ``gpu_tflops``; the 1F1B bubble adds ``(p-1)`` micro-batch times, i.e. the
  fraction (p-1)/(m+p-1) of the step;
- tensor parallel: per layer and micro-batch 4 collectives (2 forward, 2 backward; sequence
  parallel's all-gather + reduce-scatter move the bytes of an all-reduce), each
  ``2(t-1)/t * s*b*h*2`` bytes, on the critical path (TE's tp_comm_overlap is off by default);
- pipeline: an activation forward and a gradient backward, ``s*b*h*2/t`` bytes, per micro-batch;
- data parallel: fp32 gradient reduce-scatter + bf16 parameter all-gather,
  ``(d-1)/d * P_gpu * 6`` bytes (``2(d-1)/d*P_gpu*4`` all-reduce without the distributed
  optimizer), of which DP_COMM_EXPOSED is not hidden behind the backward pass.
Each collective runs on the slowest link its group spans. Groups follow megatron's rank order
(mesh.py: tp fastest, then dp, then pp): the tp group is inside a node, the dp group is inside a node
when t*d <= gpus_per_node, pipeline neighbours cross nodes once the job spans several.

Generation (``for_="generate"``, one vLLM-style engine per dp replica): weights plus a KV cache of
``2*L_stage*max(1, kv/t)*dh*2`` bytes per token for up to ``generate_batch_size`` sequences of
``seq_len`` tokens (as many as fit); decoding ``global_batch_tokens`` tokens is bandwidth bound
(weights once per pipeline micro-batch and the half-full KV cache read per step, at HBM_GBPS),
plus 2 tp all-reduces per layer and a pipeline hop per micro-batch.

Calibration. The defaults describe a DGX-A100-80GB-class cluster ("ib": NVLink inside 8-GPU nodes,
200 Gb/s InfiniBand per GPU, ~150 sustained bf16 TFLOP/s) training in bf16 with Adam, the
distributed optimizer, a colocated reference model, 4096-token sequences and 1M-token optimizer
steps. On them the search reproduces the practice HybridFlow/verl and Megatron-Bridge document
(pinned in tests/unit/test_planner.py): 7-8B on 8-64 GPUs -> dp + tp 2, pp 1; 30-34B on 32-128
GPUs -> tp 4 + pp 2; 175B and 405B on 128-1024 GPUs -> tp 8 + pp 8-16; over Ethernet (PCIe-only
nodes) a smaller tp than over InfiniBand. 13-20B sits on the boundary between the first two: there
tp 2 + pp 1-2, tp 4 + pp 1 and tp 4 + pp 2 lie within a few percent of each other and the model
picks from the small-model side (tp 2 + pp 2 for 13B on 16-32 GPUs). Under ~3B it picks pure data
parallel, as verl's FSDP recipes do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from flowrl.parallel.mesh import ParallelDims, padded_vocab_size
from flowrl.parallel.model_spec import ModelSpec

__all__ = ["INTERCONNECTS", "Interconnect", "PlanEntry", "Setup", "generate_entry", "train_entry", "train_memory"]

GB = 1e9

# -- constants (see "Calibration" above) ----------------------------------------------------------

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
    above; gradients and Adam state of the adapters only (:func:`lora_params_per_layer`); no
    reference copy (the base model with adapters disabled); only adapter gradients reduce-scattered."""

    @property
    def memory_limit_gb(self) -> float:
        return (1 - MEMORY_HEADROOM) * self.gpu_memory_gb

    @property
    def act_bytes(self) -> int:
        return 2 if self.weight_bytes == 2 else 4


def _links(setup: Setup, dims: ParallelDims) -> dict[str, tuple[float, float]]:
    """(bytes/s, seconds of latency) of the tp, dp and pp groups, from megatron's rank order."""
    link, gpn = setup.link, setup.gpus_per_node
    intra = (link.intra_node_gbps * GB, link.intra_latency_us * 1e-6)
    inter = (link.inter_node_gbps * GB, link.inter_latency_us * 1e-6)
    return {
        "tp": intra if dims.tp <= gpn else inter,
        "dp": intra if dims.tp * dims.dp <= gpn else inter,
        "pp": intra if dims.world_size <= gpn else inter,
    }


def _stage_params(spec: ModelSpec, stages: tuple[int, ...], vocab: int) -> list[int]:
    """Parameters on each pipeline stage, before tp sharding."""
    params = [n * spec.params_per_layer for n in stages]
    params[0] += vocab * spec.hidden_size  # input embedding
    if not (spec.tie_word_embeddings and len(stages) == 1):
        params[-1] += vocab * spec.hidden_size  # output layer (tied models keep a copy there if pp > 1)
    params[-1] += spec.hidden_size  # final norm
    return params


def lora_params_per_layer(spec: ModelSpec, rank: int) -> int:
    """Adapter weights of one layer with LoRA of ``rank`` on every linear layer (``all-linear``):
    ``rank * (in + out)`` for each of q, k, v, o and the MLP's projections."""
    h, f, q, kv = spec.hidden_size, spec.ffn_hidden_size, spec.num_attention_heads * spec.dh, spec.num_key_value_heads * spec.dh
    attention = (h + q) + 2 * (h + kv) + (q + h)
    return rank * (attention + (3 if spec.gated_mlp else 2) * (h + f))


def _lora_parts(parts: tuple[float, ...], setup: Setup, n_layers: int, t: int, opt_shard: int) -> tuple[float, ...]:
    """LoRA's memory of one stage: the frozen weights plus the adapters; gradients and the
    optimizer of the adapters; no reference."""
    weights, _, _, _, activations = parts
    adapters = n_layers * lora_params_per_layer(setup.spec, setup.lora_rank) / t
    opt_bytes = OPTIMIZER_BYTES[setup.optimizer][0 if setup.weight_bytes == 2 else 1]
    return (weights + adapters * setup.weight_bytes, adapters * _GRAD_BYTES, adapters * opt_bytes / opt_shard, 0.0,
            activations)


def _micro_batches(setup: Setup, dims: ParallelDims) -> int:
    return max(1, math.ceil(setup.global_batch_tokens / (setup.seq_len * setup.micro_batch_size * dims.dp)))


def train_memory(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], k: int) -> tuple[float, ...]:
    """Bytes (weights, grads, optimizer, reference, activations, total) on the fullest stage's GPUs,
    recomputing ``k`` layers per stage."""
    spec, s, b, t, p = setup.spec, setup.seq_len, setup.micro_batch_size, dims.tp, dims.pp
    vocab = padded_vocab_size(spec.vocab_size, t)
    m = _micro_batches(setup, dims)
    opt_bytes = OPTIMIZER_BYTES[setup.optimizer][0 if setup.weight_bytes == 2 else 1]
    opt_shard = dims.dp if setup.distributed_optimizer else 1
    h, f, dh = spec.hidden_size, spec.ffn_hidden_size, spec.dh
    per_token = 5 * h + spec.num_attention_heads * dh + 2 * spec.num_key_value_heads * dh
    per_token += 3 * f if spec.gated_mlp else 2 * f
    act_layer = s * b * per_token * setup.act_bytes / t
    layer_input = s * b * h * setup.act_bytes / t
    worst: tuple[float, ...] = ()
    for i, (n_layers, params) in enumerate(zip(stages, _stage_params(spec, stages, vocab))):
        recomputed = min(k, n_layers)
        activations = min(p - i, m) * ((n_layers - recomputed) * act_layer + recomputed * layer_input)
        activations += act_layer if recomputed else 0.0  # the layer being recomputed
        if i == p - 1:
            activations += _LOGIT_BYTES * s * b * vocab / t
        shard = params / t
        parts = (
            shard * setup.weight_bytes,
            shard * _GRAD_BYTES,
            shard * opt_bytes / opt_shard,
            shard * REFERENCE_BYTES if setup.reference_model else 0.0,
            activations,
        )
        if setup.lora_rank:
            parts = _lora_parts(parts, setup, n_layers, t, opt_shard)
        if setup.fully_sharded:
            parts = _fully_sharded(parts, spec.params_per_layer, setup, dims.dp)
        if not worst or sum(parts) > worst[-1]:
            worst = (*parts, sum(parts))
    return worst


def _fully_sharded(parts: tuple[float, ...], block: int, setup: Setup, d: int) -> tuple[float, ...]:
    """FSDP's memory: every state over d, one block's weights and gradients gathered."""
    weights, grads, optimizer, reference, activations = parts
    block_grads = lora_params_per_layer(setup.spec, setup.lora_rank) if setup.lora_rank else block
    return (weights / d + block * setup.weight_bytes, grads / d + block_grads * _GRAD_BYTES,
            optimizer * (1 if setup.distributed_optimizer else 1 / d), reference / d, activations)


def train_entry(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], k: int) -> PlanEntry:
    spec, s, b, t, p, d = setup.spec, setup.seq_len, setup.micro_batch_size, dims.tp, dims.pp, dims.dp
    vocab = padded_vocab_size(spec.vocab_size, t)
    m = _micro_batches(setup, dims)
    weights, grads, optimizer, reference, activations, total = (
        x / GB for x in train_memory(setup, dims, stages, k))
    links = _links(setup, dims)

    # Compute: the slowest stage paces the pipeline; a recomputed layer runs its forward twice.
    layer_flops = 6 * spec.params_per_layer + 6 * s * spec.num_attention_heads * spec.dh
    stage_flops = [(n + min(k, n) / 3) * layer_flops for n in stages]
    stage_flops[-1] += 6 * vocab * spec.hidden_size
    t_mb = s * b * max(stage_flops) / (t * setup.gpu_tflops * 1e12)
    compute_s, bubble_s = m * t_mb, (p - 1) * t_mb

    msg = s * b * spec.hidden_size * setup.act_bytes  # one micro-batch's hidden states
    tp_bytes = tp_s = 0.0
    if t > 1:
        n_coll = m * (4 * max(stages) + 2 * min(k, max(stages)))
        bw, lat = links["tp"]
        tp_bytes = n_coll * 2 * (t - 1) / t * msg
        tp_s = tp_bytes / bw + n_coll * lat
    pp_bytes = pp_s = 0.0
    if p > 1:
        bw, lat = links["pp"]
        pp_bytes = 2 * m * msg / t
        pp_s = 2 * (m + p - 1) * (msg / t / bw + lat)
    dp_bytes = dp_s = 0.0
    if d > 1:
        params_gpu = max(_stage_params(spec, stages, vocab)) / t
        trained = (spec.num_layers * lora_params_per_layer(spec, setup.lora_rank) / (t * p)
                   if setup.lora_rank else params_gpu)  # LoRA: only the adapters' gradients travel
        if setup.fully_sharded:  # gather in forward and backward, reduce-scatter: every micro-batch
            dp_bytes = m * (d - 1) / d * (params_gpu * 2 * setup.weight_bytes + trained * _GRAD_BYTES)
        elif setup.distributed_optimizer:
            dp_bytes = (d - 1) / d * params_gpu * (_GRAD_BYTES + setup.weight_bytes)
        else:
            dp_bytes = 2 * (d - 1) / d * params_gpu * _GRAD_BYTES
        bw, lat = links["dp"]
        dp_s = DP_COMM_EXPOSED * (dp_bytes / bw + 2 * lat)

    notes = []
    if len(set(stages)) > 1:
        notes.append(f"layers_per_stage={list(stages)}")
    if k:
        notes.append(f"recompute {min(k, max(stages))} of {max(stages)} layers per stage")
    if m < p:
        notes.append(f"only {m} micro-batches for {p} stages")
    return PlanEntry(
        dims=dims, for_="train", layers_per_stage=stages, recompute_layers=min(k, max(stages)),
        weights_gb=weights, grads_gb=grads, optimizer_gb=optimizer, reference_gb=reference,
        activations_gb=activations, reserved_gb=RESERVED_GB, memory_gb=total + RESERVED_GB,
        memory_limit_gb=setup.memory_limit_gb, compute_s=compute_s, bubble_s=bubble_s,
        tp_comm_s=tp_s, pp_comm_s=pp_s, dp_comm_s=dp_s,
        step_s=compute_s + bubble_s + tp_s + pp_s + dp_s, comm_gb=(tp_bytes + pp_bytes + dp_bytes) / GB,
        micro_batches=m, tokens=setup.global_batch_tokens, notes=tuple(notes),
    )


def generate_entry(setup: Setup, dims: ParallelDims, stages: tuple[int, ...]) -> PlanEntry:
    spec, s, t, p, d = setup.spec, setup.seq_len, dims.tp, dims.pp, dims.dp
    vocab = padded_vocab_size(spec.vocab_size, t)
    stage_params = max(_stage_params(spec, stages, vocab))
    weights = stage_params / t * setup.weight_bytes
    kv_token = 2 * max(stages) * max(1, spec.num_key_value_heads // t) * spec.dh * 2  # K and V, bf16
    workspace = setup.generate_batch_size * vocab / t * 4  # fp32 logits of one decode step
    free = (setup.memory_limit_gb - RESERVED_GB) * GB - weights - workspace
    batch = int(min(setup.generate_batch_size, max(0.0, free) // (kv_token * s)))
    kv_cache = max(batch, 1) * kv_token * s
    links = _links(setup, dims)

    # One decode step of the replica: each stage reads its weights once per pipeline micro-batch
    # and the half-full KV cache of its layers; compute rarely binds but is counted.
    steps = math.ceil(setup.global_batch_tokens / d / max(batch, 1))
    read = p * weights + max(batch, 1) * (s / 2) * kv_token
    step = max(read / (HBM_GBPS * GB), 2 * stage_params / t * max(batch, 1) / (setup.gpu_tflops * 1e12))
    msg = max(batch, 1) * spec.hidden_size * 2 / p  # hidden states of one pipeline micro-batch
    tp_step = tp_bytes = pp_step = pp_bytes = 0.0
    if t > 1:
        bw, lat = links["tp"]
        tp_bytes = p * 2 * max(stages) * 2 * (t - 1) / t * msg
        tp_step = tp_bytes / bw + p * 2 * max(stages) * lat
    if p > 1:
        bw, lat = links["pp"]
        pp_bytes = p * msg
        pp_step = pp_bytes / bw + p * lat
    notes = []
    if len(set(stages)) > 1:
        notes.append(f"layers_per_stage={list(stages)}")
    if 0 < batch < setup.generate_batch_size:
        notes.append(f"KV cache holds {batch} of {setup.generate_batch_size} sequences")
    return PlanEntry(
        dims=dims, for_="generate", layers_per_stage=stages, recompute_layers=0,
        weights_gb=weights / GB, grads_gb=0.0, optimizer_gb=0.0, reference_gb=0.0,
        activations_gb=(kv_cache + workspace) / GB, reserved_gb=RESERVED_GB,
        memory_gb=(weights + kv_cache + workspace) / GB + RESERVED_GB,
        memory_limit_gb=setup.memory_limit_gb, compute_s=steps * step, bubble_s=0.0,
        tp_comm_s=steps * tp_step, pp_comm_s=steps * pp_step, dp_comm_s=0.0,
        step_s=steps * (step + tp_step + pp_step), comm_gb=steps * (tp_bytes + pp_bytes) / GB,
        micro_batches=max(batch, 1), tokens=setup.global_batch_tokens, notes=tuple(notes),
    )
