"""verl's multi-turn tool config (``rollout.multi_turn.tool_config_path``, issue 37): verl's YAML
format, verl's Gsm8kTool as flowrl's (answers and scores against verl 0.9.1's own
``reward_score/gsm8k.py`` from the installed wheel), refusals by name, and the agent loop running
the tool with the row's ``extra_info.tools_kwargs``."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

from flowrl.agents.verl_tools import Gsm8kTool, create_kwargs, load_tool_config, verl_gsm8k_score
from flowrl.config.verl_tool_config import check_tool_config
from flowrl.config import ConfigError, load_config
from flowrl.config.verl_yaml import verl_config_dir

# verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, as in its repository
GSM8K_TOOL_CONFIG = """tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k. (1.0 if your answer is correct, 0.0 if your answer is incorrect)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""


@pytest.fixture
def tool_config(tmp_path) -> str:
    path = tmp_path / "gsm8k_tool_config.yaml"
    path.write_text(GSM8K_TOOL_CONFIG)
    return str(path)


def _verl_gsm8k():
    """verl 0.9.1's ``verl/utils/reward_score/gsm8k.py`` from the installed wheel (it imports only
    ``re``; ``import verl`` itself needs Ray)."""
    directory = verl_config_dir()
    if directory is None:
        pytest.skip("verl 0.9.1 is not installed (pip install --no-deps verl==0.9.1)")
    file = Path(directory).parents[1] / "utils" / "reward_score" / "gsm8k.py"
    spec = importlib.util.spec_from_file_location("verl_gsm8k_score", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verls_gsm8k_tool_config_loads_as_flowrls_tool(tool_config):
    tools = load_tool_config(tool_config)
    assert list(tools) == ["calc_gsm8k_reward"] and isinstance(tools["calc_gsm8k_reward"], Gsm8kTool)
    schema = tools["calc_gsm8k_reward"].chat_schema()
    assert schema["type"] == "function" and schema["function"]["parameters"]["required"] == ["answer"]
    assert schema["function"]["description"].startswith("A tool for calculating the reward of gsm8k.")


@pytest.mark.parametrize("answer", ["72", "#### 72", "72.", "7,2", "-3", "The answer is 72", "", "abc", "72 apples",
                                    "1.5", "72\n#### 18", 72, "  72  "])
def test_the_tool_scores_and_answers_as_verls_gsm8k_tool(answer):
    verl = _verl_gsm8k()
    for truth in ("72", "18", "-3", "1.5"):
        text = answer if isinstance(answer, str) else str(answer)
        response = text if text.startswith("#### ") else "#### " + text
        expected = verl.compute_score(response, truth, method="flexible", format_score=0.0, score=1.0)
        assert verl_gsm8k_score(response, truth) == float(expected)
        tool = Gsm8kTool()
        state = tool.create_state({"extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {
            "create_kwargs": {"ground_truth": truth}}}}})
        reply = asyncio.run(tool.call({"answer": answer}, state))
        reward = float(expected)
        assert reply == f"Current parsed answer={text!r} reward={reward!r}"
        assert tool.reward(state) == (0.0 if reward > 0 else -0.05)


