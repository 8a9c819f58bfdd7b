"""Shared prompts (``actor.use_prefix_grouper``) at 2 FSDP ranks, with a token budget: the same
log-probs and the same step as the dp strategy's per-row layout on one process."""

import pyarrow.compute as pc
import pytest
import torch

from flowrl_testing.fsdp import policy_step, run_ranks
from flowrl_testing.prefix_grouper import group_batch, shared_step


def test_fsdp_shared_prompts_match_dp_per_row(tiny_model_dir):
    table = group_batch()  # 4 groups of 4: each rank's share holds 2 whole groups
    dp = policy_step(0, 1, str(tiny_model_dir), "dp", table)
    ranks = run_ranks(2, shared_step, str(tiny_model_dir), "fsdp", table, 30, timeout_s=300)
    for r in ranks:
        logp = torch.tensor(pc.list_flatten(r["logp"]).to_pylist())
        assert float((logp - dp["logp"]).abs().max()) <= 1e-5
    state = ranks[0]["state"]
    diff = max(float((state[k] - dp["state"][k]).abs().max()) for k in state)
    assert diff <= 5e-5, diff  # as test_token_budget_fsdp: Adam's first step scales summation-order noise
    assert ranks[0]["metrics"]["actor/grad_norm"] == pytest.approx(dp["metrics"]["actor/grad_norm"], rel=1e-5)
