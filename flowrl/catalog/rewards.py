"""The reward-function catalogue: every built-in rule reward by import string.

Floor 0: names are listed and checked without importing a reward module; ``REWARD_FUNCTIONS.get``
imports the module that defines the entry. A built-in reward is one function in a module of
``flowrl/rewards/`` and one line here (nothing to import in ``flowrl/rewards/__init__.py``); a
data source that ``algorithm.reward_fn=auto`` should score with it gets a line in
:data:`DATA_SOURCE_REWARDS`. A user's reward needs neither: ``algorithm.reward_fn=my_mod:fn``
(verl's signature), or ``@REWARD_FUNCTIONS.register("name")`` in a module that is imported.
"""

from __future__ import annotations

from typing import Any, Callable

from flowrl.registry import Registry

__all__ = ["DATA_SOURCE_REWARDS", "REWARD_FUNCTIONS"]

REWARD_FUNCTIONS: Registry[Callable[..., Any]] = Registry("reward function", allow_import_strings=True)
"""Name -> ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``."""
REWARD_FUNCTIONS.register("exact_match", "flowrl.rewards.math:exact_match")
REWARD_FUNCTIONS.register("gsm8k", "flowrl.rewards.math:gsm8k")
REWARD_FUNCTIONS.register("auto", "flowrl.rewards.math:auto")
REWARD_FUNCTIONS.register("vlm_shapes", "flowrl.rewards.math:exact_match")  # the embedded vision-language task
REWARD_FUNCTIONS.register("code", "flowrl.rewards.code_tests:code")  # runs code: the sandbox (issue 38)

DATA_SOURCE_REWARDS: dict[str, str] = {
    "flowrl/addition": "exact_match",
    "flowrl/vlm_shapes": "exact_match",
    "openai/gsm8k": "gsm8k",
    **dict.fromkeys(("codecontests", "apps", "codeforces", "taco", "flowrl/code_linear"), "code"),
}
"""A row's ``data_source`` -> the registered reward function that ``auto`` scores it with."""