def test_create_kwargs_come_from_extra_info_as_in_verl():
    row = {"extra_info": json.dumps({"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "9"}}}}),
           "reward_model": {"ground_truth": "8"}}
    assert create_kwargs(row, "calc_gsm8k_reward") == {"ground_truth": "9"}
    assert Gsm8kTool().create_state(row)["ground_truth"] == "9"
    assert Gsm8kTool().create_state({"reward_model": {"ground_truth": "8"}})["ground_truth"] == "8"  # fallback
    assert create_kwargs({}, "calc_gsm8k_reward") == {}


def test_other_tools_are_refused_by_name_and_flowrl_tools_are_taken(tmp_path):
    bad = tmp_path / "search.yaml"
    bad.write_text('tools:\n  - class_name: "verl.tools.search_tool.SearchTool"\n    config: {type: native}\n')
    with pytest.raises(ValueError, match="verl's tool is not built in flowrl"):
        load_tool_config(str(bad))
    ours = tmp_path / "ours.yaml"
    ours.write_text('tools:\n  - class_name: "flowrl.agents.calculator.Calculator"\n    config: {type: native}\n'
                    '    tool_schema: {type: function, function: {name: calc, description: "arithmetic", '
                    'parameters: {type: object, properties: {expr: {type: string}}}}}\n')
    tools = load_tool_config(str(ours))
    assert list(tools) == ["calc"] and tools["calc"].schema["description"] == "arithmetic"
    notool = tmp_path / "notool.yaml"
    notool.write_text('tools:\n  - class_name: "collections.OrderedDict"\n')
    with pytest.raises(ValueError, match="not a flowrl.agents.tools.Tool subclass"):
        load_tool_config(str(notool))


def test_the_config_takes_the_path_and_pre_flight_checks_it(tool_config, tmp_path):
    args = ["rollout.multi_turn.enable=true", f"rollout.multi_turn.tool_config_path={tool_config}"]
    cfg = load_config(None, args)
    assert [t["function"]["name"] for t in cfg.rollout.multi_turn.chat_tools()] == ["calc_gsm8k_reward"]
    check_tool_config(cfg)
    missing = load_config(None, ["rollout.multi_turn.enable=true",
                                 f"rollout.multi_turn.tool_config_path={tmp_path / 'nowhere.yaml'}"])
    with pytest.raises(ConfigError, match="rollout.multi_turn.tool_config_path.*cannot be read"):
        check_tool_config(missing)
    with pytest.raises(ConfigError, match="tools"):
        load_config(None, ["rollout.multi_turn.enable=true"])  # neither tools nor a tool config


def test_verls_key_maps_with_tool_rewards_out_of_the_score(tool_config):
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config.loader import load_config_with_notes
    from flowrl.config.verl_hydra import flags_first

    args = ["config", "--from-verl", "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}"]
    ns = build_parser().parse_args(flags_first(args))
    mt = load_config_with_notes(*_split_config_args(ns.items, ns))[0].rollout.multi_turn
    assert (mt.enable, mt.tool_config_path, mt.tool_reward_coef) == (True, tool_config, 0.0)


def test_the_agent_loop_runs_the_tool_from_the_config(tool_config):
    from flowrl.agents.agent import Agent
    from flowrl.tasks.agent_task import build_agent_tokenizer

    tok = build_agent_tokenizer()
    cfg = load_config(None, ["rollout.multi_turn.enable=true", f"rollout.multi_turn.tool_config_path={tool_config}",
                             "rollout.multi_turn.tool_reward_coef=1.0"]).rollout.multi_turn
    agent = Agent(cfg, tok)
    call = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}</tool_call>'
    turns = iter([call, "done"])

    def generate(contexts, budgets, seed):
        text = next(turns)
        out = [(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])[:b] for b in budgets]
        return out, [[-0.1] * len(o) for o in out]

    rows = [{"extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}}}]
    try:
        trajs = agent.run([tok.encode("q", add_special_tokens=False)], rows, generate=generate, response_length=400,
                          seed=0)
        text = tok.decode(trajs[0].response)
        assert "Current parsed answer='72' reward=1.0" in text
        assert agent.columns(trajs)["tool_reward"].to_pylist() == [0.0]  # the answer scored: no -0.05
    finally:
        agent.close()


def test_verls_turn_caps_max_assistant_turns_and_max_user_turns_plus_one(tool_config):
    """verl's tool agent loop (verl 0.9.1 ``experimental/agent_loop/tool_agent_loop.py``) ends a
    trajectory once ``assistant_turns >= max_assistant_turns``, before that turn's tool calls run:
    flowrl's ``max_turns`` (flowrl.agents.loop). With max_assistant_turns=2 and a model that calls a
    tool every turn, verl runs model, tool, model, then stops: 2 model turns, 1 tool answer."""
    from flowrl.agents.agent import Agent
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config.loader import load_config_with_notes
    from flowrl.config.verl import translate_item
    from flowrl.config.verl_hydra import flags_first
    from flowrl.tasks.agent_task import build_agent_tokenizer

    key = "actor_rollout_ref.rollout.multi_turn"
    args = ["config", "--from-verl", f"{key}.enable=true", f"{key}.tool_config_path={tool_config}",
            f"{key}.max_assistant_turns=2"]
    ns = build_parser().parse_args(flags_first(args))
    mt = load_config_with_notes(*_split_config_args(ns.items, ns))[0].rollout.multi_turn
    assert mt.max_turns == 2
    assert translate_item(f"{key}.max_assistant_turns", 2) == (None, None)  # read by derive (verl_rollout)

    tok = build_agent_tokenizer()
    agent = Agent(mt, tok)
    call = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "7"}}</tool_call>'

    def generate(contexts, budgets, seed):
        out = [(tok.encode(call, add_special_tokens=False) + [tok.eos_token_id])[:b] for b in budgets]
        return out, [[-0.1] * len(o) for o in out]

    rows = [{"extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}}}]
    try:
        (traj,) = agent.run([tok.encode("q", add_special_tokens=False)], rows, generate=generate, response_length=400,
                            seed=0)
        assert (traj.num_turns, traj.finish_reason) == (2, "max_turns")
        assert tok.decode(traj.response).count("Current parsed answer") == 1  # one tool answer, as verl's
    finally:
        agent.close()

    # max_user_turns=U ends verl's loop after the model turn that follows the U-th tool answer: U + 1
    # model turns, flowrl's max_turns; with both caps the smaller wins; null or 0 is no cap (verl_rollout)
    def turns(*items):
        ns = build_parser().parse_args(flags_first(["config", "--from-verl", f"{key}.enable=true",
                                                    f"{key}.tool_config_path={tool_config}", *items]))
        return load_config_with_notes(*_split_config_args(ns.items, ns))[0].rollout.multi_turn.max_turns

    assert turns(f"{key}.max_user_turns=16") == 17
    assert turns(f"{key}.max_user_turns=16", f"{key}.max_assistant_turns=2") == 2
    assert turns(f"{key}.max_user_turns=1", f"{key}.max_assistant_turns=5") == 2
    assert turns(f"{key}.max_user_turns=0", f"{key}.max_assistant_turns=3") == 3  # 0: no cap
    # no cap at all: the response length bounds the turns (each model turn takes a token of it)
    assert turns(f"{key}.max_user_turns=null", "data.max_response_length=300") == 300
    with pytest.raises(ConfigError, match=r"max_user_turns=-1: must be a whole number of turns"):
        turns(f"{key}.max_user_turns=-1")
