"""Rule-based rewards for answers with a known ground truth.

``exact_match`` compares the whole stripped response; ``gsm8k`` reads the final answer after
``####`` as verl's gsm8k reward does in strict mode; ``auto`` picks one by ``data_source``
(``DATA_SOURCE_REWARDS``). Registered by import string in ``flowrl/catalog/rewards.py``.
"""

from __future__ import annotations

import re
from typing import Any

from flowrl.catalog.rewards import DATA_SOURCE_REWARDS, REWARD_FUNCTIONS

# Only the tail of a long response is searched for the final answer (as verl does), so a runaway
# generation cannot make the regular expression slow.
_SOLUTION_CLIP_CHARS = 300
_GSM8K_ANSWER = re.compile(r"####\s*\$?\s*(-?[0-9.,$]+)")


def exact_match(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """1.0 when the response equals the ground truth after stripping whitespace, else 0.0."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


def extract_gsm8k_answer(solution_str: str) -> str | None:
    """The last ``#### <number>`` answer with commas and ``$`` removed, or None if there is none."""
    matches = _GSM8K_ANSWER.findall(solution_str[-_SOLUTION_CLIP_CHARS:])
    if not matches:
        return None
    return matches[-1].replace(",", "").replace("$", "").rstrip(".")


def gsm8k(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """1.0 when the final ``####`` answer equals the ground truth, 0.0 otherwise or without one."""
    answer = extract_gsm8k_answer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if answer == str(ground_truth).strip().replace(",", "") else 0.0


def auto(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float | dict[str, Any]:
    """Dispatch on ``data_source`` (see ``DATA_SOURCE_REWARDS``)."""
    name = DATA_SOURCE_REWARDS.get(data_source)
    if name is None:
        raise ValueError(
            f"reward 'auto' does not know data_source {data_source!r}; known data sources: "
            f"{', '.join(sorted(DATA_SOURCE_REWARDS))}. Set the reward function explicitly "
            f"(one of {', '.join(REWARD_FUNCTIONS.names())}, or 'module:function')"
        )
    return REWARD_FUNCTIONS.get(name)(data_source, solution_str, ground_truth, extra_info)
