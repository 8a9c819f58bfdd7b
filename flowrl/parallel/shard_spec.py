"""Parameter shard specs: which slices of each Hugging Face parameter every rank of a layout holds.

A ``ShardSpec`` describes one model (``ModelShape``) split over one layout (``ParallelDims``) in one
*style* of local storage:

- ``"megatron"``: the training backend's shards, exactly as ``convert.hf_to_megatron`` cuts them
  (megatron names, layer indices restarting per model chunk, ``model{v}.`` prefixes with vpp > 1);
  fused ``linear_qkv`` interleaved per KV group ``[q heads of group g; k_g; v_g]`` and cut flat into
  tp equal row blocks (a group spans ``tp / kv_heads`` ranks when tp > kv heads, megatron-core's
  layout), ``linear_fc1 = [gate_r; up_r]``, vocabulary padded to a multiple of
  ``make_vocab_size_divisible_by * tp``.
- ``"vllm"``: a vLLM-style generation engine: ``qkv_proj = [q_r; k_r; v_r]`` (kv heads split over tp,
  or replicated over ``tp / kv_heads`` ranks when tp > kv heads), ``gate_up_proj = [gate_r; up_r]``,
  HF layer indices, vocabulary padded to a multiple of 64 (``DEFAULT_VOCAB_PADDING_SIZE``); with
  tied embeddings and pp > 1 the last stage also holds ``model.embed_tokens.weight`` for its head.
- ``"hf"``: transformers' own parameters (the ``hf`` generation backend and the ``dp`` trainer):
  unfused ``q/k/v_proj``, ``gate_proj``, ``up_proj`` under their HF names; at tp = 1 every local
  tensor is the HF parameter itself (no vocabulary padding). tp > 1 splits each tensor as vLLM
  does (kv heads replicated when tp > kv heads), vocabulary padded to a multiple of tp.

Mixture-of-experts models (``ModelShape.num_experts`` > 0; Qwen3-MoE, Mixtral: every layer
sparse, no shared expert) have per-expert logical parameters, the names ``save_pretrained``
writes: ``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight`` (F_e, h) / (h, F_e), the
router ``model.layers.{i}.mlp.gate.weight`` (E, h) and Qwen3's ``self_attn.{q,k}_norm.weight``
(d,). Expert-parallel rank ``ep_rank`` holds experts ``[ep_rank * E / ep, (ep_rank + 1) * E / ep)``
(local ``k = e - ep_rank * E / ep``), each expert's weights split over the expert tensor-parallel
ranks (``etp``, default tp) as a dense MLP's over tp; router and q/k norms are replicated:

- ``"megatron"`` (local spec, SequentialMLP): ``mlp.router.weight``,
  ``mlp.experts.local_experts.{k}.linear_fc1.weight = [gate_r; up_r]`` (2 F_e / etp, h),
  ``...linear_fc2.weight`` (h, F_e / etp), ``self_attention.{q,k}_layernorm.weight``.
- ``"hf"``: transformers 5's fused in-memory tensors ``mlp.experts.gate_up_proj`` (E / ep,
  2 F_e / etp, h), per expert ``[gate_r; up_r]``, and ``mlp.experts.down_proj`` (E / ep, h,
  F_e / etp); a piece addresses one expert of them by its leading ``index``.
- ``"vllm"``: FusedMoE's ``mlp.experts.w13_weight`` (E / ep, 2 F_e / etp, h) and ``w2_weight``
  (E / ep, h, F_e / etp), likewise indexed. vLLM splits experts over tp without expert parallelism
  (ep = 1, etp = tp), or holds whole ones with it (etp = 1; its EP group spans tp x its
  data-parallel attention ranks, megatron's generator with etp = 1).

Every parameter is split along at most one dimension (``split_dim``): dim 0 for column-parallel
weights, biases, embeddings and replicated norms, dim 1 for row-parallel ``o_proj``/``down_proj``.
So a rank's holding is a list of ``Piece``: HF rows/columns ``[start, stop)`` of ``param`` along
``dim`` sit at ``[offset, offset + stop - start)`` of local tensor ``local`` along the same dim, all
other dims whole (with ``index`` set: of ``local[index]``, one expert of a fused 3-D tensor).
Local elements that no piece covers are vocabulary padding (zero, no logical element). dp
replicas hold identical shards, so shards are keyed ``(tp_rank, pp_rank)``, or ``(tp_rank,
pp_rank, ep_rank, etp_rank)`` when the layout has expert parallelism (``ParallelDims.shard_key``).

Letters: V vocab, Vp padded vocab, h hidden, F ffn, L layers, nh / nkv heads, d head_dim. The
model's facts: ``flowrl.parallel.model_shape``. Pure code: no torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from flowrl.catalog.backends import ShardStyle
from flowrl.parallel.mesh import ParallelDims, validate_model_layout
from flowrl.parallel.model_shape import ModelShape, model_shape

__all__ = [
    "STYLES",
    "ModelShape",
    "Piece",
    "RankShard",
    "ShardSpec",
    "local_view",
    "model_shape",
    "shard_arrays",
    "shard_spec",
]

STYLES = (ShardStyle.MEGATRON, ShardStyle.VLLM, ShardStyle.HF)
"""The styles :func:`shard_spec` builds (``ShardStyle.FSDP``: ``flowrl.parallel.fsdp_spec``)."""
VLLM_VOCAB_PADDING = 64
"""vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``: VocabParallelEmbedding pads to a multiple of 64."""


@dataclass(frozen=True)
class Piece:
    """HF indices ``[start, stop)`` of ``param`` along ``dim`` sit at ``[offset, ...)`` of ``local``
    (of ``local[index]`` when ``index`` is set: one expert of a fused 3-D tensor)."""

    param: str
    dim: int
    start: int
    stop: int
    local: str
    offset: int
    index: int | None = None

    @property
    def length(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class RankShard:
    """What one shard key holds: its local tensors (with padding) and the pieces in them."""

    tp_rank: int
    pp_rank: int
    tensors: dict[str, tuple[int, ...]]
    """Local tensor name -> shape (padded vocabulary rows included)."""
    pieces: tuple[Piece, ...]
    ep_rank: int = 0
    etp_rank: int | None = None
    """Set (with ``ep_rank``) when the layout's keys carry expert coordinates."""

    @property
    def key(self) -> tuple[int, ...]:
        """``(tp_rank, pp_rank)``, or ``(tp_rank, pp_rank, ep_rank, etp_rank)`` (module doc)."""
        if self.etp_rank is None:
            return (self.tp_rank, self.pp_rank)
        return (self.tp_rank, self.pp_rank, self.ep_rank, self.etp_rank)

    def by_param(self) -> dict[str, list[Piece]]:
        out: dict[str, list[Piece]] = {}
        for piece in self.pieces:
            out.setdefault(piece.param, []).append(piece)
        return out


