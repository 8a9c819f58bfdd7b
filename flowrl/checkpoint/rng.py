"""This process's random number generator states as JSON (for a checkpoint's ``meta.json``).

Covers Python's ``random``, numpy's legacy global generator, torch's CPU generator and, when CUDA is
initialised, every CUDA device's generator. Byte states are base64 strings.
"""

from __future__ import annotations

import base64
import random
from typing import Any

__all__ = ["get_rng_state", "set_rng_state"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def get_rng_state() -> dict[str, Any]:
    """A JSON-serialisable snapshot of this process's RNGs; ``set_rng_state`` restores it."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {"kind": kind, "keys": _b64(np.asarray(keys, dtype="<u4").tobytes()),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore RNGs saved by ``get_rng_state`` (a missing ``cuda`` entry leaves CUDA alone)."""
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    keys = np.frombuffer(base64.b64decode(np_state["keys"]), dtype="<u4").astype(np.uint32)
    np.random.set_state((np_state["kind"], keys, np_state["pos"], np_state["has_gauss"],
                         np_state["cached_gaussian"]))

    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])
