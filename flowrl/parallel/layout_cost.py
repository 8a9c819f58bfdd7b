"""The layout cost model: per-GPU memory and step time of one (dp, tp, pp) layout of a model.

``train_entry`` / ``generate_entry`` estimate one layout for a ``Setup`` (the model, the cluster
and the batch); ``layout_search.plan_parallelism`` enumerates and ranks the layouts. ``Setup``,
``PlanEntry`` and the constants below live in ``layout_setup`` (re-exported here). Pure code:
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
from functools import lru_cache

from flowrl.parallel.layout_setup import (  # noqa: F401  (re-exported: the planner and its tests import them here)
    _GRAD_BYTES,
    _LOGIT_BYTES,
    DP_COMM_EXPOSED,
    GB,
    GPU_TFLOPS,
    HBM_GBPS,
    INTERCONNECTS,
    LONG_SEQUENCE,
    MEMORY_HEADROOM,
    MIN_LAYERS_PER_STAGE,
    NO_AXES,
    OPTIMIZER_BYTES,
    REFERENCE_BYTES,
    RESERVED_GB,
    TIE_TOLERANCE,
    WEIGHT_BYTES,
    Axes,
    Interconnect,
    PlanEntry,
    Setup,
)
from flowrl.parallel.mesh import ParallelDims, padded_vocab_size
from flowrl.parallel.model_spec import ModelSpec

__all__ = ["INTERCONNECTS", "NO_AXES", "Axes", "Interconnect", "PlanEntry", "Setup", "generate_entry", "train_entry",
           "train_memory"]


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

def _train_compute(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], k: int, axes: Axes, m: int,
                   vocab: int) -> tuple[float, float]:
    """(compute, bubble) seconds of a step. The slowest stage paces the pipeline; a recomputed layer
    runs its forward twice. Tokens pass through the active parameters only (top-k of the experts)."""
    spec = setup.spec
    s = setup.seq_len / axes.cp  # tokens of each sequence on this rank
    attention_flops = 6 * setup.seq_len * spec.num_attention_heads * spec.dh  # per token and layer, causal
    stage_flops = [(6 * active + n * attention_flops) * (1 + min(k, n) / n / 3)
                   for n, active in zip(stages, _stage_active(spec, stages))]
    stage_flops[-1] += 6 * vocab * spec.hidden_size  # the output layer
    t_mb = s * setup.micro_batch_size * max(stage_flops) / (dims.tp * setup.gpu_tflops * 1e12)
    return m * t_mb, (dims.pp - 1) * t_mb


def _expert_comm(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], axes: Axes, m: int, msg: float,
                 links: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """(bytes, seconds) of a step's expert-parallel all-to-alls and, with etp > 1, the etp
    all-gather before dispatch and reduce-scatter after combine."""
    spec = setup.spec
    ep_bytes = ep_s = 0.0
    n_sparse = max(_sparse_layers(spec, stages))
    if axes.ep > 1 and n_sparse:
        n_coll = m * 4 * n_sparse  # dispatch and combine, forward and backward
        bw, lat = links["ep"]
        # each rank dispatches its s*b/t sequence-parallel tokens, all-gathered over etp first
        routed = spec.experts_per_token * msg * axes.etp / dims.tp
        ep_bytes = n_coll * (axes.ep - 1) / axes.ep * routed
        ep_s = ep_bytes / bw + n_coll * (axes.ep - 1) * lat  # an all-to-all pays a latency per peer
    if axes.etp > 1 and n_sparse:
        n_coll = m * 4 * n_sparse
        bw, lat = links["tp"]
        etp_bytes = n_coll * (axes.etp - 1) / axes.etp * spec.experts_per_token * msg
        ep_bytes += etp_bytes
        ep_s += etp_bytes / bw + n_coll * lat
    return ep_bytes, ep_s


def _context_comm(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], axes: Axes, m: int,
                  links: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """(bytes, seconds) of a step's context-parallel K/V ring passes (3 per layer)."""
    if axes.cp <= 1:
        return 0.0, 0.0
    spec = setup.spec
    kv = spec.num_attention_heads if spec.is_mla else spec.num_key_value_heads
    n_coll = m * 3 * max(stages)
    bw, lat = links["cp"]
    cp_bytes = (n_coll * (axes.cp - 1) / axes.cp * 2 * setup.seq_len * setup.micro_batch_size * kv * spec.dh
                * setup.act_bytes / dims.tp)
    return cp_bytes, cp_bytes / bw + n_coll * (axes.cp - 1) * lat


