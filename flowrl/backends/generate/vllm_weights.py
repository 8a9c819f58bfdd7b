"""Weight and RNG helpers of the ``vllm`` backend (:mod:`flowrl.backends.generate.vllm`): one
bucket of vLLM's CUDA IPC update info, the caller's RNG state around a seeded batch of an engine
in this process, a state split into buckets, and a model directory's safetensors."""

from __future__ import annotations

from typing import Any, Iterator


def ipc_bucket(chunk: list[tuple[str, Any]], devices: dict[str, int]) -> tuple[dict[str, Any], list[Any]]:
    """One bucket of vLLM's IPC update info (``IPCWeightTransferUpdateInfo``, unpacked) for the
    tensors of ``chunk``, copied to every engine GPU (``devices``: GPU uuid -> this process's
    device index), and the copies, which must stay alive until the update is finished."""
    from torch.multiprocessing.reductions import reduce_tensor

    info: dict[str, list] = {"names": [], "dtype_names": [], "shapes": [], "ipc_handles": []}
    copies = []
    for name, tensor in chunk:
        info["names"].append(name)
        info["dtype_names"].append(str(tensor.dtype).removeprefix("torch."))
        info["shapes"].append(list(tensor.shape))
        per_gpu = {}
        for uuid, device in devices.items():
            copy = tensor.detach().to(f"cuda:{device}", non_blocking=True).contiguous()
            copies.append(copy)
            per_gpu[uuid] = reduce_tensor(copy)[1]
        info["ipc_handles"].append(per_gpu)
    return info, copies


def _rng_state(on_cuda: bool) -> tuple:
    import random

    import numpy as np
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state(), (
        torch.cuda.get_rng_state_all() if on_cuda else None)


def _set_rng_state(on_cuda: bool, saved: tuple) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])
    if on_cuda and saved[3] is not None:
        torch.cuda.set_rng_state_all(saved[3])


def _chunks(state: dict[str, Any], chunk_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    chunk, size = [], 0
    for name, tensor in state.items():
        chunk.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _read_safetensors(model_dir: str) -> dict[str, Any]:
    """``model_dir``'s weights as HF-named tensors (the one load of a ``dummy`` start)."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} holds no *.safetensors weights; save the model with save_pretrained")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
