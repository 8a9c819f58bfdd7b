"""Multi-turn, tool-using rollouts on the ``vllm`` backend (CPU build): the rollout role's agent
loop drives the vLLM engine turn by turn, runs the calculator, appends its answers with
``response_mask`` 0, and the log-probs it records (sampled for the model's tokens, the engine's
teacher-forced ones for the tool's) equal transformers' over the whole response. Runs in the vLLM
environment (``test_vllm_env.py``)."""

import pyarrow as pa
import pytest
import torch
from conftest import build_tiny_model_dir

from flowrl.backends.generate.hf import HFGenerator
from flowrl.backends.interfaces import SamplingParams
from flowrl.config.multi_turn import MultiTurnConfig
from flowrl.data import experience as ex
from flowrl.roles.rollout import RolloutRole

SAMPLING = SamplingParams(n=4, temperature=1.0, max_new_tokens=160)
MULTI_TURN = MultiTurnConfig(enable=True, tools=["calculator"], parser="flowrl_testing.agents:always_calculator",
                             max_turns=3)
TOOL_TURN = "\n<tool_response>\n2\n</tool_response>\n"  # calculator(1+1), no tool role in the template


def prompts() -> pa.Table:
    return pa.table({"prompt_ids": ex.from_lists([[10, 11, 12], [13, 14], [15, 16, 17, 18], [20]], ex.TOKEN_IDS),
                     "group": pa.array([0, 1, 2, 3], pa.int64())})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # llama (the character tokenizer keeps its newlines), head_dim 32 for vLLM's CPU attention
    return build_tiny_model_dir(tmp_path_factory.mktemp("agent_vllm"), arch="llama", hidden_size=64, num_heads=2,
                                num_kv_heads=1, intermediate_size=128, max_position_embeddings=256)


@pytest.fixture(scope="module")
def role(model_dir):
    r = RolloutRole(rank=0, world_size=1, model_dir=str(model_dir), backend="vllm", sampling=SAMPLING,
                    multi_turn=MULTI_TURN, engine_kwargs=dict(enforce_eager=True, max_model_len=256, max_num_seqs=64))
    yield r
    r.close()


@pytest.fixture(scope="module")
def table(role):
    return role.generate(prompts(), seed=3)


def test_tool_turns_through_the_vllm_engine(table, model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert table.num_rows == 16 and max(table.column("num_turns").to_pylist()) >= 2
    for row in table.to_pylist():
        resp, mask, spans = row["response_ids"], row["response_mask"], row["turn_spans"]
        assert len(resp) == len(mask) == len(row["rollout_logprobs"]) <= SAMPLING.max_new_tokens
        assert spans[0][0] == 0 and spans[-1][1] == len(resp) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        for start, end, kind in spans:  # token by token: the model's turns 1, the tool's 0
            assert mask[start:end] == [kind] * (end - start)
            if kind == 0:
                assert tok.decode(resp[start:end]) == TOOL_TURN
        assert mask[-1] == 1 and row["num_turns"] == sum(k for *_, k in spans)
        assert row["finish_reason"] in ("max_turns", "length") and row["tool_errors"] == 0


def test_the_same_seed_gives_the_same_trajectories(role, table):
    cols = ["response_ids", "response_mask", "rollout_logprobs", "turn_spans", "finish_reason"]
    assert role.generate(prompts(), seed=3).select(cols).equals(table.select(cols))
    assert not role.generate(prompts(), seed=4).select(cols).equals(table.select(cols))


def test_rollout_logprobs_equal_transformers_over_the_whole_response(table, model_dir):
    hf = HFGenerator(str(model_dir))
    expected = hf.logprobs(table.column("prompt_ids").to_pylist(), table.column("response_ids").to_pylist())
    got_T, _ = ex.token_column(table, "rollout_logprobs")
    torch.testing.assert_close(got_T, torch.tensor([x for row in expected for x in row]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [1.0])  # other temperatures need the engine's max_logprobs=-1
def test_teacher_forced_logprobs_equal_transformers(role, model_dir, temperature):
    prompt_ids, responses = [[10, 11, 12], [20]], [[30, 31, 32, 1], [40, 41]]
    got = role.engine.logprobs(prompt_ids, responses, temperature=temperature)
    want = HFGenerator(str(model_dir)).logprobs(prompt_ids, responses, temperature=temperature)
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), atol=1e-5, rtol=0)
