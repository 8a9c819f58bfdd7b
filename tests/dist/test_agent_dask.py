"""Multi-turn rollouts on a real Dask cluster: two rollout ranks (each its own worker process) run
the agent loop, tools marked ``run_on = "dask"`` run as Dask tasks (their state coming back by
value, their reward hook in ``tool_reward``), and the same seed gives the same trajectories twice.
The remote path's timeouts and errors: tests/unit/test_agents_remote.py."""

from __future__ import annotations

import importlib

import pyarrow as pa
import pytest

from flowrl.actors import Gather, GroupMesh, Scatter, Session
from flowrl.backends.interfaces import SamplingParams
from flowrl.config.multi_turn import MultiTurnConfig
from flowrl.data import experience as ex

TIMEOUT_S = 10.0  # a Dask task's round trip at load 40+ takes seconds
MULTI_TURN = MultiTurnConfig(
    enable=True, parser="flowrl_testing.agents:calls_where", max_turns=3, tool_timeout_s=TIMEOUT_S,
    tools=["calculator", "flowrl_testing.agents:Where"], tool_reward_coef=0.5)
SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=250)
pytestmark = pytest.mark.timeout(900)  # a cluster and two model loads; minutes on a loaded machine
COLUMNS = ["uid", "response_ids", "response_mask", "rollout_logprobs", "turn_spans", "finish_reason", "tool_reward"]


def prompts() -> pa.Table:
    return pa.table({"prompt_ids": ex.from_lists([[10, 11, 12], [13, 14], [15, 16, 17], [18]], ex.TOKEN_IDS),
                     "group": pa.array([0, 1, 2, 3], pa.int64()), "ground_truth": pa.array(["1", "2", "3", "4"])})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny llama with the agent task's tokenizer (tool answers render as ``\\n=<answer>\\n``)
    and its weights edited towards EOS, so random turns end early."""
    from flowrl.tasks.agent_task import build_agent_tokenizer
    from flowrl_testing.agents import bias_towards_eos
    from flowrl.models.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("agent_dask_model")
    tok = build_agent_tokenizer()
    build_tiny_model(tok, arch="llama", hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64,
                     max_position_embeddings=512).save_pretrained(path)
    tok.save_pretrained(path)
    bias_towards_eos(path)
    return path


@pytest.fixture(scope="module")
def rollout(model_dir):
    session = Session.start(2, timeout_s=300, startup_timeout_s=600)
    try:
        # the tools' module imported on every worker first: a cold import is not the tool's time
        session.client.run(importlib.import_module, "flowrl_testing.agents")
        group = session.create_group("rollout", "flowrl.roles.rollout:RolloutRole",
                                     {"model_dir": str(model_dir), "sampling": SAMPLING, "multi_turn": MULTI_TURN},
                                     mesh=GroupMesh(dp=2))
        yield group
    finally:
        session.close()


def generate(group, seed: int) -> pa.Table:
    table, _ = group.run(group.reserve(), "generate", prompts(), scatter_mode=Scatter.SPLIT,
                         gather_mode=Gather.CONCAT, kwargs={"seed": seed})
    return table


@pytest.fixture(scope="module")
def table(rollout) -> pa.Table:
    return generate(rollout, seed=5)


def test_dask_tools_run_as_tasks_and_their_state_comes_back(table, model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert table.num_rows == 8 and sorted(set(table.column("group").to_pylist())) == [0, 1, 2, 3]
    ran = 0
    for row in table.to_pylist():
        tool_turns = [(s, e) for s, e, kind in row["turn_spans"] if kind == 0]
        ran = max(ran, len(tool_turns))
        for k, (start, end) in enumerate(tool_turns, 1):
            text = tok.decode(row["response_ids"][start:end])
            # 'where' ran in a Dask task, and its state (a call counter) came back by value
            assert f"\n=task {k}\n" in text, text
            assert "\n=42\n" in text  # the calculator, on the rank
        executed = row["tool_calls"] // 2  # turns whose 2 calls ran (the last one's answer may not fit)
        assert row["tool_calls"] == 2 * executed and executed >= len(tool_turns)
        assert row["tool_errors"] == 0
        assert row["tool_reward"] == pytest.approx(0.5 * executed)  # coef x Where's reward (its call count)
    assert ran >= 1


def test_same_seed_same_trajectories_on_two_dask_ranks(rollout, table):
    again = generate(rollout, seed=5)
    assert again.select(COLUMNS).equals(table.select(COLUMNS))
    other = generate(rollout, seed=6)
    assert not other.select(COLUMNS).equals(table.select(COLUMNS))
