"""Token-budget micro-batches and packed lines (issue 14 item 2): the layout functions by hand, and
the same log-probs, losses and gradients as fixed-size micro-batches (single process, dp)."""

import pyarrow as pa
import pytest
import torch

from flowrl.config import ActorConfig, OptimConfig
from flowrl.data import experience as ex
from flowrl.data.packed import PackedBatch
from flowrl.data.token_layout import assign_lines, budget_bounds, gather_rows
from flowrl.roles.policy import PolicyRole


def test_budget_bounds_by_hand():
    # 5+4 = 9 <= 10, +3 would be 12: cut; 3+6 = 9; 11 alone (over the budget, still one row); 2
    assert budget_bounds([5, 4, 3, 6, 11, 2], 10) == [0, 2, 4, 5, 6]
    # at least 4 groups over 4 rows of one group's worth: one row each
    assert budget_bounds([1, 1, 1, 1], 100, min_groups=4) == [0, 1, 2, 3, 4]
    # 2 groups by tokens: 8 | 2 + 2 + 2 + 2
    assert budget_bounds([8, 2, 2, 2, 2], 100, min_groups=2) == [0, 1, 5]
    with pytest.raises(ValueError, match="must be > 0"):
        budget_bounds([1], 0)


def test_assign_lines_pairs_the_longest_with_the_shortest():
    # capacity 7 (the longest); 7 alone; 5 + 2; 4 + 3 (the shortest left is 3 once 2 is used)
    line_of, offset_of, capacity = assign_lines([4, 7, 2, 5, 3])
    assert capacity == 7
    assert line_of == [2, 0, 1, 1, 2] and offset_of == [0, 0, 5, 0, 4]


def test_gather_rows_reorders_ragged_rows():
    values, cu = torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 2, 3, 6])
    out, out_cu = gather_rows(values, cu, torch.tensor([2, 0]))
    assert out.tolist() == [4, 5, 6, 1, 2] and out_cu.tolist() == [0, 3, 5]


def _table(num_rows: int, seed: int = 0) -> pa.Table:
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi, n: torch.randint(lo, hi, (n,), generator=g).tolist()  # noqa: E731
    prompts = [rand(3, 40, int(torch.randint(3, 8, (1,), generator=g))) for _ in range(num_rows)]
    lengths = [int(n) for n in torch.randint(1, 14, (num_rows,), generator=g)]
    responses = [rand(3, 40, n) for n in lengths]
    adv = [[float(a)] * n for a, n in zip(torch.randn(num_rows, generator=g), lengths)]
    old = [[-3.0 + 0.1 * i for i in range(n)] for n in lengths]
    mask = [[1] * (n - 1) + [int(i % 3 != 0)] for i, n in enumerate(lengths)]
    return pa.table({
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists(mask, pa.list_(pa.int8())),
        "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "old_logprobs": ex.from_lists(old, ex.TOKEN_FLOATS),
    })


def test_packed_lines_hold_every_token_once_with_restarting_positions():
    batch = PackedBatch.from_table(_table(9))
    lines = batch.with_token_budget(1000).model_inputs(pad_id=0)
    real = int((lines.position_ids_BL > 0).sum()) + batch.num_rows  # every sequence has one position 0
    assert real == batch.num_tokens
    # each response token sits where its position says: prompt length + index in the response
    plen = batch.prompt_cu_B1.diff()
    expected = torch.cat([torch.arange(int(n)) + int(p) for p, n in zip(plen, batch.response_cu_B1.diff())])
    assert torch.equal(lines.position_ids_BL[lines.row_T, lines.pos_T], expected)
    assert torch.equal(lines.input_ids_BL[lines.row_T, lines.pos_T], batch.response_T.long())
    assert lines.num_slots < batch.padded(0).num_slots


def _role(model_dir, *, mode: str, dynamic: bool) -> PolicyRole:
    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False, loss_agg_mode=mode,
                        ppo_micro_batch_size_per_gpu=3, use_dynamic_bsz=dynamic, ppo_max_token_len_per_gpu=40,
                        log_prob_use_dynamic_bsz=dynamic, log_prob_max_token_len_per_gpu=30, entropy_coeff=0.01)
    return PolicyRole(rank=0, world_size=1, model_dir=str(model_dir), actor=actor, response_length=14)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_token_budget_update_equals_fixed_micro_batches(tiny_model_dir, mode):
    table = _table(11)
    fixed, dynamic = _role(tiny_model_dir, mode=mode, dynamic=False), _role(tiny_model_dir, mode=mode, dynamic=True)
    batch = PackedBatch.from_table(table).with_token_budget(40)
    assert len(list(batch.micro_batches(3))) >= 3  # several token-budget micro-batches, unlike 11 rows / 3
    logp_fixed, _ = ex.token_column(fixed.compute_logprobs(table), "old_logprobs")
    logp_dynamic, _ = ex.token_column(dynamic.compute_logprobs(table), "old_logprobs")
    torch.testing.assert_close(logp_dynamic, logp_fixed, atol=1e-5, rtol=0)
    m_fixed, m_dynamic = fixed.update(table, mini_batch_rows=11), dynamic.update(table, mini_batch_rows=11)
    # The loss is a sum over micro-batches of global-denominator terms, so its gradient does not
    # depend on the split. (The per-token stats like pg_loss are means over micro-batches weighted
    # by their response tokens: with masked tokens they move with the split, as they did before.)
    assert m_dynamic["actor/grad_norm"] == pytest.approx(m_fixed["actor/grad_norm"], rel=1e-5)
    g_fixed, g_dynamic = fixed.grad_state_dict(), dynamic.grad_state_dict()
    for name, g in g_fixed.items():
        torch.testing.assert_close(g_dynamic[name], g, atol=1e-6, rtol=1e-4)
