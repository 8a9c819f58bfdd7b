"""One update moves the policy the way the advantages say (single process, no cluster)."""

import pyarrow as pa
import torch

from flowrl.config import ActorConfig, OptimConfig
from flowrl.data import experience as ex
from flowrl.roles.policy import PolicyRole


def test_update_raises_logprobs_of_positive_advantage_and_lowers_negative(tiny_model_dir):
    prompts = [[10, 11, 12]] * 4
    responses = [[20, 21], [22, 23], [20, 21], [22, 23]]
    adv = [[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]]
    table = pa.table(
        {
            "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
            "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
            "response_mask": ex.from_lists([[1, 1]] * 4, pa.list_(pa.int8())),
            "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        }
    )
    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False)
    role = PolicyRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor, use_old_logprobs=False)
    before, _ = ex.token_column(role.compute_logprobs(table), "old_logprobs")
    before = before.clone()
    metrics = role.update(table, mini_batch_rows=4)
    after, _ = ex.token_column(role.compute_logprobs(table), "old_logprobs")
    delta = (after - before).view(4, 2)
    assert bool((delta[[0, 2]] > 0).all()), delta
    assert bool((delta[[1, 3]] < 0).all()), delta
    # on-policy: ratio is exactly 1, so nothing is clipped and the sampled-token KL is 0
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/ppo_kl"] == 0.0
    # token-mean of -adv * ratio with balanced advantages: (2 - 2 + 2 - 2) / 8 = 0
    assert abs(metrics["actor/pg_loss"]) < 1e-6
    assert torch.isfinite(torch.tensor(metrics["actor/grad_norm"]))


def test_dp_engine_steps_with_fused_adamw_and_the_same_update_as_the_plain_one(tiny_model_dir):
    """The dp engine's AdamW runs torch's fused kernel on CPU tensors; after three steps on the
    same gradients its parameters match the plain (for-loop) AdamW's to rounding."""
    from flowrl.backends.train.dp_policy import TorchDPEngine, adamw

    engine = TorchDPEngine(str(tiny_model_dir), lr=1e-2, weight_decay=0.1)
    assert engine.optimizer.param_groups[0]["fused"] is True
    params = list(engine.model.parameters())
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    plain = torch.optim.AdamW(copies, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)
    assert not plain.param_groups[0]["fused"]
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, c in zip(params, copies):
            p.grad = torch.randn(p.shape, generator=gen)
            c.grad = p.grad.clone()
        engine.optimizer.step()
        plain.step()
    assert max(float((p - c).abs().max()) for p, c in zip(params, copies)) < 1e-6
    frozen = adamw([torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)], lr=1e-3)
    assert not frozen.param_groups[0]["fused"]  # not a floating point tensor: the plain kernel
