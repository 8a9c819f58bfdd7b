"""A new algorithm family with its own worker group is one module: written outside flowrl, named
in the config by import string, trained through the CLI (fresh worker processes that find the
module only through the config and PYTHONPATH). Nothing in flowrl is edited.

The family (ARCHITECTURE.md's example): GRPO whose outcome reward gets a bonus from a frozen
teacher on its own worker group: ``score + coef * mean teacher log-prob of the response``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from flowrl.data import experience as ex

FAMILY_MODULE = '''
"""GRPO with a teacher's bonus: a frozen teacher on its own worker group scores each response."""

import numpy as np
import pyarrow as pa

from flowrl import nodes
from flowrl.actors import GroupMesh
from flowrl.actors.session import GroupSpec
from flowrl.data import experience
from flowrl.graphs import pieces
from flowrl.graphs.family import IterationGraph, register_family
from flowrl.graphs.grpo import GRPO
from flowrl.nodes import NodeOut, node

COEF = 0.1


def teacher_bonus(scored: pa.Table, teacher: pa.Table, *, coef: float) -> NodeOut:
    """``token_rewards`` of the last token += coef * the teacher's mean log-prob of the response."""
    logp = teacher.column("teacher_logprobs").to_pylist()
    bonus = np.array([coef * float(np.mean(row)) if row else 0.0 for row in logp], np.float32)
    rewards = scored.column("token_rewards").to_pylist()
    shaped = [r[:-1] + [r[-1] + float(b)] if r else [] for r, b in zip(rewards, bonus)]
    table = experience.with_columns(scored, teacher_logprobs=teacher.column("teacher_logprobs"),
                                    token_rewards=experience.from_lists(shaped, experience.TOKEN_FLOATS))
    return NodeOut(table, {"reward/teacher_bonus/mean": float(bonus.mean())})


@register_family("grpo_teacher")
class GRPOWithTeacher(GRPO):
    def group_specs(self):
        teacher = GroupSpec("teacher", "flowrl.roles.reference:ReferenceRole",
                            {"model_dir": self.cfg.model.path, "dtype": self.cfg.model.dtype}, GroupMesh(dp=1))
        return super().group_specs() + [teacher]

    def build(self, ctx, prompts, *, step, collected=None):
        if collected is None:  # inline: this graph generates and scores
            samples = pieces.release_rollout(ctx, pieces.generate(ctx, prompts, step=step), step=step)
            scored = pieces.score(ctx, samples, step=step)
        else:  # scored samples from GRPO's rollout() (trainer.staleness, stream) or its collect()
            scored = pieces.release_rollout(ctx, collected, step=step)
        teacher = node("teacher", nodes.logprobs, ctx.groups["teacher"].bind(), scored, "teacher_logprobs", step=step)
        shaped = node("teacher_bonus", teacher_bonus, scored, teacher, coef=COEF, step=step)
        batch = pieces.advantages(ctx, shaped, pieces.logprob_columns(ctx, shaped, step=step), step=step)
        stats = pieces.update_actor(ctx, batch, step=step)
        return IterationGraph(result=node("collect", nodes.collect, batch, stats, step=step),
                              sync=pieces.weight_sync(ctx, stats, step=step))
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_family_with_its_own_worker_group_is_one_module(tmp_path, tiny_model_dir, addition_data):
    plugin = tmp_path / "plugins"
    plugin.mkdir()
    (plugin / "my_families.py").write_text(textwrap.dedent(FAMILY_MODULE))
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train", f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}",
        f"trainer.run_dir={out}", "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=2", "algorithm.family=my_families:GRPOWithTeacher", "actor.use_kl_loss=false",
        "rollout.data_parallel_size=1", "actor.data_parallel_size=1", "trainer.progress=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pq.read_table(ex.step_path(out, 2))
    # the teacher's group ran (its log-probs are in the table) and shaped the last token's reward
    for score, rewards, logp in zip(table.column("score").to_pylist(), table.column("token_rewards").to_pylist(),
                                    table.column("teacher_logprobs").to_pylist()):
        assert len(logp) == len(rewards) and all(lp <= 0 for lp in logp)
        if rewards:
            assert rewards[-1] == pytest.approx(score + 0.1 * sum(logp) / len(logp), abs=1e-5)
    rows = [__import__("json").loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/teacher_bonus/mean"] < 0 and "timing_s/teacher" in r for r in rows)


def test_an_unknown_family_fails_before_any_worker_starts(tiny_model_dir, addition_data):
    cmd = [sys.executable, "-m", "flowrl.cli", "train", f"model.path={tiny_model_dir}",
           f"data.train_files={addition_data[0]}", "algorithm.family=nope"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "algorithm.family='nope'" in proc.stderr and "grpo, ppo, remax" in proc.stderr
