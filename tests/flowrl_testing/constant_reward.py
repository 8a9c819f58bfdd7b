"""A reward function that scores every response 0: no learning signal, the fault the
``reward_signal`` check (``flowrl.checks``) must stop a run for."""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
