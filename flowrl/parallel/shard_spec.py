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

Every parameter is split along at most one dimension (``split_dim``): dim 0 for column-parallel
weights, biases, embeddings and replicated norms, dim 1 for row-parallel ``o_proj``/``down_proj``.
So a rank's holding is a list of ``Piece``: HF rows/columns ``[start, stop)`` of ``param`` along
``dim`` sit at ``[offset, offset + stop - start)`` of local tensor ``local`` along the same dim, all
other dims whole. Local elements that no piece covers are vocabulary padding (zero, no logical
element). dp replicas hold identical shards, so shards are keyed ``(tp_rank, pp_rank)``.

Letters: V vocab, Vp padded vocab, h hidden, F ffn, L layers, nh / nkv heads, d head_dim.
Pure code: no torch, no I/O (except ``ModelShape.from_hf_config`` reading a config.json path).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from flowrl.catalog.backends import ShardStyle
from flowrl.parallel.mesh import ParallelDims, padded_vocab_size, validate_model_layout

__all__ = [
    "STYLES",
    "ModelShape",
    "Piece",
    "RankShard",
    "ShardSpec",
    "model_shape",
    "shard_arrays",
    "shard_spec",
]

STYLES = (ShardStyle.MEGATRON, ShardStyle.VLLM, ShardStyle.HF)
"""The styles :func:`shard_spec` builds (``ShardStyle.FSDP``: ``flowrl.parallel.fsdp_spec``)."""
VLLM_VOCAB_PADDING = 64
"""vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``: VocabParallelEmbedding pads to a multiple of 64."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The facts of a Llama/Qwen2 model that fix its parameter shapes (no torch, no files)."""

    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    """q/k/v projections carry biases (Qwen2)."""
    tied_embeddings: bool = False
    """``lm_head`` shares ``model.embed_tokens.weight`` (no ``lm_head.weight`` parameter)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "ffn_hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelShape.{name}={value!r} must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelShape: num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelShape:
        """From a transformers config object, its dict, a ``config.json`` or a checkpoint dir."""
        if isinstance(config, (str, os.PathLike)):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            if not os.path.isfile(path):
                raise ValueError(f"model config {path!r} does not exist; give a config.json or its "
                                 "directory")
            with open(path, encoding="utf-8") as fh:
                config = json.load(fh)
        get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        heads = get("num_attention_heads")
        if heads is None:
            raise ValueError("model config has no num_attention_heads; give a Llama/Qwen2 config")
        return cls(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            ffn_hidden_size=get("intermediate_size"), num_layers=get("num_hidden_layers"),
            num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            qkv_bias=get("model_type") == "qwen2" or bool(get("attention_bias", False)),
            tied_embeddings=bool(get("tie_word_embeddings", False)),
        )

    @property
    def q_per_group(self) -> int:
        """Query heads per KV group: nh / nkv."""
        return self.num_heads // self.num_kv_heads

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every HF parameter and its full shape, in ``state_dict`` order."""
        h, d, f = self.hidden_size, self.head_dim, self.ffn_hidden_size
        q, kv = self.num_heads * d, self.num_kv_heads * d
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "self_attn.q_proj.weight"] = (q, h)
            shapes[p + "self_attn.k_proj.weight"] = (kv, h)
            shapes[p + "self_attn.v_proj.weight"] = (kv, h)
            if self.qkv_bias:
                shapes[p + "self_attn.q_proj.bias"] = (q,)
                shapes[p + "self_attn.k_proj.bias"] = (kv,)
                shapes[p + "self_attn.v_proj.bias"] = (kv,)
            shapes[p + "self_attn.o_proj.weight"] = (h, q)
            shapes[p + "mlp.gate_proj.weight"] = (f, h)
            shapes[p + "mlp.up_proj.weight"] = (f, h)
            shapes[p + "mlp.down_proj.weight"] = (h, f)
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes["model.norm.weight"] = (h,)
        if not self.tied_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes


def model_shape(model: Any) -> ModelShape:
    """A ModelShape from a ModelShape, a transformers config / ``ArchSpec`` / dict, a config path,
    or a parameter count preset (``"7B"``, ``7e9``: ``model_spec``'s standard shapes)."""
    if isinstance(model, ModelShape):
        return model
    if hasattr(model, "ffn_hidden_size") and hasattr(model, "num_kv_heads"):  # convert.ArchSpec
        return ModelShape(vocab_size=model.vocab_size, hidden_size=model.hidden_size,
                          ffn_hidden_size=model.ffn_hidden_size, num_layers=model.num_layers,
                          num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                          head_dim=model.head_dim, qkv_bias=model.qkv_bias,
                          tied_embeddings=model.tied_embeddings)
    if isinstance(model, (str, os.PathLike)) and os.path.exists(os.fspath(model)):
        return ModelShape.from_hf_config(model)
    if isinstance(model, (str, int, float)) and not isinstance(model, bool):
        from flowrl.parallel.model_spec import parse_model  # a preset such as "7B"

        spec = parse_model(model)
        return ModelShape(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                          ffn_hidden_size=spec.ffn_hidden_size, num_layers=spec.num_layers,
                          num_heads=spec.num_attention_heads,
                          num_kv_heads=spec.num_key_value_heads, head_dim=spec.dh,
                          qkv_bias=spec.name.startswith("qwen"),
                          tied_embeddings=spec.tie_word_embeddings)
    return ModelShape.from_hf_config(model)


