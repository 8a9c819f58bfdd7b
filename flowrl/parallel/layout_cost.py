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

Mixture-of-experts and long sequences (5D layouts: dp, tp, pp, ep, cp, megatron's names and rank
order "tp-cp-ep-dp-pp"). A layout adds ``ep`` (expert_model_parallel_size), ``etp``
(expert_tensor_parallel_size) and ``cp`` (context_parallel_size): the dense part of a stage
(attention, norms, dense and shared MLPs, routers, embeddings) is split over tp and its optimizer
state over dp*cp; the routed experts over ep*etp and their optimizer state over the expert data
parallel size edp = tp*cp*dp / (ep*etp). Each rank holds s/cp tokens of a sequence. A sparse
layer's activations are its attention part plus ``k`` copies of each token through an expert of
width f_e (``k*(3*f_e + 2h)`` per token, the +2h the permuted input and output) divided by tp
(sequence parallel hands the router s/(cp*t) tokens, or etp splits the experts' width). Compute
counts the *active* parameters (top-k experts), so a 671B-parameter model costs what its 37B
active ones do, plus its memory. Communication adds, per sparse layer and micro-batch, 4
all-to-alls (dispatch and combine, forward and backward) in which each rank sends (ep-1)/ep of its
``k*s*b*h*etp/(cp*t)`` routed hidden states over the link its ep*etp group spans (with etp > 1 the
tokens are first all-gathered over the etp group, which also costs 4 collectives of
``(etp-1)/etp * k*s*b*h/cp`` bytes); and per layer 3
ring passes of K and V over the cp group (forward, and K/V again plus their gradients backward),
``(cp-1)/cp * 2*s*b*kv*dh/t`` each. cp is searched only for sequences of LONG_SEQUENCE tokens or
more (or when pinned): shorter ones gain nothing from it. Expert load imbalance is not modelled
(balanced routing); the aux-loss-balanced routers RL starts from are close to it.

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
from functools import lru_cache
from typing import Literal

from flowrl.parallel.mesh import ParallelDims, padded_vocab_size
from flowrl.parallel.model_spec import ModelSpec

__all__ = ["INTERCONNECTS", "NO_AXES", "Axes", "Interconnect", "PlanEntry", "Setup", "generate_entry", "train_entry",
           "train_memory"]

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
    above; gradients and Adam state of the adapters only (:func:`lora_params_per_layer`); no
    reference copy (the base model with adapters disabled); only adapter gradients reduce-scattered."""

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


def _links(setup: Setup, dims: ParallelDims, axes: Axes = NO_AXES) -> dict[str, tuple[float, float]]:
    """(bytes/s, seconds of latency) of each group, from megatron's rank order (tp-cp-ep-dp-pp; the
    expert groups: etp-ep-edp-pp)."""
    link, gpn = setup.link, setup.gpus_per_node
    intra = (link.intra_node_gbps * GB, link.intra_latency_us * 1e-6)
    inter = (link.inter_node_gbps * GB, link.inter_latency_us * 1e-6)
    return {
        "tp": intra if dims.tp <= gpn else inter,
        "cp": intra if dims.tp * axes.cp <= gpn else inter,
        "ep": intra if axes.etp * axes.ep <= gpn else inter,
        "dp": intra if dims.tp * axes.cp * dims.dp <= gpn else inter,
        "pp": intra if dims.world_size * axes.cp <= gpn else inter,
    }


@lru_cache(maxsize=4096)
def _stage_split(spec: ModelSpec, stages: tuple[int, ...], vocab: int) -> list[tuple[int, int]]:
    """(dense, expert) parameters on each pipeline stage, before any sharding."""
    out, first = [], 0
    for n in stages:
        parts = [spec.layer_params(i) for i in range(first, first + n)]
        out.append([sum(d for d, _ in parts), sum(e for _, e in parts)])
        first += n
    out[0][0] += vocab * spec.hidden_size  # input embedding
    if not (spec.tie_word_embeddings and len(stages) == 1):
        out[-1][0] += vocab * spec.hidden_size  # output layer (tied models keep a copy there if pp > 1)
    out[-1][0] += spec.hidden_size  # final norm
    return [(d, e) for d, e in out]


def _stage_params(spec: ModelSpec, stages: tuple[int, ...], vocab: int) -> list[int]:
    """Parameters on each pipeline stage, before tp sharding."""
    return [d + e for d, e in _stage_split(spec, stages, vocab)]


@lru_cache(maxsize=4096)
def _stage_active(spec: ModelSpec, stages: tuple[int, ...]) -> list[int]:
    """Layer parameters a token passes through on each stage (top-k experts of the sparse layers)."""
    out, first = [], 0
    for n in stages:
        out.append(sum(spec.layer_active_params(i) for i in range(first, first + n)))
        first += n
    return out


@lru_cache(maxsize=4096)
def _sparse_layers(spec: ModelSpec, stages: tuple[int, ...]) -> list[int]:
    out, first = [], 0
    for n in stages:
        out.append(sum(spec.layer_is_sparse(i) for i in range(first, first + n)))
        first += n
    return out


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


def _act_per_token(spec: ModelSpec, sparse: bool) -> int:
    """Activation elements one token keeps for the backward pass in one layer (times tp's share)."""
    h, dh = spec.hidden_size, spec.dh
    kv = spec.num_attention_heads if spec.is_mla else spec.num_key_value_heads  # MLA expands K, V per head
    per_token = 5 * h + spec.num_attention_heads * dh + 2 * kv * dh
    mlp = 3 if spec.gated_mlp else 2
    if not sparse:
        return per_token + mlp * spec.ffn_hidden_size
    per_token += spec.experts_per_token * (mlp * spec.moe_ffn_hidden_size + 2 * h)
    return per_token + mlp * spec.shared_expert_ffn_hidden_size


def train_memory(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], k: int,
                 axes: Axes = NO_AXES) -> tuple[float, ...]:
    """Bytes (weights, grads, optimizer, reference, activations, total) on the fullest stage's GPUs,
    recomputing ``k`` layers per stage."""
    return _train_memory(setup, dims, stages, k, axes)[:-1]


