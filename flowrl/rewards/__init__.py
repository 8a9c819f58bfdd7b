"""Rule-based reward functions and their registry (``exact_match``, ``gsm8k``, ``auto``)."""

from flowrl.rewards.registry import REWARD_FUNCTIONS, resolve_reward_fn, split_score
from flowrl.rewards import math as _math  # noqa: F401  (registers the built-in rewards)

__all__ = ["REWARD_FUNCTIONS", "resolve_reward_fn", "split_score"]
