import subprocess
import sys
import time

import pytest
import yaml

from flowrl.config import ConfigError, RunConfig, dump_config, load_config
from flowrl.config.loader import describe_fields


def test_defaults_are_valid_and_match_verl_names():
    cfg = load_config()
    assert isinstance(cfg, RunConfig)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor.kl_loss_type == "low_var_kl"
    assert cfg.rollout.n == 16 and cfg.data.train_batch_size == 64
    # one optimizer step per batch -> no separate old-log-prob pass
    assert cfg.num_optimizer_steps_per_batch == 1 and not cfg.needs_old_logprobs


def test_dotted_overrides_are_typed():
    cfg = load_config(None, ["actor.optim.lr=1e-3", "rollout.n=4", "actor.use_kl_loss=false", "actor.optim.betas=[0.9, 0.95]"])
    assert cfg.actor.optim.lr == pytest.approx(1e-3)  # YAML 1.1 reads 1e-3 as a string; coerced
    assert cfg.rollout.n == 4 and cfg.actor.use_kl_loss is False
    assert cfg.actor.optim.betas == (0.9, 0.95)


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  n: 4\nactor:\n  optim:\n    lr: 0.01\n")
    cfg = load_config(path, ["rollout.n=2"])
    assert cfg.rollout.n == 2 and cfg.actor.optim.lr == 0.01


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("actor.optim.lr=abc", "actor.optim.lr", "expected a number"),
        ("actor.optim.lrr=1", "actor.optim.lrr", "did you mean actor.optim.lr"),
        ("nosuch.key=1", "nosuch", "unknown key"),
        ("rollout.n=0", "rollout.n", "must be >= 1"),
        ("rollout.n=2.5", "rollout.n", "expected an integer"),
        ("actor.use_kl_loss=maybe", "actor.use_kl_loss", "true or false"),
        ("rollout.name=sglang", "rollout.name", "hf, vllm"),
        ("actor.ppo_mini_batch_size=5", "actor.ppo_mini_batch_size", "must divide data.train_batch_size=64"),
        ("algorithm.adv_estimator=nope", "algorithm.adv_estimator", "grpo"),
        ("actor.kl_loss_type=k9", "actor.kl_loss_type", "low_var_kl"),
        ("actor.tensor_model_parallel_size=2", "actor.tensor_model_parallel_size", "actor.strategy=megatron"),
        ("actor.optim.betas=[0.9]", "actor.optim.betas", "list of 2"),
        ("actor.optim.lr", "actor.optim.lr", "key.sub=value"),
    ],
)
def test_bad_values_name_key_value_and_fix(override, key, words):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.key == key
    assert words in str(info.value)
    assert "fix:" in str(info.value)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["rollout.n=4", "actor.optim.betas=[0.8, 0.9]"])
    dump_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["rollout"]["n"] == 4


def test_every_field_is_documented():
    rows = describe_fields()
    undocumented = [key for key, _, doc in rows if not doc]
    assert not undocumented
    assert any(key == "actor.optim.lr" for key, _, _ in rows)


def test_cli_rejects_bad_value_fast_with_exit_code_2():
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "train", "actor.optim.lr=abc"], capture_output=True, text=True, timeout=60
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2
    assert "actor.optim.lr" in proc.stderr and "abc" in proc.stderr
    assert "distributed" not in proc.stderr  # no cluster was started
    assert elapsed < 5, elapsed


def test_cli_missing_model_dir_fails_before_workers(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "train", f"model.path={tmp_path}", f"data.train_files={tmp_path}/x.parquet"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "model.path" in proc.stderr and "config.json" in proc.stderr


def test_shipped_cluster_spec_loads():
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[2] / "cluster" / "local.yaml")
    assert cfg.cluster.dashboard is True and cfg.cluster.host == "127.0.0.1"
