"""The tiny MoE model's multi-rank helpers (tests/dist/test_moe_fsdp.py): a rollout table with
recorded routes, and one policy step per rank under dp or fsdp, with or without routing replay."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def build_moe_dir(path) -> str:
    """The tiny Qwen3-MoE preset (``tiny_preset("moe")``) saved in ``path`` with its tokenizer."""
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    tok = build_char_tokenizer()
    build_tiny_model(tok, **tiny_preset("moe")).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def rollout_table(model_dir: str, num_prompts: int = 6, n: int = 2, seed: int = 0) -> pa.Table:
    """``num_prompts`` addition prompts x ``n`` samples from the hf backend, with its routes,
    random advantages and reference log-probs."""
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.data import experience as ex
    from flowrl.models.char_tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    rng = np.random.default_rng(seed)
    prompts = [tok.encode(f"{a}+{b}=") for a, b in rng.integers(0, 100, size=(num_prompts, 2))]
    gen = HFGenerator(model_dir)
    responses, logprobs = gen.generate(prompts, SamplingParams(n=n, max_new_tokens=5), seed=seed)
    return pa.table({
        "prompt_ids": ex.from_lists([p for p in prompts for _ in range(n)], ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        "rollout_logprobs": ex.from_lists(logprobs, ex.TOKEN_FLOATS),
        "advantages": ex.from_lists([rng.normal(size=len(r)).astype(np.float32) for r in responses], ex.TOKEN_FLOATS),
        "ref_logprobs": ex.from_lists([(-rng.random(len(r)) * 3).astype(np.float32) for r in responses],
                                      ex.TOKEN_FLOATS),
        "routed_experts": ex.from_lists(gen.last_routed_experts, pa.list_(pa.int16())),
    })


def moe_actor(strategy: str, world: int, replay: bool):
    from flowrl.config import ActorConfig, OptimConfig

    return ActorConfig(strategy=strategy, data_parallel_size=world, optim=OptimConfig(lr=1e-3, grad_clip=1.0),
                       ppo_micro_batch_size_per_gpu=2, use_kl_loss=True, kl_loss_coef=0.1,
                       use_dynamic_bsz=False, log_prob_use_dynamic_bsz=False, use_prefix_grouper=False,
                       router_replay=replay, moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)


def moe_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table, replay: bool) -> dict:
    """One rank: old log-probs of the whole table (replayed or not), then one update on this rank's
    contiguous share; the log-probs, the full state after the step (rank 0) and the metrics."""
    from flowrl.roles.policy import PolicyRole

    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=moe_actor(strategy, world, replay),
                      use_old_logprobs=False, response_length=5)
    logp = role.compute_logprobs(table).column("old_logprobs").to_pylist()
    per = table.num_rows // world
    metrics = role.update(table.slice(rank * per, per), mini_batch_rows=per)
    return {"logp": np.concatenate([np.asarray(x, dtype=np.float32) for x in logp]), "state": role.hf_state_dict(),
            "metrics": metrics}
