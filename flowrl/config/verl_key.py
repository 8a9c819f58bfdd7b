"""The record of one verl key in :data:`flowrl.config.verl_keys.VERL_KEYS` (its class, the flowrl
key it sets or why not, verl's default and whether a verl YAML's default is adopted) and its
constructor ``_k``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_NO = object()  # no verl default recorded


@dataclass(frozen=True)
class VerlKey:
    verl: str
    kind: str  # map | dyn | noop | refuse | derive
    flowrl: str = ""
    does: str = ""
    nearest: str = ""
    accept: tuple = ()
    verl_default: Any = _NO
    adopt: bool = True  # a verl YAML's default value of this key is applied (False: flowrl's stays)


def _k(verl: str, kind: str, flowrl: str = "", does: str = "", nearest: str = "", accept: tuple = (),
       default: Any = _NO, adopt: bool = True) -> VerlKey:
    return VerlKey(verl, kind, flowrl, does, nearest, accept, default, adopt)


_OFF = (False, None, 0, 0.0, "", "none", "null")
