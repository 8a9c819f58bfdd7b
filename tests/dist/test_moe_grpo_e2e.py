"""GRPO end to end through the CLI on the tiny MoE with routing replay, in separate processes
(cluster.placement=colocated: the dp trainer's weights resharded into the hf rollout): the
experience holds each token's experts, the update replays them and reports the routers."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from flowrl_testing.moe import build_moe_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, addition_data):
    model = build_moe_dir(tmp_path_factory.mktemp("tiny_moe"))
    out = tmp_path_factory.mktemp("moe-grpo") / "run"
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train", f"model.path={model}", f"data.train_files={addition_data[0]}",
        "trainer.total_training_steps=3", f"trainer.run_dir={out}", "data.train_batch_size=8", "rollout.n=4",
        "actor.ppo_mini_batch_size=4",  # 2 optimizer steps: the old-log-prob pass runs (replayed)
        "cluster.placement=colocated", "actor.router_replay=true", "actor.moe_aux_loss_coeff=0.01",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 3 steps" in proc.stdout
    return out


def test_moe_grpo_replays_recorded_routes(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert 0.5 < row["actor/moe/replayed_fraction"] < 1.0
        assert row["actor/moe/load_balancing_loss"] >= 1.0 and row["actor/moe/expert_load_max_over_mean"] >= 1.0
        assert np.isfinite(row["actor/moe/z_loss"])
        # the rollout (hf, resharded weights) and the replayed trainer agree: same weights, same experts
        assert row["rollout/logprob_diff_max"] < 1e-4
        if row["step"] > 1:
            assert row["reshard/bytes"] > 0  # the experts and routers reached the rollout worker
    table = pq.read_table(run_dir / "experience" / "step_000003.parquet")
    positions = [len(p) + len(r) for p, r in zip(table.column("prompt_ids").to_pylist(),
                                                 table.column("response_ids").to_pylist())]
    routes = table.column("routed_experts").to_pylist()
    assert [len(x) for x in routes] == [4 * n for n in positions]  # 2 layers x top-2 per position
    flat = np.concatenate([np.asarray(x).reshape(-1, 4)[:-1] for x in routes])
    assert flat.min() >= 0 and flat.max() < 4  # every fed position has 4 experts' indices, the last -1
