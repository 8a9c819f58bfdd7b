"""The megatron critic's checkpoints (``MegatronValueEngine.shard_spec``: the value head whole on the
last stage under the dp critic's name ``score.*``): saved at TP2 and at PP2, loaded by a fresh
megatron critic (same values, same next update: AdamW's state restored) and by the dp critic
(same values and next update within 1e-5); ``trainer.save_freq`` is accepted with
``critic.strategy=megatron``."""

from __future__ import annotations

import pytest

from flowrl_testing.fsdp import run_ranks


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_megatron_critic_checkpoint_resumes_on_megatron_and_on_dp(tiny_model_dir, tmp_path, tp, pp):
    pytest.importorskip("megatron.core")
    from transformers import AutoConfig

    from flowrl.checkpoint import load_meta
    from flowrl.data import experience as ex
    from flowrl.roles.critic import CriticRole
    from flowrl_testing.megatron_value import NUM_ROWS, critic_checkpoint_round, critic_config

    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    out = run_ranks(2, critic_checkpoint_round, str(tiny_model_dir), vocab, str(tmp_path / "ckpt"), tp, pp,
                    timeout_s=600)[0]
    path = out["saved"]["path"]
    assert out["optim_step"] == 1 and {"score.weight", "score.bias"} <= set(load_meta(path)["params"])
    assert out["loaded"].tolist() == pytest.approx(out["values"].tolist(), abs=1e-6)

    dp = CriticRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), critic=critic_config(strategy="dp"),
                    response_length=5)
    assert dp.load_checkpoint(path) == 1
    table = out["train"].select(["prompt_ids", "response_ids", "response_mask"])
    values = ex.token_column(dp.compute_values(table), "values")[0]
    assert values.tolist() == pytest.approx(out["values"].tolist(), abs=1e-5)
    metrics = dp.update(out["train"], mini_batch_rows=NUM_ROWS)
    assert metrics["critic/vf_loss"] == pytest.approx(out["next"]["critic/vf_loss"], abs=1e-5)
    assert metrics["critic/grad_norm"] == pytest.approx(out["next"]["critic/grad_norm"], rel=1e-4)