def _train_memory(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], k: int,
                  axes: Axes = NO_AXES) -> tuple[float, ...]:
    """``train_memory``'s bytes and, last, the routed experts' weights on that stage's GPUs."""
    spec, b, t, p = setup.spec, setup.micro_batch_size, dims.tp, dims.pp
    s = setup.seq_len / axes.cp  # this rank's share of each sequence
    vocab = padded_vocab_size(spec.vocab_size, t)
    m = _micro_batches(setup, dims)
    opt_bytes = OPTIMIZER_BYTES[setup.optimizer][0 if setup.weight_bytes == 2 else 1]
    opt_shard = dims.dp * axes.cp if setup.distributed_optimizer else 1
    expert_opt_shard = axes.edp(dims) if setup.distributed_optimizer else 1
    h = spec.hidden_size
    layer_input = s * b * h * setup.act_bytes / t
    worst: tuple[float, ...] = ()
    sparse_counts = _sparse_layers(spec, stages)
    for i, (n_layers, (dense, expert)) in enumerate(zip(stages, _stage_split(spec, stages, vocab))):
        n_sparse = sparse_counts[i]
        act_stage = s * b * setup.act_bytes / t * (
            (n_layers - n_sparse) * _act_per_token(spec, False) + n_sparse * _act_per_token(spec, True))
        act_layer = act_stage / n_layers  # the mean layer of the stage
        recomputed = min(k, n_layers)
        activations = min(p - i, m) * (act_stage * (n_layers - recomputed) / n_layers + recomputed * layer_input)
        activations += act_layer if recomputed else 0.0  # the layer being recomputed
        if i == p - 1:
            activations += _LOGIT_BYTES * s * b * vocab / t
        shard = dense / t + expert / (axes.ep * axes.etp)
        opt_elems = dense / t / opt_shard + expert / (axes.ep * axes.etp) / expert_opt_shard
        parts = (
            shard * setup.weight_bytes,
            shard * _GRAD_BYTES,
            opt_elems * opt_bytes,
            shard * REFERENCE_BYTES if setup.reference_model else 0.0,
            activations,
        )
        if setup.lora_rank:
            parts = _lora_parts(parts, setup, n_layers, t, opt_shard)
        if setup.fully_sharded:
            parts = _fully_sharded(parts, spec.params_per_layer, setup, dims.dp)
        if not worst or sum(parts) > worst[-2]:
            worst = (*parts, sum(parts), expert / (axes.ep * axes.etp) * setup.weight_bytes)
    return worst


