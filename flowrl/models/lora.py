"""LoRA adapters on a transformers causal LM through peft, with verl's settings (``model.lora_rank``,
``model.lora_alpha``, ``model.target_modules``, ``model.exclude_modules``), and the model's own
weights with the adapters merged.

peft injects its layers in place: after :func:`add_adapters` the transformers model's parameter
names gain ``.base_layer`` (the frozen weight, ``...q_proj.base_layer.weight``) and
``.lora_A.default`` / ``.lora_B.default`` (the trained adapters); everything but the adapters is
frozen. :func:`merged_weights` maps such names back to the model's own (``...q_proj.weight``) with
``W + (alpha / r) * B @ A``: what a generation engine, ``from_pretrained`` and the reshard planner
know. Training checkpoints hold only the adapters (:func:`is_adapter`); the base weights stay those
of ``model.path``.

Shape letters: O a layer's output features, I its input features, R the LoRA rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import torch

__all__ = ["ADAPTER", "LoraSpec", "add_adapters", "adapter_checkpoint_tensors", "is_adapter", "is_trained",
           "merged_weights", "plain_name"]

ADAPTER = "default"
"""peft's adapter name (one adapter per model)."""


@dataclass(frozen=True)
class LoraSpec:
    """The adapters of a model: rank ``rank`` on ``target_modules``, scaled by ``alpha / rank``."""

    rank: int
    alpha: int
    target_modules: str | tuple[str, ...] = "all-linear"
    """``all-linear`` (peft: every linear layer but the output head) or module names (``q_proj``)."""
    modules_to_save: tuple[str, ...] = ()
    """Modules trained whole next to the adapters (peft's ``modules_to_save``: a trainable copy,
    the original kept for the reference; tied embeddings stay tied, peft's ``ensure_weight_tying``)."""
    adapter_path: str = ""
    """A saved adapter the adapters start from (``model.lora_adapter_path``,
    :mod:`flowrl.models.lora_adapter`); empty: fresh adapters (B = 0)."""
    exclude_modules: str = ""
    """A regular expression: modules whose full name it matches get no adapter, even if targeted
    (peft's ``exclude_modules``, ``re.fullmatch``; verl's ``model.exclude_modules``, e.g.
    ``.*visual.*``); empty: none left out."""

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0:
            raise ValueError(f"LoraSpec(rank={self.rank}, alpha={self.alpha}): both must be > 0")
        if isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        object.__setattr__(self, "modules_to_save", tuple(self.modules_to_save))

    @classmethod
    def from_config(cls, model_cfg: Any) -> LoraSpec:
        """From a ``ModelConfig`` (``lora_rank`` > 0); a string other than ``all-linear`` is a
        comma-separated list of module names."""
        targets = model_cfg.target_modules
        if isinstance(targets, str) and targets != "all-linear":
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        save = model_cfg.modules_to_save
        save = tuple(t.strip() for t in save.split(",") if t.strip()) if isinstance(save, str) else tuple(save)
        return cls(rank=int(model_cfg.lora_rank), alpha=int(model_cfg.lora_alpha),
                   target_modules=targets if isinstance(targets, str) else tuple(targets), modules_to_save=save,
                   adapter_path=getattr(model_cfg, "lora_adapter_path", "") or "",
                   exclude_modules=getattr(model_cfg, "exclude_modules", "") or "")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoraSpec:
        targets = d["target_modules"]
        return cls(rank=int(d["rank"]), alpha=int(d["alpha"]),
                   target_modules=targets if isinstance(targets, str) else tuple(targets),
                   modules_to_save=tuple(d.get("modules_to_save", ())), adapter_path=d.get("adapter_path", ""),
                   exclude_modules=d.get("exclude_modules", ""))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a checkpoint's ``extra.lora``, an engine keyword argument)."""
        targets = self.target_modules
        out = {"rank": self.rank, "alpha": self.alpha,
               "target_modules": targets if isinstance(targets, str) else list(targets)}
        if self.adapter_path:
            out["adapter_path"] = self.adapter_path
        if self.exclude_modules:  # only when set: the records of runs without it are unchanged
            out["exclude_modules"] = self.exclude_modules
        return {**out, "modules_to_save": list(self.modules_to_save)} if self.modules_to_save else out

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def adapter_config(self) -> dict[str, Any]:
        """peft's ``adapter_config.json`` of these adapters (what vLLM's ``PEFTHelper`` reads)."""
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
                "target_modules": targets, "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
                "use_dora": False, "modules_to_save": None, "exclude_modules": self.exclude_modules or None}

    def peft_config(self) -> Any:
        """peft's ``LoraConfig`` (no dropout, no bias: the forward is deterministic, as verl's)."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        save = list(self.modules_to_save) or None
        return LoraConfig(task_type="CAUSAL_LM", r=self.rank, lora_alpha=self.alpha, target_modules=targets,
                          exclude_modules=self.exclude_modules or None, lora_dropout=0.0, bias="none",
                          modules_to_save=save, ensure_weight_tying=bool(save))


def add_adapters(model: Any, spec: LoraSpec) -> Any:
    """Inject ``spec``'s adapters into ``model`` in place (peft); returns the ``PeftModel`` around
    it (``disable_adapter()``, ``save_pretrained`` of the adapters). Only adapters are trainable.
    ValueError naming ``model.target_modules`` when no module of the model matches."""
    from peft import get_peft_model

    try:
        peft_model = get_peft_model(model, spec.peft_config())
    except ValueError as exc:
        raise ValueError(f"model.target_modules={spec.to_dict()['target_modules']!r}: {exc}; fix: use "
                         "all-linear or names of the model's linear layers (q_proj, v_proj, ...)") from None
    assert peft_model.base_model.model is model, "peft wrapped a copy of the model"
    trained = [p for p in model.parameters() if p.requires_grad]
    if spec.adapter_path and trained and not any(p.is_meta for p in trained):  # not on a meta-built layout model
        from flowrl.models.lora_adapter import load_adapter_weights

        load_adapter_weights(peft_model, spec.adapter_path)
    return peft_model


def is_adapter(name: str) -> bool:
    """Whether parameter ``name`` is a LoRA adapter weight (``...lora_A.default.weight``)."""
    return ".lora_A." in name or ".lora_B." in name


def is_trained(name: str) -> bool:
    """Whether parameter ``name`` trains under LoRA: an adapter, or the trainable copy of a module
    in ``modules_to_save`` (``...embed_tokens.modules_to_save.default.weight``)."""
    return is_adapter(name) or f".modules_to_save.{ADAPTER}." in name


def plain_name(name: str) -> str:
    """The model's own name of a peft-wrapped parameter (``.base_layer`` dropped; a
    ``modules_to_save`` copy by its module's name)."""
    return name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")


