"""Model shapes for the layout cost model: ``ModelSpec`` from a ``config.json``, a parameter count
(``"7B"``: the Llama family's standard shapes, interpolated in between), a preset name (the
mixture-of-experts models people post-train: ``deepseek-v3``, ``qwen3-235b-a22b``,
``qwen3-30b-a3b``) or a spec.

Mixture-of-experts: ``num_experts`` routed experts of width ``moe_ffn_hidden_size`` per sparse
layer, ``experts_per_token`` of them active per token, plus an always-active shared expert of
``shared_expert_ffn_hidden_size`` (DeepSeek, Qwen2-MoE) and a router; the first
``num_dense_layers`` layers keep a dense MLP of ``ffn_hidden_size`` (DeepSeek-V3's
``first_k_dense_replace``). Multi-head latent attention (DeepSeek's MLA) is described by
``q_lora_rank`` / ``kv_lora_rank`` / ``qk_rope_head_dim`` / ``v_head_dim``: its parameters and
its (compressed) KV cache differ from grouped-query attention's.

Pure code: no torch, no I/O beyond reading a ``config.json`` when given a path.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

__all__ = ["PRESETS", "ModelSpec", "format_count", "parse_model"]


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
    num_experts: int = 0
    """Routed experts per sparse layer; 0 for a dense model."""
    experts_per_token: int = 0
    """Routed experts each token uses (top-k)."""
    moe_ffn_hidden_size: int = 0
    """One routed expert's MLP width."""
    shared_expert_ffn_hidden_size: int = 0
    """The always-active shared expert(s)' total MLP width per sparse layer; 0 for none."""
    num_dense_layers: int = 0
    """Leading layers with a dense MLP of ffn_hidden_size in a MoE model."""
    q_lora_rank: int = 0
    """MLA: rank of the query compression (0: queries projected directly)."""
    kv_lora_rank: int = 0
    """MLA: rank of the compressed KV (0: not MLA)."""
    qk_rope_head_dim: int = 0
    """MLA: the rotary part of each query/key head (the non-rotary part is head_dim)."""
    v_head_dim: int = 0
    """MLA: each value head's size."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                     "ffn_hidden_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelSpec.{name}={value!r} must be a positive integer")
        for name in ("num_experts", "experts_per_token", "moe_ffn_hidden_size", "shared_expert_ffn_hidden_size",
                     "num_dense_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ModelSpec.{name}={value!r} must be a non-negative integer")
        if self.num_experts and not (1 <= self.experts_per_token <= self.num_experts and self.moe_ffn_hidden_size):
            raise ValueError(
                f"ModelSpec: a mixture-of-experts model needs 1 <= experts_per_token <= num_experts and "
                f"moe_ffn_hidden_size > 0, got experts_per_token={self.experts_per_token}, num_experts="
                f"{self.num_experts}, moe_ffn_hidden_size={self.moe_ffn_hidden_size}"
            )
        if self.num_dense_layers > self.num_layers:
            raise ValueError(f"ModelSpec: num_dense_layers={self.num_dense_layers} exceeds num_layers={self.num_layers}")
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
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_params(self) -> int:
        """One layer's attention weights and its two norms: q, k, v, o (GQA), or MLA's compressions."""
        h, dh, nh = self.hidden_size, self.dh, self.num_attention_heads
        if not self.is_mla:
            return h * dh * (2 * nh + 2 * self.num_key_value_heads) + 2 * h
        qk = dh + self.qk_rope_head_dim
        q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qk) if self.q_lora_rank else h * nh * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * nh * (dh + self.v_head_dim)
        return q + kv + nh * self.v_head_dim * h + 2 * h

    def _mlp(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    @property
    def expert_params(self) -> int:
        """One routed expert's weights."""
        return self._mlp(self.moe_ffn_hidden_size) if self.is_moe else 0

    def layer_is_sparse(self, layer: int) -> bool:
        return self.is_moe and layer >= self.num_dense_layers

    def layer_params(self, layer: int) -> tuple[int, int]:
        """(dense, expert) weights of layer ``layer``: the part every rank of a tensor-parallel group
        splits (attention, norms, dense or shared MLP, router) and the routed experts."""
        if not self.layer_is_sparse(layer):
            return self.attention_params + self._mlp(self.ffn_hidden_size), 0
        dense = self.attention_params + self.num_experts * self.hidden_size  # the router
        dense += self._mlp(self.shared_expert_ffn_hidden_size) if self.shared_expert_ffn_hidden_size else 0
        return dense, self.num_experts * self.expert_params

    def layer_active_params(self, layer: int) -> int:
        """Weights one token passes through in layer ``layer`` (top-k experts of a sparse one)."""
        dense, _ = self.layer_params(layer)
        return dense + (self.experts_per_token * self.expert_params if self.layer_is_sparse(layer) else 0)

    @property
    def params_per_layer(self) -> int:
        """Weights of the largest transformer layer (attention, MLP or experts, norms)."""
        return max(sum(self.layer_params(i)) for i in {0, self.num_layers - 1})

    @property
    def active_params_per_layer(self) -> int:
        """Mean weights a token passes through per layer (equals params_per_layer when dense)."""
        return round(sum(self.layer_active_params(i) for i in range(self.num_layers)) / self.num_layers)

    @property
    def _embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters (unpadded vocabulary), the number a model card quotes."""
        return sum(sum(self.layer_params(i)) for i in range(self.num_layers)) + self._embedding_params

    @property
    def num_active_params(self) -> int:
        """Parameters one token passes through (the "A22B" of Qwen3-235B-A22B); num_params when dense."""
        return sum(self.layer_active_params(i) for i in range(self.num_layers)) + self._embedding_params

    @property
    def num_expert_params(self) -> int:
        """All routed experts' weights (what expert parallelism splits)."""
        return sum(self.layer_params(i)[1] for i in range(self.num_layers))

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
        layers = pick("num_hidden_layers", "n_layer", "num_layers")
        return cls(
            **_moe_fields(config, layers),
            name=model_type,
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=pick("num_key_value_heads", default=heads),
            ffn_hidden_size=pick("intermediate_size", "n_inner", "ffn_hidden_size", default=4 * hidden),
            vocab_size=pick("vocab_size"),
            head_dim=config.get("qk_nope_head_dim") if config.get("kv_lora_rank") else config.get("head_dim"),
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


def _moe_fields(config: Mapping[str, Any], num_layers: int) -> dict[str, int]:
    """The mixture-of-experts and MLA fields of a transformers config (Qwen2/3-MoE, Mixtral,
    DeepSeek-V2/V3); {} for a dense model."""
    out: dict[str, int] = {}
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts") or 0
    if experts:
        width = config.get("moe_intermediate_size") or config.get("intermediate_size")
        shared = config.get("shared_expert_intermediate_size") or 0  # Qwen2-MoE: the total width
        if config.get("n_shared_experts"):  # DeepSeek: n experts of the routed width
            shared = int(config["n_shared_experts"]) * int(width)
        dense = int(config.get("first_k_dense_replace") or 0)
        only = config.get("mlp_only_layers") or []  # Qwen3-MoE: dense layers listed
        step = int(config.get("decoder_sparse_step") or 1)
        if only or step > 1:
            sparse = [i for i in range(num_layers) if i not in only and (i + 1) % step == 0]
            dense = num_layers - len(sparse)  # counted as leading dense layers (same parameters)
        out.update(num_experts=int(experts), experts_per_token=int(config.get("num_experts_per_tok") or 1),
                   moe_ffn_hidden_size=int(width), shared_expert_ffn_hidden_size=int(shared), num_dense_layers=dense)
    if config.get("kv_lora_rank"):
        out.update(q_lora_rank=int(config.get("q_lora_rank") or 0), kv_lora_rank=int(config["kv_lora_rank"]),
                   qk_rope_head_dim=int(config.get("qk_rope_head_dim") or 0),
                   v_head_dim=int(config.get("v_head_dim") or config.get("qk_nope_head_dim")))
    return out


PRESETS: dict[str, ModelSpec] = {
    # DeepSeek-V3 (671B, 37B active): 61 layers (3 dense), 256 routed experts + 1 shared, top 8, MLA.
    # The multi-token-prediction module (14B) is not counted, as the 671B is quoted without it.
    "deepseek-v3": ModelSpec(
        name="deepseek-v3", num_layers=61, hidden_size=7168, num_attention_heads=128, num_key_value_heads=128,
        ffn_hidden_size=18432, vocab_size=129280, head_dim=128, num_experts=256, experts_per_token=8,
        moe_ffn_hidden_size=2048, shared_expert_ffn_hidden_size=2048, num_dense_layers=3, q_lora_rank=1536,
        kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128),
    # Qwen3-235B-A22B: 94 layers, 128 experts, top 8, GQA 64/4 heads of 128.
    "qwen3-235b-a22b": ModelSpec(
        name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_attention_heads=64, num_key_value_heads=4,
        ffn_hidden_size=12288, vocab_size=151936, head_dim=128, num_experts=128, experts_per_token=8,
        moe_ffn_hidden_size=1536),
    # Qwen3-30B-A3B: 48 layers, 128 experts, top 8, GQA 32/4 heads of 128.
    "qwen3-30b-a3b": ModelSpec(
        name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
        ffn_hidden_size=6144, vocab_size=151936, head_dim=128, num_experts=128, experts_per_token=8,
        moe_ffn_hidden_size=768),
}
"""Mixture-of-experts models by name (``--model deepseek-v3``), shapes from their config.json."""


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
    probe = ModelSpec(name=f"interpolated-{format_count(num_params)}", num_layers=1, hidden_size=hidden,
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


def format_count(n: float) -> str:
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
        if text.lower() in PRESETS:
            return PRESETS[text.lower()]
        match = _COUNT.match(text)
        if match:
            return ModelSpec.from_num_params(float(match.group(1)) * _SUFFIX[match.group(2).lower()])
        if os.path.exists(text):
            return ModelSpec.from_hf_config(text)
        raise ValueError(
            f"model={text!r} is neither a parameter count (7B, 70e9, 350M), a preset "
            f"({', '.join(PRESETS)}) nor an existing config.json / checkpoint directory"
        )
    raise ValueError(f"model={model!r}: give a ModelSpec, a parameter count like '7B', or a config path")