def _fully_sharded(parts: tuple[float, ...], block: int, setup: Setup, d: int) -> tuple[float, ...]:
    """FSDP's memory: every state over d, one block's weights and gradients gathered."""
    weights, grads, optimizer, reference, activations = parts
    block_grads = lora_params_per_layer(setup.spec, setup.lora_rank) if setup.lora_rank else block
    return (weights / d + block * setup.weight_bytes, grads / d + block_grads * _GRAD_BYTES,
            optimizer * (1 if setup.distributed_optimizer else 1 / d), reference / d, activations)


def train_entry(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], k: int,
                axes: Axes = NO_AXES) -> PlanEntry:
    spec, b, t, p, d = setup.spec, setup.micro_batch_size, dims.tp, dims.pp, dims.dp
    s_full = setup.seq_len
    s = s_full / axes.cp  # tokens of each sequence on this rank
    vocab = padded_vocab_size(spec.vocab_size, t)
    m = _micro_batches(setup, dims)
    weights, grads, optimizer, reference, activations, total, experts = (
        x / GB for x in _train_memory(setup, dims, stages, k, axes))
    links = _links(setup, dims, axes)

    # Compute: the slowest stage paces the pipeline; a recomputed layer runs its forward twice.
    # Tokens pass through the active parameters only (top-k of the experts).
    attention_flops = 6 * s_full * spec.num_attention_heads * spec.dh  # per token and layer, causal
    stage_flops = [(6 * active + n * attention_flops) * (1 + min(k, n) / n / 3)
                   for n, active in zip(stages, _stage_active(spec, stages))]
    stage_flops[-1] += 6 * vocab * spec.hidden_size  # the output layer
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
    ep_bytes = ep_s = 0.0
    n_sparse = max(_sparse_layers(spec, stages))
    if axes.ep > 1 and n_sparse:
        n_coll = m * 4 * n_sparse  # dispatch and combine, forward and backward
        bw, lat = links["ep"]
        # each rank dispatches its s*b/t sequence-parallel tokens, all-gathered over etp first
        routed = spec.experts_per_token * msg * axes.etp / t
        ep_bytes = n_coll * (axes.ep - 1) / axes.ep * routed
        ep_s = ep_bytes / bw + n_coll * (axes.ep - 1) * lat  # an all-to-all pays a latency per peer
    if axes.etp > 1 and n_sparse:  # the etp all-gather before dispatch and reduce-scatter after combine
        n_coll = m * 4 * n_sparse
        bw, lat = links["tp"]
        etp_bytes = n_coll * (axes.etp - 1) / axes.etp * spec.experts_per_token * msg
        ep_bytes += etp_bytes
        ep_s += etp_bytes / bw + n_coll * lat
    cp_bytes = cp_s = 0.0
    if axes.cp > 1:
        kv = spec.num_attention_heads if spec.is_mla else spec.num_key_value_heads
        n_coll = m * 3 * max(stages)
        bw, lat = links["cp"]
        cp_bytes = n_coll * (axes.cp - 1) / axes.cp * 2 * s_full * b * kv * spec.dh * setup.act_bytes / t
        cp_s = cp_bytes / bw + n_coll * (axes.cp - 1) * lat
    dp_bytes = dp_s = 0.0
    dpc, edp = d * axes.cp, axes.edp(dims)  # gradients reduce over dp x cp (dense), edp (experts)
    if dpc > 1 or edp > 1:
        dense_gpu, expert_gpu = (x for x in max(_stage_split(spec, stages, vocab), key=sum))
        dense_gpu, expert_gpu = dense_gpu / t, expert_gpu / (axes.ep * axes.etp)
        if setup.lora_rank:  # LoRA: only the adapters' gradients travel
            trained = spec.num_layers * lora_params_per_layer(spec, setup.lora_rank) / (t * p)
        else:
            trained = dense_gpu + expert_gpu
        if setup.fully_sharded:  # gather in forward and backward, reduce-scatter: every micro-batch
            params_gpu = dense_gpu + expert_gpu
            dp_bytes = m * (d - 1) / d * (params_gpu * 2 * setup.weight_bytes + trained * _GRAD_BYTES)
        else:
            per_param = _GRAD_BYTES + setup.weight_bytes if setup.distributed_optimizer else 2 * _GRAD_BYTES
            if setup.lora_rank:
                dp_bytes = (dpc - 1) / dpc * trained * per_param
            else:
                dp_bytes = ((dpc - 1) / dpc * dense_gpu + (edp - 1) / edp * expert_gpu) * per_param
        bw, lat = links["dp"]
        dp_s = DP_COMM_EXPOSED * (dp_bytes / bw + 2 * lat)

    notes = []
    if len(set(stages)) > 1:
        notes.append(f"layers_per_stage={list(stages)}")
    if k:
        notes.append(f"recompute {min(k, max(stages))} of {max(stages)} layers per stage")
    if m < p:
        notes.append(f"only {m} micro-batches for {p} stages")
    if spec.is_moe:
        notes.append(f"experts {experts:.1f} GB of the weights ({spec.num_experts // axes.ep} of "
                     f"{spec.num_experts} per rank{f', etp {axes.etp}' if axes.etp > 1 else ''})")
    return PlanEntry(
        dims=dims, for_="train", layers_per_stage=stages, recompute_layers=min(k, max(stages)),
        weights_gb=weights, grads_gb=grads, optimizer_gb=optimizer, reference_gb=reference,
        activations_gb=activations, reserved_gb=RESERVED_GB, memory_gb=total + RESERVED_GB,
        memory_limit_gb=setup.memory_limit_gb, compute_s=compute_s, bubble_s=bubble_s,
        tp_comm_s=tp_s, pp_comm_s=pp_s, dp_comm_s=dp_s,
        step_s=compute_s + bubble_s + tp_s + pp_s + dp_s + ep_s + cp_s,
        comm_gb=(tp_bytes + pp_bytes + dp_bytes + ep_bytes + cp_bytes) / GB,
        micro_batches=m, tokens=setup.global_batch_tokens, notes=tuple(notes),
        ep=axes.ep, etp=axes.etp, cp=axes.cp, expert_weights_gb=experts, ep_comm_s=ep_s, cp_comm_s=cp_s,
    )


