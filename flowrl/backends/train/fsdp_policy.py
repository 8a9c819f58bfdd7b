"""The ``fsdp`` train backend: any ``AutoModelForCausalLM`` sharded with FSDP2's ``fully_shard``
(DTensor, dim-0 shards) over the data-parallel ranks.

Each rank holds ``1 / world`` of every parameter, of its gradient and of AdamW's state. Every
transformer block (the model's ``_no_split_modules`` classes) is its own FSDP unit; the rest
(embeddings, final norm, head; tied weights once) is the root unit, a small module that runs the
``dp`` backend's forward, so the numbers are the ``dp`` backend's: the same forward, gradients
reduce-scattered as a SUM (losses are normalised by global token counts, as in ``dp_policy``),
the global gradient norm over all shards, the same AdamW per element.

Weights leave the engine whole: ``reshard_source`` all-gathers every parameter (``hf`` style,
every rank a full replica for the planner, which sends each generation rank only what it lacks),
``hf_state_dict`` gathers on every rank and keeps it on rank 0. Checkpoints are sharded: each rank
writes its own rows (``fsdp_checkpoint``). Computes on the rank's ``device``: on the CPU over gloo
in the compute dtype; on a GPU (NCCL) with fp32 sharded parameters gathered in bf16 and gradients
reduced in fp32 (``flowrl.parallel.dtypes.fsdp_mixed_precision``).

LoRA (``lora=``, ``model.lora_rank`` > 0): peft's adapters are injected before sharding (sharded
with their blocks; the frozen base weights too, FSDP2 handles the mix), AdamW holds only the
adapters, ``reference_logprobs`` is the base model (adapters disabled), and the weights leave
merged (``W + s B A``) under the plain model's names for ``hf`` (``reshard_source``); vLLM gets the
adapters alone, gathered by the policy role (``flowrl.backends.reshard.adapters``); checkpoints hold
the adapters.

Shape letters: T response tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from flowrl.backends.interfaces import torch_dtype
from flowrl.backends.train.dp_policy import TorchDPEngine
from flowrl.backends.train.optim import AdamWSettings
from flowrl.backends.train.fsdp_tensors import full as _full
from flowrl.backends.train.fsdp_tensors import local as _local
from flowrl.backends.train.precision import placement
from flowrl.data.packed import PackedBatch
from flowrl.models import vlm
from flowrl.parallel.dtypes import Precision, fsdp_mixed_precision

__all__ = ["FSDPEngine"]


class _Root(torch.nn.Module):
    """The root FSDP unit: holds the model, runs ``fn`` under FSDP's root hooks."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn, *args, **kwargs):  # noqa: ANN001 - any engine method
        out = fn(*args, **kwargs)  # fresh tensors out (FSDP's backward hooks must not sit on views)
        if isinstance(out, tuple):
            return tuple(t.clone() if isinstance(t, torch.Tensor) and t._base is not None else t for t in out)
        return out.clone() if isinstance(out, torch.Tensor) and out._base is not None else out