@dataclass(frozen=True)
class ShardSpec:
    """A model's parameters split over a layout: ``params`` (HF name -> full shape), ``split_dim``
    (HF name -> the one dim that layouts cut), ``shards[(tp_rank, pp_rank)]``."""

    model: ModelShape
    dims: ParallelDims
    style: ShardStyle
    padded_vocab_size: int
    params: dict[str, tuple[int, ...]]
    split_dim: dict[str, int]
    shards: dict[tuple[int, ...], RankShard] = field(repr=False)

    def key_of(self, rank: int) -> tuple[int, ...]:
        """The shard key of a global rank (``ParallelDims.shard_key``)."""
        return self.dims.shard_key(rank)

    def shard_of(self, rank: int) -> RankShard:
        """The shard held by a global rank (dp replicas hold the same shard)."""
        return self.shards[self.dims.shard_key(rank)]

    def slice_numel(self, param: str) -> int:
        """Elements in one index of ``param`` along its split dim (a row, or a column)."""
        shape = self.params[param]
        return math.prod(shape) // shape[self.split_dim[param]]

    @property
    def num_params(self) -> int:
        """Logical elements of the model (unpadded vocabulary, tied embeddings counted once)."""
        return sum(math.prod(s) for s in self.params.values())

    def shard_numel(self, key: tuple[int, ...]) -> int:
        """Elements allocated on one shard, padding included."""
        return sum(math.prod(s) for s in self.shards[key].tensors.values())


