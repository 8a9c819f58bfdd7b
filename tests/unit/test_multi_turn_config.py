"""``rollout.multi_turn``: off by default and then invisible to the worker specs; what it accepts
is resolved at load time, what it cannot use is a ConfigError before any worker starts."""

from __future__ import annotations

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.roles.specs import rollout_spec

ON = ["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[calculator]"]


def test_off_by_default_and_absent_from_the_rollout_spec():
    cfg = load_config(None, [])
    assert cfg.rollout.multi_turn.enable is False
    assert "multi_turn" not in rollout_spec(cfg).role_kwargs


def test_on_reaches_the_rollout_role():
    cfg = load_config(None, ON + ["rollout.multi_turn.max_turns=3"])
    assert rollout_spec(cfg).role_kwargs["multi_turn"].max_turns == 3


@pytest.mark.parametrize("overrides,key", [
    (["rollout.multi_turn.enable=true"], "rollout.multi_turn.tools"),
    (["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[abacus]"], "rollout.multi_turn.tools"),
    (["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[no_such_module:Tool]"], "rollout.multi_turn.tools"),
    (ON + ["rollout.multi_turn.parser=yaml"], "rollout.multi_turn.parser"),
    (ON + ["rollout.multi_turn.max_turns=0"], "rollout.multi_turn.max_turns"),
    (ON + ["rollout.multi_turn.tool_timeout_s=0"], "rollout.multi_turn.tool_timeout_s"),
    (ON + ["rollout.multi_turn.environment=x"], "environment"),
])
def test_mistakes_are_config_errors_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, overrides)


def test_the_shipped_agent_config_loads():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "agent_calculator.yaml", [])
    assert cfg.rollout.multi_turn.enable and cfg.rollout.multi_turn.tools == ["calculator"]
    assert cfg.algorithm.reward_fn == "flowrl.tasks.agent_task:compute_score"
