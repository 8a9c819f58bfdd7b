"""Multi-process gloo helpers for the fsdp backend's tests: run a function on ``world`` ranks
(torch multiprocessing, a fresh process group), each rank's return value pickled back."""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import pyarrow as pa


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, out: str, backend: str = "gloo") -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=300))
    try:
        result = fn(rank, world, *args)
        with open(os.path.join(out, f"{rank}.pkl"), "wb") as fh:
            pickle.dump(result, fh)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn: Callable, *args: Any, timeout_s: float = 600, backend: str = "gloo") -> list[Any]:
    """``[fn(rank, world, *args) for every rank]``, each in its own process of one ``backend`` group."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_entry, args=(world, _free_port(), fn, args, out, backend), nprocs=world,
                                 join=False, start_method="spawn")
        import time

        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"run_ranks: {world} ranks still running after {timeout_s}s")
        results = []
        for rank in range(world):
            with open(os.path.join(out, f"{rank}.pkl"), "rb") as fh:
                results.append(pickle.load(fh))
        return results


def batch(num_rows: int = 12, seed: int = 0) -> pa.Table:
    """Random prompts, responses, advantages and reference log-probs (as the dp test's)."""
    from flowrl.data import experience as ex

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(10, 40, size=rng.integers(2, 5)).tolist() for _ in range(num_rows)]
    responses = [rng.integers(10, 40, size=rng.integers(1, 6)).tolist() for _ in range(num_rows)]
    adv = [rng.normal(size=len(r)).astype(np.float32).tolist() for r in responses]
    ref = [(-rng.random(len(r)) * 3).astype(np.float32).tolist() for r in responses]
    return pa.table({
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "ref_logprobs": ex.from_lists(ref, ex.TOKEN_FLOATS),
    })


def actor_cfg(strategy: str, world: int):
    from flowrl.config import ActorConfig, OptimConfig

    # lr 1e-3: Adam's first step moves every weight by about lr whatever its gradient's size, so
    # the ranks' summation-order differences in near-zero gradients show in the parameters scaled
    # by lr (at 1e-2: up to 1.02e-5 between fsdp at 2 ranks and dp on one CPU, 1.3e-6 on another).
    return ActorConfig(strategy=strategy, data_parallel_size=world, optim=OptimConfig(lr=1e-3, grad_clip=1.0),
                       ppo_micro_batch_size_per_gpu=2, use_kl_loss=True, kl_loss_coef=0.1)


def policy_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table) -> dict:
    """One rank: log-probs of the whole ``table``, then one update on this rank's contiguous share;
    returns the log-probs, the full state after the step (rank 0), the per-rank state bytes."""
    from flowrl.data.packed import PackedBatch
    from flowrl.roles.policy import PolicyRole

    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor_cfg(strategy, world),
                      use_old_logprobs=False, response_length=6)
    logp, _ = role.engine.forward_logprobs(PackedBatch.from_table(table), micro_batch_size=2)
    per = table.num_rows // world
    metrics = role.update(table.slice(rank * per, per), mini_batch_rows=per)
    state = role.hf_state_dict()
    out = {"logp": logp, "state": state, "metrics": metrics}
    if hasattr(role.engine, "state_bytes_local"):
        out["bytes"] = role.engine.state_bytes_local()
    return out


FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")


def build_family_dir(path, family: str, vocab_size: int = 64):
    """A tiny randomly initialised ``family`` causal LM saved in ``path`` (built in code)."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab_size, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "gpt2":
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, **common)
    else:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[family]
        config = cls(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                     tie_word_embeddings=family in ("qwen2", "qwen3"), **common)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def full_optim(engine) -> dict:
    """AdamW's ``exp_avg`` / ``exp_avg_sq`` by HF name, gathered whole (any engine)."""
    from flowrl.backends.train.fsdp_tensors import full as _full

    out: dict = {}
    for n, p in engine.model.named_parameters():
        state = engine.optimizer.state.get(p) or {}
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                out.setdefault(key, {})[n] = _full(state[key]).clone()
    return out


def save_after_step(rank: int, world: int, model_dir: str, table: pa.Table, path: str) -> dict:
    """One fsdp update on this rank's share, then a sharded checkpoint; the full state (rank 0)."""
    from flowrl.roles.policy import PolicyRole

    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor_cfg("fsdp", world),
                      use_old_logprobs=False, response_length=6)
    per = table.num_rows // world
    role.update(table.slice(rank * per, per), mini_batch_rows=per)
    saved = role.save_checkpoint(path, step=1, extra={"next_step": 2})
    return {"saved": saved, "state": role.hf_state_dict(), "optim": full_optim(role.engine)}


