"""The PPO critic on megatron-core (``critic.strategy=megatron``) on CPU over gloo.

(a) per-token values equal the dp critic's (``AutoModelForTokenClassification``, same seed) within
1e-5 at (dp, tp, pp) in {(1,1,1), (2,1,1), (1,2,1), (1,1,2)}, untied Llama and tied Qwen2 (tied
embeddings with pp > 1 keep an embedding copy on the last stage, which the value model drops);
(b) after one identical clipped value-loss update (two micro-batches per rank, value clipping
engaged) the gathered HF state, ``score`` head included, equals the dp critic's within 1e-5;
(c) a few PPO steps with the megatron actor and a megatron critic at pp=2 run through the graph and
log the critic's metrics. Bad critic layouts and critic checkpoints are refused before workers.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("megatron.core")

from flowrl.comm import free_port  # noqa: E402
from flowrl_testing import megatron as testing  # noqa: E402
from flowrl_testing import megatron_value as value_testing  # noqa: E402
from flowrl.config import load_config  # noqa: E402
from flowrl.config import ConfigError  # noqa: E402
from flowrl.run import resolve_inputs, train  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def critic_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_critic")
    out = {"root": root}
    for name, kwargs in (("llama", {"kind": "llama", "tied": False}), ("qwen2", {"kind": "qwen2", "tied": True})):
        model = testing.make_tiny_model(str(root / name), **kwargs)
        ref = value_testing.dp_reference(str(root / name), model.config.vocab_size)
        torch.save(ref, root / f"{name}.pt")
        out[name] = {"model_dir": str(root / name), "ref_path": str(root / f"{name}.pt")}
    return out


def _launch(models, name, world_size, layouts):
    out_path = models["root"] / f"{name}_w{world_size}.json"
    testing.spawn(value_testing.critic_layouts_worker, world_size=world_size,
                  args=(world_size, free_port(), models[name]["ref_path"], models[name]["model_dir"],
                        layouts, str(out_path)), timeout_s=240)
    return json.loads(out_path.read_text())


@pytest.mark.timeout(600)
def test_megatron_critic_matches_dp_critic(critic_models):
    results = _launch(critic_models, "llama", 1, [(1, 1, 1)])
    results += _launch(critic_models, "llama", 2, [(2, 1, 1), (1, 2, 1), (1, 1, 2)])
    results += [{**r, "model": "qwen2"} for r in _launch(critic_models, "qwen2", 2, [(1, 2, 1), (1, 1, 2)])]
    print(f"\n{'model':<7}{'layout':<10}{'values':>10}{'state':>10}{'|dgnorm|':>10}{'moved':>9}{'s':>6}")
    for r in results:
        print(f"{r.get('model', 'llama'):<7}{str(tuple(r['layout'])):<10}{r['values']:>10.1e}{r['state']:>10.1e}"
              f"{r['grad_norm']:>10.1e}{r['head_moved']:>9.1e}{r['seconds']:>6.1f}")
    for r in results:
        assert r["values"] < TOL, r
        assert r["state"] < TOL, r
        assert r["grad_norm"] < TOL, r
        assert r["head_moved"] > 1e-4, r  # the update changed the value head (the check can fail)
        assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"} <= set(r["metrics"])


def _ppo_overrides(tiny_model_dir, addition_data, run_dir, *extra):
    return [
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", f"trainer.run_dir={run_dir}",
        "algorithm.adv_estimator=gae", "actor.use_kl_loss=false", "trainer.progress=false",
        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=2",
        "rollout.data_parallel_size=1", "actor.data_parallel_size=1", "actor.strategy=megatron",
        "critic.strategy=megatron", "critic.data_parallel_size=1", "critic.pipeline_model_parallel_size=2",
        *extra,
    ]


def test_bad_megatron_critic_settings_are_refused_before_workers(tmp_path, tiny_model_dir, addition_data):
    base = _ppo_overrides(tiny_model_dir, addition_data, tmp_path / "run")
    with pytest.raises(ConfigError, match="critic.tensor_model_parallel_size"):
        resolve_inputs(load_config(None, [*base, "critic.tensor_model_parallel_size=3"]))
    resolve_inputs(load_config(None, [*base, "trainer.save_freq=1"]))  # checkpointed (test_megatron_critic_checkpoint)
    with pytest.raises(ConfigError, match="critic.tensor_model_parallel_size"):  # dp strategy: no tp
        load_config(None, [*base, "critic.strategy=dp"])
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(600)
def test_ppo_with_megatron_actor_and_critic(tmp_path, tiny_model_dir, addition_data):
    summary = train(load_config(None, [*_ppo_overrides(tiny_model_dir, addition_data, tmp_path / "run"),
                                       "trainer.total_training_steps=2"]))
    assert summary.steps == 2
    for metrics in summary.history:
        assert metrics["critic/num_optimizer_steps"] == 2  # (4 prompts x 2 samples) / (2 x 2) per step
        assert metrics["critic/vf_loss"] >= 0 and metrics["critic/grad_norm"] >= 0
        assert 0.0 <= metrics["critic/vf_clipfrac"] <= 1.0
        assert "critic/vf_explained_var" in metrics
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("critic/vf_loss" in r for r in rows)
