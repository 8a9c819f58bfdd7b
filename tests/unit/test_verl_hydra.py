"""Hydra's own flags on flowrl's command line, as verl's main_ppo takes them (issue 37, item 1):
``--config-path``/``--config-name`` (verl's tree, a user's directory extending it), ``+key``,
``++key``, ``~key``."""

from __future__ import annotations

import pytest

from flowrl.cli import _split_config_args, build_parser, main
from flowrl.config import load_config
from flowrl.config.verl_hydra import config_file, encode_deletions, flags_first
from flowrl.config.verl_yaml import verl_config_dir

needs_verl_tree = pytest.mark.skipif(verl_config_dir() is None, reason="verl's config tree is absent: "
                                     "pip install --no-deps verl==0.9.1 (as .ci/run does)")
HF = ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]


def test_hydra_flags_are_read_anywhere_on_the_line():
    argv = ["train", "a.b=1", "--config-path", "config", "c=2", "-cn", "ppo_trainer.yaml", "~d.e"]
    assert flags_first(argv) == ["train", "--config-path=config", "--config-name=ppo_trainer.yaml", "a.b=1", "c=2", "~d.e"]
    args = build_parser().parse_args(flags_first(argv))
    assert (args.config_path, args.config_name, args.items) == ("config", "ppo_trainer.yaml", ["a.b=1", "c=2", "~d.e"])
    assert flags_first(["devices", "--config-path=x"]) == ["devices", "--config-path=x"]  # only train/submit/config
    assert encode_deletions(["~a.b", "~a.b=3", "a=1"]) == ["~a.b=", "~a.b=3", "a=1"]


@needs_verl_tree
def test_config_path_is_relative_to_verl_trainer_as_in_main_ppo(tmp_path):
    tree = verl_config_dir()
    assert config_file("config", "ppo_megatron_trainer.yaml") == tree / "ppo_megatron_trainer.yaml"
    assert config_file("./config", "ppo_megatron_trainer") == tree / "ppo_megatron_trainer.yaml"
    assert config_file(None, "ppo_trainer") == tree / "ppo_trainer.yaml"
    assert config_file(str(tree), None) == tree / "ppo_trainer.yaml"
    from flowrl.config import ConfigError

    with pytest.raises(ConfigError, match="is not a file"):
        config_file(str(tmp_path), "nope")


@needs_verl_tree
def test_megatron_trainer_config_name_composes_verls_megatron_tree(capsys):
    rc = main(["config", "--from-verl", "--config-path=config", "--config-name=ppo_megatron_trainer.yaml", *HF])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "actor.strategy=megatron" in out


@needs_verl_tree
def test_a_users_directory_extending_verls_config(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text("hydra:\n  searchpath:\n    - file://verl/trainer/config\n"
                                        "defaults:\n  - ppo_megatron_trainer\n  - _self_\n"
                                        "data:\n  max_prompt_length: 77\n")
    path, overrides = _split_config_args(HF, build_parser().parse_args(
        ["train", f"--config-path={tmp_path}", "--config-name=mine"]))
    assert path == tmp_path / "mine.yaml"
    cfg = load_config(path, overrides)
    assert cfg.data.max_prompt_length == 77 and cfg.actor.strategy == "megatron"


@needs_verl_tree
def test_plus_plusplus_and_tilde(capsys):
    tree = verl_config_dir()
    cfg = load_config(tree / "ppo_trainer.yaml", [*HF, "++data.max_prompt_length=33", "+trainer.project_name=p"])
    assert cfg.data.max_prompt_length == 33 and cfg.trainer.project_name == "p"
    # ~key of the composed config: the key is gone, flowrl keeps its own setting
    cfg = load_config(tree / "ppo_trainer.yaml", [*HF, "data.max_prompt_length=33", *encode_deletions(["~data.max_prompt_length"])])
    assert cfg.data.max_prompt_length == load_config().data.max_prompt_length
    # ~key without a YAML drops the earlier override; ~key=value only when it holds that value
    assert load_config(None, ["rollout.n=3", "~rollout.n="]).rollout.n == load_config().rollout.n
    assert load_config(None, ["rollout.n=3", "~rollout.n=4"]).rollout.n == 3
    rc = main(["config", "--from-verl", "actor_rollout_ref.rollout.n=3", "~actor_rollout_ref.rollout.n"])
    assert rc == 0 and "rollout.n=" not in capsys.readouterr().out


def test_a_config_file_given_twice_is_refused(capsys):
    assert main(["config", "x.yaml", "--config-name=ppo_trainer", "a=1"]) == 2
    assert "give the config file one way" in capsys.readouterr().err


@needs_verl_tree
def test_verls_critic_enable_null_is_a_critic_with_gae():
    """verl's ``critic.enable: null`` means "when algorithm.adv_estimator=gae" (verl's need_critic):
    the Megatron config's ``critic.strategy: megatron`` then applies, as it does in verl."""
    tree = verl_config_dir()
    gae = load_config(tree / "ppo_megatron_trainer.yaml", ["algorithm.adv_estimator=gae", *HF])
    assert gae.critic.strategy == "megatron"
    grpo = load_config(tree / "ppo_megatron_trainer.yaml", ["algorithm.adv_estimator=grpo", *HF])
    from flowrl.config import RunConfig

    assert grpo.critic.strategy == RunConfig().critic.strategy  # no critic: its section stays flowrl's


@needs_verl_tree
def test_value_overrides_on_the_composed_base_are_hydras_composition():
    """A command line's value overrides are applied to verl's tree composed once (the unit suite and
    every verl command line save Hydra's seconds): the same config as Hydra's full composition."""
    from omegaconf import OmegaConf

    from flowrl.config.verl_yaml import _compose, _compose_cached

    path = verl_config_dir() / "ppo_megatron_trainer.yaml"
    overrides = ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "data.train_files=[a.parquet,b.parquet]",
                 "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
                 "++trainer.nnodes=2", "~trainer.val_before_train", "actor_rollout_ref.rollout.name=vllm"]
    fast = OmegaConf.to_container(_compose(path, overrides), resolve=True)
    full = OmegaConf.to_container(_compose_cached(str(path.resolve()), path.stat().st_mtime_ns, tuple(overrides)),
                                  resolve=True)
    assert fast == full
    assert fast["actor_rollout_ref"]["ref"]["megatron"]["tensor_model_parallel_size"] == 2  # interpolation followed
    assert "val_before_train" not in fast["trainer"]
