"""The facts of a model that fix its parameter shapes: ``ModelShape`` (Llama / Qwen2 / Qwen3, and
the mixture-of-experts Qwen3-MoE / Mixtral: per-expert parameters, router, q/k norms) and
``model_shape``, which makes one from a config, a config.json path, a converter's ``ArchSpec``
or a preset name. ``flowrl.parallel.shard_spec`` splits a ModelShape over a layout.
``NamedShape`` is a model known by its parameters' names and shapes alone (a vision-language model:
vision tower and language model under transformers' in-memory names), which only layouts of whole
parameters hold (``flowrl.parallel.named_spec``).

Letters: V vocab, h hidden, F ffn, F_e one expert's width, E experts, d head_dim.
Pure code: no torch, no I/O (except reading a config.json path).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["ModelShape", "NamedShape", "model_shape"]


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
    num_experts: int = 0
    """Routed experts of every (sparse) layer; 0 for a dense model."""
    experts_per_token: int = 0
    """Experts each token is routed to (top-k)."""
    moe_ffn_hidden_size: int = 0
    """One expert's MLP width F_e (Qwen3-MoE ``moe_intermediate_size``, Mixtral ``intermediate_size``)."""
    qk_norm: bool = False
    """Per-head RMSNorm of queries and keys (Qwen3's ``q_norm`` / ``k_norm``, (head_dim,) each)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "ffn_hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelShape.{name}={value!r} must be a positive integer")
        for name in ("num_experts", "experts_per_token", "moe_ffn_hidden_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ModelShape.{name}={value!r} must be a whole number >= 0")
        if self.num_experts and not (1 <= self.experts_per_token <= self.num_experts
                                     and self.moe_ffn_hidden_size):
            raise ValueError(
                f"ModelShape: a mixture-of-experts model needs 1 <= experts_per_token <= "
                f"num_experts and moe_ffn_hidden_size > 0, got experts_per_token="
                f"{self.experts_per_token}, num_experts={self.num_experts}, moe_ffn_hidden_size="
                f"{self.moe_ffn_hidden_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelShape: num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

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
        if isinstance(config, Mapping) and isinstance(config.get("text_config"), Mapping):  # a VLM: its LM's shape
            config = {**config, **config["text_config"]}
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
            qk_norm=get("model_type") in ("qwen3", "qwen3_moe"),
            **_moe_config(get),
        )

    @property
    def expert_names(self) -> tuple[str, str, str]:
        """The HF names of one expert's three weights, ``{i}`` layer and ``{e}`` expert."""
        x = "model.layers.{i}.mlp.experts.{e}."
        return x + "gate_proj.weight", x + "up_proj.weight", x + "down_proj.weight"

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
            if self.qk_norm:
                shapes[p + "self_attn.q_norm.weight"] = (d,)
                shapes[p + "self_attn.k_norm.weight"] = (d,)
            if self.is_moe:
                fe = self.moe_ffn_hidden_size
                shapes[p + "mlp.gate.weight"] = (self.num_experts, h)
                for e in range(self.num_experts):
                    x = f"{p}mlp.experts.{e}."
                    shapes[x + "gate_proj.weight"] = (fe, h)
                    shapes[x + "up_proj.weight"] = (fe, h)
                    shapes[x + "down_proj.weight"] = (h, fe)
            else:
                shapes[p + "mlp.gate_proj.weight"] = (f, h)
                shapes[p + "mlp.up_proj.weight"] = (f, h)
                shapes[p + "mlp.down_proj.weight"] = (h, f)
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes["model.norm.weight"] = (h,)
        if not self.tied_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes


