"""verl's reward managers (``reward_model.reward_manager``; ``flowrl.config.verl_reward``, issue 37):
``naive`` is flowrl's reward stage; ``dapo`` the same plus DAPO's overlong penalty from
``reward_model.reward_kwargs`` (flowrl's ``reward_model.overlong_buffer.*``); the others refused by name."""

from __future__ import annotations

import pytest
import torch

from flowrl.algos.dapo import overlong_penalty
from flowrl.config import ConfigError

DAPO = ["algorithm.adv_estimator=grpo", "data.max_response_length=8", "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False", "+reward_model.reward_kwargs.max_resp_len=8"]


def from_verl(args: list[str]):
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config.loader import load_config_with_notes
    from flowrl.config.verl_hydra import flags_first

    ns = build_parser().parse_args(flags_first(["config", "--from-verl", *args]))
    return load_config_with_notes(*_split_config_args(ns.items, ns))[0]


def test_dapos_overlong_penalty_is_flowrls_overlong_buffer():
    cfg = from_verl(DAPO)
    ob = cfg.reward_model.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor, cfg.rollout.response_length) == (True, 4, 0.5, 8)
    # verl's DAPORewardManager: min(-(L - (max_resp_len - len)) / len * penalty_factor, 0) with
    # max_resp_len 8, len 4, factor 0.5: L = 3, 4, 6, 8 exceed by -1, 0, 2, 4 -> 0, 0, -0.25, -0.5
    got = overlong_penalty(torch.tensor([3, 4, 6, 8]), max_response_length=cfg.rollout.response_length,
                           buffer_len=ob.len, penalty_factor=ob.penalty_factor)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5]


def test_dapo_without_the_buffer_and_naive_are_the_reward_stage_alone():
    for args in (["reward_model.reward_manager=dapo"], ["reward_model.reward_manager=naive"],
                 ["reward.reward_manager.name=dapo"], DAPO[:3] + ["+reward_model.reward_kwargs.max_resp_len=8"]):
        assert not from_verl(args).reward_model.overlong_buffer.enable, args
    assert from_verl([a.replace("reward_model.reward_manager", "reward.reward_manager.name") if "manager" in a else a
                      for a in DAPO]).reward_model.overlong_buffer.enable  # verl's newer key for the manager


def test_what_flowrl_does_not_do_as_verl_is_refused():
    with pytest.raises(ConfigError, match="the prime reward manager; flowrl has no equivalent"):
        from_verl(["reward_model.reward_manager=prime"])
    with pytest.raises(ConfigError, match="an overlong budget other than the response length"):
        from_verl([*DAPO[:-1], "+reward_model.reward_kwargs.max_resp_len=6"])
    with pytest.raises(ConfigError, match="max_resp_len.*is needed"):
        from_verl(DAPO[:-1])
    with pytest.raises(ConfigError, match="read by the dapo reward manager only"):  # verl's naive leaves them unused
        from_verl([a for a in DAPO if "reward_manager" not in a])
