"""GRPO end to end through the CLI on a tiny model: run directory, metrics, experience Parquet."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from flowrl.data import experience as ex

REQUIRED_METRICS = {
    "timing_s/gen", "timing_s/reward", "timing_s/ref", "timing_s/adv", "timing_s/update_actor",
    "timing_s/step", "perf/throughput", "critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/ppo_kl",
    "actor/grad_norm", "actor/kl_loss", "response_length/mean",
}


@pytest.fixture(scope="module", params=["auto", "colocated"])
def placement(request):
    """The default placement (auto: hybrid for this config) and the separate-process one."""
    return request.param


@pytest.fixture(scope="module")
def run_dir(placement, tmp_path_factory, tiny_model_dir, addition_data):
    out = tmp_path_factory.mktemp(f"grpo-{placement}") / "run"
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train",
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}",
        "trainer.total_training_steps=3", f"trainer.run_dir={out}",
        "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=4",  # 2 optimizer steps: old log-probs node on
        *([f"cluster.placement={placement}"] if placement != "auto" else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 3 steps" in proc.stdout
    started = "placement: hybrid (auto)" if placement == "auto" else f"placement: {placement}"
    assert started in proc.stdout.splitlines()
    return out


def test_run_directory_holds_config_metrics_and_experience(run_dir, placement):
    assert (run_dir / "config.yaml").is_file()
    hybrid = placement == "auto"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # verl's numbering
    for row in rows:
        assert REQUIRED_METRICS <= set(row), REQUIRED_METRICS - set(row)
        # the reshard overlaps the next step's submission: step k reports step k-1's reshard
        assert ("timing_s/reshard" in row) == (row["step"] > 1)
        if row["step"] > 1 and hybrid:  # generation reads the training parameters: nothing moves
            assert row["reshard/bytes"] == row["reshard/bytes_min"] == row["reshard/peak_extra_bytes"] == 0
        elif row["step"] > 1:  # dp replicas -> full rollout models: each rollout rank lacks all of it
            assert row["reshard/bytes"] == row["reshard/bytes_min"] > 0
            assert row["reshard/peak_extra_bytes"] <= 64 * 2**20
        assert "timing_s/old_log_prob" in row  # ppo_mini_batch_size < train_batch_size
        assert row["actor/num_optimizer_steps"] == 2
        assert 0.0 <= row["critic/score/mean"] <= 1.0
        # the rollout's log-probs and the trainer's pre-update log-probs come from the same
        # weights (synced after every update): they must agree
        assert row["rollout/logprob_diff_max"] < 1e-4
    for step in range(1, 4):
        table = pq.read_table(ex.step_path(run_dir, step))
        assert table.num_rows == 8 * 4
        for column in ("uid", "group", "prompt_ids", "response_ids", "old_logprobs", "ref_logprobs", "advantages", "score"):
            assert column in table.column_names
        assert table.schema.field("response_ids").type == ex.TOKEN_IDS  # ragged, no padding stored
        assert len(set(table.column("uid").to_pylist())) == table.num_rows
        groups = table.column("group").to_pylist()
        assert all(groups.count(g) == 4 for g in set(groups))  # n samples per prompt
        # GRPO: advantages within each group sum to zero (outcome reward, equal lengths aside)
        adv = table.column("advantages").to_pylist()
        for g in set(groups):
            firsts = [a[0] for a, gg in zip(adv, groups) if gg == g]
            assert abs(sum(firsts)) < 1e-4


def test_resolved_config_reloads(run_dir, placement):
    from flowrl.config import load_config

    cfg = load_config(run_dir / "config.yaml")
    assert cfg.trainer.total_training_steps == 3 and cfg.rollout.n == 4
    # auto is written as what it resolved to, its reason in the first line
    hybrid = placement == "auto"
    assert cfg.cluster.placement == ("hybrid" if hybrid else "colocated")
    first = (run_dir / "config.yaml").read_text().splitlines()[0]
    assert first == ("# placement: hybrid (auto)" if hybrid else "# placement: colocated")
