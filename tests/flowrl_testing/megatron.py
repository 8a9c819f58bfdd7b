"""Helpers shared by the megatron backend's CPU (gloo) and GPU (NCCL) parity checks.

Tiny Llama/Qwen2 checkpoints built in code, a batch with per-token advantages, a plain
single-process torch reference (transformers forward + one AdamW step with megatron's clipping and
weight-decay rules), a per-layout check run inside each rank, and a spawn helper whose every wait
has a timeout.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

# eps well above float32 gradient noise: Adam's first step is lr * g / (|g| + eps), which turns
# 1e-9 differences in near-zero gradients into lr * 1e-9 / eps differences in the weights.
HYPERS = dict(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-6, grad_clip=0.5)


# ----------------------------------------------------------------------------- processes
def init_process_group(rank: int, world_size: int, port: int, backend: str = "gloo") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def spawn(fn: Callable, *, world_size: int, args: tuple = (), timeout_s: float = 300,
          start_method: str | None = None) -> None:
    """Run ``fn(rank, *args)`` in ``world_size`` fresh processes; raise if any fails or hangs.

    Without CUDA the default is ``forkserver`` with megatron, transformers and ``fn``'s module
    preloaded in the server: the imports (most of a small test's time) are paid once per session
    instead of once per rank and launch. The server never computes, so forking it is safe. With
    CUDA the default is ``spawn`` (the server must not touch the driver before forking).
    """
    import multiprocessing

    import torch.multiprocessing as mp

    if start_method is None:
        start_method = "spawn" if torch.cuda.is_available() else "forkserver"
    if start_method == "forkserver":  # no effect once this session's server runs
        import multiprocessing.forkserver as forkserver

        # tests/conftest.py set the session's list (megatron's modules with the Dask workers'): add fn's.
        current = list(getattr(forkserver._forkserver, "_preload_modules", None) or [])
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            (current or ["flowrl.backends.train.megatron.engine", "transformers"]) + [fn.__module__])
    ctx = mp.start_processes(fn, args=args, nprocs=world_size, join=False,
                             start_method=start_method)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size} ranks of {fn.__name__} still running after "
                                   f"{timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)


# ----------------------------------------------------------------------------- model and data
def make_tiny_model(path: str, *, kind: str = "llama", vocab_size: int = 61, hidden_size: int = 32,
                    num_layers: int = 4, num_heads: int = 4, num_kv_heads: int = 2,
                    ffn_hidden_size: int = 64, tied: bool = False, seed: int = 0):
    """Save a randomly initialised tiny HF model (norms and biases perturbed) to ``path``."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kind]
    config = cls(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=ffn_hidden_size,
                 num_hidden_layers=num_layers, num_attention_heads=num_heads,
                 num_key_value_heads=num_kv_heads, max_position_embeddings=256,
                 tie_word_embeddings=tied, rope_theta=5000.0, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return model


def make_batch(*, num_items: int, vocab_size: int, seed: int = 1) -> list[dict[str, Any]]:
    """Items of varied prompt/response lengths with a per-token 'advantages' list."""
    g = torch.Generator().manual_seed(seed)
    batch = []
    for i in range(num_items):
        prompt_len, response_len = 1 + (3 * i) % 5, 1 + (5 * i + 2) % 7
        batch.append({
            "prompt_ids": torch.randint(0, vocab_size, (prompt_len,), generator=g).tolist(),
            "response_ids": torch.randint(0, vocab_size, (response_len,), generator=g).tolist(),
            "advantages": torch.randn(response_len, generator=g).tolist(),
        })
    return batch


ENTROPY_COEF = 0.01


def pg_loss_fn(total_tokens: int) -> Callable:
    """Token-mean (over the global batch) of -logp * advantage - ENTROPY_COEF * entropy: a
    micro-batch's share of it (the entropy term checks the entropy's gradient too)."""
    def loss_fn(logp_T, entropy_T, items, cu_seqlens_B1):
        adv_T = torch.tensor([a for it in items for a in it["advantages"]], dtype=logp_T.dtype,
                             device=logp_T.device)
        loss = -(logp_T * adv_T + ENTROPY_COEF * entropy_T).sum() / total_tokens
        return loss, {"entropy": entropy_T.mean().detach(), "tokens": torch.tensor(len(adv_T))}
    return loss_fn


# ----------------------------------------------------------------------------- reference
def _hf_logprobs(model, batch, temperature=1.0):
    logps, entropies = [], []
    for item in batch:
        ids = torch.tensor([item["prompt_ids"] + item["response_ids"]])
        logits = model(ids).logits[0].float() / temperature
        p = len(item["prompt_ids"])
        logsm = torch.log_softmax(logits[p - 1:-1], dim=-1)
        logps.append(logsm.gather(1, ids[0, p:, None]).squeeze(1))
        entropies.append(-(logsm.exp() * logsm).sum(-1))
    return logps, entropies


def reference(model_dir: str, batch: list[dict], *, temperatures=(1.0, 0.7)) -> dict[str, Any]:
    """transformers log-probs, and the state after one AdamW step as MegatronEngine takes it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for t in temperatures:
            logps, entropies = _hf_logprobs(model, batch, t)
            out[f"logp@{t}"] = [x.numpy() for x in logps]
            out[f"entropy@{t}"] = [x.numpy() for x in entropies]
    total = sum(len(it["response_ids"]) for it in batch)
    logps, entropies = _hf_logprobs(model, batch)
    adv = torch.tensor([a for it in batch for a in it["advantages"]])
    loss = -(torch.cat(logps) * adv + ENTROPY_COEF * torch.cat(entropies)).sum() / total
    loss.backward()
    params = dict(model.named_parameters())
    decay = [p for n, p in params.items() if p.ndim > 1 and not n.endswith("bias")]
    no_decay = [p for n, p in params.items() if not (p.ndim > 1 and not n.endswith("bias"))]
    h = HYPERS
    out["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(list(params.values()), h["grad_clip"]))
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": h["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=h["lr"], betas=h["betas"], eps=h["eps"])
    opt.step()
    out["loss"] = float(loss.detach())
    out["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out


# ----------------------------------------------------------------------------- in-rank checks
def _max_diff(got, want) -> float:
    return max((abs(g - w).max() if len(w) else 0.0 for g, w in zip(got, want)), default=0.0)


def _all_max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")


def _dp_replicas_identical(engine) -> bool:
    from megatron.core import parallel_state as ps

    flat = torch.cat([t.detach().float().reshape(-1) for m in engine.models
                      for t in engine._local_state(m).values()])
    group = ps.get_data_parallel_group()
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(copies, flat, group=group)
    same = torch.tensor([float(all(torch.equal(c, flat) for c in copies))], device=flat.device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


def check_layout(model_dir: str, ref: dict, batch: list[dict], *, dp: int, tp: int, pp: int,
                 vpp: int | None = None, bf16: bool = False,
                 use_distributed_optimizer: bool = False,
                 micro_batch_size: int = 2, make_vocab_size_divisible_by: int = 128,
                 export_dir: str | None = None) -> dict[str, Any]:
    """Build an engine for one layout and measure it against ``ref``; the same on every rank."""
    from megatron.core import parallel_state as ps

    from flowrl.backends.train.megatron.engine import MegatronEngine

    engine = MegatronEngine(model_dir, tp=tp, pp=pp, vpp=vpp, dp=dp, bf16=bf16,
                            use_distributed_optimizer=use_distributed_optimizer,
                            make_vocab_size_divisible_by=make_vocab_size_divisible_by, **HYPERS)
    dp_rank, n = ps.get_data_parallel_rank(), len(batch) // dp
    share = slice(dp_rank * n, (dp_rank + 1) * n)
    result: dict[str, Any] = {}
    for t in (1.0, 0.7):
        logps, entropies = engine.forward_logprobs(batch[share], micro_batch_size=micro_batch_size,
                                                   temperature=t, with_entropy=True)
        result[f"logp@{t}"] = _all_max(_max_diff(logps, ref[f"logp@{t}"][share]))
        result[f"entropy@{t}"] = _all_max(_max_diff(entropies, ref[f"entropy@{t}"][share]))
    total = sum(len(it["response_ids"]) for it in batch)
    stats = engine.train_step(batch[share], micro_batch_size=micro_batch_size,
                              loss_fn=pg_loss_fn(total))
    result["grad_norm"] = abs(stats["grad_norm"] - ref["grad_norm"])
    result["loss"] = abs(stats["loss"] - ref["loss"])
    result["dp_identical"] = _dp_replicas_identical(engine)
    state = engine.hf_state_dict()
    if dist.get_rank() == 0:
        want = {k: v for k, v in ref["state"].items() if k in state}
        missing = set(ref["state"]) - set(state) - (
            {"lm_head.weight"} if engine.arch.tied_embeddings else set())
        assert not missing, f"gathered state lacks {missing}"
        result["state"] = max(float((state[k].float() - v).abs().max()) for k, v in want.items())
    result["param_bytes"] = engine.param_bytes_local()
    if export_dir is not None:  # the trained model's log-probs, to compare with the export's
        engine.save_hf(export_dir)
        logps, _ = engine.forward_logprobs(batch[share], micro_batch_size=micro_batch_size)
        shares = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object((dp_rank, [x.tolist() for x in logps]), shares, dst=0)
        if dist.get_rank() == 0:
            result["logp_after"] = [x for d in range(dp) for x in dict(shares)[d]]
    engine.close()
    return result


def measure_param_bytes(model_dir: str, *, dp: int, tp: int, pp: int) -> dict[str, Any]:
    """Per-rank parameter bytes of one layout (gathered on every rank, global-rank order)."""
    from megatron.core import parallel_state as ps

    from flowrl.backends.train.megatron.engine import MegatronEngine

    engine = MegatronEngine(model_dir, tp=tp, pp=pp, dp=dp, **HYPERS)
    mine = torch.tensor([engine.param_bytes_local(), ps.get_data_parallel_rank(), engine.checkpoint_bytes_read],
                        dtype=torch.int64, device=_comm_device())
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    engine.close()
    per_rank = [int(t[0]) for t in every]
    replica = [int(t[0]) for t in every if int(t[1]) == 0]
    read = [int(t[2]) for t in every]  # checkpoint bytes each rank read while loading
    return {"per_rank": per_rank, "max": max(per_rank), "replica_sum": sum(replica), "read": read}


def exported_logprobs(export_dir: str, batch: list[dict]) -> list:
    """Log-probs of the batch's responses under the model that ``save_hf`` wrote."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    with torch.no_grad():
        return [x.numpy() for x in _hf_logprobs(model, batch)[0]]


def check_compat_paths() -> dict[str, Any]:
    """Exercise the compat patches directly, including those no engine run reaches (default
    causal masks, the inf-norm and zero-count paths of clip_grads). Returns what each saw."""
    import importlib

    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.optimizer import clip_grads
    from megatron.core.transformer import utils as transformer_utils

    from flowrl.backends.train.megatron import compat

    out: dict[str, Any] = {"applied": [compat.apply_cpu_compat(), compat.apply_cpu_compat()]}
    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(123)
    out["current_device"] = str(torch.cuda.current_device())
    torch.cuda.synchronize()
    mask = transformer_utils.get_default_causal_mask(3)
    out["causal_mask"] = mask.int().tolist()
    swa = transformer_utils.get_sliding_window_causal_mask(3, 3, (1, 0))
    out["sliding_mask_device"] = str(swa.device)
    grads = [torch.tensor([3.0, -4.0]), torch.tensor([0.0, 12.0])]
    out["inf_norm"] = clip_grads.get_grad_norm_fp32(grads, norm_type=float("inf"))
    out["l2_norm"] = clip_grads.get_grad_norm_fp32(grads, norm_type=2)
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    out["num_zeros"] = float(clip_grads.count_zeros_fp32(params, grad_stats_parallel_group=None))
    opt_module = importlib.import_module("megatron.core.optimizer.optimizer")
    found_inf = opt_module.torch.tensor([0.0], dtype=torch.float, device="cuda")  # optimizer.py:473
    out["optimizer_tensor_device"] = str(found_inf.device)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    before = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(3)
    with tracker.fork():
        second = torch.rand(3)
    out["fork_advances"] = not torch.equal(first, second)
    out["default_rng_restored"] = torch.equal(before, torch.get_rng_state())
    ps.destroy_model_parallel()
    return out


def layouts_worker(rank: int, world_size: int, port: int, jobs: list[dict], out_path: str,
                   backend: str = "gloo") -> None:
    """Spawned rank: run ``check_layout`` for each job in turn; global rank 0 writes JSON results.

    A job is ``{"name", "model_dir", "ref_path", "dp", "tp", "pp"}`` plus optional ``check_layout``
    keywords (``vpp``, ``bf16``, ``use_distributed_optimizer``, ...).
    """
    import json

    init_process_group(rank, world_size, port, backend)
    results = []
    for job in jobs:
        kwargs = {k: v for k, v in job.items()
                  if k not in ("name", "kind", "model_dir", "ref_path")}
        start = time.monotonic()
        if job.get("kind") == "memory":
            result = measure_param_bytes(job["model_dir"], **kwargs)
        elif job.get("kind") == "compat":
            result = check_compat_paths()
        else:
            ref = torch.load(job["ref_path"], weights_only=False)
            result = check_layout(job["model_dir"], ref, ref["batch"], **kwargs)
        results.append({"name": job["name"], **result, "seconds": time.monotonic() - start})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def prepare_reference(model_dir: str, ref_path: str, *, num_items: int = 8, **model_kwargs) -> dict:
    """Build a tiny model in ``model_dir`` and save its reference numbers to ``ref_path``."""
    model = make_tiny_model(model_dir, **model_kwargs)
    batch = make_batch(num_items=num_items, vocab_size=model.config.vocab_size)
    ref = {**reference(model_dir, batch), "batch": batch}
    torch.save(ref, ref_path)
    return ref