@dataclass(frozen=True)
class Piece:
    """HF indices ``[start, stop)`` of ``param`` along ``dim`` sit at ``[offset, ...)`` of ``local``."""

    param: str
    dim: int
    start: int
    stop: int
    local: str
    offset: int

    @property
    def length(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class RankShard:
    """What one (tp_rank, pp_rank) holds: its local tensors (with padding) and the pieces in them."""

    tp_rank: int
    pp_rank: int
    tensors: dict[str, tuple[int, ...]]
    """Local tensor name -> shape (padded vocabulary rows included)."""
    pieces: tuple[Piece, ...]

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
    shards: dict[tuple[int, int], RankShard] = field(repr=False)

    def shard_of(self, rank: int) -> RankShard:
        """The shard held by a global rank (dp replicas hold the same shard)."""
        _, tp_rank, pp_rank = self.dims.rank_coords(rank)
        return self.shards[(tp_rank, pp_rank)]

    def slice_numel(self, param: str) -> int:
        """Elements in one index of ``param`` along its split dim (a row, or a column)."""
        shape = self.params[param]
        return math.prod(shape) // shape[self.split_dim[param]]

    @property
    def num_params(self) -> int:
        """Logical elements of the model (unpadded vocabulary, tied embeddings counted once)."""
        return sum(math.prod(s) for s in self.params.values())

    def shard_numel(self, key: tuple[int, int]) -> int:
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

    def piece(self, param: str, start: int, stop: int, local: str, offset: int) -> None:
        if stop > start:
            self.pieces.append(Piece(param, _split_dim(param), start, stop, local, offset))

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
    b.whole(hf + "post_attention_layernorm.weight", hf + "post_attention_layernorm.weight", (h,))
    for proj in ("gate", "up"):
        b.block(f"{hf}mlp.{proj}_proj.weight", f"{hf}mlp.{proj}_proj.weight", (f, h), rank, tp)
    b.block(hf + "mlp.down_proj.weight", hf + "mlp.down_proj.weight", (h, f), rank, tp)


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
    b.whole(hf + "post_attention_layernorm.weight", names["post_norm"], (h,))
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
        make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    tp = dims.tp
    if model.ffn_hidden_size % tp:
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
    """Describe what every (tp_rank, pp_rank) of ``dims`` holds of ``model`` (see the module doc).

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
    for pp_rank in range(pp):
        for tp_rank in range(tp):
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
            shards[(tp_rank, pp_rank)] = RankShard(tp_rank, pp_rank, b.tensors, tuple(b.pieces))
    params = model.param_shapes()
    return ShardSpec(model=model, dims=dims, style=style, padded_vocab_size=vocab, params=params,
                     split_dim={name: _split_dim(name) for name in params}, shards=shards)


def piece_index(piece: Piece, *, local: bool, ndim: int) -> tuple[slice, ...]:
    """The index of a piece in the HF tensor (``local=False``) or in its local tensor."""
    start = piece.offset if local else piece.start
    return (slice(None),) * piece.dim + (slice(start, start + piece.length),) + \
        (slice(None),) * (ndim - piece.dim - 1)


def _default_zeros(like: Any) -> Callable[[tuple[int, ...]], Any]:
    if hasattr(like, "new_zeros"):  # torch
        return lambda shape: like.new_zeros(shape)
    import numpy as np

    return lambda shape: np.zeros(shape, dtype=like.dtype)


def shard_arrays(spec: ShardSpec, full: Mapping[str, Any], key: tuple[int, int], *,
                 zeros: Callable[[tuple[int, ...]], Any] | None = None) -> dict[str, Any]:
    """Cut shard ``key = (tp_rank, pp_rank)`` out of a full HF state (numpy or torch arrays);
    padding is zero. The reference the planner's output is checked against."""
    zeros = zeros or _default_zeros(next(iter(full.values())))
    shard = spec.shards[key]
    out = {name: zeros(shape) for name, shape in shard.tensors.items()}
    for piece in shard.pieces:
        ndim = len(spec.params[piece.param])
        out[piece.local][piece_index(piece, local=True, ndim=ndim)] = \
            full[piece.param][piece_index(piece, local=False, ndim=ndim)]
    return out


def iter_pieces(spec: ShardSpec) -> Iterator[tuple[tuple[int, int], Piece]]:
    """Every (shard key, piece) of a spec."""
    for key, shard in spec.shards.items():
        for piece in shard.pieces:
            yield key, piece
