"""Code that runs inside vLLM's worker processes (``LLM(worker_extension_cls=...)``).

vLLM mixes :class:`WeightReloadExtension` into its worker class, so its methods are reachable
through ``LLM.collective_rpc``. Kept apart from ``vllm.py`` and free of module-level vLLM imports:
vLLM imports it by qualified name in every worker.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

#: ``worker_extension_cls`` as vLLM wants it (a dotted qualified name).
EXTENSION = "flowrl.backends.generate.vllm_worker.WeightReloadExtension"
#: Keys of one bucket of vLLM's IPC weight-transfer update info (``IPCWeightTransferUpdateInfo``,
#: unpacked mode): per tensor its name, dtype name, shape and ``{GPU uuid: reduce_tensor args}``.
IPC_BUCKET_KEYS = ("names", "dtype_names", "shapes", "ipc_handles")


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


def encode_ipc_bucket(update_info: dict[str, Any]) -> bytes:
    """One bucket of vLLM's IPC update info as pickled bytes, the one form of it that crosses
    ``collective_rpc``: its msgpack channel refuses the classes and ``torch.dtype`` inside
    ``reduce_tensor``'s arguments unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` opens it to any
    pickle, while bytes pass as they are (verl's and NeMo-RL's worker extensions do the same)."""
    if set(update_info) != set(IPC_BUCKET_KEYS):
        raise ValueError(f"IPC weight bucket: keys {sorted(update_info)}, expected {sorted(IPC_BUCKET_KEYS)}")
    return pickle.dumps(update_info, protocol=pickle.HIGHEST_PROTOCOL)


class _HandleUnpickler(pickle.Unpickler):
    """Unpickles an IPC bucket and nothing else: the only globals it resolves are torch's dtypes,
    ``torch.Size`` and tensor and storage classes (what ``reduce_tensor``'s arguments hold)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "torch" or module.startswith("torch."):
            obj = super().find_class(module, name)
            storages = (torch.UntypedStorage, torch.storage.TypedStorage)
            if (isinstance(obj, torch.dtype) or obj is torch.Size
                    or (isinstance(obj, type) and issubclass(obj, (torch.Tensor, *storages)))):
                return obj
        raise pickle.UnpicklingError(f"IPC weight bucket: {module}.{name} is not a tensor, storage, dtype or "
                                     "size; the payload did not come from flowrl's encode_ipc_bucket")


def decode_ipc_bucket(payload: bytes) -> dict[str, Any]:
    """The update info :func:`encode_ipc_bucket` packed (the worker's side)."""
    info = _HandleUnpickler(io.BytesIO(bytes(payload))).load()
    if not isinstance(info, dict) or set(info) != set(IPC_BUCKET_KEYS):
        raise ValueError(f"IPC weight bucket: expected a dict with keys {sorted(IPC_BUCKET_KEYS)}")
    return info


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

    def flowrl_update_weights_ipc(self, payload: bytes) -> int:
        """One bucket of the CUDA weight update: vLLM's own ``update_weights`` (its weight-transfer
        API, IPC backend: ``parse_update_info`` then ``receive_weights``) on the update info
        :func:`encode_ipc_bucket` packed. Between the driver's ``start_weight_update`` and
        ``finish_weight_update``. Returns the number of tensors."""
        info = decode_ipc_bucket(payload)
        self.update_weights(info)  # type: ignore[attr-defined]  # vLLM's Worker.update_weights
        return len(info["names"])

    def flowrl_use_weight_transfer(self, backend: str) -> str:
        """Give this worker vLLM's weight-transfer engine ``backend`` (``nccl``) in place of the
        one it was started with (``ipc``), as vLLM's worker builds it at load time
        (``WeightTransferEngineFactory.create_engine``); once, before
        ``init_weight_transfer_engine``. Returns the engine's class name."""
        from vllm.config.weight_transfer import WeightTransferConfig
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

        current = getattr(self, "weight_transfer_engine", None)  # type: ignore[attr-defined]
        if getattr(self, "_weight_update_active", False):
            raise RuntimeError("flowrl_use_weight_transfer during a weight update")
        config = WeightTransferConfig(backend=backend)
        if current is None or getattr(current.config, "backend", None) != backend:
            if current is not None:
                current.shutdown()
            self.weight_transfer_engine = WeightTransferEngineFactory.create_engine(  # type: ignore[attr-defined]
                config, self.vllm_config, self.device, self.model_runner.get_model())  # type: ignore[attr-defined]
        return type(self.weight_transfer_engine).__name__  # type: ignore[attr-defined]

    def flowrl_seed(self, seed: int) -> None:
        """Seed this worker's samplers for the next batch of requests, which carry no seeds of
        their own: torch's generators (vLLM's V1 sampler draws the unseeded requests' noise from
        them in one call) and numpy's (its V2 model runner draws each unseeded request's seed
        there), as vLLM seeds a worker at start-up."""
        from vllm.utils.torch_utils import set_random_seed

        set_random_seed(seed)

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
        hf_config = self.model_config.hf_config  # type: ignore[attr-defined]
        text_config = getattr(hf_config, "text_config", None)  # a VLM's (Qwen2-VL) says it there
        if not (getattr(hf_config, "tie_word_embeddings", False) or getattr(text_config, "tie_word_embeddings", False)):
            return
        if hasattr(model, "get_language_model"):  # a multimodal model: the language model holds both
            model = model.get_language_model()
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