def _split_dim(name: str) -> int:
    return 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0


class _Builder:
    """Collects the local tensors and pieces of one rank."""

    def __init__(self) -> None:
        self.tensors: dict[str, tuple[int, ...]] = {}
        self.pieces: list[Piece] = []

    def tensor(self, local: str, shape: tuple[int, ...]) -> None:
        assert local not in self.tensors, local
        self.tensors[local] = shape

    def piece(self, param: str, start: int, stop: int, local: str, offset: int,
              index: int | None = None) -> None:
        if stop > start:
            self.pieces.append(Piece(param, _split_dim(param), start, stop, local, offset, index))

    def whole(self, param: str, local: str, shape: tuple[int, ...]) -> None:
        """A replicated (or unsplit) parameter stored as is."""
        self.tensor(local, shape)
        self.piece(param, 0, shape[0], local, 0)

    def block(self, param: str, local: str, shape: tuple[int, ...], rank: int, num: int) -> None:
        """The rank-th of num equal blocks along the split dim (row/column parallel)."""
        dim = _split_dim(param)
        size = shape[dim] // num
        self.tensor(local, shape[:dim] + (size,) + shape[dim + 1:])
        self.piece(param, rank * size, (rank + 1) * size, local, 0)

    def vocab(self, param: str, local: str, model: ModelShape, vocab_padded: int, rank: int,
              tp: int) -> None:
        """A vocab-parallel block of Vp / tp rows; rows past V are padding (no piece)."""
        per = vocab_padded // tp
        self.tensor(local, (per, model.hidden_size))
        self.piece(param, rank * per, min((rank + 1) * per, model.vocab_size), local, 0)


