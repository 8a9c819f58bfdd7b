"""Token-budget micro-batches at 2 FSDP ranks whose shares form different numbers of micro-batches:
the ranks agree on a count (no hang), and the step equals the dp strategy's fixed-size
micro-batches on one process (issue 14 item 2)."""

import pyarrow.compute as pc
import pytest
import torch

from flowrl_testing.fsdp import batch, policy_step, run_ranks
from flowrl_testing.token_budget import budget_step


def test_fsdp_token_budget_ranks_agree_and_match_dp(tiny_model_dir):
    table = batch()
    lengths = pc.add(pc.list_value_length(table["prompt_ids"]), pc.list_value_length(table["response_ids"]))
    table = table.take(pc.array_sort_indices(lengths, order="descending"))  # rank 0 gets the long rows
    dp = policy_step(0, 1, str(tiny_model_dir), "dp", table)
    ranks = run_ranks(2, budget_step, str(tiny_model_dir), "fsdp", table, 12, timeout_s=300)
    counts = [r["own_micro_batches"] for r in ranks]
    assert counts[0] > counts[1], counts  # alone, the ranks would run different numbers of micro-batches
    for r in ranks:  # packed token-budget log-probs == dp's padded fixed-size ones
        logp = torch.tensor(pc.list_flatten(r["logp"]).to_pylist())
        assert float((logp - dp["logp"]).abs().max()) <= 1e-5
    state = ranks[0]["state"]
    diff = max(float((state[k] - dp["state"][k]).abs().max()) for k in state)
    # AdamW's first step moves every weight by about lr = 1e-2 whatever its gradient's size, so the
    # other summation order (micro-batches of other rows) shows at ~1e-5 on near-zero gradients.
    assert diff <= 5e-5, diff
    assert ranks[0]["metrics"]["actor/grad_norm"] == pytest.approx(dp["metrics"]["actor/grad_norm"], rel=1e-5)
