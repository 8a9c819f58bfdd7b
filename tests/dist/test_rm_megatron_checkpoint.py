"""The megatron reward model's checkpoints (``MegatronValueEngine.shard_spec``: the head whole on the
last stage under the HF name ``score.weight``): saved at TP2, loaded by a fresh TP2 engine and by
the dp reward model (same scores, and the next step's loss equal: AdamW's state restored), and
exported by ``flowrl export-hf`` as the sequence classifier RL's reward model scores alike."""

from __future__ import annotations

import pytest

from flowrl_testing.fsdp import run_ranks
from flowrl_testing.post_training import actor_cfg, pair_batch, rm_checkpoint_round


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_megatron_reward_model_checkpoint_loads_at_tp2_and_on_dp_and_exports(tiny_model_dir, tmp_path):
    pytest.importorskip("megatron.core")
    from flowrl.checkpoint import load_meta
    from flowrl.checkpoint.hf_export import export_hf
    from flowrl.roles.reward_model import RewardModelRole
    from flowrl.roles.reward_trainer import RewardTrainerRole

    table = pair_batch(num_pairs=4)
    out = run_ranks(2, rm_checkpoint_round, str(tiny_model_dir), table, str(tmp_path / "ckpt"), 2, timeout_s=400)[0]
    path = out["saved"]["path"]
    assert out["optim_step"] == 1 and "score.weight" in load_meta(path)["params"]
    assert out["loaded"] == pytest.approx(out["scores"], abs=1e-6)

    dp = RewardTrainerRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor_cfg("dp", dp=1))
    assert dp.load_checkpoint(path) == 1
    assert dp.compute_rm_scores(table).column("rm_score").to_numpy() == pytest.approx(out["scores"], abs=1e-5)
    assert dp.train_pairs(table, mini_batch_rows=table.num_rows)["actor/rm_loss"] == pytest.approx(out["next"], abs=1e-5)

    exported = export_hf(path, tmp_path / "rm", tiny_model_dir)
    scored = RewardModelRole(rank=0, world_size=1, model_dir=str(exported)).compute_rm_scores(table)
    assert scored.column("rm_score").to_numpy() == pytest.approx(out["scores"], abs=1e-5)
