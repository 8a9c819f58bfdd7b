"""The reward-function registry.

A reward function has verl's signature::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

``solution_str`` is the decoded response without the EOS token. A returned dict must hold
``"score"``; its other keys become extra metrics. Users pass their own function as an import
string, ``"mypkg.rewards:my_score"``, wherever a registered name is accepted.
"""

from __future__ import annotations

from typing import Any, Callable

from flowrl.registry import Registry

RewardFn = Callable[..., "float | dict[str, Any]"]

REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function", allow_import_strings=True)


def resolve_reward_fn(name: str) -> RewardFn:
    """The reward function registered as ``name``, or the one ``"module:function"`` names."""
    fn = REWARD_FUNCTIONS.get(name)
    if not callable(fn):
        raise TypeError(f"reward function {name!r} resolved to {fn!r}, which is not callable")
    return fn


def split_score(result: float | dict[str, Any]) -> tuple[float, dict[str, float]]:
    """``(score, extra_metrics)`` from a reward function's return value."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(
                f"a reward function returned a dict without 'score' (keys: {sorted(result)}); "
                "put the reward under 'score'"
            )
        extras = {key: float(value) for key, value in result.items() if key != "score"}
        return float(result["score"]), extras
    return float(result), {}
