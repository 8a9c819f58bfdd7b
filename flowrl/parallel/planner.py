"""Parallelism planner: which (dp, tp, pp) to train or generate with, for a model and a cluster.

``plan_parallelism("70B", num_gpus=128)`` enumerates the layouts the model and the cluster allow
(tp inside a node and dividing the heads, stages of at least MIN_LAYERS_PER_STAGE layers unless
pp is pinned), estimates per-GPU memory and the time of one optimizer step (train) or of generating
one batch (generate), drops layouts that do not fit, and ranks the rest by time; estimates within
TIE_TOLERANCE of each other count as ties and go to layouts without recompute, then to the
shallower pipeline, then to less communication. ``format_plan`` renders a table;
``flowrl parallel-plan`` (plan_cli.py) is the shell around both. Pure code: no torch, no I/O beyond
reading a ``config.json`` when given a path.

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
steps. On them the planner reproduces the practice HybridFlow/verl and Megatron-Bridge document
(pinned in tests/unit/test_planner.py): 7-8B on 8-64 GPUs -> dp + tp 2, pp 1; 30-34B on 32-128
GPUs -> tp 4 + pp 2; 175B and 405B on 128-1024 GPUs -> tp 8 + pp 8-16; over Ethernet (PCIe-only
nodes) a smaller tp than over InfiniBand. 13-20B sits on the boundary between the first two: there
tp 2 + pp 1-2, tp 4 + pp 1 and tp 4 + pp 2 lie within a few percent of each other and the model
picks from the small-model side (tp 2 + pp 2 for 13B on 16-32 GPUs). Under ~3B it picks pure data
parallel, as verl's FSDP recipes do.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Iterator, Literal, Mapping

from flowrl.parallel.mesh import ParallelDims, balanced_stages, padded_vocab_size, validate_model_layout

__all__ = ["INTERCONNECTS", "Interconnect", "ModelSpec", "PlanEntry", "format_plan", "parse_model",
           "plan_parallelism"]

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
"""The planner does not propose pipeline stages thinner than this (pin ``pp`` to go below): thin
stages buy nothing the cost model sees but pay p2p latency and end-stage imbalance in practice."""
TIE_TOLERANCE = 0.005
"""Step times within 0.5% count as equal; ties go to layouts without recompute, then to the
shallower pipeline, then to less communication."""
REFERENCE_BYTES = 2
"""A colocated frozen reference policy: bf16 weights in the actor's layout."""
_LOGIT_BYTES = 6  # bf16 logits + the fp32 copy inside the fused vocab-parallel cross-entropy
_GRAD_BYTES = 4  # fp32 main_grad buffers (Megatron-LM with bf16/fp16), fp32 anyway for fp32
_WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_OPTIMIZER_BYTES = {  # state per parameter: (with low-precision weights, with fp32 weights)
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

# -- model shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The shape of a decoder-only transformer, enough to size memory, compute and communication."""

    name: str = "custom"
    """What the shape is (a checkpoint's model type, or the family it was taken from)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    """Equal to num_attention_heads for multi-head attention, fewer for GQA."""
    ffn_hidden_size: int
    vocab_size: int
    head_dim: int | None = None
    """Per-head size; hidden_size / num_attention_heads when None."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with gate and up projections (Llama, Qwen, Mistral); False for GPT-2 style."""
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                     "ffn_hidden_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelSpec.{name}={value!r} must be a positive integer")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"ModelSpec: hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; give head_dim explicitly"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelSpec: num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )

    @property
    def dh(self) -> int:
        """Per-head size."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def params_per_layer(self) -> int:
        """Weights of one transformer layer: q, k, v, o projections, MLP, two norms."""
        h, dh = self.hidden_size, self.dh
        attention = h * dh * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_hidden_size
        return attention + mlp + 2 * h

    @property
    def num_params(self) -> int:
        """All parameters (unpadded vocabulary), the number a model card quotes."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.params_per_layer + embeddings + self.hidden_size

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | os.PathLike) -> ModelSpec:
        """From a transformers ``config.json`` (a dict, the file, or the checkpoint directory)."""
        if not isinstance(config, Mapping):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            if not os.path.isfile(path):
                raise ValueError(f"model config {path!r} does not exist; give a config.json or its directory")
            with open(path, encoding="utf-8") as fh:
                config = json.load(fh)
        if isinstance(config.get("text_config"), Mapping):  # multimodal wrappers
            config = {**config, **config["text_config"]}

        def pick(*keys: str, default: Any = None) -> Any:
            for key in keys:
                if config.get(key) is not None:
                    return config[key]
            if default is None:
                raise ValueError(
                    f"model config has none of the keys {list(keys)}; is it a decoder-only LM config?")
            return default

        hidden = pick("hidden_size", "n_embd", "d_model")
        heads = pick("num_attention_heads", "n_head")
        model_type = str(config.get("model_type", "custom"))
        act = str(config.get("hidden_act", config.get("activation_function", "silu")))
        return cls(
            name=model_type,
            num_layers=pick("num_hidden_layers", "n_layer", "num_layers"),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=pick("num_key_value_heads", default=heads),
            ffn_hidden_size=pick("intermediate_size", "n_inner", "ffn_hidden_size", default=4 * hidden),
            vocab_size=pick("vocab_size"),
            head_dim=config.get("head_dim"),
            gated_mlp=act in ("silu", "swiglu", "swish") or "glu" in act,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_num_params(cls, num_params: float) -> ModelSpec:
        """A standard shape for a parameter count: the Llama family's at 1B, 3B, 7B, 8B, 13B, 34B,
        70B and 405B (Qwen2.5 at 0.5B), log-interpolated (hidden, ffn ratio, then layers to match the
        count) in between and beyond."""
        if not isinstance(num_params, (int, float)) or isinstance(num_params, bool) or not num_params > 0:
            raise ValueError(f"num_params={num_params!r} must be a positive number such as 7e9")
        if num_params < 1e7:
            raise ValueError(f"num_params={num_params:g} is under 10M; write the count in full (7e9 or '7B')")
        for nominal, spec in _STANDARD_SHAPES:
            if abs(num_params / nominal - 1) < 0.02:
                return spec
        return _interpolate_shape(num_params)


_STANDARD_SHAPES: list[tuple[float, ModelSpec]] = [
    (0.5e9, ModelSpec(name="qwen2.5-0.5b", num_layers=24, hidden_size=896, num_attention_heads=14,
                      num_key_value_heads=2, ffn_hidden_size=4864, vocab_size=151936, tie_word_embeddings=True)),
    (1e9, ModelSpec(name="llama-3.2-1b", num_layers=16, hidden_size=2048, num_attention_heads=32,
                    num_key_value_heads=8, ffn_hidden_size=8192, vocab_size=128256, tie_word_embeddings=True)),
    (3e9, ModelSpec(name="llama-3.2-3b", num_layers=28, hidden_size=3072, num_attention_heads=24,
                    num_key_value_heads=8, ffn_hidden_size=8192, vocab_size=128256, tie_word_embeddings=True)),
    (7e9, ModelSpec(name="llama-2-7b", num_layers=32, hidden_size=4096, num_attention_heads=32,
                    num_key_value_heads=32, ffn_hidden_size=11008, vocab_size=32000)),
    (8e9, ModelSpec(name="llama-3-8b", num_layers=32, hidden_size=4096, num_attention_heads=32,
                    num_key_value_heads=8, ffn_hidden_size=14336, vocab_size=128256)),
    (13e9, ModelSpec(name="llama-2-13b", num_layers=40, hidden_size=5120, num_attention_heads=40,
                     num_key_value_heads=40, ffn_hidden_size=13824, vocab_size=32000)),
    (34e9, ModelSpec(name="codellama-34b", num_layers=48, hidden_size=8192, num_attention_heads=64,
                     num_key_value_heads=8, ffn_hidden_size=22016, vocab_size=32000)),
    (70e9, ModelSpec(name="llama-3-70b", num_layers=80, hidden_size=8192, num_attention_heads=64,
                     num_key_value_heads=8, ffn_hidden_size=28672, vocab_size=128256)),
    (405e9, ModelSpec(name="llama-3.1-405b", num_layers=126, hidden_size=16384, num_attention_heads=128,
                      num_key_value_heads=8, ffn_hidden_size=53248, vocab_size=128256)),
]


def _interpolate_shape(num_params: float) -> ModelSpec:
    """Hidden size, layer count and ffn ratio interpolated in log-parameters between the two nearest
    standard shapes (extrapolated beyond them); heads of 128 dims, 8 kv heads, the nearer shape's
    vocabulary; then the layer count (a multiple of 4, within 1.5x of the interpolated one) that
    best matches the parameter count."""
    anchors = [(n, s) for n, s in _STANDARD_SHAPES if n != 8e9]  # one shape per size class
    lo, hi = anchors[0], anchors[1]
    for lo, hi in zip(anchors, anchors[1:]):
        if num_params <= hi[0]:
            break
    (n0, s0), (n1, s1) = lo, hi
    x = math.log(num_params / n0) / math.log(n1 / n0)  # < 0 or > 1 extrapolates

    def geo(a: float, b: float, floor: float = -math.inf) -> float:
        return a * (b / a) ** max(x, floor)

    raw = geo(s0.hidden_size, s1.hidden_size) if x >= 0 else s0.hidden_size * (num_params / n0) ** (1 / 3)
    step = 1024 if raw >= 4096 else 512 if raw >= 1024 else 128  # heads a multiple of 8, 4, 1
    hidden = max(step, round(raw / step) * step)
    heads = hidden // 128
    ratio = geo(s0.ffn_hidden_size / s0.hidden_size, s1.ffn_hidden_size / s1.hidden_size, floor=0.0)
    near = s0 if x < 0.5 else s1
    kv = 8 if heads % 8 == 0 else 4 if heads % 4 == 0 else heads
    probe = ModelSpec(name=f"interpolated-{_format_count(num_params)}", num_layers=1, hidden_size=hidden,
                      num_attention_heads=heads, num_key_value_heads=kv,
                      ffn_hidden_size=max(256, round(hidden * ratio / 256) * 256),
                      vocab_size=near.vocab_size if x >= 0 else 32000,  # small models, small vocabularies
                      tie_word_embeddings=near.tie_word_embeddings)
    layers = (num_params - (probe.num_params - probe.params_per_layer)) / probe.params_per_layer
    typical = geo(s0.num_layers, s1.num_layers, floor=0.0)
    layers = min(max(layers, typical / 1.5), typical * 1.5)
    return replace(probe, num_layers=max(4, round(layers / 4) * 4))


_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def _format_count(n: float) -> str:
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


def parse_model(model: ModelSpec | Mapping[str, Any] | str | float | os.PathLike) -> ModelSpec:
    """A ModelSpec from a spec, a config dict, a parameter count (``7e9``, ``"7B"``, ``"350M"``), or a
    path to a Hugging Face ``config.json`` or checkpoint directory."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return ModelSpec.from_hf_config(model)
    if isinstance(model, (int, float)) and not isinstance(model, bool):
        return ModelSpec.from_num_params(float(model))
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        match = _COUNT.match(text)
        if match:
            return ModelSpec.from_num_params(float(match.group(1)) * _SUFFIX[match.group(2).lower()])
        if os.path.exists(text):
            return ModelSpec.from_hf_config(text)
        raise ValueError(
            f"model={text!r} is neither a parameter count (7B, 70e9, 350M) nor an existing "
            "config.json / checkpoint directory"
        )
    raise ValueError(f"model={model!r}: give a ModelSpec, a parameter count like '7B', or a config path")


# -- plan entries ---------------------------------------------------------------------------------


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


# -- estimates ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Setup:
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

    @property
    def memory_limit_gb(self) -> float:
        return (1 - MEMORY_HEADROOM) * self.gpu_memory_gb

    @property
    def act_bytes(self) -> int:
        return 2 if self.weight_bytes == 2 else 4


def _links(setup: _Setup, dims: ParallelDims) -> dict[str, tuple[float, float]]:
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


def _micro_batches(setup: _Setup, dims: ParallelDims) -> int:
    return max(1, math.ceil(setup.global_batch_tokens / (setup.seq_len * setup.micro_batch_size * dims.dp)))


def _train_memory(setup: _Setup, dims: ParallelDims, stages: tuple[int, ...], k: int) -> tuple[float, ...]:
    """Bytes (weights, grads, optimizer, reference, activations, total) on the fullest stage's GPUs,
    recomputing ``k`` layers per stage."""
    spec, s, b, t, p = setup.spec, setup.seq_len, setup.micro_batch_size, dims.tp, dims.pp
    vocab = padded_vocab_size(spec.vocab_size, t)
    m = _micro_batches(setup, dims)
    opt_bytes = _OPTIMIZER_BYTES[setup.optimizer][0 if setup.weight_bytes == 2 else 1]
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
        if not worst or sum(parts) > worst[-1]:
            worst = (*parts, sum(parts))
    return worst


def _train_entry(setup: _Setup, dims: ParallelDims, stages: tuple[int, ...], k: int) -> PlanEntry:
    spec, s, b, t, p, d = setup.spec, setup.seq_len, setup.micro_batch_size, dims.tp, dims.pp, dims.dp
    vocab = padded_vocab_size(spec.vocab_size, t)
    m = _micro_batches(setup, dims)
    weights, grads, optimizer, reference, activations, total = (
        x / GB for x in _train_memory(setup, dims, stages, k))
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
        if setup.distributed_optimizer:
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


def _generate_entry(setup: _Setup, dims: ParallelDims, stages: tuple[int, ...]) -> PlanEntry:
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


# -- the planner ----------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def _check_positive(value: Any, name: str, *, integer: bool = True) -> None:
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or not value > 0:
        kind, example = ("integer", "8") if integer else ("number", "80")
        raise ValueError(f"{name}={value!r} must be a positive {kind}, e.g. {example}")


def _layouts(setup: _Setup, tp: int | None, pp: int | None) -> Iterator[tuple[ParallelDims, tuple[int, ...]]]:
    """(dims, layers_per_stage) of every layout the model and cluster allow."""
    spec, n, gpn = setup.spec, setup.num_gpus, setup.gpus_per_node
    heads, kv, layers = spec.num_attention_heads, spec.num_key_value_heads, spec.num_layers
    for t in _divisors(n) if tp is None else [tp]:
        if t > gpn or gpn % t or heads % t or (kv % t and t % kv):
            continue  # a tp group stays inside one node and splits heads (kv heads may replicate)
        for p in _divisors(n // t) if pp is None else [pp]:
            if p > layers or (pp is None and p > 1 and layers // p < MIN_LAYERS_PER_STAGE):
                continue
            stages = (layers // p,) * p if layers % p == 0 else tuple(balanced_stages(layers, p))
            yield ParallelDims(dp=n // (t * p), tp=t, pp=p), stages


def _evaluate(setup: _Setup, for_: str, recompute: str, tp: int | None, pp: int | None) -> list[PlanEntry]:
    entries = []
    limit = (setup.memory_limit_gb - RESERVED_GB) * GB
    for dims, stages in _layouts(setup, tp, pp):
        if for_ == "generate":
            entries.append(_generate_entry(setup, dims, stages))
            continue
        most = max(stages)
        k = most if recompute == "full" else 0
        if recompute == "auto":  # the fewest recomputed layers that fit (all of them if none do)
            k = next((k for k in range(most + 1) if _train_memory(setup, dims, stages, k)[-1] <= limit), most)
        entries.append(_train_entry(setup, dims, stages, k))
    return entries


def _rank(entries: list[PlanEntry]) -> list[PlanEntry]:
    """Fastest first. Among entries within TIE_TOLERANCE of the fastest left, one without recompute
    wins, then the shallower pipeline (real pipelines lose more than the ideal bubble: stage
    imbalance, p2p synchronisation), then less traffic, then fewer model-parallel ranks."""
    left = sorted(entries, key=lambda e: e.step_s)
    ranked = []
    while left:
        ties = [e for e in left if e.step_s <= left[0].step_s * (1 + TIE_TOLERANCE)]
        best = min(ties, key=lambda e: (e.recompute_layers > 0, e.dims.pp, e.comm_gb,
                                        e.dims.model_parallel_size, e.step_s))
        ranked.append(best)
        left.remove(best)
    return ranked


def _no_fit_error(setup: _Setup, for_: str, recompute: str, tp: int | None, pp: int | None,
                  entries: list[PlanEntry]) -> ValueError:
    spec = setup.spec
    what = f"{_format_count(spec.num_params)} parameters ({spec.name})"
    best = min(entries, key=lambda e: e.memory_gb)
    head = (
        f"no layout of num_gpus={setup.num_gpus} fits {what} for {for_} in gpu_memory_gb="
        f"{setup.gpu_memory_gb:g} ({setup.memory_limit_gb:.1f} GB usable): the smallest needs "
        f"{best.memory_gb:.1f} GB per GPU ({best.dims}"
        f"{', recomputing every layer' if best.recompute_layers else ''})"
    )
    extra = ", or recompute='auto'" if recompute == "none" else ""
    for k in range(1, 11):  # more GPUs help until pp would exceed num_layers at the largest tp
        bigger = replace(setup, num_gpus=setup.num_gpus * 2**k)
        if any(e.fits for e in _evaluate(bigger, for_, recompute, tp, pp)):
            return ValueError(f"{head}; use num_gpus={bigger.num_gpus} or more, GPUs with more memory, "
                              f"or a shorter seq_len{extra}")
    max_tp = max(t for t in _divisors(setup.gpus_per_node) if spec.num_attention_heads % t == 0)
    return ValueError(
        f"{head}; more GPUs do not help: a replica would need more than num_layers*tp = "
        f"{spec.num_layers}*{max_tp} = {spec.num_layers * max_tp} GPUs, i.e. "
        f"pipeline_model_parallel_size > num_layers={spec.num_layers}; use GPUs with more memory or a "
        f"shorter seq_len{extra}"
    )


def _check_pinned(setup: _Setup, tp: int | None, pp: int | None) -> None:
    spec, n = setup.spec, setup.num_gpus
    if tp is not None:
        _check_positive(tp, "tensor_model_parallel_size")
        if tp > setup.gpus_per_node:
            raise ValueError(
                f"tensor_model_parallel_size={tp} exceeds gpus_per_node={setup.gpus_per_node}; keep tp "
                "inside one node and span nodes with pipeline_model_parallel_size"
            )
    if pp is not None:
        _check_positive(pp, "pipeline_model_parallel_size")
    if n % ((tp or 1) * (pp or 1)):
        raise ValueError(
            f"tensor_model_parallel_size*pipeline_model_parallel_size = {tp or 1}*{pp or 1} does not "
            f"divide num_gpus={n}; pick sizes whose product divides {n}"
        )
    p = pp or 1
    validate_model_layout(  # names the setting and the values that work
        ParallelDims(dp=n // ((tp or 1) * p), tp=tp or 1, pp=p),
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        num_layers=spec.num_layers, vocab_size=spec.vocab_size,
        layers_per_stage=balanced_stages(spec.num_layers, p) if p <= spec.num_layers else None,
    )


def plan_parallelism(
    model: ModelSpec | Mapping[str, Any] | str | float,
    *,
    num_gpus: int,
    gpu_memory_gb: float = 80.0,
    interconnect: Literal["nvlink_ib", "ib", "ethernet"] = "ib",
    gpus_per_node: int = 8,
    seq_len: int = 4096,
    micro_batch_size: int = 1,
    global_batch_tokens: int = 2**20,
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16",
    optimizer: Literal["adam", "sgd"] = "adam",
    distributed_optimizer: bool = True,
    reference_model: bool = True,
    for_: Literal["train", "generate"] = "train",
    top_k: int | None = 5,
    recompute: Literal["auto", "none", "full"] = "auto",
    tp: int | None = None,
    pp: int | None = None,
    generate_batch_size: int = 256,
    gpu_tflops: float = GPU_TFLOPS,
) -> list[PlanEntry]:
    """Rank the (dp, tp, pp) layouts of ``num_gpus`` GPUs for training or generating with ``model``.

    Args:
        model: a ModelSpec, a transformers config dict, a parameter count (``7e9``, ``"7B"``) or the
            path of a ``config.json`` / checkpoint directory.
        num_gpus: GPUs of the worker group; every layout has dp*tp*pp = num_gpus.
        gpu_memory_gb: memory per GPU.
        interconnect: a key of INTERCONNECTS (its ``description`` says what it models).
        gpus_per_node: tp groups stay inside a node.
        seq_len, micro_batch_size: tokens per sequence, sequences per micro-batch.
        global_batch_tokens: tokens per optimizer step (train) or generated per batch (generate).
        dtype, optimizer, distributed_optimizer: as Megatron's --bf16, --optimizer and
            --use-distributed-optimizer.
        reference_model: a frozen reference policy shares the actor's GPUs and layout (train).
        for_: "train" (the Megatron actor update) or "generate" (the rollout engine).
        top_k: how many layouts to return; None for all that fit.
        recompute: "auto" recomputes the fewest layers per stage that make a layout fit.
        tp, pp: pin tensor_model_parallel_size / pipeline_model_parallel_size and plan the rest.
        generate_batch_size: most concurrent sequences per generation replica (vLLM max_num_seqs).
        gpu_tflops: sustained bf16 TFLOP/s per GPU.

    Returns the layouts that fit, fastest first. Raises ValueError naming the bad argument and a fix,
    or, when nothing fits, the smallest memory any layout needs and how many GPUs would do.
    """
    _check_positive(num_gpus, "num_gpus")
    _check_positive(gpu_memory_gb, "gpu_memory_gb", integer=False)
    _check_positive(gpu_tflops, "gpu_tflops", integer=False)
    for name, value in (("gpus_per_node", gpus_per_node), ("seq_len", seq_len),
                        ("micro_batch_size", micro_batch_size), ("global_batch_tokens", global_batch_tokens),
                        ("generate_batch_size", generate_batch_size)):
        _check_positive(value, name)
    if top_k is not None:
        _check_positive(top_k, "top_k")
    for name, value, valid in (
        ("interconnect", interconnect, INTERCONNECTS),
        ("dtype", dtype, _WEIGHT_BYTES),
        ("optimizer", optimizer, _OPTIMIZER_BYTES),
        ("for_", for_, ("train", "generate")),
        ("recompute", recompute, ("auto", "none", "full")),
    ):
        if value not in valid:
            raise ValueError(f"unknown {name}={value!r}; use one of {', '.join(map(repr, valid))}")
    setup = _Setup(
        spec=parse_model(model), num_gpus=num_gpus, gpu_memory_gb=float(gpu_memory_gb),
        link=INTERCONNECTS[interconnect], gpus_per_node=gpus_per_node, seq_len=seq_len,
        micro_batch_size=micro_batch_size, global_batch_tokens=global_batch_tokens,
        weight_bytes=_WEIGHT_BYTES[dtype], optimizer=optimizer,
        distributed_optimizer=bool(distributed_optimizer), reference_model=bool(reference_model),
        generate_batch_size=generate_batch_size, gpu_tflops=float(gpu_tflops),
    )
    _check_pinned(setup, tp, pp)
    entries = _evaluate(setup, for_, recompute, tp, pp)
    if not entries:  # only when num_gpus cannot be split at all, e.g. a prime count above a node
        raise ValueError(
            f"no (dp, tp, pp) split of num_gpus={num_gpus} suits {setup.spec.name}: tp must divide "
            f"gpus_per_node={gpus_per_node} and num_attention_heads={setup.spec.num_attention_heads}"
        )
    fitting = [e for e in entries if e.fits]
    if not fitting:
        raise _no_fit_error(setup, for_, recompute, tp, pp, entries)
    ranked = _rank(fitting)
    return ranked[:top_k] if top_k is not None else ranked


def format_plan(entries: list[PlanEntry]) -> str:
    """A fixed-width table of plan entries, best first."""
    if not entries:
        return "(no layouts)"
    generate = entries[0].for_ == "generate"
    mem_names = ("weights", "kv cache") if generate else ("weights", "grads", "optim", "ref", "activ")
    header = ("#", "dp", "tp", "pp", "mem GB", *mem_names, "step s", "compute", "bubble",
              "tp comm", "pp comm", "dp comm", "comm GB", "notes")
    rows = [header]
    for i, e in enumerate(entries, 1):
        mems = (e.weights_gb, e.activations_gb) if generate else (
            e.weights_gb, e.grads_gb, e.optimizer_gb, e.reference_gb, e.activations_gb)
        rows.append((
            str(i), str(e.dims.dp), str(e.dims.tp), str(e.dims.pp),
            f"{e.memory_gb:.1f}/{e.memory_limit_gb:.0f}", *(f"{x:.1f}" for x in mems),
            *(f"{x:.2f}" for x in (e.step_s, e.compute_s, e.bubble_s, e.tp_comm_s, e.pp_comm_s, e.dp_comm_s)),
            f"{e.comm_gb:.1f}", "; ".join(e.notes),
        ))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    lines = [line.rstrip() for line in lines]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