class FSDPEngine(TorchDPEngine):
    same_micro_batch_count = True  # each forward all-gathers, each backward reduce-scatters

    def __init__(
        self,
        model_dir: str,
        *,
        trainable: bool = True,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        reshard_after_forward: bool = True,
        param_offload: bool = False,
        optimizer_offload: bool = False,
        offload_policy: bool = False,
        param_dtype: str | None = None,
        reduce_dtype: str | None = None,
        buffer_dtype: str | None = None,
        gradient_checkpointing: bool = False,
        lora: dict | None = None,
        ulysses_sequence_parallel_size: int = 1,
        **optim: Any,
    ) -> None:
        """``optim``: :class:`~flowrl.backends.train.optim.AdamWSettings`'s keywords; offload: :meth:`offload_state`."""
        freeze_vision = optim.pop("freeze_vision_tower", False)  # a VLM's actor.freeze_vision_tower
        settings = AdamWSettings(**optim)
        if not dist.is_initialized():
            raise RuntimeError("FSDPEngine needs torch.distributed.init_process_group first (a worker group)")
        torch.manual_seed(seed)
        # the device is the rank's (its plan entry), not the group's backend: the same code on both
        self.device, precision = placement(device, dtype, trainable=trainable)
        # FSDP2 casts itself (MixedPrecisionPolicy), so the forward runs without autocast
        self.precision = Precision(precision.param_dtype, precision.compute_dtype, autocast=False)
        param_dtype, reduce_dtype = fsdp_mixed_precision(precision, param_dtype, reduce_dtype)
        meta = self._build_model(model_dir, torch_dtype(precision.param_dtype), lora, freeze_vision)
        self.pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        self.grad_clip = settings.grad_clip
        offload_policy = offload_policy or (param_offload and not trainable)  # a frozen one: verl's ref policy
        self._offload = self._offload_switch(param_offload and not offload_policy, optimizer_offload and not offload_policy)
        param_offload = offload_policy  # CPUOffloadPolicy below: parameters, gradients, AdamW's step on the host
        if buffer_dtype is not None:
            self._cast_buffers(torch_dtype(buffer_dtype))
        if gradient_checkpointing and trainable:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if meta:  # the real tensors (adapters, buffers) set aside; each rank then reads its own rows
            self._root = self._shard_and_fill(meta, model_dir, reshard_after_forward, param_offload, param_dtype,
                                              reduce_dtype)
        else:
            self._broadcast_parameters()  # heads new in the checkpoint (the critic's) start equal
            self._root = self._shard(reshard_after_forward, param_offload, param_dtype, reduce_dtype)
        self._sequence_parallel(ulysses_sequence_parallel_size)  # Ulysses (flowrl.backends.train.ulysses)
        self._set_mode(trainable, settings)

    def _build_model(self, model_dir: str, param_dtype: torch.dtype, lora: dict | None,
                     freeze_vision: bool) -> tuple[torch.nn.Module, dict, dict] | None:
        """Set ``self.model`` (on the meta device where it can be read shard by shard, adapters
        added, a VLM's vision tower frozen on request); returns ``_meta_model``'s answer, None
        where the model was loaded whole onto the device."""
        # None: this model loads whole (no safetensors; or peft's modules_to_save, whose copies of
        # the base modules have no checkpoint entry of their own)
        whole = bool(lora and lora.get("modules_to_save"))
        meta = None if whole else self._meta_model(model_dir, param_dtype)
        self.model = meta[0] if meta else self._load_model(model_dir, param_dtype).to(self.device)
        self._add_adapters_on(meta is not None, lora)  # LoRA: before sharding, sharded with their blocks
        if freeze_vision:
            vlm.freeze_vision_tower(self.model)
        return meta

    def _cast_buffers(self, dtype: torch.dtype) -> None:
        for buf in self.model.buffers():
            if buf.is_floating_point():
                buf.data = buf.data.to(dtype)

    def _set_mode(self, trainable: bool, settings: AdamWSettings) -> None:
        """Train mode and AdamW over the trainable parameters, or eval mode without gradients."""
        self.optimizer = None
        if trainable:
            self.model.train()
            self.optimizer = torch.optim.AdamW(self._trainable_parameters(), **settings.adamw_kwargs())
        else:
            self.model.eval()
            self.model.requires_grad_(False)

    # ----------------------------------------------------------------- offload between phases
    def _offload_switch(self, params: bool, optimizer: bool):  # noqa: ANN202 - an OffloadSwitch
        from flowrl.backends.train.fsdp_offload import OffloadSwitch

        self.offloads = params or optimizer
        return OffloadSwitch(self.device, params=params, optimizer=optimizer, modules=lambda: [self.model],
                             get_optimizer=lambda: self.optimizer)

    def offload_state(self) -> None:
        """After a phase: the parameters and gradients (``param_offload``) and AdamW's state
        (``optimizer_offload``) to the host; nothing moves on the CPU."""
        self._offload.offload()

    def onload_state(self, *, optimizer: bool = False) -> None:
        """Before a phase: the parameters back on the device, AdamW's state too for an update."""
        self._offload.onload(optimizer=optimizer)

    def _meta_model(self, model_dir: str, dtype: torch.dtype) -> tuple[torch.nn.Module, dict, dict] | None:
        """The model with its parameters on the meta device (buffers real), each parameter's
        checkpoint name and the checkpoint's index (``flowrl.backends.train.fsdp_load``); None
        when it must load whole: no safetensors checkpoint, or a parameter it lacks."""
        from transformers import AutoConfig, AutoModelForCausalLM

        from flowrl.backends.train.fsdp_load import checkpoint_index, checkpoint_names, params_on_meta

        index = checkpoint_index(model_dir)
        if not index:
            return None
        with params_on_meta():
            vlm.register_auto_classes()  # Qwen2-VL / Qwen2.5-VL (flowrl.models.vlm)
            model = vlm.with_text_ids(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype))
        names = checkpoint_names(model, index)
        return (model, names, index) if names is not None else None

    def _add_adapters_on(self, meta: bool, lora: dict | None) -> None:
        """``_add_adapters``; on a meta-built model the adapters stay real (drawn from the seed as
        on a real base) to be kept through sharding."""
        if not (meta and lora):
            self._add_adapters(lora)
            return
        from flowrl.backends.train.fsdp_load import adapters_stay_real

        with adapters_stay_real():
            self._add_adapters(lora)

    def _shard_and_fill(self, meta: tuple, model_dir: str, reshard_after_forward: bool, param_offload: bool,
                        param_dtype: str | None, reduce_dtype: str | None) -> torch.nn.Module:
        """Shard the meta-built model, then fill each rank's shards from the checkpoint's rows."""
        from flowrl.backends.train.fsdp_load import checkpoint_names, fill_from_checkpoint

        model, names, index = meta
        keep = self._kept_tensors()
        if self.lora is not None:  # peft renamed the wrapped layers' weights (``.base_layer.``)
            from flowrl.models.lora import plain_name

            names = checkpoint_names(self.model, index, skip=keep, rename=plain_name)
            assert names is not None, "a LoRA-wrapped parameter has no checkpoint entry"
        root = self._shard(reshard_after_forward, param_offload, param_dtype, reduce_dtype)
        on = "cpu" if param_offload and self.device.type == "cuda" else self.device
        fill_from_checkpoint(self.model, model_dir, names, index, device=on, keep=keep)
        return root

    def _kept_tensors(self) -> dict[str, torch.Tensor]:
        """Before sharding a meta-built model: the full tensors that are no checkpoint entry (LoRA
        adapters, made from the seed; buffers such as rotary ``inv_freq``, by ``buffer:<name>``),
        rank 0's everywhere (as ``_broadcast_parameters`` makes them)."""
        keep = {n: p.detach().to(self.device).clone() for n, p in self.model.named_parameters() if not p.is_meta}
        keep.update({f"buffer:{n}": b.detach().to(self.device).clone() for n, b in self.model.named_buffers()})
        if self.dp_size > 1:
            for t in keep.values():
                dist.broadcast(t, src=0)
        return keep

    def _shard(self, reshard_after_forward: bool, param_offload: bool, param_dtype: str | None,
               reduce_dtype: str | None) -> torch.nn.Module:
        """``fully_shard`` every block, then the root; gradients reduce as a SUM."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (self.dp_size,))
        mp = MixedPrecisionPolicy(param_dtype=torch_dtype(param_dtype) if param_dtype else None,
                                  reduce_dtype=torch_dtype(reduce_dtype) if reduce_dtype else None)
        kw = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": reshard_after_forward}
        if param_offload and self.device.type == "cuda":
            kw["offload_policy"] = CPUOffloadPolicy()
        blocks = set(getattr(self.model, "_no_split_modules", None) or ())
        for module in list(self.model.modules()):
            if type(module).__name__ in blocks:
                fully_shard(module, **kw)
        root = fully_shard(_Root(self.model), **kw)
        for module in root.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        return root

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum small host values over the data-parallel group (on the group's device)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.cpu().tolist()

    # ----------------------------------------------------------------- forward (under the root)
    def _forward(self, mb: PackedBatch, *, temperature: float, with_entropy: bool, token_stat: str = "entropy"):
        return self._root(super()._forward, mb, temperature=temperature, with_entropy=with_entropy,
                          token_stat=token_stat)

    # ----------------------------------------------------------------- update
    def _reduce_gradients_and_step(self) -> float:
        """FSDP reduced the gradients during backward; clip by the norm over all shards, step."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # as dp: a parameter without a gradient steps with zeros
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        norm = _full(torch.nn.utils.get_total_norm(grads, 2.0))
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm)
        self.optimizer.step()
        return float(norm)

    # ----------------------------------------------------------------- weights
    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full HF-named state on rank 0 (LoRA adapters merged), None elsewhere; every rank must call it."""
        with self._offload.loaded():  # offloaded parameters gather on the device
            state = self._plain({k: _full(v.detach()).cpu().clone() for k, v in self.model.state_dict().items()})
        return state if dist.get_rank() == 0 else None

    def reshard_source(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered whole (``hf`` style; LoRA adapters merged): every rank calls it."""
        with self._offload.loaded():  # offloaded parameters gather on the device
            return self._plain({n: _full(p.detach()).cpu() for n, p in self.model.named_parameters()})

    def grad_state_dict(self) -> dict[str, torch.Tensor]:
        """The reduced gradients of the last step, gathered whole; every rank must call it."""
        return {n: _full(p.grad.detach()).cpu().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def save_hf(self, directory: str) -> None:
        """Every rank calls it; rank 0 writes a transformers directory."""
        state = self.hf_state_dict()
        if state is not None:
            self.model.save_pretrained(directory, state_dict=state)

    def param_bytes_local(self) -> int:
        return sum(_local(p).numel() * p.element_size() for p in self.model.parameters())

    def state_bytes_local(self) -> dict[str, int]:
        """Bytes this rank holds of parameters, gradients and optimizer state (for the memory table)."""
        grads = sum(_local(p.grad).numel() * p.grad.element_size() for p in self.model.parameters() if p.grad is not None)
        optim = 0
        for state in (self.optimizer.state.values() if self.optimizer else ()):
            optim += sum(_local(v).numel() * v.element_size() for v in state.values()
                         if isinstance(v, torch.Tensor) and v.dim() > 0)
        return {"params": self.param_bytes_local(), "grads": grads, "optim": optim}

    # ----------------------------------------------------------------- checkpoints (sharded)
    def save_checkpoint_sharded(self, path: str, *, step: int, extra: dict | None = None) -> dict | None:
        from flowrl.backends.train.fsdp_checkpoint import save_sharded

        return save_sharded(self, path, step=step, extra=extra)

    def load_checkpoint_sharded(self, path: str) -> int:
        from flowrl.backends.train.fsdp_checkpoint import load_sharded

        return load_sharded(self, path)

    def local_params(self) -> dict[str, torch.Tensor]:
        """This rank's rows of every checkpointed parameter (HF names, tied once; with LoRA the
        adapters only): the DTensors' local tensors."""
        return {n: _local(p) for n, p in self._state_named().items()}

    def close(self) -> None:
        """Nothing to release beyond the process (the group belongs to the actor)."""
