"""State-dict adapter between Hugging Face Llama/Qwen2 (and Qwen3-MoE/Mixtral) checkpoints and
megatron GPTModel shards.

Pure tensor functions (torch only, no megatron, no process group), in the spirit of torchtitan's
state-dict adapters. One *shard* is the state dict of one model chunk: the parameters held by
tensor-parallel rank ``tp_rank`` of pipeline stage ``pp_rank`` (virtual stage ``vpp_rank`` when the
interleaved schedule is used), with megatron names and layer indices restarting at 0 in each chunk.

The name map (megatron local layer spec, no Transformer Engine):

==============================================  ==========================================  =====
HF                                              megatron                                    split
==============================================  ==========================================  =====
model.embed_tokens.weight                       embedding.word_embeddings.weight            dim 0
model.layers.i.input_layernorm.weight           decoder.layers.j.input_layernorm.weight     none
model.layers.i.self_attn.{q,k,v}_proj.weight    decoder.layers.j.self_attention.linear_qkv  dim 0
  (and .bias for Qwen2)                           interleaved per KV group: [q heads, k, v]
model.layers.i.self_attn.o_proj.weight          ...self_attention.linear_proj.weight        dim 1
model.layers.i.post_attention_layernorm.weight  ...pre_mlp_layernorm.weight                 none
model.layers.i.mlp.{gate,up}_proj.weight        ...mlp.linear_fc1.weight: [gate_r; up_r]    dim 0
model.layers.i.mlp.down_proj.weight             ...mlp.linear_fc2.weight                    dim 1
model.norm.weight                               decoder.final_layernorm.weight              none
lm_head.weight (absent when tied)               output_layer.weight                         dim 0
==============================================  ==========================================  =====

Mixture-of-experts layers (Qwen3-MoE, Mixtral; megatron's local spec with ``num_experts`` and
``moe_grouped_gemm=False``: a SequentialMLP of plain MLPs). The HF names are the checkpoint's
per-expert names (``save_pretrained`` writes them; a loaded transformers 5 model holds them fused as
``experts.gate_up_proj`` (E, 2F, h) / ``experts.down_proj`` (E, h, F), which is read too):

==============================================  ==========================================  =====
HF                                              megatron                                    split
==============================================  ==========================================  =====
model.layers.i.mlp.gate.weight (E, h)           ...mlp.router.weight                        none
model.layers.i.mlp.experts.e.{gate,up}_proj     ...mlp.experts.local_experts.k.linear_fc1   etp 0
model.layers.i.mlp.experts.e.down_proj          ...mlp.experts.local_experts.k.linear_fc2   etp 1
model.layers.i.self_attn.{q,k}_norm (Qwen3)     ...self_attention.{q,k}_layernorm.weight    none
==============================================  ==========================================  =====

Expert-parallel rank ``ep_rank`` holds global experts ``e = ep_rank * E / ep + k`` (local ``k``);
their weights are split over the expert-tensor-parallel ranks (``etp``, megatron's default: tp) as
the dense MLP's are over tp. Gathered shards (:func:`megatron_to_hf`'s input) name each expert by
its global index (:func:`experts_to_global`) under the key of its expert-tensor-parallel rank.

The vocabulary is padded to a multiple of ``make_vocab_size_divisible_by * tp`` (megatron's rule,
``flowrl.parallel.mesh.padded_vocab_size``);
padded rows of the embedding and output layer are zero and are dropped on the way back. With tied
embeddings and ``pp > 1`` the last stage holds a copy of the embedding as ``output_layer.weight``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Mapping

import torch

from flowrl.backends.train.tensor_source import as_source, chunk_range
from flowrl.parallel.mesh import padded_vocab_size
from flowrl.parallel.shard_spec import ModelShape

Shards = Mapping[tuple[int, int, int | None], Mapping[str, torch.Tensor]]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3_moe", "mixtral")
MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")
_LOCAL_EXPERTS = "mlp.experts.local_experts."


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchSpec(ModelShape):
    """A model's shape (:class:`~flowrl.parallel.shard_spec.ModelShape`) plus the facts the
    megatron model needs to mirror the HF one numerically."""

    rope_theta: float
    rope_parameters: dict
    norm_eps: float
    max_position_embeddings: int
    moe: MoeSpec | None = None
    """The mixture-of-experts facts (every layer sparse); None for a dense model."""
    qk_norm: bool = False
    """RMSNorm of each query and key head before RoPE (Qwen3's ``q_norm``/``k_norm``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeSpec:
    """A mixture-of-experts model's router and experts (every layer sparse, no shared expert)."""

    num_experts: int
    topk: int
    ffn_hidden_size: int
    """Each expert's width (Qwen3-MoE ``moe_intermediate_size``, Mixtral ``intermediate_size``)."""
    norm_topk_prob: bool
    """HF renormalises the top-k softmax probabilities to sum to 1 (Mixtral always does)."""


def arch_spec(hf_config: Any) -> ArchSpec:
    """Read a transformers Llama/Qwen2 config; raises ValueError for what megatron can't mirror."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported by the megatron backend; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf_config.hidden_act!r}: only SwiGLU ('silu') is supported")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported (megatron would bias every linear)")
    if model_type != "qwen2" and getattr(hf_config, "attention_bias", False):
        raise ValueError(f"{model_type} attention_bias=True is not supported (no megatron o_proj bias)")
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("use_sliding_window=True is not supported; set it to False")
    moe = _moe_spec(hf_config) if model_type in MOE_MODEL_TYPES else None
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    num_heads = hf_config.num_attention_heads
    return ArchSpec(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=moe.ffn_hidden_size if moe else hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
        qkv_bias=model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        rope_theta=float(rope_theta),
        rope_parameters=rope,
        norm_eps=hf_config.rms_norm_eps,
        max_position_embeddings=hf_config.max_position_embeddings,
        moe=moe,
        qk_norm=model_type == "qwen3_moe",
    )


def _moe_spec(hf_config: Any) -> MoeSpec:
    """Qwen3-MoE's or Mixtral's experts; refuses what megatron's local MoE spec can't mirror."""
    get = functools.partial(getattr, hf_config)
    if hf_config.model_type == "qwen3_moe":
        if get("decoder_sparse_step", 1) != 1 or list(get("mlp_only_layers", None) or []):
            raise ValueError(f"qwen3_moe with decoder_sparse_step={get('decoder_sparse_step', 1)}, "
                             f"mlp_only_layers={get('mlp_only_layers', None)}: only models whose every "
                             "layer is sparse are supported (decoder_sparse_step=1, mlp_only_layers=[])")
        num_experts, width = get("num_experts", None) or get("num_local_experts"), get("moe_intermediate_size")
        norm = bool(get("norm_topk_prob", False))
    else:  # mixtral: softmax, top-k, renormalised (MixtralTopKRouter)
        if get("sliding_window", None) is not None:
            raise ValueError(f"mixtral sliding_window={get('sliding_window')} is not supported; set it to null")
        num_experts, width, norm = get("num_local_experts"), get("intermediate_size"), True
    if get("router_jitter_noise", 0.0):
        raise ValueError(f"router_jitter_noise={get('router_jitter_noise')} is not supported; set it to 0")
    topk = get("num_experts_per_tok")
    if not 1 <= topk <= num_experts:
        raise ValueError(f"num_experts_per_tok={topk} must be between 1 and the number of experts {num_experts}")
    return MoeSpec(num_experts=num_experts, topk=topk, ffn_hidden_size=width, norm_topk_prob=norm)


def chunk_layers(num_layers: int, *, pp_rank: int, pp: int, vpp_rank: int | None = None,
                 vpp: int | None = None) -> range:
    """Global (HF) layer indices held by one model chunk, as megatron assigns them.

    With the interleaved schedule chunk ``v`` of stage ``p`` holds layers starting at
    ``v * num_layers / vpp + p * num_layers / (pp * vpp)`` (transformer_layer.py,
    get_transformer_layer_offset).
    """
    num_chunks = pp * (vpp or 1)
    if num_layers % num_chunks:
        raise ValueError(f"num_layers={num_layers} is not divisible by pp*vpp={num_chunks}")
    per_chunk = num_layers // num_chunks
    start = (vpp_rank or 0) * (num_layers // (vpp or 1)) + pp_rank * per_chunk
    return range(start, start + per_chunk)


def chunk_role(*, pp_rank: int, pp: int, vpp_rank: int | None = None,
               vpp: int | None = None) -> tuple[bool, bool]:
    """(pre_process, post_process) of one model chunk: holds the embedding / the output head."""
    first = pp_rank == 0 and (vpp_rank or 0) == 0
    last = pp_rank == pp - 1 and (vpp_rank or 0) == (vpp or 1) - 1
    return first, last


def _qkv_groups(arch: ArchSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[q; k; v] rows regrouped per KV group: [num_kv, (q_per_group + 2) * head_dim, ...]."""
    rest = q.shape[1:]
    g, d = arch.num_kv_heads, arch.head_dim
    return torch.cat([q.reshape(g, -1, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)],
                     dim=1)


def _pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([w, w.new_zeros(rows - w.shape[0], *w.shape[1:])]) if rows > w.shape[0] else w


def check_expert_layout(arch: ArchSpec, *, ep: int, etp: int) -> None:
    """``ep`` divides the experts and ``etp`` each expert's width (dense models: ep 1, etp unused)."""
    if arch.moe is None:
        if ep != 1:
            raise ValueError(f"expert_model_parallel_size={ep}: the model has no experts (a dense "
                             "model); set it to 1")
        return
    if arch.moe.num_experts % ep:
        raise ValueError(f"expert_model_parallel_size={ep} does not divide the model's "
                         f"{arch.moe.num_experts} experts; use a divisor of {arch.moe.num_experts}")
    if arch.moe.ffn_hidden_size % etp:
        raise ValueError(f"expert_tensor_parallel_size={etp} does not divide the experts' width "
                         f"{arch.moe.ffn_hidden_size}; use a divisor of it")


def _check_tp(arch: ArchSpec, tp: int) -> None:
    if arch.num_heads % tp or (arch.num_kv_heads % tp and tp % arch.num_kv_heads):
        raise ValueError(f"tp={tp} must divide num_attention_heads={arch.num_heads}, and it and "
                         f"num_key_value_heads={arch.num_kv_heads} must divide one another")
    if arch.moe is None and arch.ffn_hidden_size % tp:  # experts split by etp (check_expert_layout)
        raise ValueError(f"tp={tp} must divide intermediate_size={arch.ffn_hidden_size}")


def hf_to_megatron(hf_state: Any, hf_config: Any, *, tp_rank: int, tp: int,
                   pp_rank: int, pp: int, vpp_rank: int | None = None, vpp: int | None = None,
                   ep_rank: int = 0, ep: int = 1, etp_rank: int | None = None,
                   etp: int | None = None,
                   make_vocab_size_divisible_by: int = 128) -> dict[str, torch.Tensor]:
    """The megatron state dict of exactly one model chunk (contiguous clones, HF dtype).

    ``hf_state``: a state dict, or a source of slices (``flowrl.backends.train.tensor_source``):
    from a safetensors source only this chunk's layers are read, and of each tensor-parallel
    weight only this rank's rows or columns (whole KV groups of q, k and v); of a MoE layer only
    expert-parallel rank ``ep_rank``'s experts, split by expert-tensor-parallel rank ``etp_rank``
    of ``etp`` (None: ``tp_rank`` of ``tp``, megatron's default)."""
    arch = arch_spec(hf_config)
    etp, etp_rank = (tp, tp_rank) if etp is None else (etp, etp_rank)
    check_expert_layout(arch, ep=ep, etp=etp)
    _check_tp(arch, tp)
    src = as_source(hf_state)
    pre, post = chunk_role(pp_rank=pp_rank, pp=pp, vpp_rank=vpp_rank, vpp=vpp)
    vocab = padded_vocab_size(arch.vocab_size, tp, make_vocab_size_divisible_by)

    def col(name, rows=None):  # column-parallel: split dim 0 (of ``rows`` rows, zero-padded)
        size = src.shape(name)[0]
        start, stop = chunk_range(size if rows is None else rows, tp, tp_rank)
        part = src.rows(name, min(start, size), min(stop, size))
        return _pad_rows(part, stop - start) if stop - start > part.shape[0] else part

    def row(name):  # row-parallel: split dim 1
        return src.cols(name, *chunk_range(src.shape(name)[1], tp, tp_rank))

    out = {}
    embed = "model.embed_tokens.weight"
    if pre:
        out["embedding.word_embeddings.weight"] = col(embed, vocab)
    if post:
        out["decoder.final_layernorm.weight"] = src.full("model.norm.weight")
        if not arch.tied_embeddings:
            out["output_layer.weight"] = col("lm_head.weight", vocab)
        elif not pre:  # tied, pp > 1: the last stage keeps its own copy of the embedding
            out["output_layer.weight"] = col(embed, vocab)
    layers = chunk_layers(arch.num_layers, pp_rank=pp_rank, pp=pp, vpp_rank=vpp_rank, vpp=vpp)
    for j, i in enumerate(layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{j}."
        attn = h + "self_attn."
        out[m + "input_layernorm.weight"] = src.full(h + "input_layernorm.weight")
        suffixes = ("weight", "bias") if arch.qkv_bias else ("weight",)
        for s in suffixes:
            out[m + f"self_attention.linear_qkv.{s}"] = _qkv_part(src, arch, [f"{attn}{p}_proj.{s}" for p in "qkv"],
                                                                   tp=tp, tp_rank=tp_rank)
        out[m + "self_attention.linear_proj.weight"] = row(attn + "o_proj.weight")
        out[m + "pre_mlp_layernorm.weight"] = src.full(h + "post_attention_layernorm.weight")
        if arch.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = src.full(attn + "q_norm.weight")
            out[m + "self_attention.k_layernorm.weight"] = src.full(attn + "k_norm.weight")
        if arch.moe is None:
            out[m + "mlp.linear_fc1.weight"] = torch.cat([col(h + "mlp.gate_proj.weight"), col(h + "mlp.up_proj.weight")])
            out[m + "mlp.linear_fc2.weight"] = row(h + "mlp.down_proj.weight")
        else:
            out.update(_moe_layer(src, arch, h, m, ep_rank=ep_rank, ep=ep, etp_rank=etp_rank, etp=etp))
    return {name: t.detach().clone().contiguous() for name, t in out.items()}


def _moe_layer(src: Any, arch: ArchSpec, h: str, m: str, *, ep_rank: int, ep: int, etp_rank: int,
               etp: int) -> dict[str, torch.Tensor]:
    """One MoE layer's router and expert-parallel rank ``ep_rank``'s experts (HF prefix ``h``,
    megatron prefix ``m``), each split by expert-tensor-parallel rank ``etp_rank``."""
    out = {m + "mlp.router.weight": src.full(h + "mlp.gate.weight")}
    experts = _ExpertReader(src, h + "mlp.experts.")
    num_local = arch.moe.num_experts // ep
    part = chunk_range(arch.moe.ffn_hidden_size, etp, etp_rank)
    for k in range(num_local):
        e, x = ep_rank * num_local + k, f"{m}{_LOCAL_EXPERTS}{k}."
        out[x + "linear_fc1.weight"] = torch.cat([experts.rows(e, p, *part) for p in ("gate_proj", "up_proj")])
        out[x + "linear_fc2.weight"] = experts.cols(e, "down_proj", *part)
    return out


def _moe_layer_back(shards: Shards, arch: ArchSpec, h: str, m: str, *, pp_rank: int, vpp_rank: int | None,
                    etp: int) -> dict[str, torch.Tensor]:
    """One MoE layer's router and experts under HF per-expert names, from gathered shards."""
    out = {h + "mlp.gate.weight": shards[(0, pp_rank, vpp_rank)][m + "mlp.router.weight"]}
    for e in range(arch.moe.num_experts):
        x, y = f"{m}{_LOCAL_EXPERTS}{e}.", f"{h}mlp.experts.{e}."
        parts = [shards[(r, pp_rank, vpp_rank)] for r in range(etp)]
        fc1 = [part[x + "linear_fc1.weight"].chunk(2) for part in parts]
        out[y + "gate_proj.weight"] = torch.cat([g for g, _ in fc1])
        out[y + "up_proj.weight"] = torch.cat([u for _, u in fc1])
        out[y + "down_proj.weight"] = torch.cat([part[x + "linear_fc2.weight"] for part in parts], dim=1)
    return out


class _ExpertReader:
    """One MoE layer's expert weights by expert and projection, from the checkpoint's per-expert
    tensors (``experts.{e}.gate_proj.weight`` ...) or, where those are absent (the state dict of a
    loaded transformers 5 model), from its fused ``experts.gate_up_proj`` / ``experts.down_proj``."""

    def __init__(self, src: Any, prefix: str):
        self.src, self.prefix = src, prefix

    def _fused(self, e: int, proj: str) -> torch.Tensor:
        if proj == "down_proj":
            return self.src.full(self.prefix + "down_proj")[e]
        gate_up = self.src.full(self.prefix + "gate_up_proj")[e]  # (2F, h): [gate; up]
        return gate_up.chunk(2)[proj == "up_proj"]

    def rows(self, e: int, proj: str, start: int, stop: int) -> torch.Tensor:
        name = f"{self.prefix}{e}.{proj}.weight"
        return self.src.rows(name, start, stop) if name in self.src else self._fused(e, proj)[start:stop]

    def cols(self, e: int, proj: str, start: int, stop: int) -> torch.Tensor:
        name = f"{self.prefix}{e}.{proj}.weight"
        return self.src.cols(name, start, stop) if name in self.src else self._fused(e, proj)[:, start:stop]


def experts_to_global(shard: Mapping[str, torch.Tensor], *, ep_rank: int,
                      num_local_experts: int) -> dict[str, torch.Tensor]:
    """A chunk's state with each ``local_experts.{k}`` renamed to its global expert index."""
    def rename(name: str) -> str:
        return _LOCAL_EXPERT_RE.sub(lambda m: f"{_LOCAL_EXPERTS}{ep_rank * num_local_experts + int(m[1])}.", name)

    return {rename(k): v for k, v in shard.items()}


_LOCAL_EXPERT_RE = re.compile(re.escape(_LOCAL_EXPERTS) + r"(\d+)\.")


def is_expert_param(name: str) -> bool:
    """A megatron parameter name of an expert (sharded over expert-parallel ranks)."""
    return _LOCAL_EXPERTS in name


def fuse_experts(hf_state: Mapping[str, torch.Tensor], arch: ArchSpec) -> dict[str, torch.Tensor]:
    """Per-expert HF names to the fused in-memory layout of a transformers 5 MoE model
    (``experts.gate_up_proj`` (E, 2F, h), ``experts.down_proj`` (E, h, F)), for ``load_state_dict``;
    ``save_pretrained`` writes the per-expert names again. Dense models: unchanged."""
    if arch.moe is None:
        return dict(hf_state)
    out = {k: v for k, v in hf_state.items() if ".mlp.experts." not in k}
    for i in range(arch.num_layers):
        x = f"model.layers.{i}.mlp.experts."
        experts = range(arch.moe.num_experts)
        out[x + "gate_up_proj"] = torch.stack([torch.cat([hf_state[f"{x}{e}.gate_proj.weight"],
                                                          hf_state[f"{x}{e}.up_proj.weight"]]) for e in experts])
        out[x + "down_proj"] = torch.stack([hf_state[f"{x}{e}.down_proj.weight"] for e in experts])
    return out


def _qkv_part(src: Any, arch: ArchSpec, names: list[str], *, tp: int, tp_rank: int) -> torch.Tensor:
    """This rank's rows of the fused ``linear_qkv`` (q, k, v regrouped per KV group, then split
    flat in ``tp`` parts), reading only the KV groups the part spans: whole groups per rank when
    ``tp`` divides the KV heads; with more ranks than KV heads a group spans ``tp / kv`` ranks
    (attention.py:1398 gathers it back)."""
    g, d = arch.num_kv_heads, arch.head_dim
    per_group = (arch.num_heads // g + 2) * d  # rows of one regrouped KV group
    start, stop = chunk_range(g * per_group, tp, tp_rank)
    first, last = start // per_group, -(-stop // per_group)  # the groups the part spans
    q_rows = arch.num_heads // g * d
    q, k, v = (src.rows(n, first * r, last * r) for n, r in zip(names, (q_rows, d, d)))
    local = dataclasses.replace(arch, num_kv_heads=last - first, num_heads=(last - first) * (arch.num_heads // g))
    qkv = _qkv_groups(local, q, k, v)
    flat = qkv.reshape(-1, *qkv.shape[2:])
    return flat[start - first * per_group: stop - first * per_group]


def megatron_to_hf(shards: Shards, hf_config: Any, *, tp: int, pp: int, vpp: int | None = None,
                   etp: int | None = None) -> dict[str, torch.Tensor]:
    """Gather every chunk's shard (keyed ``(tp_rank, pp_rank, vpp_rank)``) back to HF names.

    TP-replicated tensors (norms, routers) are read from tp_rank 0; padded vocabulary rows are
    dropped; ``lm_head.weight`` is omitted when the embeddings are tied (as ``save_pretrained``
    does). Experts: every expert by its global index (:func:`experts_to_global`) in the shards
    keyed by expert-tensor-parallel ranks ``0 .. etp - 1`` (None: ``tp``); per-expert HF names out.
    """
    arch = arch_spec(hf_config)
    etp = tp if etp is None else etp
    out: dict[str, torch.Tensor] = {}
    vpps = list(range(vpp)) if vpp else [None]

    def cat(pp_rank, vpp_rank, name, dim):
        return torch.cat([shards[(r, pp_rank, vpp_rank)][name] for r in range(tp)], dim=dim)

    for pp_rank in range(pp):
        for vpp_rank in vpps:
            pre, post = chunk_role(pp_rank=pp_rank, pp=pp, vpp_rank=vpp_rank, vpp=vpp)
            first = shards[(0, pp_rank, vpp_rank)]
            if pre:
                embed = cat(pp_rank, vpp_rank, "embedding.word_embeddings.weight", 0)
                out["model.embed_tokens.weight"] = embed[: arch.vocab_size]
            if post:
                out["model.norm.weight"] = first["decoder.final_layernorm.weight"]
                if not arch.tied_embeddings:
                    lm_head = cat(pp_rank, vpp_rank, "output_layer.weight", 0)
                    out["lm_head.weight"] = lm_head[: arch.vocab_size]
            layers = chunk_layers(arch.num_layers, pp_rank=pp_rank, pp=pp, vpp_rank=vpp_rank,
                                  vpp=vpp)
            for j, i in enumerate(layers):
                h, m = f"model.layers.{i}.", f"decoder.layers.{j}."
                out[h + "input_layernorm.weight"] = first[m + "input_layernorm.weight"]
                out[h + "post_attention_layernorm.weight"] = first[m + "pre_mlp_layernorm.weight"]
                suffixes = ("weight", "bias") if arch.qkv_bias else ("weight",)
                for s in suffixes:
                    qkv = cat(pp_rank, vpp_rank, m + f"self_attention.linear_qkv.{s}", 0)
                    rest = qkv.shape[1:]
                    d = arch.head_dim
                    q, k, v = qkv.reshape(arch.num_kv_heads, -1, *rest).split(
                        [arch.num_heads // arch.num_kv_heads * d, d, d], dim=1)
                    for p, t in zip("qkv", (q, k, v)):
                        out[f"{h}self_attn.{p}_proj.{s}"] = t.reshape(-1, *rest)
                out[h + "self_attn.o_proj.weight"] = cat(
                    pp_rank, vpp_rank, m + "self_attention.linear_proj.weight", 1)
                if arch.qk_norm:
                    for p in "qk":
                        out[f"{h}self_attn.{p}_norm.weight"] = first[f"{m}self_attention.{p}_layernorm.weight"]
                if arch.moe is not None:
                    out.update(_moe_layer_back(shards, arch, h, m, pp_rank=pp_rank, vpp_rank=vpp_rank, etp=etp))
                    continue
                fc1 = [shards[(r, pp_rank, vpp_rank)][m + "mlp.linear_fc1.weight"].chunk(2)
                       for r in range(tp)]
                out[h + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in fc1])
                out[h + "mlp.up_proj.weight"] = torch.cat([u for _, u in fc1])
                out[h + "mlp.down_proj.weight"] = cat(
                    pp_rank, vpp_rank, m + "mlp.linear_fc2.weight", 1)
    return {name: t.contiguous() for name, t in out.items()}
