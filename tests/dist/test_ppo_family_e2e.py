"""The algorithm family end to end: PPO with a critic learns the default task; RLOO, REINFORCE++,
REINFORCE++-baseline, ReMax and the KL reward penalty run through real worker groups.

Most use the embedded default task (a warmed-up tiny model that already scores sometimes, so
advantages, gradients and the KL are not all 0), from the cache ``flowrl train`` uses; the
extension test uses the random tiny model of conftest.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from flowrl.config import load_config
from flowrl.data import experience as ex
from flowrl.run import train

PPO_METRICS = {
    "critic/vf_loss", "critic/vf_clipfrac", "critic/vf_explained_var", "critic/values/mean", "critic/grad_norm",
    "critic/returns/mean", "timing_s/values", "timing_s/update_critic", "actor/pg_loss", "actor/ppo_kl",
}
SMALL = ["rollout.data_parallel_size=1", "actor.data_parallel_size=1", "ref.data_parallel_size=1",
         "critic.data_parallel_size=1", "trainer.progress=false"]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def default_task():
    # The cache `flowrl train` itself uses: built once (about 15 s on an idle core), then reused.
    from flowrl.tasks.default_task import prepare_default_task
    from flowrl.run import default_cache_dir

    return prepare_default_task(default_cache_dir() / "default_task")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ppo_with_critic_raises_the_reward_on_the_default_task(tmp_path, default_task):
    # PPO: GAE (gamma = lam = 1) on a learned value head, 2 actor and 2 critic mini-batches per
    # step, value clipping 0.5, no KL. Measured on this machine: first-5 mean ~0.2 -> last-5 ~0.45.
    cfg = load_config(None, [
        f"model.path={default_task.model_dir}", f"data.train_files={default_task.train_path}",
        f"trainer.run_dir={tmp_path / 'run'}", "algorithm.adv_estimator=gae", "actor.use_kl_loss=false",
        "data.train_batch_size=16", "rollout.n=8", "actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=8",
        "trainer.total_training_steps=14", *SMALL,
    ])
    summary = train(cfg)
    rows = _rows(tmp_path / "run")
    for row in rows:
        assert PPO_METRICS <= set(row), PPO_METRICS - set(row)
        assert row["critic/num_optimizer_steps"] == 2 and row["actor/num_optimizer_steps"] == 2
        assert 0.0 <= row["critic/vf_clipfrac"] <= 1.0
    # the critic learns: its values explain the returns better at the end than at the start
    assert rows[-1]["critic/vf_explained_var"] > rows[0]["critic/vf_explained_var"]
    print(f"PPO default task: first5 {summary.first_score:.3f} -> last5 {summary.last_score:.3f}")
    assert summary.last_score > summary.first_score + 0.1, (summary.first_score, summary.last_score)
    table = pq.read_table(ex.step_path(tmp_path / "run", 1))
    assert {"values", "returns", "advantages", "old_logprobs"} <= set(table.column_names)


def _smoke(tmp_path, task, *extra, steps=2, ran=None):
    cfg = load_config(None, [
        f"model.path={task.model_dir}", f"data.train_files={task.train_path}", f"trainer.run_dir={tmp_path / 'run'}",
        "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
        f"trainer.total_training_steps={steps}", *SMALL, *extra,
    ])
    summary = train(cfg)
    assert summary.steps == (steps if ran is None else ran)
    return _rows(tmp_path / "run"), pq.read_table(ex.step_path(tmp_path / "run", steps))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_critic_free_estimators_run_end_to_end(tmp_path, default_task, estimator):
    rows, table = _smoke(tmp_path, default_task, f"algorithm.adv_estimator={estimator}")
    assert all("actor/pg_loss" in r and "critic/vf_loss" not in r for r in rows)
    assert "values" not in table.column_names and "advantages" in table.column_names


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_remax_generates_a_greedy_baseline(tmp_path, default_task):
    rows, table = _smoke(tmp_path, default_task, "algorithm.adv_estimator=remax")
    assert all("timing_s/gen_baseline" in r and "reward_baseline/mean" in r for r in rows)
    # one greedy score per prompt, shared by its samples; advantage = return - baseline
    baseline, groups = table.column("reward_baseline").to_pylist(), table.column("group").to_pylist()
    for g in set(groups):
        assert len({b for b, gg in zip(baseline, groups) if gg == g}) == 1
    adv, ret = table.column("advantages").to_pylist(), table.column("returns").to_pylist()
    for a, r, b in zip(adv, ret, baseline):
        assert a == pytest.approx([x - b for x in r], abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kl_in_reward_with_adaptive_controller(tmp_path, default_task):
    rows, table = _smoke(
        tmp_path, default_task, "algorithm.adv_estimator=reinforce_plus_plus",
        "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.1",
        "algorithm.kl_ctrl.target_kl=0.01", "algorithm.kl_ctrl.horizon=64", "actor.use_kl_loss=false", steps=3,
    )
    assert all({"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "timing_s/kl_in_reward"} <= set(r) for r in rows)
    assert "actor/kl_loss" not in rows[0]  # KL in the reward, not in the loss
    # the driver keeps the controller across steps: coef_{k+1} = coef_k * (1 + clip(kl/target - 1) * 16 / 64)
    for prev, nxt in zip(rows, rows[1:]):
        error = min(max(prev["actor/reward_kl_penalty"] / 0.01 - 1, -0.2), 0.2)
        assert nxt["actor/reward_kl_penalty_coeff"] == pytest.approx(prev["actor/reward_kl_penalty_coeff"] * (1 + error * 16 / 64))
    assert rows[0]["actor/reward_kl_penalty_coeff"] == 0.1
    # the penalty lands on the token rewards: rewards = score at the last token - coef * kl
    assert "ref_logprobs" in table.column_names and "old_logprobs" in table.column_names


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_estimator_from_outside_runs_via_config(tmp_path, tiny_model_dir, addition_data):
    # The README's extension example: one decorated function in the user's own module, named in
    # the config by import string; nothing in flowrl is edited. Run through the CLI so that the
    # workers are fresh processes that find the module only through the config.
    plugin = tmp_path / "plugins"
    plugin.mkdir()
    (plugin / "my_estimators.py").write_text(textwrap.dedent('''
        from flowrl.algos import broadcast_rows, register_estimator, row_scores

        @register_estimator("score_minus_batch_mean")
        def score_minus_batch_mean(inputs, *, gamma=1.0, lam=1.0, norm_adv_by_std=True):
            """Each sample's score minus the batch's mean score, on every response token."""
            scores = row_scores(inputs)
            adv = broadcast_rows(scores - scores.mean(), inputs)
            return adv, adv
    '''))
    out = tmp_path / "run"
    env = {**__import__("os").environ, "PYTHONPATH": str(plugin)}
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train", f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}",
        f"trainer.run_dir={out}", "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1", "algorithm.adv_estimator=my_estimators:score_minus_batch_mean", *SMALL,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pq.read_table(ex.step_path(out, 1))
    scores = table.column("score").to_numpy()
    for adv, s in zip(table.column("advantages").to_pylist(), scores):
        assert adv == pytest.approx([s - scores.mean()] * len(adv), abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dapo_dynamic_sampling_and_overlong_shaping(tmp_path, default_task):
    rows, table = _smoke(
        tmp_path, default_task, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=20",
        "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
        "reward_model.overlong_buffer.penalty_factor=0.5", "actor.clip_ratio_high=0.28", "actor.use_kl_loss=false",
    )
    for r in rows:
        assert r["train/num_gen_batches"] >= 1 and r["num_samples"] == 4 * 4  # the batch is always full
        assert {"reward/overlong_penalty/mean", "reward/overlong_frac", "dynamic_sampling/kept_group_frac"} <= set(r)
    # every kept group has a learning signal: its scores differ
    scores, groups = table.column("score").to_pylist(), table.column("group").to_pylist()
    assert len(set(groups)) == 4
    for g in set(groups):
        assert len({s for s, gg in zip(scores, groups) if gg == g}) > 1
    # overlong shaping lands on the last token: score + min(-(len - (8 - 4)) / 4 * 0.5, 0)
    for s, rewards in zip(scores, table.column("token_rewards").to_pylist()):
        assert rewards[-1] == pytest.approx(s + min(-(len(rewards) - 4) / 4 * 0.5, 0.0), abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reward_model_group_combines_with_the_rule_reward(tmp_path, tiny_model_dir, addition_data):
    import torch
    from transformers import AutoModelForSequenceClassification

    # A tiny sequence-classification reward model on the policy's family and tokenizer.
    torch.manual_seed(0)
    rm_dir = tmp_path / "rm"
    rm_model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    rm_model.save_pretrained(rm_dir)
    rows, table = _smoke(
        tmp_path, SimpleNamespace(model_dir=tiny_model_dir, train_path=addition_data[0]),
        "reward_model.enable=true", f"reward_model.model_path={rm_dir}", "reward_model.rule_coef=0.5",
        "reward_model.rm_coef=2.0", "actor.use_kl_loss=false", steps=1,
    )
    assert {"timing_s/rm_score", "reward/rm_score/mean", "reward/rule_score/mean"} <= set(rows[0])
    rule, rm, score = (table.column(c).to_numpy() for c in ("rule_score", "rm_score", "score"))
    assert score == pytest.approx(0.5 * rule + 2.0 * rm, abs=1e-5)
    # the reward model's score is its head at the last token of prompt + response
    rm_model.eval()
    with torch.no_grad():
        for p, r, s in zip(table.column("prompt_ids").to_pylist(), table.column("response_ids").to_pylist(), rm):
            ids = torch.tensor([p + r])
            hidden = rm_model.base_model(input_ids=ids).last_hidden_state[0, -1]
            assert float(rm_model.score(hidden)[0]) == pytest.approx(float(s), abs=1e-4)
    # and the last token's reward carries the combined score
    for s, rewards in zip(score, table.column("token_rewards").to_pylist()):
        assert rewards[-1] == pytest.approx(float(s), abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ppo_resume_restores_the_critic_exactly(tmp_path, default_task):
    # 3 uninterrupted PPO steps vs 2 steps + a resume to 3: step 2's actor and critic metrics
    # must be bitwise equal, which needs the critic's parameters and AdamW state restored.
    def run(run_dir, steps):
        return _smoke(run_dir, default_task, "algorithm.adv_estimator=gae", "actor.use_kl_loss=false",
                      "critic.ppo_mini_batch_size=4", "trainer.save_freq=2", steps=steps)

    rows_a, _ = run(tmp_path / "a", 3)
    run(tmp_path / "b", 2)
    assert (tmp_path / "b" / "run" / "critic_checkpoints" / "step_00000002").is_dir()
    rows_b, _ = _smoke(tmp_path / "b", default_task, "algorithm.adv_estimator=gae", "actor.use_kl_loss=false",
                       "critic.ppo_mini_batch_size=4", "trainer.save_freq=2", steps=3, ran=1)  # resumed at step 2
    assert [r["step"] for r in rows_b] == [1, 2, 3]
    for key in ("critic/values/mean", "critic/vf_loss", "critic/grad_norm", "actor/pg_loss", "critic/score/mean"):
        assert rows_a[2][key] == rows_b[2][key], (key, rows_a[2][key], rows_b[2][key])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_critic_data_parallel_matches_one_rank(tmp_path, default_task):
    # Same samples (rollout and actor on one rank in both runs), critic on 1 vs 2 ranks: global
    # denominators and the gradient all-reduce make the critic's updates the same.
    def run(run_dir, dp):
        # one critic mini-batch (its rows are split over the ranks), two epochs: two optimizer steps
        rows, _ = _smoke(run_dir, default_task, "algorithm.adv_estimator=gae", "actor.use_kl_loss=false",
                         "critic.ppo_mini_batch_size=4", "critic.ppo_epochs=2", f"critic.data_parallel_size={dp}", steps=2)
        return rows

    one, two = run(tmp_path / "one", 1), run(tmp_path / "two", 2)
    assert one[0]["critic/score/mean"] == two[0]["critic/score/mean"]
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/values/mean", "critic/vf_explained_var"):
        for a, b in zip(one, two):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (key, a[key], b[key])
    assert one[0]["critic/num_optimizer_steps"] == two[0]["critic/num_optimizer_steps"] == 2
