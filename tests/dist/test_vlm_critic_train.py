"""The critic of a vision-language policy (issue 33): FSDP2 at 2 ranks computes the same values
and the same update as the dp critic on one process, images in every micro-batch, and its
sharded checkpoint restores the values exactly; PPO (``algorithm.adv_estimator=gae``) with a tiny
Qwen2-VL trains end to end with finite critic values and losses that change."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch

from flowrl_testing.fsdp import run_ranks
from test_vlm_fsdp import vlm_batch
from test_vlm_geo3k import train_geo3k


def critic_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table, ckpt: str) -> dict:
    """One rank: the values of the whole ``table``, one update on this rank's contiguous share
    (returns 1.0, the values as computed), the full state after it, the values after it, and the
    values of a fresh critic that loaded the checkpoint written after the update."""
    from flowrl.config import CriticConfig, OptimConfig
    from flowrl.data import experience as ex
    from flowrl.roles.critic import CriticRole

    cfg = CriticConfig(strategy=strategy, data_parallel_size=world, optim=OptimConfig(lr=1e-3, grad_clip=1.0),
                       ppo_micro_batch_size_per_gpu=2, forward_micro_batch_size_per_gpu=2)

    def role() -> CriticRole:
        return CriticRole(rank=rank, world_size=world, model_dir=model_dir, critic=cfg, response_length=6, seed=1)

    critic = role()
    values = critic.compute_values(table).column("values")
    lengths = [len(r) for r in table.column("response_ids").to_pylist()]
    train = table.append_column("values", values).append_column(
        "returns", ex.from_lists([[1.0] * n for n in lengths], ex.TOKEN_FLOATS))
    per = table.num_rows // world
    metrics = critic.update(train.slice(rank * per, per), mini_batch_rows=per)
    after = critic.compute_values(table).column("values")
    critic.save_checkpoint(ckpt, step=1, extra={})
    state = critic.engine.hf_state_dict()
    fresh = role()
    fresh.load_checkpoint(ckpt)
    def flat(col: pa.ChunkedArray) -> torch.Tensor:
        return torch.tensor([x for row in col.to_pylist() for x in row])

    return {"values": flat(values), "after": flat(after), "reloaded": flat(fresh.compute_values(table).column("values")),
            "state": state, "metrics": metrics}


@pytest.mark.timeout(600)
def test_fsdp_vlm_critic_at_two_ranks_matches_dp_and_its_checkpoint_restores(tmp_path):
    from flowrl.models.tiny_vlm import save_tiny_vlm

    model_dir = str(save_tiny_vlm(tmp_path / "model"))
    table = vlm_batch(model_dir)
    dp = critic_step(0, 1, model_dir, "dp", table, str(tmp_path / "dp_ckpt"))
    ranks = run_ranks(2, critic_step, model_dir, "fsdp", table, str(tmp_path / "fsdp_ckpt"), timeout_s=500)
    assert float((dp["after"] - dp["values"]).abs().max()) > 1e-4  # the update moved the values
    assert torch.equal(dp["reloaded"], dp["after"])
    for r in ranks:
        assert float((r["values"] - dp["values"]).abs().max()) <= 1e-5
        assert float((r["after"] - dp["after"]).abs().max()) <= 1e-4
        assert float((r["reloaded"] - r["after"]).abs().max()) <= 1e-6
    state = ranks[0]["state"]
    assert set(state) == set(dp["state"]) and any(k.startswith("model.visual.") for k in state) and "score.weight" in state
    diff = max(float((state[k] - dp["state"][k]).abs().max()) for k in state)
    assert diff <= 5e-5, diff
    assert ranks[0]["metrics"]["critic/grad_norm"] == pytest.approx(dp["metrics"]["critic/grad_norm"], rel=1e-5)


@pytest.mark.timeout(300)
def test_ppo_with_a_vlm_critic_trains(tmp_path):
    """Three PPO steps (the critic at 2 dp ranks, its values from the images): the critic's values,
    value loss and gradient norm are finite on every step and change from step to step."""
    proc, out, _, _ = train_geo3k(
        tmp_path, "algorithm.adv_estimator=gae", "rollout.n=4", "rollout.response_length=6", "data.train_batch_size=4",
        "data.max_prompt_length=64", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
        "actor.freeze_vision_tower=true", "trainer.total_training_steps=3", num_good=8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    keys = ("critic/values/mean", "critic/vf_loss", "critic/grad_norm", "critic/vpred_mean")
    for key in keys:
        series = [r[key] for r in rows]
        assert all(abs(x) < float("inf") and x == x for x in series), (key, series)
        assert len(set(series)) > 1, (key, series)
    assert all(r["critic/grad_norm"] > 0 for r in rows)