def adapter_checkpoint_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``tensors`` (by peft-wrapped names, the adapter name ``default`` in
    them: ``model.layers.0.self_attn.q_proj.lora_A.default.weight``) under the names of peft's saved
    adapters (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``): what
    ``adapter_model.safetensors`` holds and vLLM's LoRA loader parses. Other tensors are dropped."""
    out = {}
    for name, t in tensors.items():
        if not is_adapter(name):
            continue
        short = name.replace(f".{ADAPTER}.", ".")
        out[short if short.startswith("base_model.model.") else f"base_model.model.{short}"] = t
    return out


def merged_weights(model: Any, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (full tensors by peft-wrapped names: a state dict or the named parameters of
    ``model``) under the model's own names, each adapted layer's weight ``W + s * B @ A`` (in
    float32, cast back to ``W``'s dtype), the adapters dropped. ``model`` gives each layer's scaling
    and orientation (GPT-2's ``Conv1D`` stores ``W`` transposed)."""
    out = {plain_name(n): t for n, t in tensors.items() if not is_adapter(n) and ".original_module." not in n}
    suffix = f".lora_A.{ADAPTER}.weight"
    for name, a_RI in tensors.items():
        if not name.endswith(suffix):
            continue
        prefix = name[: -len(suffix)]
        layer = model.get_submodule(prefix)
        b_OR = tensors[f"{prefix}.lora_B.{ADAPTER}.weight"]
        delta_OI = (b_OR.float() @ a_RI.float()) * layer.scaling[ADAPTER]
        if getattr(layer, "fan_in_fan_out", False):
            delta_OI = delta_OI.T
        w = out[f"{prefix}.weight"]
        out[f"{prefix}.weight"] = (w.float() + delta_OI.to(w.device)).to(w.dtype)
    return out
