"""Helpers of the megatron mixture-of-experts parity tests (CPU, gloo).

The tiny Qwen3-MoE / Mixtral of ``flowrl.models.tiny`` with perturbed weights (so routing is far
from uniform), an independent single-process reference (transformers' own forward, backward and
one AdamW step, gradients renamed to the checkpoint's per-expert names), and the in-rank check of
one (dp, tp, pp, ep, etp) layout: token log-probs, the clipped gradient of every parameter gathered
back to HF names, the state after one step, DP and expert-DP replicas identical.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist

from flowrl_testing import megatron as testing

HYPERS = testing.HYPERS


def make_tiny_moe(path: str, *, arch: str = "qwen3_moe", seed: int = 0):
    """Save the ``moe`` preset (or its Mixtral form) with perturbed weights to ``path``."""
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, **{**tiny_preset("moe"), "arch": arch, "seed": seed})
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.add_(0.1 * noise)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * noise)  # router logits of order 1: well separated top-k
            else:
                p.copy_(0.15 * noise)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model


def per_expert(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers 5 MoE state (fused ``experts.gate_up_proj`` / ``down_proj``) under the
    checkpoint's per-expert names, by plain indexing (independent of ``convert``)."""
    out = {}
    for name, t in named.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2)
                out[f"{base}{e}.gate_proj.weight"], out[f"{base}{e}.up_proj.weight"] = gate, up
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


@torch.no_grad()
def routed_tokens(model, batch: list[dict]) -> torch.Tensor:
    """[layers, experts]: how many of the batch's input tokens (each row but its last token, as a
    trainer feeds them) transformers' routers send to each expert (top-k of its router logits)."""
    cfg = model.config
    counts = torch.zeros(cfg.num_hidden_layers, getattr(cfg, "num_experts", None) or cfg.num_local_experts)
    for item in batch:
        ids = torch.tensor([item["prompt_ids"] + item["response_ids"]])[:, :-1]
        out = model(ids, output_router_logits=True)
        for layer, logits in enumerate(out.router_logits):
            top = logits.topk(cfg.num_experts_per_tok, dim=-1).indices
            counts[layer] += torch.bincount(top.reshape(-1), minlength=counts.shape[1]).float()
    return counts


def router_losses(model, batch: list[dict], *, dp: int, micro_batch_size: int) -> dict[str, torch.Tensor]:
    """Megatron's router losses written out from transformers' router logits over each row's input
    tokens (row but its last token; no padding: each row runs alone). Per micro-batch (the dp
    rank's share cut in ``micro_batch_size`` rows) of V real tokens, per layer: the switch
    load-balancing loss ``E / (k V^2) sum_e P_e C_e`` (P_e: summed softmax probability of expert e,
    C_e: its top-k selections) and the z-loss ``mean logsumexp(logits)^2``. Returns each summed
    over layers, as the gradient takes it (micro-batches weighted by V / all real tokens: ``aux``,
    ``z``) and as it is logged (plain mean over micro-batches: ``aux_logged``, ``z_logged``)."""
    cfg = model.config
    k = cfg.num_experts_per_tok
    n = len(batch) // dp
    per_mb = []  # (V, lb summed over layers, z summed over layers)
    for d in range(dp):
        share = batch[d * n:(d + 1) * n]
        for m in range(0, n, micro_batch_size):
            logits_by_layer = None
            for item in share[m:m + micro_batch_size]:
                ids = torch.tensor([(item["prompt_ids"] + item["response_ids"])[:-1]])
                layers = model(ids, output_router_logits=True).router_logits
                logits_by_layer = [x for x in layers] if logits_by_layer is None else \
                    [torch.cat([a, x]) for a, x in zip(logits_by_layer, layers)]
            lb = z = 0.0
            for logits in logits_by_layer:
                probs = torch.softmax(logits.float(), dim=-1)
                V, E = probs.shape
                counts = torch.zeros(E).scatter_add_(0, logits.topk(k, dim=-1).indices.reshape(-1), torch.ones(V * k))
                lb = lb + E / (k * V * V) * (probs.sum(0) * counts).sum()
                z = z + torch.logsumexp(logits.float(), dim=-1).square().mean()
            per_mb.append((logits_by_layer[0].shape[0], lb, z))
    total = sum(v for v, _, _ in per_mb)
    return {"aux": sum(v / total * lb for v, lb, _ in per_mb), "z": sum(v / total * z for v, _, z in per_mb),
            "aux_logged": sum(lb for _, lb, _ in per_mb) / len(per_mb),
            "z_logged": sum(z for _, _, z in per_mb) / len(per_mb)}


