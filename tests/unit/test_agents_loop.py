"""The agent loop with a scripted "model": masks token by token, turn spans, finish reasons,
max turns, the token budget, and tools that raise, hang, return garbage or 1 MB."""

from __future__ import annotations

import asyncio
import time

import pytest

from flowrl.agents.loop import AgentSettings, ChatCodec, run_agent_loop
from flowrl.agents.parsers import hermes
from flowrl.agents.runner import ToolRunner
from flowrl.agents.tools import Tool, resolve_tools
from flowrl.tasks.agent_task import build_agent_tokenizer

TOK = build_agent_tokenizer()
CODEC = ChatCodec(TOK)
EOS = TOK.eos_token_id


def enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def call(name: str, args: str) -> str:
    return f'<tool_call>{{"name":"{name}","arguments":{args}}}</tool_call>'


def scripted(turns: dict[str, list[str]]):
    """A generate callback answering prompt text -> its turns in order (EOS after each)."""
    def generate(contexts, budgets, seed):
        out = []
        for ctx, budget in zip(contexts, budgets):
            text = TOK.decode(ctx, skip_special_tokens=False)
            prompt = next(p for p in turns if text.startswith(p))
            k = text.count(TOK.eos_token)
            out.append((enc(turns[prompt][k]) + [EOS])[:budget])
        return out, [[-0.5] * len(o) for o in out]
    return generate


class Raises(Tool):
    name = "raises"

    async def call(self, args, state):
        raise RuntimeError("boom")


class Hangs(Tool):
    name = "hangs"

    async def call(self, args, state):
        await asyncio.sleep(3600)


class Blocks(Tool):
    """Blocks its event loop (synchronous sleep inside async)."""
    name = "blocks"

    async def call(self, args, state):
        time.sleep(3)
        return "late"


class Garbage(Tool):
    name = "garbage"

    async def call(self, args, state):
        return {"not": "text"}


class Huge(Tool):
    name = "huge"

    async def call(self, args, state):
        return "x" * (1 << 20)


class Counter(Tool):
    """Per-trajectory state and a reward hook."""
    name = "counter"

    def create_state(self, row):
        return {"n": 0}

    async def call(self, args, state):
        state["n"] += 1
        return str(state["n"])

    def reward(self, state):
        return float(state["n"])


def run(turns, *, tools=("calculator",), max_turns=4, budget=200, timeout_s=1.0, extra=None, seed=0):
    tool_map = resolve_tools(list(tools))
    tool_map.update({t.name: t for t in (extra or [])})
    runner = ToolRunner(tool_map, timeout_s=timeout_s, max_chars=100)
    prompts = [enc(p) for p in turns]
    states = [{name: t.create_state({}) for name, t in tool_map.items()} for _ in prompts]
    try:
        return run_agent_loop(prompts, generate=scripted(turns), codec=CODEC, parser=hermes, runner=runner, seed=seed,
                              settings=AgentSettings(max_turns=max_turns, response_length=budget,
                                                     max_observation_chars=100), states=states)
    finally:
        runner.close()


def test_call_then_answer_masks_token_by_token():
    c = call("calculator", '{"expression":"347*86"}')
    (t,) = run({"347*86=": [c, "29842"]})
    # model turn: the call + EOS (mask 1); tool turn: "\n=29842\n" (mask 0); model: "29842" + EOS.
    expected = [(enc(c) + [EOS], 1), (enc("\n=29842\n"), 0), (enc("29842") + [EOS], 1)]
    assert t.response == [tok for ids, _ in expected for tok in ids]
    assert t.mask == [m for ids, m in expected for _ in ids]
    starts = [0, len(expected[0][0]), len(expected[0][0]) + len(expected[1][0])]
    assert t.spans == [[s, s + len(ids), m] for s, (ids, m) in zip(starts, expected)]
    assert all(lp == -0.5 for lp, m in zip(t.logprobs, t.mask) if m) and all(lp == 0.0 for lp, m in zip(t.logprobs, t.mask) if not m)
    assert (t.num_turns, t.tool_calls, t.tool_errors, t.finish_reason) == (2, 1, 0, "stop")
    assert TOK.decode(t.response, skip_special_tokens=True).rsplit("\n", 1)[-1] == "29842"


def test_no_call_is_one_turn():
    (t,) = run({"1+1=": ["2"]})
    assert (t.num_turns, t.tool_calls, t.finish_reason) == (1, 0, "stop") and set(t.mask) == {1}


