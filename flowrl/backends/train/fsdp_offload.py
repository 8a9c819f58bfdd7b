"""A trainer's state in host memory between its phases: verl's ``offload_fsdp_model_to_cpu`` /
``load_fsdp_model_to_gpu`` and ``offload_fsdp_optimizer`` / ``load_fsdp_optimizer`` pattern.

With ``fsdp_config.param_offload`` the engine's parameters and gradients (FSDP2's sharded
DTensors: each rank's rows) leave the GPU whenever the engine is not computing, so the generation
engine that shares the GPU (the colocated and hybrid placements) has its memory; with
``optimizer_offload`` AdamW's state leaves it outside the update. The role calls
:meth:`OffloadSwitch.onload` before a phase and :meth:`OffloadSwitch.offload` after it
(``flowrl.roles.memory.Residency``). On the CPU the state is in host memory already: the calls
happen in the same order and move nothing (:func:`offload_target` is None), so a CPU run's
numbers are unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch

__all__ = ["OffloadSwitch", "move_modules", "move_optimizer_state", "offload_target"]


def offload_target(device: torch.device | str) -> torch.device | None:
    """Where offloaded state goes for an engine on ``device``: the host for an accelerator, None
    on the CPU (the state is in host memory already: nothing moves)."""
    return torch.device("cpu") if torch.device(device).type != "cpu" else None


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's rows
        total += local.numel() * local.element_size()
    return total


@torch.no_grad()
def move_modules(modules: Iterable[torch.nn.Module], device: torch.device) -> int:
    """Every parameter (with its gradient: ``Module.to`` moves ``.grad`` too) and buffer of
    ``modules`` to ``device``, as verl's ``model.to(device)`` does for FSDP2 modules (each DTensor
    moves its local shard). Returns the parameter and gradient bytes this rank moved."""
    moved = 0
    for module in modules:
        params = list(module.parameters())
        moved += _nbytes(params) + _nbytes(p.grad for p in params if p.grad is not None)
        module.to(device)
    return moved


@torch.no_grad()
def move_optimizer_state(optimizer: Any, device: torch.device) -> int:
    """Every tensor of ``optimizer.state`` (AdamW's moments) to ``device`` (verl's
    ``offload_fsdp_optimizer``); scalars (AdamW's ``step``) stay where AdamW keeps them.
    Returns the bytes moved."""
    moved = 0
    for state in getattr(optimizer, "state", {}).values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != device:
                moved += _nbytes([value])
                state[key] = value.to(device, non_blocking=device.type == "cpu")
    return moved


class OffloadSwitch:
    """Moves an engine's modules and optimizer state between its device and the host, by the two
    switches (verl's ``param_offload``, ``optimizer_offload``). ``modules()`` and ``optimizer()``
    are read at each call (the engine may rebuild them). ``moves`` counts the moves that went
    somewhere (none on the CPU), ``last_bytes`` the bytes of the last call."""

    def __init__(self, device: torch.device, *, params: bool, optimizer: bool, modules: Any, get_optimizer: Any) -> None:
        self.device, self.params, self.optimizer = torch.device(device), bool(params), bool(optimizer)
        self.target = offload_target(self.device)
        self._modules, self._optimizer = modules, get_optimizer
        self.moves = 0
        self.last_bytes = 0
        self.params_on_host = False
        """Whether the parameters are on the host now (``params`` switched on, after :meth:`offload`)."""

    def _move(self, device: torch.device, *, params: bool, optimizer: bool) -> None:
        self.last_bytes = 0
        if self.target is None:  # on the CPU: already in host memory
            return
        if params:
            self.last_bytes += move_modules(self._modules(), device)
        opt = self._optimizer()
        if optimizer and opt is not None:
            self.last_bytes += move_optimizer_state(opt, device)
        if params or optimizer:
            self.moves += 1
            if device.type == "cpu" and torch.cuda.is_available():
                torch.cuda.empty_cache()  # give the freed blocks back for the generation engine

    def offload(self) -> None:
        """The configured state to the host (after a phase)."""
        self._move(self.target or self.device, params=self.params, optimizer=self.optimizer)
        self.params_on_host = self.params

    def onload(self, *, optimizer: bool) -> None:
        """The parameters (and, with ``optimizer``, the optimizer state) back on the device."""
        self._move(self.device, params=self.params, optimizer=self.optimizer and optimizer)
        self.params_on_host = False

    @contextlib.contextmanager
    def loaded(self) -> Iterator[None]:
        """The parameters on the device for the block when they are on the host now (a caller that
        reaches the engine outside its role's phases: the hybrid role's weight export), back to
        the host after; nothing otherwise."""
        if not self.params_on_host:
            yield
            return
        self.onload(optimizer=False)
        try:
            yield
        finally:
            self.offload()