@dataclass(frozen=True, kw_only=True)
class NamedShape:
    """A model known by its HF parameters alone: ``params`` (name, full shape) in ``named_parameters``
    order, tied weights once. Hashable, so a reshard job keyed by it is cached like one of a ModelShape."""

    model_type: str
    params: tuple[tuple[str, tuple[int, ...]], ...]
    def __post_init__(self) -> None:
        if not self.params:
            raise ValueError(f"NamedShape({self.model_type}): no parameters")
        names = [n for n, _ in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"NamedShape({self.model_type}): a parameter name repeats")
        for name, shape in self.params:
            if not shape or any(not isinstance(d, int) or d < 1 for d in shape):
                raise ValueError(f"NamedShape({self.model_type}): {name} has shape {shape}; every parameter "
                                 "needs at least one dim, each >= 1")

    @classmethod
    def from_shapes(cls, shapes: Mapping[str, tuple[int, ...]], *, model_type: str) -> NamedShape:
        return cls(model_type=model_type, params=tuple((n, tuple(int(d) for d in s)) for n, s in shapes.items()))

    @property
    def is_moe(self) -> bool:
        return False

    @property
    def vocab_size(self) -> int:
        """Rows of the token embedding (0 when no parameter is named ``*embed_tokens.weight``)."""
        return next((s[0] for n, s in self.params if n.endswith("embed_tokens.weight")), 0)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter and its full shape, in ``named_parameters`` order."""
        return dict(self.params)


def _moe_config(get: Callable[..., Any]) -> dict[str, Any]:
    """The MoE fields of a transformers config (Qwen3-MoE, Mixtral); {} for a dense model.
    Refuses what the shard styles cannot describe, naming the key."""
    experts = get("num_experts") or get("num_local_experts") or get("n_routed_experts") or 0
    if not experts:
        return {}
    model_type = get("model_type")
    for key, ok in (("kv_lora_rank", None), ("n_shared_experts", None),
                    ("shared_expert_intermediate_size", None), ("first_k_dense_replace", None)):
        if get(key):
            raise ValueError(
                f"model config {model_type}: {key}={get(key)!r} is not supported by the shard specs "
                "(multi-head latent attention, shared experts and leading dense layers have no "
                "megatron local-spec layout here); give a Qwen3-MoE or Mixtral-style config (every "
                "layer sparse, no shared expert)")
    if get("mlp_only_layers") or (get("decoder_sparse_step") or 1) != 1:
        raise ValueError(
            f"model config {model_type}: mlp_only_layers={get('mlp_only_layers')!r}, "
            f"decoder_sparse_step={get('decoder_sparse_step')!r}: only models whose every layer is "
            "sparse are supported; set mlp_only_layers=[] and decoder_sparse_step=1")
    width = get("moe_intermediate_size") or get("intermediate_size")
    return {"num_experts": int(experts), "experts_per_token": int(get("num_experts_per_tok") or 1),
            "moe_ffn_hidden_size": int(width)}


def model_shape(model: Any) -> ModelShape | NamedShape:
    """A ModelShape from a ModelShape (a NamedShape is itself), a transformers config / ``ArchSpec`` / dict, a config path,
    a parameter count preset (``"7B"``, ``7e9``: ``model_spec``'s standard shapes) or a MoE
    preset name (``"qwen3-30b-a3b"``, ``"qwen3-235b-a22b"``)."""
    if type(model) in (ModelShape, NamedShape):
        return model
    if hasattr(model, "ffn_hidden_size") and hasattr(model, "num_kv_heads"):  # convert.ArchSpec
        moe = getattr(model, "moe", None)
        extra = {} if moe is None else {
            "num_experts": moe.num_experts, "experts_per_token": getattr(moe, "topk", 1),
            "moe_ffn_hidden_size": moe.ffn_hidden_size}
        if moe is None and getattr(model, "num_experts", 0):
            extra = {"num_experts": model.num_experts, "experts_per_token": model.experts_per_token,
                     "moe_ffn_hidden_size": model.moe_ffn_hidden_size}
        return ModelShape(vocab_size=model.vocab_size, hidden_size=model.hidden_size,
                          ffn_hidden_size=model.ffn_hidden_size, num_layers=model.num_layers,
                          num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                          head_dim=model.head_dim, qkv_bias=model.qkv_bias,
                          tied_embeddings=model.tied_embeddings,
                          qk_norm=bool(getattr(model, "qk_norm", False)), **extra)
    if isinstance(model, (str, os.PathLike)) and os.path.exists(os.fspath(model)):
        return ModelShape.from_hf_config(model)
    if isinstance(model, (str, int, float)) and not isinstance(model, bool):
        from flowrl.parallel.model_spec import parse_model  # a preset such as "7B"

        spec = parse_model(model)
        extra: dict[str, Any] = {}
        if getattr(spec, "num_experts", 0):
            for key in ("kv_lora_rank", "shared_expert_ffn_hidden_size", "num_dense_layers"):
                if getattr(spec, key, 0):
                    raise ValueError(
                        f"model {model!r}: {key}={getattr(spec, key)} (multi-head latent attention, "
                        "shared experts or leading dense layers) has no shard layout here; use "
                        "qwen3-30b-a3b, qwen3-235b-a22b or a Qwen3-MoE / Mixtral config.json")
            extra = {"num_experts": spec.num_experts, "experts_per_token": spec.experts_per_token,
                     "moe_ffn_hidden_size": spec.moe_ffn_hidden_size,
                     "qk_norm": spec.name.startswith("qwen3")}
        return ModelShape(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                          ffn_hidden_size=spec.ffn_hidden_size, num_layers=spec.num_layers,
                          num_heads=spec.num_attention_heads,
                          num_kv_heads=spec.num_key_value_heads, head_dim=spec.dh,
                          qkv_bias=spec.name.startswith("qwen") and not extra,
                          tied_embeddings=spec.tie_word_embeddings, **extra)
    return ModelShape.from_hf_config(model)
