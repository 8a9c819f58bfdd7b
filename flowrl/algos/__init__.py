"""The pure algorithm core: advantage estimators, policy losses, KL estimators, loss aggregation.

Pure torch, no I/O. Token-level tensors are flat over the rows of a batch with ``cu_seqlens_B1``
offsets (see ``aggregate.py``). Each extension point is a ``flowrl.registry.Registry`` of the
torch-free catalogue ``flowrl.catalog.algos``: adding an estimator or a loss means registering
one function.

The face: the catalogue's registries and decorators are plain imports (torch-free); the names of
the torch modules (each module's ``__all__``) load on first use (PEP 562), because this package's
``__init__`` also runs for ``import flowrl.algos.registries``, which must import no torch.
``from flowrl.algos import grpo_advantages`` imports the torch modules.
"""

from __future__ import annotations

import importlib
from typing import Any

from flowrl.catalog.algos import (ADVANTAGE_ESTIMATORS, AGG_MODES, KL_CONTROLLERS, KL_ESTIMATORS, POLICY_LOSSES,
                                  register_kl_estimator, register_policy_loss)

TORCH_MODULES = ("advantages", "aggregate", "kl", "kl_control", "logprobs", "policy_loss", "value")
"""The modules whose ``__all__`` this face exports on first use (they import torch)."""

__all__ = ["ADVANTAGE_ESTIMATORS", "AGG_MODES", "KL_CONTROLLERS", "KL_ESTIMATORS", "POLICY_LOSSES",
           "register_kl_estimator", "register_policy_loss"]
"""The torch-free names; the torch modules' names come on top (``dir(flowrl.algos)`` lists them)."""


def _torch_names() -> dict[str, Any]:
    """Every name of the torch modules' ``__all__`` -> its object (imports them: torch)."""
    found: dict[str, Any] = {}
    for short in TORCH_MODULES:
        module = importlib.import_module(f"flowrl.algos.{short}")
        found.update({n: getattr(module, n) for n in module.__all__})
    return found


def __getattr__(name: str) -> Any:
    if not name.startswith("__"):
        torch_names = _torch_names()
        if name in torch_names:
            globals().update(torch_names)
            return torch_names[name]
    raise AttributeError(f"module 'flowrl.algos' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_torch_names()))
