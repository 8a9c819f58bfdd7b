"""Multi-turn rollouts through the rollout role on the hf engine, and what the trainer makes of
them: tool tokens are context (their log-probs computed like every other) but never loss."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from flowrl.backends.interfaces import SamplingParams
from flowrl.config import ActorConfig, OptimConfig
from flowrl.config.multi_turn import MultiTurnConfig
from flowrl.data import experience as ex
from flowrl.nodes.generation import agent_metrics
from flowrl.roles.rollout import RolloutRole

MULTI_TURN = MultiTurnConfig(enable=True, tools=["calculator"], parser="flowrl_testing.agents:always_calculator",
                             max_turns=3)
SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=40)


def prompts() -> pa.Table:
    return pa.table({"prompt_ids": ex.from_lists([[10, 11, 12], [13, 14]], ex.TOKEN_IDS),
                     "group": pa.array([0, 1], pa.int64())})


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """The tiny model, its weights edited towards EOS so random turns end early (in the weights,
    not a sampling-time processor: the hf engine's decode loop applies none)."""
    from conftest import build_tiny_model_dir

    from flowrl_testing.agents import bias_towards_eos

    path = build_tiny_model_dir(tmp_path_factory.mktemp("eos_model"), arch="llama")  # llama: see agent_task.py
    bias_towards_eos(path)
    return path


def role(model_dir, rank: int = 0, multi_turn=MULTI_TURN) -> RolloutRole:
    return RolloutRole(rank=rank, world_size=2, model_dir=str(model_dir), sampling=SAMPLING, multi_turn=multi_turn)


@pytest.fixture(scope="module")
def agent_table(tiny_model_dir) -> pa.Table:
    return role(tiny_model_dir).generate(prompts(), seed=3)


def test_tool_answers_are_in_the_response_with_mask_zero(agent_table, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    t = agent_table
    assert max(t.column("num_turns").to_pylist()) >= 2
    assert t.num_rows == 4 and t.column("uid").to_pylist() == ["0-0", "0-1", "1-0", "1-1"]
    for row in t.to_pylist():
        resp, mask, spans = row["response_ids"], row["response_mask"], row["turn_spans"]
        assert len(resp) == len(mask) == len(row["rollout_logprobs"]) <= SAMPLING.max_new_tokens
        assert spans[0][0] == 0 and spans[-1][1] == len(resp)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous turns
        for start, end, kind in spans:  # token by token: model turns 1, tool turns 0
            assert mask[start:end] == [kind] * (end - start)
            if kind == 0:
                assert tok.decode(resp[start:end]) == "\n<tool_response>\n2\n</tool_response>\n"
        assert mask[-1] == 1  # a trajectory ends on a model token (the outcome reward's place)
        assert row["num_turns"] == sum(k for *_, k in spans)
        assert row["tool_calls"] in (row["num_turns"] - 1, row["num_turns"])  # the last turn's call may not run
        assert row["finish_reason"] in ("max_turns", "length") and row["tool_errors"] == 0


def test_agent_metrics(agent_table):
    m = agent_metrics(agent_table)
    assert m["agent/tool_error_frac"] == 0.0 and m["agent/well_formed_call_frac"] == 1.0
    assert 1.0 <= m["agent/num_turns/mean"] <= 3.0
    assert sum(m[f"agent/finish_reason/{r}"] for r in ("stop", "length", "max_turns")) == pytest.approx(1.0)
    assert agent_metrics(agent_table.drop_columns(["num_turns"])) == {}


def test_rollout_logprobs_cover_the_whole_response_as_the_trainer_computes_them(agent_table, tiny_model_dir):
    """Model tokens: sampled log-probs; tool tokens: teacher-forced. Both equal the trainer's
    teacher-forced log-probs over prompt + the whole response (tool tokens as context)."""
    from flowrl.roles.policy import PolicyRole

    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False)
    policy = PolicyRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor, use_old_logprobs=False)
    trainer_T, _ = ex.token_column(policy.compute_logprobs(agent_table), "old_logprobs")
    rollout_T, _ = ex.token_column(agent_table, "rollout_logprobs")
    torch.testing.assert_close(rollout_T, trainer_T, atol=2e-4, rtol=0)


def test_the_actor_loss_never_sees_tool_tokens(agent_table, tiny_model_dir):
    """The gradient of the actor's loss w.r.t. each token's log-prob is 0 exactly on tool tokens
    (and not on model tokens), whatever advantage the tool tokens carry."""
    from flowrl.roles.policy import PolicyRole

    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False)
    policy = PolicyRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor, use_old_logprobs=False)
    mask_T, cu = ex.token_column(agent_table, "response_mask")
    adv = ex.list_column(torch.linspace(-1, 2, mask_T.numel()), cu, ex.TOKEN_FLOATS)  # non-zero everywhere
    table = ex.with_columns(agent_table, advantages=adv)
    grads = []

    def train_step(batch, *, micro_batch_size, loss_fn, temperature=1.0, with_entropy=True):
        logp_T, _ = policy.engine.forward_logprobs(batch, micro_batch_size=micro_batch_size, temperature=temperature)
        logp_T = logp_T.detach().requires_grad_(True)
        loss, _ = loss_fn(logp_T, None, batch)
        loss.backward()
        grads.append(logp_T.grad)
        return {}

    policy.engine.train_step = train_step
    policy.update(table, mini_batch_rows=table.num_rows)
    (grad_T,) = grads
    assert int((mask_T == 0).sum()) > 0
    assert bool((grad_T[mask_T == 0] == 0).all()) and bool((grad_T[mask_T == 1] != 0).all())


def test_same_seed_same_trajectories_on_two_ranks(tiny_model_dir):
    cols = ["response_ids", "response_mask", "rollout_logprobs", "turn_spans", "finish_reason"]
    r0, r1 = role(tiny_model_dir, 0), role(tiny_model_dir, 1)
    a0, a1 = r0.generate(prompts(), seed=5).select(cols), r1.generate(prompts(), seed=5).select(cols)
    assert a0.equals(r0.generate(prompts(), seed=5).select(cols))
    assert a1.equals(role(tiny_model_dir, 1).generate(prompts(), seed=5).select(cols))
    assert not a0.equals(a1)  # ranks draw their own samples


def test_multi_turn_off_is_the_single_turn_path(tiny_model_dir):
    off = role(tiny_model_dir, multi_turn=MultiTurnConfig()).generate(prompts(), seed=5)
    plain = RolloutRole(rank=0, world_size=2, model_dir=str(tiny_model_dir), sampling=SAMPLING).generate(prompts(), seed=5)
    assert off.equals(plain) and "num_turns" not in off.column_names
