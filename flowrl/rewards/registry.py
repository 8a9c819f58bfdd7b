"""The reward-function registry.

A reward function has verl's signature::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

``solution_str`` is the decoded response without the EOS token. A returned dict must hold
``"score"``; its other keys become extra metrics. Users pass their own function as an import
string, ``"mypkg.rewards:my_score"``, or as verl's ``custom_reward_function`` does, a file and a
name, ``"path/to/reward.py:compute_score"``, wherever a registered name is accepted.

The function is called as verl's default (naive) reward manager calls it: by keyword, with
``extra_info`` as a dict (the row's ``extra_info`` plus ``num_turns`` and
``rollout_reward_scores``, as verl adds them). ``REWARD_FUNCTIONS`` is the floor-0 catalogue
``flowrl.catalog.rewards``, where the built-ins are registered by import string.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

from flowrl.catalog.rewards import REWARD_FUNCTIONS

RewardFn = Callable[..., "float | dict[str, Any]"]

REWARD_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""The keywords a reward function is called with (verl's naive reward manager's)."""

SIGNATURE_FIX = "define it as def compute_score(data_source, solution_str, ground_truth, extra_info=None)"


class RewardFunctionError(RuntimeError):
    """A reward function failed on a row (it raised, exited, hung, or returned no finite score):
    the message names the function, the row and the fix; the CLI prints it as one ``error:`` line."""


def resolve_reward_fn(name: str) -> RewardFn:
    """The reward function registered as ``name``, or the one ``"module:function"`` or
    ``"file.py:function"`` names, called with verl's arguments (:class:`VerlCall`)."""
    fn = load_file_function(name) if is_file_ref(name) else REWARD_FUNCTIONS.get(name)
    if not callable(fn):
        raise TypeError(f"reward function {name!r} resolved to {fn!r}, which is not callable")
    if getattr(fn, "__module__", "").startswith("flowrl.rewards."):
        return fn  # the built-ins take extra_info as a dict or its JSON string alike
    check_signature(name, fn)
    return VerlCall(fn)


def check_signature(name: str, fn: Any) -> None:
    """``fn`` accepts verl's keywords (:data:`REWARD_ARGS`), else a TypeError naming the fix."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    try:
        sig.bind(**dict.fromkeys(REWARD_ARGS))
    except TypeError as exc:
        raise TypeError(f"reward function {name!r} has the signature {sig}, which cannot be called with verl's "
                        f"arguments ({exc}); {SIGNATURE_FIX}") from None


def is_file_ref(name: str) -> bool:
    """``path/to/file.py:function`` (verl's ``custom_reward_function.path`` and ``.name``)."""
    path, sep, _ = name.rpartition(":")
    return bool(sep) and path.endswith(".py")


def load_file_function(name: str) -> Any:
    """The function ``name`` of the Python file ``path`` in ``"path:name"`` (loaded once)."""
    path, _, attr = name.rpartition(":")
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ValueError(f"reward function file {path!r} does not exist; fix custom_reward_function.path "
                         "(algorithm.reward_fn=path/to/file.py:function)")
    module_name = "flowrl_reward_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    if not hasattr(module, attr):
        raise ValueError(f"{path} has no function {attr!r}; fix custom_reward_function.name")
    return getattr(module, attr)


class VerlCall:
    """Calls a reward function as verl's default reward manager does: keywords
    ``data_source, solution_str, ground_truth, extra_info`` with ``extra_info`` a dict (a JSON
    string from the experience table is decoded) holding ``num_turns`` and
    ``rollout_reward_scores`` too."""

    def __init__(self, fn: RewardFn) -> None:
        self.fn = fn

    def __call__(self, data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> Any:
        if isinstance(extra_info, str):
            extra_info = json.loads(extra_info) if extra_info else {}
        info = dict(extra_info or {})
        info.setdefault("num_turns", None)
        info.setdefault("rollout_reward_scores", {})
        return self.fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=info)


def split_score(result: float | dict[str, Any]) -> tuple[float, dict[str, float]]:
    """``(score, extra_metrics)`` from a reward function's return value: a finite number (a
    float, int, bool, numpy or 0-d tensor scalar) or a dict holding one under ``"score"``; its
    other numeric values become metrics (strings and other values are left out). Anything else,
    a string like ``"1.0"`` included, and NaN or +-inf, raise ValueError naming the fix."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(
                f"a reward function returned a dict without 'score' (keys: {sorted(result)}); "
                "put the reward under 'score'"
            )
        extras = {key: float(value) for key, value in result.items() if key != "score" and _is_number(value)}
        return _finite(result["score"], "the dict's 'score'"), extras
    return _finite(result, "it"), {}


def _is_number(value: Any) -> bool:
    return not isinstance(value, (str, bytes, bytearray)) and hasattr(value, "__float__")


def _finite(value: Any, what: str) -> float:
    if not _is_number(value):
        raise ValueError(f"returned {value!r} ({type(value).__name__}) where a score belongs; {what} must be a "
                         "number (float, int or bool), or a dict with the number under 'score'"
                         + (": convert the string with float()" if isinstance(value, str) else ""))
    try:
        score = float(value)
    except (TypeError, ValueError) as exc:  # e.g. a tensor of several elements
        raise ValueError(f"returned {value!r} ({type(value).__name__}), which is not one number ({exc}); "
                         "return one float per response") from None
    if not math.isfinite(score):
        raise ValueError(f"returned the score {score} (not finite); return a finite number (e.g. 0.0 for a "
                         "response that cannot be scored) so that no NaN or inf reaches the policy")
    return score
