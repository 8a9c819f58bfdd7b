"""Shared-prompt (``actor.use_prefix_grouper``) updates over ranks: GRPO-like groups and one rank's
step with the shared layout (and optionally a token budget)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa


def group_batch(num_groups: int = 4, group_size: int = 4, seed: int = 0) -> pa.Table:
    """``num_groups`` prompts (2-5 tokens) x ``group_size`` responses (1-6 tokens), consecutive
    rows per prompt, with advantages and reference log-probs (as ``flowrl_testing.fsdp.batch``)."""
    from flowrl.data import experience as ex

    rng = np.random.default_rng(seed)
    prompts, responses = [], []
    for _ in range(num_groups):
        prompt = rng.integers(10, 40, size=rng.integers(2, 6)).tolist()
        for _ in range(group_size):
            prompts.append(prompt)
            responses.append(rng.integers(10, 40, size=rng.integers(1, 7)).tolist())
    adv = [rng.normal(size=len(r)).astype(np.float32).tolist() for r in responses]
    ref = [(-rng.random(len(r)) * 3).astype(np.float32).tolist() for r in responses]
    return pa.table({
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "ref_logprobs": ex.from_lists(ref, ex.TOKEN_FLOATS),
    })


def shared_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table, budget: int) -> dict:
    """``flowrl_testing.fsdp.policy_step`` with ``use_prefix_grouper`` (and ``budget`` tokens per
    micro-batch when > 0): old log-probs of the whole table, one update on this rank's share."""
    from flowrl.roles.policy import PolicyRole
    from flowrl_testing.fsdp import actor_cfg

    actor = dataclasses.replace(actor_cfg(strategy, world), use_prefix_grouper=True, use_dynamic_bsz=budget > 0,
                                ppo_max_token_len_per_gpu=budget or 16384, log_prob_use_dynamic_bsz=budget > 0,
                                log_prob_max_token_len_per_gpu=budget or 16384)
    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor, use_old_logprobs=False,
                      response_length=6)
    logp = role.compute_logprobs(table).column("old_logprobs")
    per = table.num_rows // world
    metrics = role.update(table.slice(rank * per, per), mini_batch_rows=per)
    return {"logp": logp, "state": role.hf_state_dict(), "metrics": metrics}
