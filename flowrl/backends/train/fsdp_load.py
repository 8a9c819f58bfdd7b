"""The fsdp backend's loader: the model built on the meta device, sharded, then each rank reads
only its own rows of every parameter from the safetensors files.

Why this way, and not ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``:
a broadcast load has rank 0 read (and hold, tensor by tensor, then all of it) the whole
checkpoint and send every byte to every rank; reading slices with ``safe_open(...).get_slice``
has every rank touch only its ``1 / world`` of each tensor's rows in the file (the pages of the
other rows are never mapped in), so a rank's peak host memory is about one shard plus the
largest single slice in flight, on rank 0 as on the others, and no bytes cross the network.

The order (torchtitan's ``model.to_empty(...)`` then init, with the checkpoint as the init):

1. :func:`params_on_meta`: the HF model built from its config with *parameters* on the meta
   device and *buffers* real (rotary ``inv_freq`` is computed by its module's constructor, as a
   whole-model load computes it; it is no checkpoint entry to read).
2. The engine adds what it adds before sharding (LoRA adapters: real, small, initialised from the
   seed as ever) and shards with ``fully_shard``: parameters become meta DTensors.
3. :func:`fill_from_checkpoint`: ``to_empty`` allocates each rank's shards, every checkpoint
   parameter is filled from the slice of rows its shard holds (tied weights once: one parameter),
   the real tensors kept aside in step 2 (adapters, buffers) are copied back, sliced alike.

:func:`checkpoint_names` decides up front whether a model can load this way: every parameter
(or a tied twin) must be in the checkpoint by its own name. A model with parameters the
checkpoint lacks (the critic's new value head) loads whole, as before.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

import torch

__all__ = ["adapters_stay_real", "checkpoint_index", "checkpoint_names", "fill_from_checkpoint", "params_on_meta", "read_rows"]


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device and keep real buffers
    (``accelerate.init_empty_weights(include_buffers=False)``, without the dependency). A
    parameter's constructor tensor (``torch.empty``) is dropped unread: no page of it is touched,
    and its initialisation runs on meta (free, and the CPU generator does not advance)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            cls = type(module._parameters[name])
            extra = module._parameters[name].__dict__
            module._parameters[name] = cls(module._parameters[name].to("meta"), **extra)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


@contextlib.contextmanager
def adapters_stay_real() -> Iterator[None]:
    """peft moves a new adapter to its base layer's device; on a meta base that would drop the
    adapter's initial values (drawn from the seed as on a real base): inside, they stay on the CPU
    (cast to the base's dtype as ever), to be kept through sharding (:func:`fill_from_checkpoint`)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    move = BaseTunerLayer._move_adapter_to_device_of_base_layer

    def to_real(self: Any, adapter_name: str, device: Any = None) -> None:
        if device is None:
            base = self.get_base_layer()
            weight = getattr(base, "weight", None)
            if weight is not None and weight.is_meta:
                device = torch.device("cpu")
        move(self, adapter_name, device)

    module_to = torch.nn.Module.to

    def not_to_meta(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None and device.type == "meta":  # peft's _replace_module: "to the base's device"
            return self
        return module_to(self, *args, **kwargs)

    BaseTunerLayer._move_adapter_to_device_of_base_layer = to_real
    torch.nn.Module.to = not_to_meta
    try:
        yield
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = move
        torch.nn.Module.to = module_to


def checkpoint_index(model_dir: str) -> dict[str, str]:
    """Tensor name -> safetensors file under ``model_dir`` (the index file when sharded, else the
    files' headers); empty when there is no safetensors checkpoint."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return {k: str(root / v) for k, v in json.loads(index.read_text())["weight_map"].items()}
    from safetensors import safe_open

    out: dict[str, str] = {}
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({k: str(path) for k in f.keys()})
    return out


def checkpoint_names(model: torch.nn.Module, index: dict[str, str], *, skip: Any = (),
                     rename: Any = None) -> dict[str, str] | None:
    """Each parameter's (``named_parameters``: tied ones once; none in ``skip``) checkpoint name:
    its own (through ``rename``: peft's wrapped names to the model's own), else a tied twin's
    (``lm_head.weight`` of tied embeddings); None when one is missing (load whole)."""
    rename = rename or (lambda n: n)
    twins: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        twins.setdefault(id(p), []).append(rename(name))
    out = {}
    for name, p in model.named_parameters():
        if name in skip:
            continue
        found = next((n for n in [rename(name), *twins[id(p)]] if n in index), None)
        if found is None:
            return None
        out[name] = found
    return out


def read_rows(handle: Any, name: str, start: int, stop: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of tensor ``name`` of an open safetensors file: only those bytes
    are read (a 0-d tensor whole)."""
    sl = handle.get_slice(name)
    if len(sl.get_shape()) == 0:
        return handle.get_tensor(name)
    return sl[start:stop]


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's local tensor of ``t`` and the global row its rows start at."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t, 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return t.to_local(), (offset[0] if offset else 0)


def fill_from_checkpoint(model: torch.nn.Module, model_dir: str, names: dict[str, str], index: dict[str, str], *,
                         device: torch.device | str, keep: dict[str, torch.Tensor]) -> None:
    """Allocate the sharded ``model``'s local shards on ``device`` and fill them: parameters named
    in ``keep`` (full tensors kept before sharding: adapters) from there, the others' rows from
    the checkpoint (``names``: parameter -> checkpoint name); buffers from ``keep`` (by buffer
    name) too. Every rank reads only its own rows."""
    from safetensors import safe_open

    buffers = {n: b for n, b in keep.items() if n.startswith("buffer:")}
    model.to_empty(device=device)
    by_file: dict[str, list[tuple[str, str]]] = {}
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            local, start = _rows(p)
            if name in keep:
                src = keep[name]
                local.copy_(src[start:start + local.shape[0]] if src.dim() else src)
            else:
                by_file.setdefault(index[names[name]], []).append((name, names[name]))
        for path, entries in by_file.items():
            with safe_open(path, framework="pt") as f:
                for name, key in entries:
                    local, start = _rows(params[name])
                    stop = start + (local.shape[0] if local.dim() else 0)
                    local.copy_(read_rows(f, key, start, stop).to(local.dtype))
        for name, buf in model.named_buffers():
            saved = buffers.get(f"buffer:{name}")
            if saved is not None:
                buf.copy_(saved)