def test_max_turns_stops_without_running_the_last_calls():
    c = call("counter", "{}")
    (t,) = run({"go": [c] * 10}, tools=(), extra=[Counter()], max_turns=3)
    assert (t.num_turns, t.tool_calls, t.finish_reason) == (3, 2, "max_turns")
    assert t.state["counter"]["n"] == 2  # the third turn's call did not run
    assert t.mask[-1] == 1 and [s[2] for s in t.spans] == [1, 0, 1, 0, 1]


def test_budget_counts_every_turn_and_ends_on_a_model_token():
    c = call("calculator", '{"expression":"1+1"}')
    first = len(enc(c)) + 1
    (t,) = run({"q": [c, c, c]}, budget=first + 4 + 3)  # call, "\n=2\n" (4), then 3 tokens of the next
    assert len(t.response) == first + 4 + 3 and t.finish_reason == "length" and t.mask[-1] == 1
    (t,) = run({"q": [c, "2"]}, budget=first + 4)  # the answer would leave no room: dropped
    assert len(t.response) == first and t.finish_reason == "length" and t.mask == [1] * first


@pytest.mark.parametrize("tool,error", [(Raises(), "RuntimeError: boom"), (Hangs(), "timed out"),
                                        (Garbage(), "returned dict, not text")])
def test_failing_tools_become_error_observations(tool, error):
    (t,) = run({"q": [call(tool.name, "{}"), "done"]}, tools=(), extra=[tool], timeout_s=0.5)
    assert (t.tool_calls, t.tool_errors, t.finish_reason) == (1, 1, "stop")
    observation = TOK.decode([x for x, m in zip(t.response, t.mask) if not m])
    assert error in observation


def test_a_tool_that_blocks_its_loop_times_out_and_the_next_batch_still_runs():
    start = time.monotonic()
    (t,) = run({"q": [call("blocks", "{}"), call("calculator", '{"expression":"2*2"}'), "4"]},
               extra=[Blocks()], timeout_s=0.5)
    assert time.monotonic() - start < 3.0  # did not wait for the blocked tool
    obs = TOK.decode([x for x, m in zip(t.response, t.mask) if not m])
    assert "timed out" in obs and "=4" in obs and (t.tool_calls, t.tool_errors) == (2, 1)


def test_one_megabyte_answer_is_truncated():
    (t,) = run({"q": [call("huge", "{}"), "ok"]}, tools=(), extra=[Huge()])
    assert t.mask.count(0) < 200 and t.tool_errors == 0 and t.finish_reason == "stop"


def test_malformed_and_unknown_calls_are_counted_and_answered():
    (t,) = run({"q": ["<tool_call>{bad</tool_call>", call("abacus", "{}"), "x"]}, budget=400)
    obs = TOK.decode([x for x, m in zip(t.response, t.mask) if not m])
    assert "malformed tool call" in obs and "unknown tool 'abacus'" in obs
    assert (t.tool_calls, t.tool_errors, t.malformed_calls, t.num_turns) == (2, 2, 1, 3)


def test_trajectories_keep_their_own_state_and_order():
    c = call("counter", "{}")
    a, b = run({"a": [c, c, "x"], "b": [c, "y"]}, tools=(), extra=[Counter()])
    assert a.state["counter"]["n"] == 2 and b.state["counter"]["n"] == 1
    assert TOK.decode(a.response, skip_special_tokens=True).endswith("x")


def test_a_gym_style_environment_runs_through_the_same_loop():
    from flowrl.agents.env import ENV_TOOL, Environment, as_parser_and_tool

    class Guess(Environment):
        def reset(self, row):
            self.secret = 7

        def step(self, action):
            guess = int(action.replace(TOK.eos_token, "") or 0)
            done = guess == self.secret
            return ("higher" if guess < self.secret else "lower"), float(done), done

    parser, tool, ended = as_parser_and_tool(Guess)
    runner = ToolRunner({tool.name: tool}, timeout_s=1.0, max_chars=100)
    (t,) = run_agent_loop([enc("guess:")], generate=scripted({"guess:": ["3", "9", "7", "1"]}), codec=CODEC,
                          parser=parser, runner=runner, settings=AgentSettings(max_turns=5, response_length=100),
                          states=[{ENV_TOOL: tool.create_state({})}], ended=ended)
    runner.close()
    assert TOK.decode(t.response, skip_special_tokens=True) == "3\n=higher\n9\n=lower\n7"
    assert (t.num_turns, t.finish_reason, tool.reward(t.state[ENV_TOOL])) == (3, "stop", 1.0)
    assert t.mask[-1] == 1
