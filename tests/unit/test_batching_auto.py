"""``auto`` batching (issue 30 item 1): token budgets and shared prompts chosen from the config alone
(``flowrl.config.batching_auto``), explicit values kept, verl's defaults not adopted, a value the
user wrote adopted."""

from __future__ import annotations

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.config.batching_auto import (MIN_SAVED_SHARE, Shapes, describe_batching, resolve_batching,
                                         resolved_section, settled)
from flowrl.config.roles import ActorConfig, CriticConfig
from flowrl.config.verl_yaml import verl_config_dir

needs_verl_tree = pytest.mark.skipif(verl_config_dir() is None, reason="verl's config tree is absent: "
                                     "pip install --no-deps verl==0.9.1")
HF = ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]


def test_defaults_are_auto_and_resolve_to_the_fast_layout():
    cfg = load_config()
    assert (cfg.actor.use_dynamic_bsz, cfg.actor.use_prefix_grouper, cfg.actor.ppo_max_token_len_per_gpu) == ("auto", "auto", 0)
    got = resolve_batching(cfg)
    # rollout.n=16, prompts <= 32, responses <= 8: prefix sharing saves 15/16 * 32/40 = 0.75 of the positions
    assert got["actor"].values == {"use_dynamic_bsz": True, "log_prob_use_dynamic_bsz": True,
                                   "ppo_max_token_len_per_gpu": 256 * 40, "log_prob_max_token_len_per_gpu": 256 * 40,
                                   "use_prefix_grouper": True}
    assert got["ref"].values == {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 256 * 40,
                                 "use_prefix_grouper": True}
    assert got["critic"].values == {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 256 * 40,
                                    "forward_max_token_len_per_gpu": 256 * 40, "use_prefix_grouper": True}
    assert "75%" in got["actor"].reasons["use_prefix_grouper"]


def test_explicit_values_stay_and_verls_followers_follow_them():
    cfg = load_config(None, ["actor.use_dynamic_bsz=false", "actor.use_prefix_grouper=false",
                             "ref.use_prefix_grouper=true", "actor.ppo_max_token_len_per_gpu=4096"])
    got = resolve_batching(cfg)
    assert got["actor"].values["use_dynamic_bsz"] is False
    # verl: rollout/ref.log_prob_use_dynamic_bsz and critic.use_dynamic_bsz are ${actor.use_dynamic_bsz}
    assert got["actor"].values["log_prob_use_dynamic_bsz"] is False
    assert got["ref"].values["log_prob_use_dynamic_bsz"] is False and got["critic"].values["use_dynamic_bsz"] is False
    # verl: the log-prob budgets are ${actor.ppo_max_token_len_per_gpu}; the critic's its own
    assert got["actor"].values["log_prob_max_token_len_per_gpu"] == got["ref"].values["log_prob_max_token_len_per_gpu"] == 4096
    assert got["critic"].values["ppo_max_token_len_per_gpu"] == 256 * 40
    assert got["actor"].values["use_prefix_grouper"] is False and got["critic"].values["use_prefix_grouper"] is False
    assert got["ref"].values["use_prefix_grouper"] is True  # its own explicit value wins
    on = resolve_batching(load_config(None, ["actor.use_dynamic_bsz=true", "rollout.n=1"]))
    assert on["critic"].values["use_dynamic_bsz"] is True and on["actor"].values["use_prefix_grouper"] is False  # n=1


def test_prefix_grouping_needs_groups_and_a_real_prompt_share():
    assert Shapes(n=1, prompt_len=512, response_len=8).saved_share == 0
    assert Shapes(n=2, prompt_len=2, response_len=8).saved_share == pytest.approx(MIN_SAVED_SHARE)  # 1/2 * 2/10
    long = load_config(None, ["data.max_prompt_length=64", "rollout.response_length=4096", "rollout.n=8"])
    got = resolve_batching(long)["actor"]  # 7/8 * 64/4160 = 1.3% of the positions: not worth a dense mask
    assert got.values["use_prefix_grouper"] is False and "under 10%" in got.reasons["use_prefix_grouper"]
    assert got.values["use_dynamic_bsz"] is True and got.values["ppo_max_token_len_per_gpu"] == 256 * 4160
    small = load_config(None, ["actor.ppo_micro_batch_size_per_gpu=1", "data.max_prompt_length=4", "rollout.response_length=4"])
    assert resolve_batching(small)["actor"].values["ppo_max_token_len_per_gpu"] == 8  # one whole sequence