def load_and_report(rank: int, world: int, model_dir: str, strategy: str, path: str) -> dict:
    """A fresh ``strategy`` policy restored from checkpoint ``path``: its full state and AdamW state."""
    from flowrl.roles.policy import PolicyRole

    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor_cfg(strategy, world),
                      use_old_logprobs=False, response_length=6)
    step = role.load_checkpoint(path)
    return {"step": step, "state": role.hf_state_dict(), "optim": full_optim(role.engine)}


def state_bytes(engine) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and AdamW state (dp or fsdp engine)."""
    from flowrl.backends.train.fsdp_tensors import local as _local

    def size(t) -> int:
        t = _local(t)
        return t.numel() * t.element_size()

    params = list(engine.model.parameters())
    optim = sum(size(v) for s in engine.optimizer.state.values() for v in s.values()
                if hasattr(v, "dim") and v.dim() > 0)
    return {"params": sum(size(p) for p in params),
            "grads": sum(size(p.grad) for p in params if p.grad is not None), "optim": optim}


def memory_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table) -> dict:
    """One update under ``strategy``; this rank's state bytes afterwards."""
    from flowrl.roles.policy import PolicyRole

    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor_cfg(strategy, world),
                      use_old_logprobs=False, response_length=6)
    per = table.num_rows // world
    role.update(table.slice(rank * per, per), mini_batch_rows=per)
    return state_bytes(role.engine)


# --------------------------------------------------------------------------- LoRA (model.lora_rank)
LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}
"""The adapters of the LoRA cases (``LoraSpec.to_dict()``)."""


def lora_role(rank: int, world: int, model_dir: str, strategy: str):
    from flowrl.roles.policy import PolicyRole

    return PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor_cfg(strategy, world),
                      use_old_logprobs=False, response_length=6, engine_kwargs={"lora": dict(LORA)})


def lora_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table, path: str | None = None) -> dict:
    """One LoRA update on this rank's share under ``strategy``: log-probs (adapters on) and the
    reference's (adapters off) after it, the merged full state (rank 0), the names the optimizer
    holds, this rank's state bytes; with ``path`` a checkpoint saved after the step."""
    from flowrl.data.packed import PackedBatch

    role = lora_role(rank, world, model_dir, strategy)
    per = table.num_rows // world
    metrics = role.update(table.slice(rank * per, per), mini_batch_rows=per)
    packed = PackedBatch.from_table(table)
    logp, _ = role.engine.forward_logprobs(packed, micro_batch_size=2)
    ref = role.compute_ref_logprobs(table).column("ref_logprobs").to_pylist()
    held = {id(p) for g in role.engine.optimizer.param_groups for p in g["params"]}
    out = {"logp": logp, "ref": ref, "metrics": metrics, "state": role.hf_state_dict(),
           "optimized": sorted(n for n, p in role.engine.model.named_parameters() if id(p) in held),
           "bytes": state_bytes(role.engine), "source": sorted(role.engine.reshard_source()),
           "adapter_bytes": sum(p.numel() * p.element_size() for p in role.engine.model.parameters() if id(p) in held)}
    if path is not None:
        out["saved"] = role.save_checkpoint(path, step=1, extra={"next_step": 2})
    return out


def lora_load(rank: int, world: int, model_dir: str, strategy: str, path: str) -> dict:
    """A fresh LoRA policy restored from checkpoint ``path``: its merged state and AdamW state."""
    role = lora_role(rank, world, model_dir, strategy)
    step = role.load_checkpoint(path)
    return {"step": step, "state": role.hf_state_dict(), "optim": full_optim(role.engine)}


def run_jobs(rank: int, world: int, jobs: list) -> list:
    """``[fn(rank, world, *args) for fn, args in jobs]`` in one process group: one spawn (and one
    set of imports) for many cases."""
    return [fn(rank, world, *args) for fn, args in jobs]


def run_cases(world: int, jobs: list, **kwargs: Any) -> list[list[Any]]:
    """Every job of ``jobs`` on ``world`` ranks of one group: ``out[job][rank]``."""
    per_rank = run_ranks(world, run_jobs, jobs, **kwargs)
    return [[per_rank[r][j] for r in range(world)] for j in range(len(jobs))]
