"""The hybrid engine (``cluster.placement=hybrid``): one process per rank holds the trainer and the
generation engine, which generates with the training parameters themselves.

In one process (no cluster): the generation weights are the trainer's tensors (same storage), the
weight sync of a colocated job moves nothing, generation sees every update at once, and the rank
holds no more tensor bytes than the trainer alone. Through the CLI: a 2-step GRPO run on 2 hybrid
ranks reports ``reshard/bytes`` 0 and rollout log-probs equal to the actor's.
"""

import json
import subprocess
import sys

import pytest
import torch
from flowrl_testing.hybrid import _train_table, prompt_table, role_parts

from flowrl.backends.reshard import make_job
from flowrl.parallel.mesh import ParallelDims
from flowrl.roles.hybrid import HybridRole
from flowrl.roles.memory import role_memory_bytes


@pytest.fixture(scope="module")
def role(tiny_model_dir):
    torch.set_num_threads(1)
    return HybridRole(rank=0, world_size=1, parts=role_parts(str(tiny_model_dir), n=4, response_length=8))


def test_generation_weights_are_the_training_parameters(role):
    assert role.shared
    train = dict(role.actor.inner.engine.model.named_parameters())
    gen = role.rollout.inner.engine.model.named_parameters()
    assert all(p.data_ptr() == train[n].data_ptr() for n, p in gen)
    mem = role_memory_bytes(role.actor.inner, role.rollout.inner)
    assert mem["generation"] == 0 and mem["params"] > 0


def test_reshard_moves_nothing_and_generation_follows_the_update(role, tiny_model_dir):
    vocab = role.actor.inner.engine.model.config.vocab_size
    samples = role.rollout.generate(prompt_table(4, vocab), seed=0)
    before = role.rollout.compute_logprobs(samples).column("gen_logprobs").to_pylist()
    stats = role.actor.update(_train_table(samples), samples.num_rows)
    assert stats  # a real optimizer step ran
    assert role.actor.inner.engine.model.training  # generation's eval mode did not leak into training
    job = make_job(str(tiny_model_dir), src=ParallelDims(dp=1, tp=1, pp=1), dst=ParallelDims(dp=1, tp=1, pp=1),
                   placement="colocated", src_style="hf", dst_style="hf")
    out = role.reshard(job)
    assert out["bytes_received"] == out["bytes_sent"] == out["bytes_local"] == out["bytes_min"] == 0
    after = role.rollout.compute_logprobs(samples).column("gen_logprobs").to_pylist()
    trainer = role.actor.compute_logprobs(samples).column("old_logprobs").to_pylist()
    moved = max(abs(a - b) for ra, rb in zip(after, before) for a, b in zip(ra, rb))
    assert moved > 1e-4  # the update reached generation with no sync
    assert max(abs(a - b) for ra, rb in zip(after, trainer) for a, b in zip(ra, rb)) < 1e-5


def test_hybrid_rank_holds_no_more_tensor_bytes_than_the_trainer(role, tiny_model_dir):
    from flowrl.roles.rollout import RolloutRole

    mem = role_memory_bytes(role.actor.inner, role.rollout.inner)
    train_alone = role_memory_bytes(role.actor.inner)
    # today's colocated rank: the trainer's process plus a rollout process with its own weights
    separate = RolloutRole(rank=0, world_size=1, **role_parts(str(tiny_model_dir))["rollout"][1])
    two_processes = sum(train_alone.values()) + sum(role_memory_bytes(rollout=separate).values())
    assert sum(mem.values()) <= 1.15 * sum(train_alone.values())
    assert two_processes >= 1.2 * sum(train_alone.values())  # fp32 AdamW: params + grads + 2 states = 4x, +1x


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory, tiny_model_dir, addition_data):
    out = tmp_path_factory.mktemp("hybrid") / "run"
    cmd = [sys.executable, "-m", "flowrl.cli", "train", f"model.path={tiny_model_dir}",
           f"data.train_files={addition_data[0]}", f"trainer.run_dir={out}", "cluster.placement=hybrid",
           "trainer.total_training_steps=3", "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=4",
           "actor.entropy_coeff=0.01"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 3 steps" in proc.stdout
    return out


def test_hybrid_run_syncs_nothing_and_generates_with_the_trained_weights(hybrid_run):
    rows = [json.loads(line) for line in (hybrid_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    synced = [r for r in rows if "reshard/bytes" in r]  # step k's sync is reported with step k+1
    assert synced and all(r["reshard/bytes"] == 0 and r["reshard/bytes_min"] == 0 for r in synced)
    for row in rows:  # two optimizer steps per batch: old log-probs (pre-update) vs the rollout's
        assert row["rollout/logprob_diff_max"] < 1e-4
        assert "timing_s/ref" in row and "timing_s/update_actor" in row
