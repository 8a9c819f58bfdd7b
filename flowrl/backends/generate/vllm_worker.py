"""Code that runs inside vLLM's worker processes (``LLM(worker_extension_cls=...)``).

vLLM mixes :class:`WeightReloadExtension` into its worker class, so its methods are reachable
through ``LLM.collective_rpc``. Kept apart from ``vllm.py`` and free of module-level vLLM imports:
vLLM imports it by qualified name in every worker.
"""

from __future__ import annotations

from typing import Any

#: ``worker_extension_cls`` as vLLM wants it (a dotted qualified name).
EXTENSION = "flowrl.backends.generate.vllm_worker.WeightReloadExtension"


def encode_state(state: dict[str, Any]) -> bytes:
    """HF-named tensors as safetensors bytes: what crosses a process boundary (``collective_rpc``
    arguments are msgpack'd, where tensors would arrive as nested lists)."""
    from safetensors.torch import save

    return save({k: v.detach().contiguous() for k, v in state.items()})


def decode_state(payload: bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(payload, dict):
        return payload
    from safetensors.torch import load

    return load(bytes(payload))


class WeightReloadExtension:
    """Worker-side half of the CPU weight-update path: load a full HF-named state in place.

    vLLM's CPU build repacks linear weights at load time, so calling the model's ``load_weights``
    on a loaded model corrupts it; the worker's ``reload_weights(weights_iterator=...)`` redoes
    the loader's post-processing and is the supported in-place path. Named apart from vLLM's own
    ``update_weights`` (its weight-transfer API), which it must not shadow.
    """

    def flowrl_reload_weights(self, payload: bytes | dict[str, Any]) -> int:
        state = decode_state(payload)
        self.reload_weights(weights_iterator=iter(state.items()))  # type: ignore[attr-defined]
        self._flowrl_retie_embeddings()
        return len(state)

    def flowrl_load_lora(self, payload: bytes | dict[str, Any], adapter_config: dict[str, Any], lora_id: int) -> int:
        """Install LoRA adapter ``lora_id`` from tensors in memory (peft's saved names,
        ``base_model.model....q_proj.lora_A.weight``) and drop every other adapter: what vLLM's own
        loader does with an adapter directory (``WorkerLoRAManager._load_adapter``), without the
        directory. Requests name it by a ``LoRARequest`` with the same id, which then finds it
        loaded and does not look at its path. Returns the number of adapted layers (peft's, before
        vLLM packs them)."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        manager = self.model_runner.lora_manager  # type: ignore[attr-defined]  # LRUCacheWorkerLoRAManager
        helper = PEFTHelper.from_dict({**adapter_config, "vllm_max_position_embeddings": manager.max_position_embeddings})
        helper.validate_legal(manager.lora_config)
        model = manager._adapter_manager.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        lora = LoRAModel.from_lora_tensors(
            lora_model_id=lora_id, tensors=decode_state(payload), peft_helper=helper, device="cpu",
            dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
            skip_prefixes=getattr(model, "lora_skip_prefixes", None),
        )
        adapted = len(lora.loras)  # before add_adapter packs q/k/v and gate/up into vLLM's fused layers
        manager.remove_all_adapters()  # one adapter: the trainer's current one
        manager._adapter_manager.add_adapter(lora)
        manager._adapter_manager.activate_adapter(lora_id)
        return adapted

    def _flowrl_retie_embeddings(self) -> None:
        """A tied output layer is not named in the checkpoint, so the layerwise reload never
        reprocesses it: tie it to the reloaded input embedding again and redo its post-load step
        (on CPU, the packed GEMM built from the old weights)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        if not getattr(self.model_config.hf_config, "tie_word_embeddings", False):  # type: ignore[attr-defined]
            return
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)  # Llama/Qwen2 layout
        if lm_head is None or embed is None or lm_head is embed:
            return
        if lm_head.weight is not embed.weight:
            lm_head.weight = embed.weight
        # Even when still tied, the output layer's packed GEMM holds the old weights.
        method = getattr(lm_head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(lm_head)