def generate_entry(setup: Setup, dims: ParallelDims, stages: tuple[int, ...]) -> PlanEntry:
    spec, s, t, p, d = setup.spec, setup.seq_len, dims.tp, dims.pp, dims.dp
    vocab = padded_vocab_size(spec.vocab_size, t)
    split = _stage_split(spec, stages, vocab)
    stage_params = max(d_ + e_ for d_, e_ in split)
    weights = stage_params / t * setup.weight_bytes  # experts split over tp too (vLLM's default)
    if spec.is_mla:  # the compressed latent and the rotary key, one per token and layer, whole on every rank
        kv_token = max(stages) * (spec.kv_lora_rank + spec.qk_rope_head_dim) * 2
    else:
        kv_token = 2 * max(stages) * max(1, spec.num_key_value_heads // t) * spec.dh * 2  # K and V, bf16
    workspace = setup.generate_batch_size * vocab / t * 4  # fp32 logits of one decode step
    free = (setup.memory_limit_gb - RESERVED_GB) * GB - weights - workspace
    batch = int(min(setup.generate_batch_size, max(0.0, free) // (kv_token * s)))
    kv_cache = max(batch, 1) * kv_token * s
    links = _links(setup, dims)

    # One decode step of the replica: each stage reads its weights once per pipeline micro-batch
    # and the half-full KV cache of its layers; compute rarely binds but is counted.
    steps = math.ceil(setup.global_batch_tokens / d / max(batch, 1))
    weights_read = weights
    if spec.is_moe:  # a decode step reads the experts its tokens route to: 1 - (1 - k/E)^batch of them
        touched = 1 - (1 - spec.experts_per_token / spec.num_experts) ** max(batch, 1)
        dense, expert = max(split, key=sum)
        weights_read = (dense + touched * expert) / t * setup.weight_bytes
    active = max(_stage_active(spec, stages)) + vocab * spec.hidden_size
    read = p * weights_read + max(batch, 1) * (s / 2) * kv_token
    step = max(read / (HBM_GBPS * GB), 2 * active / t * max(batch, 1) / (setup.gpu_tflops * 1e12))
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
