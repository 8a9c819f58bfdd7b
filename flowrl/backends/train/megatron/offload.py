"""A megatron rank's state in host memory between its phases (verl's megatron ``param_offload``,
``grad_offload``, ``optimizer_offload``: ``offload_megatron_model_to_cpu`` /
``load_megatron_model_to_gpu``, ``offload_megatron_optimizer`` / ``load_megatron_optimizer``).

megatron-core keeps a DDP chunk's parameters and gradients in flat buffers the parameters are
views of; its own ``_ParamAndGradBuffer.offload_to_cpu`` copies the parameter buffer to pinned
host memory and shrinks the device storage to nothing (the views stay valid), and
``reload_from_cpu`` grows it back and copies; gradients are dropped and come back zeroed (they
are zeroed before each step anyway). The optimizer's ``offload_to_cpu`` / ``restore_from_cpu``
move its state (and, with bf16, its fp32 main parameters). With fp32 weights the optimizer's
parameters are the model's buffer views themselves, so only its state moves then.

On the CPU (gloo) everything is in host memory already: :class:`MegatronOffload` is called in
the same order and moves nothing (``flowrl.backends.train.fsdp_offload.offload_target``).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from flowrl.backends.train.fsdp_offload import move_optimizer_state, offload_target

__all__ = ["MegatronOffload", "chunk_buffers"]


def chunk_buffers(chunks: Iterable[Any]) -> list[Any]:
    """The parameter-and-gradient buffers of megatron DDP chunks (dense and expert-parallel)."""
    out = []
    for chunk in chunks:
        out += list(getattr(chunk, "buffers", []) or []) + list(getattr(chunk, "expert_parallel_buffers", []) or [])
    return out


def _sub_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


class MegatronOffload:
    """The three switches of one megatron engine. ``chunks()`` and ``optimizer()`` are read at
    each call; ``main_params``: the optimizer holds fp32 main copies of its own (bf16 weights),
    so megatron's optimizer offload may move its parameters too. ``moves`` counts the moves
    that went somewhere (none on the CPU)."""

    def __init__(self, device: torch.device | str, *, params: bool, grads: bool, optimizer: bool,
                 chunks: Any, get_optimizer: Any, main_params: bool) -> None:
        self.device, self.target = torch.device(device), offload_target(device)
        self.params, self.grads, self.optimizer = bool(params), bool(grads), bool(optimizer)
        self._chunks, self._optimizer, self.main_params = chunks, get_optimizer, main_params
        self.moves = 0

    @property
    def offloads(self) -> bool:
        return self.params or self.grads or self.optimizer

    def offload(self) -> None:
        """After a phase: the switched-on state to the host."""
        if self.target is None or not self.offloads:
            return
        if self.params or self.grads:
            for buf in chunk_buffers(self._chunks()):
                buf.offload_to_cpu(move_params=self.params, move_grads=self.grads)
        if self.optimizer and self._optimizer() is not None:
            self._move_optimizer(to_host=True)
        self.moves += 1
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def onload(self, *, optimizer: bool = False) -> None:
        """Before a phase: parameters (and gradients) back on the device; with ``optimizer``,
        the optimizer's state too."""
        if self.target is None or not self.offloads:
            return
        if self.params or self.grads:
            for buf in chunk_buffers(self._chunks()):
                buf.reload_from_cpu(move_params=self.params, move_grads=self.grads)
        if optimizer and self.optimizer and self._optimizer() is not None:
            self._move_optimizer(to_host=False)
        self.moves += 1

    def _move_optimizer(self, *, to_host: bool) -> None:
        for opt in _sub_optimizers(self._optimizer()):
            if self.main_params:  # megatron's own: state and fp32 main parameters
                opt.offload_to_cpu() if to_host else opt.restore_from_cpu()
            else:  # the parameters are the model's buffer views: the state alone
                move_optimizer_state(getattr(opt, "optimizer", opt), self.target if to_host else self.device)