def _dp_comm(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], axes: Axes, m: int, vocab: int,
             links: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """(bytes, exposed seconds) of a step's data-parallel gradient (and parameter) traffic: over
    dp x cp for the dense part, over edp for the experts; every micro-batch under FSDP."""
    spec, t, d = setup.spec, dims.tp, dims.dp
    dpc, edp = d * axes.cp, axes.edp(dims)
    if not (dpc > 1 or edp > 1):
        return 0.0, 0.0
    dense_gpu, expert_gpu = (x for x in max(_stage_split(spec, stages, vocab), key=sum))
    dense_gpu, expert_gpu = dense_gpu / t, expert_gpu / (axes.ep * axes.etp)
    if setup.lora_rank:  # LoRA: only the adapters' gradients travel
        trained = spec.num_layers * lora_params_per_layer(spec, setup.lora_rank) / (t * dims.pp)
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
    return dp_bytes, DP_COMM_EXPOSED * (dp_bytes / bw + 2 * lat)


def _train_notes(spec: ModelSpec, stages: tuple[int, ...], k: int, m: int, p: int, axes: Axes,
                 experts_gb: float) -> tuple[str, ...]:
    notes = []
    if len(set(stages)) > 1:
        notes.append(f"layers_per_stage={list(stages)}")
    if k:
        notes.append(f"recompute {min(k, max(stages))} of {max(stages)} layers per stage")
    if m < p:
        notes.append(f"only {m} micro-batches for {p} stages")
    if spec.is_moe:
        notes.append(f"experts {experts_gb:.1f} GB of the weights ({spec.num_experts // axes.ep} of "
                     f"{spec.num_experts} per rank{f', etp {axes.etp}' if axes.etp > 1 else ''})")
    return tuple(notes)


def train_entry(setup: Setup, dims: ParallelDims, stages: tuple[int, ...], k: int,
                axes: Axes = NO_AXES) -> PlanEntry:
    spec, b, t, p = setup.spec, setup.micro_batch_size, dims.tp, dims.pp
    s = setup.seq_len / axes.cp  # tokens of each sequence on this rank
    vocab = padded_vocab_size(spec.vocab_size, t)
    m = _micro_batches(setup, dims)
    weights, grads, optimizer, reference, activations, total, experts = (
        x / GB for x in _train_memory(setup, dims, stages, k, axes))
    links = _links(setup, dims, axes)
    compute_s, bubble_s = _train_compute(setup, dims, stages, k, axes, m, vocab)

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
    ep_bytes, ep_s = _expert_comm(setup, dims, stages, axes, m, msg, links)
    cp_bytes, cp_s = _context_comm(setup, dims, stages, axes, m, links)
    dp_bytes, dp_s = _dp_comm(setup, dims, stages, axes, m, vocab, links)
    return PlanEntry(
        dims=dims, for_="train", layers_per_stage=stages, recompute_layers=min(k, max(stages)),
        weights_gb=weights, grads_gb=grads, optimizer_gb=optimizer, reference_gb=reference,
        activations_gb=activations, reserved_gb=RESERVED_GB, memory_gb=total + RESERVED_GB,
        memory_limit_gb=setup.memory_limit_gb, compute_s=compute_s, bubble_s=bubble_s,
        tp_comm_s=tp_s, pp_comm_s=pp_s, dp_comm_s=dp_s,
        step_s=compute_s + bubble_s + tp_s + pp_s + dp_s + ep_s + cp_s,
        comm_gb=(tp_bytes + pp_bytes + dp_bytes + ep_bytes + cp_bytes) / GB,
        micro_batches=m, tokens=setup.global_batch_tokens, notes=_train_notes(spec, stages, k, m, p, axes, experts),
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
