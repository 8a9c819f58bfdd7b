"""Rule-based reward functions and their registry (``exact_match``, ``gsm8k``, ``auto``).

The built-ins are registered by import string in ``flowrl.catalog.rewards``: a new built-in
reward module needs no import here."""

from flowrl.rewards.registry import REWARD_FUNCTIONS, resolve_reward_fn, split_score

__all__ = ["REWARD_FUNCTIONS", "resolve_reward_fn", "split_score"]
