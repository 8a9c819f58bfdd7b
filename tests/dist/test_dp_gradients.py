"""Data parallelism over gloo: a dp=2 update equals the single-process update of the whole batch,
and the replicas stay bit-identical."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from flowrl.actors import Gather, GroupMesh, Scatter, Session
from flowrl.config import ActorConfig, OptimConfig
from flowrl.data import experience as ex
from flowrl.roles.policy import PolicyRole


def _batch(num_rows: int = 12, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(10, 40, size=rng.integers(2, 5)).tolist() for _ in range(num_rows)]
    responses = [rng.integers(10, 40, size=rng.integers(1, 6)).tolist() for _ in range(num_rows)]
    adv = [rng.normal(size=len(r)).astype(np.float32).tolist() for r in responses]
    ref = [(-rng.random(len(r)) * 3).astype(np.float32).tolist() for r in responses]
    return pa.table(
        {
            "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
            "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
            "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
            "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
            "ref_logprobs": ex.from_lists(ref, ex.TOKEN_FLOATS),
        }
    )


ACTOR = ActorConfig(
    data_parallel_size=2,
    optim=OptimConfig(lr=1e-2, grad_clip=1.0),
    ppo_micro_batch_size_per_gpu=2,  # several micro-batches per rank: accumulation is exercised
    use_kl_loss=True,
    kl_loss_coef=0.1,
)


def test_dp2_update_equals_single_process_and_replicas_are_identical(tiny_model_dir):
    table = _batch()
    kwargs = {"model_dir": str(tiny_model_dir), "actor": ACTOR, "use_old_logprobs": False, "response_length": 6}

    single = PolicyRole(rank=0, world_size=1, **kwargs)
    before = {k: v.clone() for k, v in single.hf_state_dict().items()}
    single_metrics = single.update(table, mini_batch_rows=table.num_rows)
    expected = single.hf_state_dict()
    expected_grads = single.grad_state_dict()

    with Session.start(2, timeout_s=120, startup_timeout_s=120) as session:
        group = session.create_group("actor", "flowrl.roles.policy:PolicyRole", kwargs, mesh=GroupMesh(dp=2))
        metrics, _ = group.run(group.reserve(), "update", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.ALL,
                               kwargs={"mini_batch_rows": table.num_rows // 2})
        states, _ = group.run(group.reserve(), "hf_state_dict", gather_mode=Gather.ALL)
        grads, _ = group.run(group.reserve(), "grad_state_dict", gather_mode=Gather.ALL)

    assert any(not torch.equal(before[k], expected[k]) for k in expected)  # the step did something
    assert set(grads[0]) == set(expected_grads)
    for name in expected_grads:
        # the all-reduced gradient of two half batches == the gradient of the whole batch
        torch.testing.assert_close(grads[0][name], expected_grads[name], atol=1e-7, rtol=1e-5, msg=name)
        assert torch.equal(grads[0][name], grads[1][name])
    for name in expected:
        assert torch.equal(states[0][name], states[1][name]), f"replicas differ at {name}"
    # the metrics are global: both ranks report the same, and they match the single process
    def same(k: str) -> bool:  # per-rank wall time, and perf/* (this rank's time and peak memory)
        return k != "actor/update_s" and not k.startswith("perf/")

    assert {k: v for k, v in metrics[0].items() if same(k)} == {k: v for k, v in metrics[1].items() if same(k)}
    assert "perf/train_tokens_per_s" in metrics[0] and "perf/max_rss_gb" in metrics[0]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
        assert metrics[0][key] == pytest.approx(single_metrics[key], rel=1e-4, abs=1e-6), key
