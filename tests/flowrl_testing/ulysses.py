"""Ulysses sequence parallelism's parity cases: one rank's log-probs, entropies, one update's
loss and gradients (policy), values and one value update (critic), run unsplit on one rank and
split over an sp group; each returns what the test compares."""

from __future__ import annotations

import contextlib

import pyarrow as pa

LAYOUTS = {"rows": {}, "packed": {"budget": 24}, "shared": {"shared": True}}
"""Padded rows, token-budget packed lines (``use_dynamic_bsz``), shared-prompt lines (``use_prefix_grouper``)."""


def long_batch(num_rows: int = 8, seed: int = 1) -> pa.Table:
    """``flowrl_testing.fsdp.batch`` with longer sequences (prompts 3-9, responses 2-12 tokens),
    GRPO-like groups of two rows sharing a prompt (for the shared-prompt layout)."""
    import numpy as np

    from flowrl.data import experience as ex

    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(num_rows // 2):
        p = rng.integers(10, 40, size=rng.integers(3, 10)).tolist()
        prompts += [p, p]
    responses = [rng.integers(10, 40, size=rng.integers(2, 13)).tolist() for _ in range(num_rows)]
    adv = [rng.normal(size=len(r)).astype(np.float32).tolist() for r in responses]
    ref = [(-rng.random(len(r)) * 3).astype(np.float32).tolist() for r in responses]
    old = [(-rng.random(len(r)) * 3).astype(np.float32).tolist() for r in responses]
    values = [rng.normal(size=len(r)).astype(np.float32).tolist() for r in responses]
    return pa.table({
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "returns": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "values": ex.from_lists(values, ex.TOKEN_FLOATS),
        "ref_logprobs": ex.from_lists(ref, ex.TOKEN_FLOATS),
        "old_logprobs": ex.from_lists(old, ex.TOKEN_FLOATS),
    })


@contextlib.contextmanager
def _eager_attention(on: bool):
    """With ``on``: the dp engine loads its model with eager attention (this process, for the block)."""
    from flowrl.backends.train.dp_policy import TorchDPEngine

    load = TorchDPEngine._load_model

    def eager_load(self, model_dir, dtype):  # noqa: ANN001, ANN202
        model = load(self, model_dir, dtype)
        model.set_attn_implementation("eager")
        return model

    if on:
        TorchDPEngine._load_model = eager_load
    try:
        yield
    finally:
        TorchDPEngine._load_model = load


def _share(table: pa.Table, rank: int, world: int) -> pa.Table:
    per = table.num_rows // world
    return table.slice(rank * per, per)


def policy_case(rank: int, world: int, model_dir: str, strategy: str, sp: int, table: pa.Table, budget: int = 0,
                shared: bool = False, recompute: bool = False, eager: bool = False) -> dict:
    """Log-probs and entropies of this rank's share, then one update (old log-probs used, KL
    loss on) of it: the metrics and the reduced gradients. ``recompute``: fsdp's gradient
    checkpointing (``model.enable_gradient_checkpointing``: attention runs again in the backward);
    ``eager``: the model loaded with transformers' eager attention (dp strategy), not sdpa."""
    from flowrl.backends.train.ulysses_options import sequence_parallel_kwargs
    from flowrl.config import ActorConfig, OptimConfig
    from flowrl.roles.policy import PolicyRole

    actor = ActorConfig(strategy=strategy, data_parallel_size=world, ulysses_sequence_parallel_size=sp,
                        optim=OptimConfig(lr=1e-3, grad_clip=1.0), ppo_micro_batch_size_per_gpu=2, use_kl_loss=True,
                        kl_loss_coef=0.1, entropy_coeff=0.01, use_dynamic_bsz=budget > 0,
                        ppo_max_token_len_per_gpu=budget, log_prob_use_dynamic_bsz=budget > 0,
                        log_prob_max_token_len_per_gpu=budget, use_prefix_grouper=shared)
    with _eager_attention(eager):
        role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor, use_old_logprobs=True,
                          response_length=12,  # engine arguments as roles.specs gives them
                          engine_kwargs={**sequence_parallel_kwargs(actor),
                                         **({"gradient_checkpointing": True} if recompute else {})})
    share = _share(table, rank, world)
    logp, entropy = role.engine.forward_logprobs(role._log_prob_batch(share), micro_batch_size=2, with_entropy=True)
    metrics = role.update(share, mini_batch_rows=share.num_rows)
    return {"logp": logp, "entropy": entropy, "metrics": metrics, "grads": role.grad_state_dict(),
            "split": role.engine.ulysses is not None}


def critic_case(rank: int, world: int, model_dir: str, strategy: str, sp: int, table: pa.Table, budget: int = 0,
                shared: bool = False) -> dict:
    """Values of this rank's share, then one value update of it: metrics and reduced gradients."""
    from flowrl.config import CriticConfig, OptimConfig
    from flowrl.roles.critic import CriticRole

    critic = CriticConfig(strategy=strategy, data_parallel_size=world, ulysses_sequence_parallel_size=sp,
                          optim=OptimConfig(lr=1e-3, grad_clip=1.0), ppo_micro_batch_size_per_gpu=2,
                          forward_micro_batch_size_per_gpu=2, use_dynamic_bsz=budget > 0,
                          ppo_max_token_len_per_gpu=budget, forward_max_token_len_per_gpu=budget,
                          use_prefix_grouper=shared)
    role = CriticRole(rank=rank, world_size=world, model_dir=model_dir, critic=critic, response_length=12)
    share = _share(table, rank, world)
    values = role.compute_values(share.select(["prompt_ids", "response_ids"])).column("values")
    metrics = role.update(share, mini_batch_rows=share.num_rows)
    return {"values": values, "metrics": metrics, "grads": role.engine.grad_state_dict(),
            "split": role.engine.ulysses is not None}


def reference_case(rank: int, world: int, model_dir: str, strategy: str, sp: int, table: pa.Table) -> dict:
    """The reference role's log-probs of this rank's share."""
    from flowrl.roles.reference import ReferenceRole

    kwargs = {"ulysses_sequence_parallel_size": sp} if sp > 1 else {}
    role = ReferenceRole(rank=rank, world_size=world, model_dir=model_dir, strategy=strategy, micro_batch_size=2,
                         engine_kwargs=kwargs)
    return {"logp": role.compute_logprobs(_share(table, rank, world)).column("ref_logprobs"),
            "split": role.engine.ulysses is not None}
