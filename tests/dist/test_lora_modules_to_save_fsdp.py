"""``model.modules_to_save=embed_tokens`` under FSDP2 at 2 ranks: the tied embedding's copy trains
and stays tied, the ranks gather it whole with the adapters (what the vLLM sync sends), and the
merged weights rank 0 syncs to ``hf`` equal dp's on one process after the same update."""

from __future__ import annotations

import torch

from flowrl_testing.fsdp import actor_cfg, batch, run_cases

LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear", "modules_to_save": ["embed_tokens"]}


def _step(rank: int, world: int, model_dir: str, strategy: str, table) -> dict:
    from flowrl.backends.train.lora import sync_names
    from flowrl.roles.policy import PolicyRole

    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor_cfg(strategy, world),
                      use_old_logprobs=False, response_length=6, engine_kwargs={"lora": dict(LORA)})
    per = table.num_rows // world
    role.update(table.slice(rank * per, per), mini_batch_rows=per)
    return {"sent": sync_names(role.adapters_whole()), "merged": role.hf_state_dict()}


def test_fsdp_trains_the_tied_embedding_like_dp(tiny_model_dir):
    table = batch()
    (fsdp,) = run_cases(2, [(_step, (str(tiny_model_dir), "fsdp", table))])
    (dp,) = run_cases(1, [(_step, (str(tiny_model_dir), "dp", table))])
    sent = fsdp[0]["sent"]
    assert "model.embed_tokens.weight" in sent and list(sent) == list(dp[0]["sent"])
    for name, t in sent.items():
        torch.testing.assert_close(t, dp[0]["sent"][name], atol=2e-5, rtol=0)
    for name, t in dp[0]["merged"].items():
        torch.testing.assert_close(fsdp[0]["merged"][name], t, atol=2e-5, rtol=0)
    torch.testing.assert_close(fsdp[0]["merged"]["model.embed_tokens.weight"], sent["model.embed_tokens.weight"])
