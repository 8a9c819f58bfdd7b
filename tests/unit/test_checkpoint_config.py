"""Checkpoint settings: config errors before any worker starts, the dp engine's exact state
round trip, and ``flowrl export-hf``."""

from __future__ import annotations

import json

import pytest
import torch

from flowrl.checkpoint import save_checkpoint
from flowrl.cli import main
from flowrl.config import ConfigError, load_config


def _cfg(tiny_model_dir, addition_data, *overrides):
    return load_config(None, [f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}",
                              "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8", *overrides])


def test_defaults():
    cfg = load_config(None, [])
    assert (cfg.trainer.save_freq, cfg.trainer.max_ckpt_to_keep, cfg.trainer.resume_mode) == (0, 3, "auto")


@pytest.mark.parametrize("override, key", [
    ("trainer.max_ckpt_to_keep=-2", "trainer.max_ckpt_to_keep"),
    ("trainer.resume_mode=", "trainer.resume_mode"),
])
def test_bad_values(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key and "fix:" in str(err.value)


def test_megatron_distributed_optimizer_with_save_freq_is_accepted():
    """Issue 37: its dp-sharded state is saved (tests/dist/test_megatron_checkpoint.py)."""
    pp2 = ["actor.strategy=megatron", "actor.pipeline_model_parallel_size=2"]
    cfg = load_config(None, [*pp2, "actor.use_distributed_optimizer=true", "trainer.save_freq=5"])
    assert cfg.actor.use_distributed_optimizer and cfg.trainer.save_freq == 5
    load_config(None, [*pp2, "trainer.save_freq=5"])  # sharded megatron checkpoints


def test_max_restarts():
    assert load_config(None, []).trainer.max_restarts == 3
    with pytest.raises(ConfigError) as err:
        load_config(None, ["trainer.max_restarts=-1"])
    assert err.value.key == "trainer.max_restarts" and "fix:" in str(err.value)


def test_resume_path_must_exist_before_workers(tmp_path, tiny_model_dir, addition_data):
    from flowrl.run import resolve_inputs

    cfg = _cfg(tiny_model_dir, addition_data, f"trainer.run_dir={tmp_path / 'run'}",
               f"trainer.resume_mode={tmp_path / 'nope'}")
    with pytest.raises(ConfigError, match="existing checkpoint directory") as err:
        resolve_inputs(cfg)
    assert err.value.key == "trainer.resume_mode"
    (tmp_path / "half").mkdir()  # a directory without meta.json: not a complete checkpoint
    cfg = _cfg(tiny_model_dir, addition_data, f"trainer.resume_mode={tmp_path / 'half'}")
    with pytest.raises(ConfigError, match="not a loadable checkpoint"):
        resolve_inputs(cfg)
    for mode in ("auto", "disable"):
        assert resolve_inputs(_cfg(tiny_model_dir, addition_data, f"trainer.resume_mode={mode}")).trainer.resume_mode == mode


def test_cli_reports_a_missing_resume_path(tmp_path, tiny_model_dir, addition_data, capsys):
    rc = main(["train", f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}",
               f"trainer.run_dir={tmp_path / 'run'}", f"trainer.resume_mode={tmp_path / 'nope'}"])
    assert rc == 2
    assert "trainer.resume_mode" in capsys.readouterr().err


def _train_engine(model_dir, steps):
    from flowrl.backends.train.dp_policy import TorchDPEngine

    engine = TorchDPEngine(str(model_dir), lr=1e-2)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    for _ in range(steps):
        engine.optimizer.zero_grad()
        engine.model(input_ids=ids).logits.float().square().mean().backward()
        engine.optimizer.step()
    return engine, ids


def test_dp_engine_state_round_trips_exactly(tiny_model_dir):
    a, ids = _train_engine(tiny_model_dir, 2)
    state = a.checkpoint_state()
    assert state["optim_step"] == 2
    assert set(state["optim"]) == {"exp_avg", "exp_avg_sq"}
    assert set(state["optim"]["exp_avg"]) == set(state["params"])
    assert "lm_head.weight" not in state["params"]  # tied: one logical tensor
    b, _ = _train_engine(tiny_model_dir, 0)
    b.load_checkpoint(state["params"], state["optim"], state["optim_step"])
    for engine in (a, b):  # one more identical step on both
        engine.optimizer.zero_grad()
        engine.model(input_ids=ids).logits.float().square().mean().backward()
        engine.optimizer.step()
    pa, pb = a.checkpoint_state(), b.checkpoint_state()
    assert pb["optim_step"] == 3
    for n in pa["params"]:
        assert torch.equal(pa["params"][n], pb["params"][n]), n
        assert torch.equal(pa["optim"]["exp_avg_sq"][n], pb["optim"]["exp_avg_sq"][n]), n


def test_export_hf_cli(tmp_path, tiny_model_dir, capsys):
    from transformers import AutoModelForCausalLM

    engine, ids = _train_engine(tiny_model_dir, 1)
    state = engine.checkpoint_state()
    ckpt = save_checkpoint(tmp_path / "ckpt", step=1, params=state["params"], optim=state["optim"],
                           extra={"next_step": 1, "optim_step": 1, "config": {"model": {"path": str(tiny_model_dir)}}})
    assert main(["export-hf", ckpt, str(tmp_path / "hf")]) == 0  # config dir from extra.config.model.path
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    model = engine.model.eval()
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, model(ids).logits)
    assert main(["export-hf", ckpt, str(tmp_path / "hf2"), "--config-dir", str(tiny_model_dir)]) == 0
    assert (tmp_path / "hf2" / "tokenizer_config.json").is_file()


def test_export_hf_cli_bad_paths(tmp_path, tiny_model_dir, capsys):
    assert main(["export-hf", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no such checkpoint" in err and "trainer.save_freq" in err  # a default run saves none: says which flag
    ckpt = save_checkpoint(tmp_path / "ckpt", step=0, params={"w": torch.zeros(2)})
    assert main(["export-hf", ckpt, str(tmp_path / "out")]) == 2  # no recorded model path
    assert "--config-dir" in capsys.readouterr().err
    assert main(["export-hf", ckpt, str(tmp_path / "out"), "--config-dir", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["step"] == 0


def test_verl_minus_one_frequencies_mean_never():
    """verl's defaults ``trainer.save_freq=-1`` / ``test_freq=-1``: never (issue 37), as flowrl's 0."""
    cfg = load_config(None, ["trainer.save_freq=-1", "trainer.test_freq=-1"])
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq) == (0, 0)