def test_a_backend_without_the_capability_resolves_auto_off_and_refuses_explicit_true():
    cfg = load_config(None, ["actor.strategy=megatron", "critic.strategy=megatron"])
    got = resolve_batching(cfg)
    assert not any(v for r in got.values() for k, v in r.values.items() if "max_token_len" not in k)
    assert got["ref"].reasons["use_prefix_grouper"] == "auto: the backend lacks it"
    mixed = resolve_batching(load_config(None, ["actor.use_dynamic_bsz=true", "critic.strategy=megatron"]))["critic"]
    assert mixed.values["use_dynamic_bsz"] is False  # follows the actor only where its own backend has it
    with pytest.raises(ConfigError) as err:
        load_config(None, ["actor.strategy=megatron", "actor.use_prefix_grouper=true"])
    assert err.value.key.endswith("use_prefix_grouper") and "auto or false" in err.value.fix
    with pytest.raises(ConfigError) as err:
        load_config(None, ["actor.strategy=megatron", "ref.log_prob_use_dynamic_bsz=true"])
    assert err.value.key == "ref.log_prob_use_dynamic_bsz"


def test_bad_switch_and_budget_values_name_the_key_and_the_fix():
    with pytest.raises(ConfigError) as err:
        ActorConfig(use_dynamic_bsz="maybe")
    assert (err.value.key, err.value.value) == ("use_dynamic_bsz", "maybe") and "auto" in err.value.fix
    with pytest.raises(ConfigError) as err:
        load_config(None, ["critic.forward_max_token_len_per_gpu=-1"])
    assert err.value.key.endswith("forward_max_token_len_per_gpu") and "0 (derived" in err.value.fix


def test_resolved_sections_and_settled_ones_have_no_auto_left():
    cfg = load_config()
    actor = resolved_section(cfg, "actor")
    assert actor.use_dynamic_bsz is True and actor.log_prob_max_token_len_per_gpu == 10240
    assert settled(actor) is actor  # resolved: unchanged
    alone = settled(ActorConfig())  # a role built without a run: auto off, verl's budgets
    assert (alone.use_dynamic_bsz, alone.use_prefix_grouper, alone.ppo_max_token_len_per_gpu) == (False, False, 16384)
    assert settled(CriticConfig()).forward_max_token_len_per_gpu == 32768


def test_the_role_specs_carry_the_resolved_values():
    from flowrl.roles.specs import actor_spec, critic_spec, ref_spec

    cfg = load_config(None, ["ref.use_prefix_grouper=false"])
    assert actor_spec(cfg).role_kwargs["actor"].use_prefix_grouper is True
    assert ref_spec(cfg).role_kwargs["max_token_len"] == 10240 and ref_spec(cfg).role_kwargs["prefix_grouper"] is False
    assert critic_spec(cfg).role_kwargs["critic"].use_dynamic_bsz is True


def test_describe_says_what_auto_chose():
    line = describe_batching(load_config(None, ["actor.use_dynamic_bsz=false"]), ("actor",))[0]
    assert line.startswith("batching actor: use_dynamic_bsz=False, ") and "use_prefix_grouper=True (auto: saves 75%" in line


@needs_verl_tree
def test_verls_yaml_defaults_stay_auto_and_a_command_line_value_is_explicit():
    tree = verl_config_dir()
    cfg = load_config(tree / "ppo_trainer.yaml", HF)  # verl's use_dynamic_bsz: false, only a default
    assert (cfg.actor.use_dynamic_bsz, cfg.ref.log_prob_use_dynamic_bsz, cfg.critic.use_dynamic_bsz) == ("auto",) * 3
    assert cfg.actor.use_prefix_grouper == "auto" and cfg.actor.ppo_max_token_len_per_gpu == 0
    cfg = load_config(tree / "ppo_trainer.yaml", [*HF, "actor_rollout_ref.actor.use_dynamic_bsz=false"])
    assert cfg.actor.use_dynamic_bsz is False  # written on the command line, equal to verl's default: explicit
    assert resolve_batching(cfg)["ref"].values["log_prob_use_dynamic_bsz"] is False  # and followed, as in verl
    cfg = load_config(tree / "ppo_trainer.yaml", [*HF, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384"])
    assert cfg.actor.use_dynamic_bsz is True and cfg.actor.ppo_max_token_len_per_gpu == 16384
    assert resolve_batching(cfg)["ref"].values["log_prob_max_token_len_per_gpu"] == 16384


@needs_verl_tree
def test_a_value_written_in_the_users_own_verl_yaml_is_explicit(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
                    "actor_rollout_ref:\n  actor:\n    use_dynamic_bsz: false\n    use_prefix_grouper: false\n")
    cfg = load_config(path, HF)
    assert (cfg.actor.use_dynamic_bsz, cfg.actor.use_prefix_grouper) == (False, False)
    assert cfg.critic.use_dynamic_bsz == "auto" and resolve_batching(cfg)["critic"].values["use_dynamic_bsz"] is False