def reference(model_dir: str, batch: list[dict], *, aux_coeff: float = 0.0, z_coeff: float = 0.0,
              dp: int = 1, micro_batch_size: int = 2) -> dict[str, Any]:
    """transformers' log-probs and entropies; the clipped gradient and the state after one AdamW
    step on ``testing.pg_loss_fn``'s loss (plus ``aux_coeff`` / ``z_coeff`` times
    :func:`router_losses` for ``dp`` ranks' micro-batches), as MegatronEngine takes it (its
    clipping and decay)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for t in (1.0, 0.7):
            logps, entropies = testing._hf_logprobs(model, batch, t)
            out[f"logp@{t}"] = [x.numpy() for x in logps]
            out[f"entropy@{t}"] = [x.numpy() for x in entropies]
    out["tokens_per_expert"] = routed_tokens(model, batch)
    total = sum(len(it["response_ids"]) for it in batch)
    logps, entropies = testing._hf_logprobs(model, batch)
    adv = torch.tensor([a for it in batch for a in it["advantages"]])
    loss = -(torch.cat(logps) * adv + testing.ENTROPY_COEF * torch.cat(entropies)).sum() / total
    if aux_coeff or z_coeff:
        router = router_losses(model, batch, dp=dp, micro_batch_size=micro_batch_size)
        out["load_balancing_loss"] = float(router["aux_logged"].detach()) / model.config.num_hidden_layers
        out["z_loss"] = float(router["z_logged"].detach()) / model.config.num_hidden_layers
        (loss + aux_coeff * router["aux"] + z_coeff * router["z"]).backward()
    else:
        loss.backward()
    params = dict(model.named_parameters())
    h = HYPERS
    out["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(list(params.values()), h["grad_clip"]))
    out["grads"] = per_expert({k: p.grad.detach().clone() for k, p in params.items()})
    decay = [p for n, p in params.items() if p.ndim > 1 and not n.endswith("bias")]
    no_decay = [p for n, p in params.items() if not (p.ndim > 1 and not n.endswith("bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": h["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=h["lr"], betas=h["betas"], eps=h["eps"])
    opt.step()
    out["loss"] = float(loss.detach())
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    out["state"] = per_expert({k: v.detach().clone() for k, v in model.state_dict().items() if k not in tied})
    return out


def prepare(model_dir: str, ref_path: str, *, arch: str = "qwen3_moe", num_items: int = 8,
            aux: dict[str, dict] | None = None) -> dict:
    """The model and its reference; ``aux``: extra references with the load-balancing loss, by
    name (``reference`` keywords), saved beside ``ref_path`` as ``<ref_path>.<name>``."""
    model = make_tiny_moe(model_dir, arch=arch)
    batch = testing.make_batch(num_items=num_items, vocab_size=model.config.vocab_size)
    ref = {**reference(model_dir, batch), "batch": batch}
    torch.save(ref, ref_path)
    for name, kwargs in (aux or {}).items():
        torch.save({**reference(model_dir, batch, **kwargs), "batch": batch}, f"{ref_path}.{name}")
    return ref


def _replicas_identical(engine) -> bool:
    """Dense parameters equal over the dp group, expert parameters over the expert-dp group."""
    from megatron.core import parallel_state as ps

    from flowrl.backends.train.megatron.convert import is_expert_param

    same = True
    for expert, group in ((False, ps.get_data_parallel_group()),
                          (True, ps.get_expert_data_parallel_group())):
        parts = [t.detach().float().reshape(-1) for m in engine.models
                 for k, t in engine._local_state(m).items() if is_expert_param(k) == expert]
        flat = torch.cat(parts) if parts else torch.zeros(0)
        copies = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
        dist.all_gather(copies, flat, group=group)
        same &= all(torch.equal(c, flat) for c in copies)
    flag = torch.tensor([float(same)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.main_grad for n, p in model.named_parameters()}


def check_layout(model_dir: str, ref: dict, batch: list[dict], *, dp: int, tp: int, pp: int,
                 ep: int, etp: int | None = None, micro_batch_size: int = 2,
                 grads_path: str | None = None, ref_grads_path: str | None = None,
                 export_dir: str | None = None, **engine_kwargs) -> dict[str, Any]:
    """One layout against ``ref`` (and, with ``ref_grads_path``, against the single-rank megatron
    gradients that a ``grads_path`` run saved); the same result on every rank."""
    from megatron.core import parallel_state as ps

    from flowrl.backends.train.megatron.convert import megatron_to_hf
    from flowrl.backends.train.megatron.engine import MegatronEngine

    engine = MegatronEngine(model_dir, tp=tp, pp=pp, dp=dp, ep=ep, etp=etp, **HYPERS, **engine_kwargs)
    dp_rank, n = ps.get_data_parallel_rank(), len(batch) // dp
    share = slice(dp_rank * n, (dp_rank + 1) * n)
    result: dict[str, Any] = {}
    for t in (1.0, 0.7):
        logps, entropies = engine.forward_logprobs(batch[share], micro_batch_size=micro_batch_size,
                                                   temperature=t, with_entropy=True)
        result[f"logp@{t}"] = testing._all_max(testing._max_diff(logps, ref[f"logp@{t}"][share]))
        result[f"entropy@{t}"] = testing._all_max(testing._max_diff(entropies, ref[f"entropy@{t}"][share]))
    total = sum(len(it["response_ids"]) for it in batch)
    stats = engine.train_step(batch[share], micro_batch_size=micro_batch_size,
                              loss_fn=testing.pg_loss_fn(total))
    result["grad_norm"] = abs(stats["grad_norm"] - ref["grad_norm"])
    result["loss"] = abs(stats["loss"] - ref["loss"])
    result["moe_stats"] = {k: v for k, v in stats.items() if k.startswith("moe/")}
    if "load_balancing_loss" in ref:
        result["lb_loss"] = abs(stats["moe/load_balancing_loss"] - ref["load_balancing_loss"])
    if engine_kwargs.get("moe_z_loss_coeff"):
        result["z_loss"] = abs(stats["moe/z_loss"] - ref["z_loss"]) / ref["z_loss"]
    counts_LE = ref["tokens_per_expert"].double()  # whole numbers: the ratios are exact in float64
    want_L = counts_LE.max(1).values / counts_LE.mean(1)
    result["imbalance"] = max(abs(stats[f"moe/expert_load_imbalance/layer_{i}"] - float(w))
                              for i, w in enumerate(want_L))
    result["dp_identical"] = _replicas_identical(engine)
    grad_shards = engine.gathered_shards(_grads)
    state = engine.hf_state_dict()
    if dist.get_rank() == 0:
        grads = megatron_to_hf(grad_shards, engine.hf_config, tp=tp, pp=pp, etp=engine.etp)
        assert set(grads) == set(ref["grads"]) == set(state), (
            sorted(set(grads) ^ set(ref["grads"])), sorted(set(state) ^ set(ref["grads"])))
        result["grad"] = max(float((grads[k] - v).abs().max()) for k, v in ref["grads"].items())
        result["grad_scale"] = max(float(v.abs().max()) for v in ref["grads"].values())
        result["state"] = max(float((state[k] - v).abs().max()) for k, v in ref["state"].items())
        if grads_path is not None:
            torch.save(grads, grads_path)
        if ref_grads_path is not None:
            single = torch.load(ref_grads_path)
            result["grad_vs_world1"] = max(float((grads[k] - v).abs().max()) for k, v in single.items())
    if export_dir is not None:  # save_hf after the step: the export's log-probs are the engine's
        engine.save_hf(export_dir)
        logps, _ = engine.forward_logprobs(batch[share], micro_batch_size=micro_batch_size)
        shares = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object((dp_rank, [x.tolist() for x in logps]), shares, dst=0)
        if dist.get_rank() == 0:
            after = [x for d in range(dp) for x in dict(shares)[d]]
            exported = testing.exported_logprobs(export_dir, batch)
            result["export"] = float(max(max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(after, exported)))
    engine.close()
    return result


def layouts_worker(rank: int, world_size: int, port: int, jobs: list[dict], out_path: str) -> None:
    """Spawned rank: ``check_layout`` for each job in turn; rank 0 writes the results as JSON."""
    testing.init_process_group(rank, world_size, port)
    results = []
    for job in jobs:
        kwargs = {k: v for k, v in job.items() if k not in ("name", "model_dir", "ref_path")}
        start = time.monotonic()
        ref = torch.load(job["ref_path"], weights_only=False)
        result = check_layout(job["model_dir"], ref, ref["batch"], **kwargs)
        results.append({"name": job["name"], **result, "seconds": time.monotonic() - start})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
