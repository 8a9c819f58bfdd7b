"""LoRA adapters in a vLLM engine, from tensors in memory (``model.lora_rank`` > 0).

The engine keeps the base weights and serves the trainer's adapters as one vLLM LoRA adapter:
after each update only the adapters cross to it (for a 7B model at rank 8 about 20 MB against
15 GB of merged weights). vLLM loads adapters from a directory only; the worker extension
(:meth:`~flowrl.backends.generate.vllm_worker.WeightReloadExtension.flowrl_load_lora`) builds
vLLM's ``LoRAModel`` from the tensors as its loader does from a directory (verl patches the loader
with a ``TensorLoRARequest``; this needs no patch). Each install gets a new adapter id, so no
prefix cached under the old adapter is reused; requests carry a ``LoRARequest`` with that id.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LORA_RANKS", "adapter_payload", "install_adapter", "lora_engine_kwargs"]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""``max_lora_rank`` values vLLM takes (``vllm.config.lora.MaxLoRARanks``); an adapter of a
smaller rank runs padded to the next one."""
IN_MEMORY_PATH = "flowrl://in-memory"
"""The ``lora_path`` of the requests: never read, since the adapter is installed before them."""


def lora_engine_kwargs(lora: dict | None) -> dict[str, Any]:
    """``vllm.LLM``'s LoRA settings for adapters ``lora`` (``LoraSpec.to_dict()``; None: LoRA
    off): one adapter slot, ``max_lora_rank`` the smallest vLLM takes that holds the rank."""
    if not lora:
        return {}
    rank = int(lora["rank"])
    fits = [r for r in LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora_rank={rank}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}; "
                         f"fix: use model.lora_rank <= {LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1, "max_cpu_loras": 1}


def adapter_payload(adapters: dict[str, Any]) -> dict[str, Any]:
    """The adapter tensors of ``adapters`` (trainer names ``...lora_A.default.weight`` or peft's
    saved ones) under peft's saved names, contiguous; ValueError when there are none."""
    from flowrl.models.lora import adapter_checkpoint_tensors

    tensors = {k: v.detach().contiguous() for k, v in adapter_checkpoint_tensors(adapters).items()}
    if not tensors:
        raise ValueError("LoRA sync: no adapter tensors (names with .lora_A. / .lora_B.) in the state")
    return tensors


def install_adapter(llm: Any, lora: dict, adapters: dict[str, Any], *, lora_id: int, in_process: bool) -> Any:
    """Install ``adapters`` in every worker of ``llm`` as adapter ``lora_id`` (dropping the
    previous one) and return the ``LoRARequest`` that selects it. Tensors go by reference when
    the engine runs in this process (copies: vLLM merges ``lora_alpha / r`` into ``lora_B`` in
    place, ``LoRALayerWeights.optimize``, which would scale the caller's tensors, and with them the
    trainer's when they share storage and the weight-sync fingerprints taken of them), as
    safetensors bytes otherwise."""
    from vllm.lora.request import LoRARequest

    from flowrl.backends.generate.vllm_worker import encode_state
    from flowrl.models.lora import LoraSpec

    tensors = adapter_payload(adapters)
    payload = {k: v.clone() for k, v in tensors.items()} if in_process else encode_state(tensors)
    config = LoraSpec.from_dict(lora).adapter_config()
    counts = llm.collective_rpc("flowrl_load_lora", args=(payload, config, lora_id))
    if any(c != len(tensors) // 2 for c in counts):
        raise RuntimeError(f"LoRA sync: workers adapted {counts} modules; the adapters hold {len(tensors) // 2}")
    request = LoRARequest(f"flowrl-{lora_id}", lora_id, lora_path=IN_MEMORY_PATH)
    llm.reset_prefix_cache()  # the prefix cache is keyed by adapter id too; drop the old entries
    return request
