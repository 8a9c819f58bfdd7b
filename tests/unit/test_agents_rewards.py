"""The tools' reward hooks in the score (``score = reward function + tool_reward_coef x sum of
hooks``), their release hook, and a gym-style environment named in the config."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flowrl.agents.agent import Agent, agent_columns
from flowrl.agents.loop import Trajectory
from flowrl.config import ConfigError, load_config
from flowrl.config.multi_turn import MultiTurnConfig
from flowrl.data import experience as ex
from flowrl.tasks.agent_task import DATA_SOURCE, build_agent_tokenizer
from flowrl_testing.agents import Where

TOK = build_agent_tokenizer()
EOS = TOK.eos_token_id


def enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_tool_reward_is_the_coefficient_times_the_summed_hooks_then_states_are_released():
    from flowrl.agents.tools import resolve_tools

    tools = resolve_tools(["calculator", "flowrl_testing.agents:Where"])  # calculator's hook: 0
    trajs = [Trajectory(response=[5], mask=[1], spans=[[0, 1, 1]], state={"where": {"calls": n}, "calculator": None})
             for n in (0, 3)]
    Where.released.clear()
    cols = agent_columns(trajs, tools, tool_reward_coef=0.5)
    assert cols["tool_reward"].to_pylist() == [0.0, 1.5]  # 0.5 x (0 + 0), 0.5 x (0 + 3)
    assert Where.released == [{"calls": 0}, {"calls": 3}]  # after the reward, once per trajectory
    assert agent_columns(trajs, tools, tool_reward_coef=0.0)["tool_reward"].to_pylist() == [0.0, 0.0]


def test_the_reward_node_adds_tool_reward_to_the_reward_functions_score(tmp_path):
    from flowrl.nodes.rewards import reward

    TOK.save_pretrained(tmp_path)
    responses = [enc("\n=408\n408") + [EOS], enc("407") + [EOS], enc("408") + [EOS]]
    table = pa.table({"data_source": [DATA_SOURCE] * 3, "ground_truth": ["408"] * 3,
                      "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
                      "tool_reward": pa.array([0.5, 0.25, 0.0], pa.float32())})
    out = reward(table, str(tmp_path), "flowrl.tasks.agent_task:compute_score").value
    # exact match 1, 0, 1 plus tool rewards 0.5, 0.25, 0
    assert out.column("score").to_pylist() == [1.5, 0.25, 1.0]
    assert [r[-1] for r in out.column("token_rewards").to_pylist()] == [1.5, 0.25, 1.0]
    plain = reward(table.drop_columns(["tool_reward"]), str(tmp_path), "flowrl.tasks.agent_task:compute_score").value
    assert plain.column("score").to_pylist() == [1.0, 0.0, 1.0]  # single-turn tables: the function alone


def scripted_generate(contexts, budgets, seed):
    """Each turn answers ``go`` then EOS."""
    out = [(enc("go") + [EOS])[:b] for b in budgets]
    return out, [[-0.1] * len(o) for o in out]


def test_an_environment_from_the_config_runs_the_loop_and_rewards_the_score():
    cfg = load_config(None, ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_turns=5",
                             "rollout.multi_turn.environment=flowrl_testing.agents:Countdown",
                             "rollout.multi_turn.tool_reward_coef=2"]).rollout.multi_turn
    agent = Agent(cfg, TOK)
    rows = [{"ground_truth": "1"}, {"ground_truth": "3"}, {"ground_truth": "9"}]
    try:
        trajs = agent.run([enc("a"), enc("b"), enc("c")], rows, generate=scripted_generate, response_length=200, seed=0)
        cols = agent.columns(trajs)
    finally:
        agent.close()
    # Countdown(n): n steps, each rewarded 0.25, the n-th says done (its observation is not appended)
    assert cols["num_turns"].to_pylist() == [1, 3, 5]
    assert cols["finish_reason"].to_pylist() == ["stop", "stop", "max_turns"]
    assert cols["tool_reward"].to_pylist() == [2 * 0.25, 2 * 0.75, 2 * 1.0]  # the 5th turn is not stepped
    spans = cols["turn_spans"].to_pylist()[1]
    resp = cols["response_ids"].to_pylist()[1]
    assert [TOK.decode(resp[s:e]) for s, e, k in spans if k == 0] == ["\n=left 2\n", "\n=left 1\n"]
    assert cols["response_mask"].to_pylist()[1] == [k for s, e, k in spans for _ in range(s, e)]


@pytest.mark.parametrize("overrides, key", [
    (["rollout.multi_turn.environment=flowrl_testing.agents:Countdown", "rollout.multi_turn.tools=[calculator]"],
     "rollout.multi_turn.environment"),
    (["rollout.multi_turn.environment=no_such_module:Env"], "rollout.multi_turn.environment"),
    (["rollout.multi_turn.environment=flowrl.agents.tools:Tool"], "rollout.multi_turn.environment"),
    (["rollout.multi_turn.tools=[calculator]", "rollout.multi_turn.dask_tools=[python]"],
     "rollout.multi_turn.dask_tools"),
    (["rollout.multi_turn.tools=[calculator]", "rollout.multi_turn.tool_reward_coef=nan"],
     "rollout.multi_turn.tool_reward_coef"),
])
def test_environment_dask_tools_and_coefficient_mistakes_name_their_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["rollout.multi_turn.enable=true", *overrides])
    assert key in str(info.value) and "fix:" in str(info.value)


def test_dask_tools_and_the_run_on_flag_choose_the_remote_executor():
    cfg = MultiTurnConfig(enable=True, tools=["calculator", "flowrl_testing.agents:Where"], dask_tools=["calculator"])
    with pytest.raises(RuntimeError, match=r"\['calculator', 'where'\] run as Dask tasks"):
        Agent(cfg, TOK)  # no executor: refused rather than run on the rank
    agent = Agent(cfg, TOK, remote=lambda *a: None)
    assert agent.runner.remote_tools == {"calculator", "where"}
    agent.close()
