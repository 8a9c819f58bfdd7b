"""Token-budget micro-batches over ranks (issue 14): one update whose ranks form different numbers
of micro-batches (FSDP must still run as many forwards/backwards on every rank)."""

from __future__ import annotations

import dataclasses

import pyarrow as pa


def budget_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table, budget: int) -> dict:
    """``flowrl_testing.fsdp.policy_step`` with ``use_dynamic_bsz`` and ``budget`` tokens per
    micro-batch; also how many micro-batches this rank's share forms on its own."""
    from flowrl.data.packed import PackedBatch
    from flowrl.roles.policy import PolicyRole
    from flowrl_testing.fsdp import actor_cfg

    actor = dataclasses.replace(actor_cfg(strategy, world), use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget,
                                log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=budget)
    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor, use_old_logprobs=False,
                      response_length=6)
    per = table.num_rows // world
    share = table.slice(rank * per, per)
    own = len(list(PackedBatch.from_table(share).with_token_budget(budget).micro_batches(1)))
    logp = role.compute_logprobs(table).column("old_logprobs")
    metrics = role.update(share, mini_batch_rows=per)
    return {"logp": logp, "state": role.hf_state_dict(), "metrics": metrics, "own_micro_batches": own}
