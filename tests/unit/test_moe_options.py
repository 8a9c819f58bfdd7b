"""The MoE options before any worker starts: model.tiny (the default task's preset),
actor.router_replay and the router-loss coefficients, refused by name where they cannot run."""

import json

import pytest

from flowrl.config import ConfigError
from flowrl.config.loader import load_config
from flowrl.config.moe_options import check_moe_options, num_experts
from flowrl.tasks.default_task import default_task_dir, prepare_default_task
from flowrl.tasks.warmup import WarmupConfig


@pytest.fixture()
def moe_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 4}))
    return str(tmp_path)


@pytest.fixture()
def dense_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense")
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return str(path)


def test_config_keys_and_their_errors():
    cfg = load_config(None, ["model.tiny=moe", "actor.router_replay=true", "actor.moe_aux_loss_coeff=0.01",
                             "actor.moe_z_loss_coeff=0.001"])
    assert (cfg.model.tiny, cfg.actor.router_replay, cfg.actor.moe_aux_loss_coeff) == ("moe", True, 0.01)
    assert load_config(None, []).model.tiny == "default" and not load_config(None, []).actor.router_replay
    with pytest.raises(ConfigError, match="model.tiny='huge'.*default, vllm, 10m, moe"):
        load_config(None, ["model.tiny=huge"])
    with pytest.raises(ConfigError, match="actor.moe_z_loss_coeff=-1.0: must be a number >= 0"):
        load_config(None, ["actor.moe_z_loss_coeff=-1"])
    with pytest.raises(ConfigError, match="actor.router_replay.*not actor.strategy=megatron"):
        load_config(None, ["actor.router_replay=true", "actor.strategy=megatron"])


def test_tiny_with_a_model_path_is_refused(dense_dir):
    from flowrl.run.preflight import _inputs

    cfg = load_config(None, ["model.tiny=moe", f"model.path={dense_dir}", "data.train_files=x.parquet"])
    with pytest.raises(ConfigError, match="model.tiny='moe': picks the embedded default task's model"):
        _inputs(cfg)


def test_replay_preflight(moe_dir, dense_dir):
    ok = load_config(None, ["actor.router_replay=true"])
    check_moe_options(ok, model_path=moe_dir)
    assert num_experts(moe_dir) == 4 and num_experts(dense_dir) == 0
    cases = [
        (["actor.router_replay=true"], dense_dir, "needs a mixture-of-experts model"),
        (["actor.moe_aux_loss_coeff=0.01"], dense_dir, "actor.moe_aux_loss_coeff=0.01: needs a mixture-of-experts"),
        (["actor.router_replay=true", "rollout.name=vllm"], moe_dir, "rollout.name=vllm does not record them"),
        (["actor.router_replay=true", "rollout.multi_turn.enable=true"], moe_dir, "multi-turn"),
        (["actor.moe_z_loss_coeff=0.1", "actor.strategy=megatron"], moe_dir, "not megatron"),
        (["actor.router_replay=true", "actor.strategy=fsdp", "model.enable_gradient_checkpointing=true"], moe_dir,
         "recomputes it in backward"),
        (["model.lora_rank=4"], moe_dir, "model.target_modules='all-linear'.*q_proj,k_proj,v_proj,o_proj"),
    ]
    for overrides, path, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_moe_options(load_config(None, overrides), model_path=path)
    check_moe_options(load_config(None, ["model.lora_rank=4", "model.target_modules=[q_proj,v_proj]"]),
                      model_path=moe_dir)


def test_the_moe_default_task_is_built_apart(tmp_path):
    """model.tiny=moe: the default task with the tiny Qwen3-MoE, cached in default_task_moe."""
    from transformers import AutoConfig

    assert default_task_dir("default") == "default_task" and default_task_dir("moe") == "default_task_moe"
    fast = WarmupConfig(max_steps=2, batch_size=8, target_greedy_accuracy=0.5, check_every=2, num_probe_rows=4)
    task = prepare_default_task(tmp_path / default_task_dir("moe"), preset="moe", num_train=32, num_test=8,
                                num_eval_rows=4, warmup=fast)
    config = AutoConfig.from_pretrained(task.model_dir)
    assert (config.model_type, config.num_experts, config.num_experts_per_tok) == ("qwen3_moe", 4, 2)
    assert 1 <= task.warmup_steps <= 2