def _layer_groups(model: ModelShape, dims: ParallelDims, stages: tuple[int, ...], pp_rank: int,
                  style: str) -> list[tuple[str, range]]:
    """(local name prefix, HF layer indices) of each model chunk of stage pp_rank."""
    if dims.vpp is None or dims.vpp == 1:
        start = sum(stages[:pp_rank])
        layers = range(start, start + stages[pp_rank])
        return [("", layers)]
    per_chunk = model.num_layers // (dims.pp * dims.vpp)  # convert.chunk_layers' formula
    groups = []
    for v in range(dims.vpp):
        start = v * (model.num_layers // dims.vpp) + pp_rank * per_chunk
        groups.append((f"model{v}.", range(start, start + per_chunk)))
    return groups


def _qkv_megatron(b: _Builder, model: ModelShape, layer: int, local: str, suffix: str, rank: int,
                  tp: int) -> None:
    """Rows [rank*R, (rank+1)*R) of the flat [q_g; k_g; v_g] per-group interleave."""
    d, qpg = model.head_dim, model.q_per_group
    hf = f"model.layers.{layer}.self_attn."
    total = (model.num_heads + 2 * model.num_kv_heads) * d
    per = total // tp
    lo, hi = rank * per, (rank + 1) * per
    trailing = (model.hidden_size,) if suffix == "weight" else ()
    b.tensor(local, (per,) + trailing)
    flat = 0
    for g in range(model.num_kv_heads):
        for proj, rows in (("q", qpg * d), ("k", d), ("v", d)):
            start, stop = max(lo, flat), min(hi, flat + rows)
            if start < stop:  # this segment's rows [start, stop) in flat order
                first = g * rows  # HF row of this segment's first row
                b.piece(f"{hf}{proj}_proj.{suffix}", first + start - flat, first + stop - flat,
                        local, start - lo)
            flat += rows


def _qkv_vllm(b: _Builder, model: ModelShape, layer: int, local: str, suffix: str, rank: int,
              tp: int) -> None:
    """[q_r; k_r; v_r]: q heads split; kv heads split, or head rank // (tp / nkv) replicated."""
    d = model.head_dim
    hf = f"model.layers.{layer}.self_attn."
    q_rows = model.num_heads // tp * d
    if tp <= model.num_kv_heads:
        kv_rows = model.num_kv_heads // tp * d
        kv_start = rank * kv_rows
    else:
        kv_rows = d
        kv_start = rank // (tp // model.num_kv_heads) * d
    trailing = (model.hidden_size,) if suffix == "weight" else ()
    b.tensor(local, (q_rows + 2 * kv_rows,) + trailing)
    b.piece(f"{hf}q_proj.{suffix}", rank * q_rows, (rank + 1) * q_rows, local, 0)
    b.piece(f"{hf}k_proj.{suffix}", kv_start, kv_start + kv_rows, local, q_rows)
    b.piece(f"{hf}v_proj.{suffix}", kv_start, kv_start + kv_rows, local, q_rows + kv_rows)


def _layer_hf(b: _Builder, model: ModelShape, layer: int, rank: int, tp: int) -> None:
    """Unfused HF tensors, each one cut as vLLM cuts its fused counterpart."""
    h, f, d = model.hidden_size, model.ffn_hidden_size, model.head_dim
    hf = f"model.layers.{layer}."
    q_rows = model.num_heads // tp * d
    if tp <= model.num_kv_heads:
        kv_rows = model.num_kv_heads // tp * d
        kv_start = rank * kv_rows
    else:
        kv_rows, kv_start = d, rank // (tp // model.num_kv_heads) * d
    b.whole(hf + "input_layernorm.weight", hf + "input_layernorm.weight", (h,))
    for suffix in ("weight", "bias") if model.qkv_bias else ("weight",):
        trailing = (h,) if suffix == "weight" else ()
        for proj, rows, start in (("q", q_rows, rank * q_rows), ("k", kv_rows, kv_start),
                                  ("v", kv_rows, kv_start)):
            name = f"{hf}self_attn.{proj}_proj.{suffix}"
            b.tensor(name, (rows,) + trailing)
            b.piece(name, start, start + rows, name, 0)
    b.block(hf + "self_attn.o_proj.weight", hf + "self_attn.o_proj.weight",
            (h, model.num_heads * d), rank, tp)
    _qk_norms(b, model, layer, hf + "self_attn.{p}_norm.weight")
    b.whole(hf + "post_attention_layernorm.weight", hf + "post_attention_layernorm.weight", (h,))
    if model.is_moe:
        return
    for proj in ("gate", "up"):
        b.block(f"{hf}mlp.{proj}_proj.weight", f"{hf}mlp.{proj}_proj.weight", (f, h), rank, tp)
    b.block(hf + "mlp.down_proj.weight", hf + "mlp.down_proj.weight", (h, f), rank, tp)


def _qk_norms(b: _Builder, model: ModelShape, layer: int, local: str) -> None:
    """Qwen3's per-head q/k RMSNorm weights, replicated (``local`` with ``{p}`` for q / k)."""
    if model.qk_norm:
        for p in "qk":
            b.whole(f"model.layers.{layer}.self_attn.{p}_norm.weight", local.format(p=p),
                    (model.head_dim,))


def _experts(b: _Builder, model: ModelShape, style: ShardStyle, layer: int, prefix: str,
             ep_rank: int, ep: int, etp_rank: int, etp: int) -> None:
    """One MoE layer's router (replicated) and this expert rank's experts (module doc)."""
    h, fe, num = model.hidden_size, model.moe_ffn_hidden_size, model.num_experts // ep
    rows = fe // etp
    lo, hi = etp_rank * rows, (etp_rank + 1) * rows
    gate, up, down = (n.replace("{i}", str(layer)) for n in model.expert_names)
    hf = f"model.layers.{layer}.mlp."
    if style is ShardStyle.MEGATRON:
        b.whole(hf + "gate.weight", prefix + "mlp.router.weight", (model.num_experts, h))
        for k in range(num):
            e, x = ep_rank * num + k, f"{prefix}mlp.experts.local_experts.{k}."
            b.tensor(x + "linear_fc1.weight", (2 * rows, h))
            b.piece(gate.format(e=e), lo, hi, x + "linear_fc1.weight", 0)
            b.piece(up.format(e=e), lo, hi, x + "linear_fc1.weight", rows)
            b.tensor(x + "linear_fc2.weight", (h, rows))
            b.piece(down.format(e=e), lo, hi, x + "linear_fc2.weight", 0)
        return
    b.whole(hf + "gate.weight", hf + "gate.weight", (model.num_experts, h))
    fc1, fc2 = (("gate_up_proj", "down_proj") if style is ShardStyle.HF
                else ("w13_weight", "w2_weight"))
    fc1, fc2 = hf + "experts." + fc1, hf + "experts." + fc2
    b.tensor(fc1, (num, 2 * rows, h))
    b.tensor(fc2, (num, h, rows))
    for k in range(num):
        e = ep_rank * num + k
        b.piece(gate.format(e=e), lo, hi, fc1, 0, index=k)
        b.piece(up.format(e=e), lo, hi, fc1, rows, index=k)
        b.piece(down.format(e=e), lo, hi, fc2, 0, index=k)


def _layer(b: _Builder, model: ModelShape, style: ShardStyle, layer: int, prefix: str, rank: int,
           tp: int) -> None:
    if style is ShardStyle.HF:
        _layer_hf(b, model, layer, rank, tp)
        return
    h, f, q = model.hidden_size, model.ffn_hidden_size, model.num_heads * model.head_dim
    hf = f"model.layers.{layer}."
    megatron = style is ShardStyle.MEGATRON
    if megatron:
        names = {"in_norm": prefix + "input_layernorm.weight",
                 "qkv": prefix + "self_attention.linear_qkv.",
                 "o": prefix + "self_attention.linear_proj.weight",
                 "post_norm": prefix + "pre_mlp_layernorm.weight",
                 "fc1": prefix + "mlp.linear_fc1.weight", "fc2": prefix + "mlp.linear_fc2.weight"}
    else:
        names = {"in_norm": hf + "input_layernorm.weight", "qkv": hf + "self_attn.qkv_proj.",
                 "o": hf + "self_attn.o_proj.weight",
                 "post_norm": hf + "post_attention_layernorm.weight",
                 "fc1": hf + "mlp.gate_up_proj.weight", "fc2": hf + "mlp.down_proj.weight"}
    b.whole(hf + "input_layernorm.weight", names["in_norm"], (h,))
    qkv = _qkv_megatron if megatron else _qkv_vllm
    for suffix in ("weight", "bias") if model.qkv_bias else ("weight",):
        qkv(b, model, layer, names["qkv"] + suffix, suffix, rank, tp)
    b.block(hf + "self_attn.o_proj.weight", names["o"], (h, q), rank, tp)
    _qk_norms(b, model, layer, prefix + "self_attention.{p}_layernorm.weight" if megatron
              else hf + "self_attn.{p}_norm.weight")
    b.whole(hf + "post_attention_layernorm.weight", names["post_norm"], (h,))
    if model.is_moe:
        return
    rows = f // tp
    b.tensor(names["fc1"], (2 * rows, h))
    b.piece(hf + "mlp.gate_proj.weight", rank * rows, (rank + 1) * rows, names["fc1"], 0)
    b.piece(hf + "mlp.up_proj.weight", rank * rows, (rank + 1) * rows, names["fc1"], rows)
    b.block(hf + "mlp.down_proj.weight", names["fc2"], (h, f), rank, tp)


def _check(model: ModelShape, dims: ParallelDims, style: ShardStyle,
           layers_per_stage: list[int] | None, make_vocab_size_divisible_by: int
           ) -> tuple[tuple[int, ...], int]:
    layout = validate_model_layout(
        dims, num_attention_heads=model.num_heads, num_key_value_heads=model.num_kv_heads,
        num_layers=model.num_layers, vocab_size=model.vocab_size,
        layers_per_stage=layers_per_stage,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by, num_experts=model.num_experts)
    tp = dims.tp
    if model.is_moe and model.moe_ffn_hidden_size % dims.expert_tp:
        raise ValueError(f"expert_tensor_parallel_size={dims.expert_tp} does not divide the experts' "
                         f"width moe_intermediate_size={model.moe_ffn_hidden_size}; pick an etp "
                         "that divides it")
    if style is ShardStyle.VLLM and model.is_moe and not (
            (dims.ep == 1 and dims.expert_tp == tp) or (dims.expert_tp == 1 and dims.ep % tp == 0)):
        raise ValueError(
            f"expert_model_parallel_size={dims.ep}, expert_tensor_parallel_size={dims.expert_tp} "
            f"with tensor_model_parallel_size={tp}: vLLM's FusedMoE either splits every expert over "
            "tp (ep=1, etp=tp) or, with expert parallelism, holds whole experts (etp=1) over an EP "
            f"group of tp x data-parallel ranks (ep a multiple of tp={tp}); use ep=1, or ep={tp},"
            "etp=1 (enable_expert_parallel in one engine), or the hf generation style")
    if not model.is_moe and model.ffn_hidden_size % tp:
        raise ValueError(f"tensor_model_parallel_size={tp} does not divide intermediate_size="
                         f"{model.ffn_hidden_size}; pick a tp that divides it")
    if style is ShardStyle.MEGATRON and ((model.num_heads + 2 * model.num_kv_heads) * model.head_dim) % tp:
        raise ValueError(f"tensor_model_parallel_size={tp} does not divide the fused qkv rows "
                         f"(num_heads + 2*num_kv_heads)*head_dim; use a tp <= num_kv_heads="
                         f"{model.num_kv_heads}")
    if style in (ShardStyle.VLLM, ShardStyle.HF):
        if dims.vpp not in (None, 1):
            raise ValueError(f"virtual_pipeline_model_parallel_size={dims.vpp}: a {style}-style "
                             "generation layout has no virtual pipeline; set it to None")
        if style is ShardStyle.HF:
            if model.num_heads % tp:
                raise ValueError(f"tensor_model_parallel_size={tp} does not divide num_heads="
                                 f"{model.num_heads}")
            return layout.layers_per_stage, math.ceil(model.vocab_size / tp) * tp
        vocab = math.ceil(model.vocab_size / VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
        if vocab % tp:
            raise ValueError(f"tensor_model_parallel_size={tp} does not divide vLLM's padded "
                             f"vocabulary {vocab}; use a power of two up to {VLLM_VOCAB_PADDING}")
    else:
        vocab = layout.padded_vocab_size
    return layout.layers_per_stage, vocab


def shard_spec(model: Any, dims: ParallelDims, *, style: ShardStyle | str = ShardStyle.MEGATRON,
               layers_per_stage: list[int] | None = None,
               make_vocab_size_divisible_by: int = 128) -> ShardSpec:
    """Describe what every shard key of ``dims`` holds of ``model`` (see the module doc).

    Raises ValueError (naming the setting and the fix) when the model does not split over ``dims``.
    """
    model = model_shape(model)
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, got {type(dims).__name__}")
    if style not in STYLES:
        raise ValueError(f"style={style!r} is not a shard style; use one of {', '.join(STYLES)}")
    style = ShardStyle(style)
    stages, vocab = _check(model, dims, style, layers_per_stage, make_vocab_size_divisible_by)
    tp, pp = dims.tp, dims.pp
    shards = {}
    for key in dims.shard_keys():
        tp_rank, pp_rank = key[:2]
        ep_rank, etp_rank = key[2:] if dims.expert_keys else (0, tp_rank)
        b = _Builder()
        groups = _layer_groups(model, dims, stages, pp_rank, style)
        first, last = pp_rank == 0, pp_rank == pp - 1
        embed = "model.embed_tokens.weight"
        if first:
            local = (groups[0][0] + "embedding.word_embeddings.weight"
                     if style is ShardStyle.MEGATRON else embed)
            b.vocab(embed, local, model, vocab, tp_rank, tp)
        for prefix, layers in groups:
            for j, i in enumerate(layers):
                mprefix = f"{prefix}decoder.layers.{j}."
                _layer(b, model, style, i, mprefix, tp_rank, tp)
                if model.is_moe:
                    _experts(b, model, style, i, mprefix, ep_rank, dims.ep, etp_rank,
                             dims.expert_tp)
        if last:
            prefix = groups[-1][0]
            b.whole("model.norm.weight", prefix + "decoder.final_layernorm.weight"
                    if style is ShardStyle.MEGATRON else "model.norm.weight", (model.hidden_size,))
            if not model.tied_embeddings:
                local = prefix + "output_layer.weight" if style is ShardStyle.MEGATRON else "lm_head.weight"
                b.vocab("lm_head.weight", local, model, vocab, tp_rank, tp)
            elif not first:  # tied, pp > 1: the last stage keeps its own copy of the embedding
                local = prefix + "output_layer.weight" if style is ShardStyle.MEGATRON else embed
                b.vocab(embed, local, model, vocab, tp_rank, tp)
        shards[key] = RankShard(tp_rank, pp_rank, b.tensors, tuple(b.pieces), ep_rank,
                                etp_rank if dims.expert_keys else None)
    params = model.param_shapes()
    return ShardSpec(model=model, dims=dims, style=style, padded_vocab_size=vocab, params=params,
                     split_dim={name: _split_dim(name) for name in params}, shards=shards)


def piece_index(piece: Piece, *, local: bool, ndim: int) -> tuple[Any, ...]:
    """The index of a piece in the HF tensor (``local=False``) or in its local tensor (led by
    the piece's ``index`` when it addresses one expert of a fused tensor)."""
    start = piece.offset if local else piece.start
    lead = (piece.index,) if local and piece.index is not None else ()
    return lead + (slice(None),) * piece.dim + (slice(start, start + piece.length),) + \
        (slice(None),) * (ndim - piece.dim - 1)


def local_view(piece: Piece, tensor: Any) -> Any:
    """The 2-D (or 1-D) view of a local tensor that ``piece``'s dims address: ``tensor[index]``
    for one expert of a fused tensor, else the tensor itself."""
    return tensor if piece.index is None else tensor[piece.index]


def _default_zeros(like: Any) -> Callable[[tuple[int, ...]], Any]:
    if hasattr(like, "new_zeros"):  # torch
        return lambda shape: like.new_zeros(shape)
    import numpy as np

    return lambda shape: np.zeros(shape, dtype=like.dtype)


def shard_arrays(spec: ShardSpec, full: Mapping[str, Any], key: tuple[int, ...], *,
                 zeros: Callable[[tuple[int, ...]], Any] | None = None) -> dict[str, Any]:
    """Cut shard ``key`` (``(tp_rank, pp_rank)``, with expert coordinates when the layout has
    them: ``spec.key_of(rank)``) out of a full HF state (numpy or torch arrays);
    padding is zero. The reference the planner's output is checked against."""
    zeros = zeros or _default_zeros(next(iter(full.values())))
    shard = spec.shards[key]
    out = {name: zeros(shape) for name, shape in shard.tensors.items()}
    for piece in shard.pieces:
        ndim = len(spec.params[piece.param])
        out[piece.local][piece_index(piece, local=True, ndim=ndim)] = \
            full[piece.param][piece_index(piece, local=False, ndim=ndim)]
    return out


def iter_pieces(spec: ShardSpec) -> Iterator[tuple[tuple[int, ...], Piece]]:
    """Every (shard key, piece) of a spec."""
    for key, shard in spec.shards.items():
        for piece in shard.pieces:
            yield key, piece
