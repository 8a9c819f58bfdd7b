"""The critic (single process, no cluster): values are read at the position that predicts each
response token, and updates regress them onto the returns, within the value clip."""

import pyarrow as pa
import pytest
import torch

from flowrl.config import CriticConfig, OptimConfig
from flowrl.data import experience as ex
from flowrl.roles.critic import CriticRole


def _table(values=None, returns=None):
    prompts = [[10, 11, 12], [10, 13], [14, 11, 12, 15]]
    responses = [[20, 21], [22, 23, 24], [20]]
    cols = {
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
    }
    if values is not None:
        cols["values"] = values
        cols["returns"] = ex.from_lists(returns, ex.TOKEN_FLOATS)
    return pa.table(cols)


def _critic(tiny_model_dir, **kw):
    cfg = CriticConfig(data_parallel_size=1, optim=OptimConfig(lr=3e-3), **kw)
    return CriticRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), critic=cfg, response_length=3)


def test_values_are_the_head_at_the_predicting_position(tiny_model_dir):
    role = _critic(tiny_model_dir)
    values_T, cu = ex.token_column(role.compute_values(_table()), "values")
    assert cu.tolist() == [0, 2, 5, 6]
    model = role.engine.model
    with torch.no_grad():  # row 1: prompt [10, 13], response [22, 23, 24] -> positions 1, 2, 3
        out = model(input_ids=torch.tensor([[10, 13, 22, 23, 24]])).logits[0, :, 0]
    torch.testing.assert_close(values_T[2:5], out[1:4], atol=1e-5, rtol=1e-5)


def test_updates_move_values_towards_the_returns(tiny_model_dir):
    role = _critic(tiny_model_dir, cliprange_value=10.0, ppo_epochs=4)
    base = _table()
    returns = [[1.0, 1.0], [0.0, 0.0, 0.0], [1.0]]
    values = role.compute_values(base).column("values")
    table = _table(values, returns)
    ret_T, _ = ex.token_column(table, "returns")

    def error():
        v, _ = ex.token_column(role.compute_values(base), "values")
        return float((v - ret_T).square().mean())

    before = error()
    metrics = role.update(table, mini_batch_rows=3)
    assert error() < before
    assert metrics["critic/num_optimizer_steps"] == 4
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"} <= set(metrics)


def test_value_clip_limits_the_move(tiny_model_dir):
    # A tiny clip range: once a prediction leaves v_old ± 1e-4 towards far returns, the clipped
    # branch (constant in v) dominates and vf_clipfrac reports it.
    role = _critic(tiny_model_dir, cliprange_value=1e-4, ppo_epochs=3)
    base = _table()
    table = _table(role.compute_values(base).column("values"), [[50.0, 50.0], [50.0, 50.0, 50.0], [50.0]])
    metrics = role.update(table, mini_batch_rows=3)
    assert metrics["critic/vf_clipfrac"] > 0
    with pytest.raises(Exception):
        CriticConfig(cliprange_value=-1.0)
