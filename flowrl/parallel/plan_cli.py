"""``flowrl parallel-plan``: rank (dp, tp, pp, and ep/cp where they apply) layouts for a model on a
cluster (``layout_search.py``, estimates in ``layout_cost.py``).

    flowrl parallel-plan --model 70B --gpus 128
    flowrl parallel-plan --model /ckpt/Qwen2.5-7B --gpus 16 --interconnect ethernet --for both --json
    flowrl parallel-plan --model deepseek-v3 --gpus 512
    flowrl parallel-plan --model qwen3-30b-a3b --gpus 16 --seq-len 32768 --ep 8

``add_arguments`` fills a parser (the lead's ``flowrl/cli.py`` mounts it as a subcommand) and
``run`` executes parsed arguments: it prints the table (or JSON) and returns 0, or prints
``error: ...`` to stderr and returns 2 when the planner rejects the inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``parallel-plan`` options to ``parser``."""
    from flowrl.parallel.layout_cost import INTERCONNECTS

    from flowrl.parallel.model_spec import PRESETS

    parser.add_argument("--model", required=True,
                        help="parameter count (7B, 70e9, 350M), a mixture-of-experts preset "
                             f"({', '.join(PRESETS)}) or a Hugging Face config.json or its directory")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the worker group (dp*tp*pp)")
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0, help="memory per GPU (default 80)")
    parser.add_argument("--interconnect", default="ib",
                        help="; ".join(f"{name}: {link.description}" for name, link in INTERCONNECTS.items())
                        + " (default ib)")
    parser.add_argument("--gpus-per-node", type=int, default=8,
                        help="GPUs per node; tp stays inside one (default 8)")
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--micro-batch-size", type=int, default=1, help="sequences per micro-batch (default 1)")
    parser.add_argument("--global-batch-tokens", type=int, default=2**20,
                        help="tokens per optimizer step, or generated per rollout batch (default 1048576)")
    parser.add_argument("--for", dest="for_", choices=("train", "generate", "both", "hybrid"), default="train",
                        help="plan the Megatron actor update, the rollout engine, both, or hybrid: the train "
                             "layouts whose GPUs also hold a vLLM engine (cluster.placement=hybrid), each "
                             "phase's memory as perf/hybrid_<phase>_peak_mem_bytes reports it (default train)")
    parser.add_argument("--gen-tp", type=int, default=1,
                        help="with --for hybrid: rollout.tensor_model_parallel_size (default 1)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="with --for hybrid: rollout.gpu_memory_utilization, vLLM's pool (default 0.5)")
    parser.add_argument("--keep-cache-engine", action="store_true",
                        help="with --for hybrid: rollout.free_cache_engine=false (the engine never sleeps)")
    parser.add_argument("--param-offload", action="store_true",
                        help="with --for hybrid: actor param_offload (weights on the host outside training)")
    parser.add_argument("--optimizer-offload", action="store_true",
                        help="with --for hybrid: actor optimizer_offload (optimizer state on the host outside the update)")
    parser.add_argument("--ref-offload", action="store_true",
                        help="with --for hybrid: ref param_offload (reference weights on the host outside its forward)")
    parser.add_argument("--tp", type=int, default=None, help="pin tensor_model_parallel_size")
    parser.add_argument("--pp", type=int, default=None, help="pin pipeline_model_parallel_size")
    parser.add_argument("--ep", type=int, default=None,
                        help="pin expert_model_parallel_size (MoE models; searched when not given)")
    parser.add_argument("--etp", type=int, default=None,
                        help="pin expert_tensor_parallel_size (MoE models; 1 or tp searched when not given)")
    parser.add_argument("--cp", type=int, default=None,
                        help="pin context_parallel_size (searched for --seq-len of 16384 or more)")
    parser.add_argument("--fully-sharded", action="store_true",
                        help="plan actor.strategy=fsdp: data parallel only, states sharded over dp")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="with --fully-sharded: LoRA of this rank on every linear layer (model.lora_rank): "
                             "frozen base weights, gradients and Adam state of the adapters only, no reference copy")
    parser.add_argument("--top", type=int, default=5, help="layouts to show per plan (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _entry_dict(entry: Any) -> dict[str, Any]:
    data = dataclasses.asdict(entry)
    data["dims"] = {"dp": entry.dims.dp, "tp": entry.dims.tp, "pp": entry.dims.pp, "ep": entry.ep,
                    "etp": entry.etp, "cp": entry.cp}
    for key in ("ep", "etp", "cp"):
        data.pop(key)
    data["for"] = data.pop("for_")
    data["tokens_per_s"] = entry.tokens_per_s
    return data


def run(args: argparse.Namespace) -> int:
    """Plan and print; 0 on success, 2 (with ``error: ...`` on stderr) on bad inputs."""
    from flowrl.parallel.layout_search import explain_memory, format_plan, plan_parallelism
    from flowrl.parallel.model_spec import parse_model

    if args.for_ == "hybrid":
        return _run_hybrid(args)
    phases = ("train", "generate") if args.for_ == "both" else (args.for_,)
    try:
        spec = parse_model(args.model)
        plans = {
            phase: plan_parallelism(
                spec, num_gpus=args.gpus, gpu_memory_gb=args.gpu_memory_gb, interconnect=args.interconnect,
                gpus_per_node=args.gpus_per_node, seq_len=args.seq_len, micro_batch_size=args.micro_batch_size,
                global_batch_tokens=args.global_batch_tokens, for_=phase, top_k=args.top, tp=args.tp, pp=args.pp,
                fully_sharded=getattr(args, "fully_sharded", False), lora_rank=getattr(args, "lora_rank", 0),
                ep=getattr(args, "ep", None), etp=getattr(args, "etp", None), cp=getattr(args, "cp", None),
            )
            for phase in phases
        }
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({
            "model": {**dataclasses.asdict(spec), "num_params": spec.num_params,
                      "num_active_params": spec.num_active_params},
            "num_gpus": args.gpus, "gpu_memory_gb": args.gpu_memory_gb, "interconnect": args.interconnect,
            "plans": {phase: [_entry_dict(e) for e in entries] for phase, entries in plans.items()},
        }, sys.stdout, indent=2)
        print()
        return 0
    moe = (f" ({spec.num_active_params / 1e9:.1f}B active: {spec.experts_per_token} of {spec.num_experts} "
           f"experts per token{', MLA' if spec.is_mla else ''})" if spec.is_moe else "")
    print(f"{spec.name}: {spec.num_params / 1e9:.2f}B parameters{moe}, {spec.num_layers} layers, hidden "
          f"{spec.hidden_size}, {spec.num_attention_heads} heads ({spec.num_key_value_heads} kv); "
          f"{args.gpus} GPUs of {args.gpu_memory_gb:g} GB, {args.gpus_per_node} per node, {args.interconnect}")
    what = {"train": "train: one optimizer step", "generate": "generate: decoding"}
    for phase, entries in plans.items():
        print(f"\n{what[phase]} of {args.global_batch_tokens:,} tokens, fastest first")
        print(format_plan(entries))
        if entries:
            print()
            print(explain_memory(entries[0], spec))
    return 0


def _run_hybrid(args: argparse.Namespace) -> int:
    """``--for hybrid``: the fastest train layouts whose every phase fits beside the engine."""
    from flowrl.parallel.hybrid_memory import HybridOptions, format_hybrid, hybrid_memory
    from flowrl.parallel.layout_search import plan_parallelism
    from flowrl.parallel.model_spec import parse_model

    options = HybridOptions(
        gen_tp=args.gen_tp, gpu_memory_utilization=args.gpu_memory_utilization,
        free_cache_engine=not args.keep_cache_engine, param_offload=args.param_offload,
        optimizer_offload=args.optimizer_offload, ref_offload=args.ref_offload,
        persistent_grads=not getattr(args, "fully_sharded", False),
    )
    try:
        spec = parse_model(args.model)
        # The trainer keeps what the engine's pool leaves: plan it on that share of the GPU.
        entries = plan_parallelism(
            spec, num_gpus=args.gpus, gpu_memory_gb=args.gpu_memory_gb, interconnect=args.interconnect,
            gpus_per_node=args.gpus_per_node, seq_len=args.seq_len, micro_batch_size=args.micro_batch_size,
            global_batch_tokens=args.global_batch_tokens, for_="train", top_k=None, tp=args.tp, pp=args.pp,
            fully_sharded=getattr(args, "fully_sharded", False), lora_rank=getattr(args, "lora_rank", 0),
            ep=getattr(args, "ep", None), etp=getattr(args, "etp", None), cp=getattr(args, "cp", None),
        )
        rows = [(e, hybrid_memory(spec, e, options, gpu_memory_gb=args.gpu_memory_gb, seq_len=args.seq_len,
                                  gpus_per_node=args.gpus_per_node)) for e in entries]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    fitting = [r for r in rows if r[1].fits]
    if not fitting:
        best = min(rows, key=lambda r: r[1].peak_gb)
        phase = max(best[1].phases_gb, key=best[1].phases_gb.get)
        print(f"error: no train layout of {args.gpus} GPUs fits beside a vLLM engine (tp {args.gen_tp}, "
              f"gpu_memory_utilization {args.gpu_memory_utilization:g}): the smallest peak is "
              f"{best[1].peak_gb:.1f} GB in phase {phase} ({best[0].dims}; limit {best[1].limit_gb:.1f} GB, "
              f"KV cache for {best[1].kv_sequences} sequences); try --param-offload, --optimizer-offload, "
              "--ref-offload, a lower --gpu-memory-utilization, a larger --gen-tp, or more GPUs", file=sys.stderr)
        return 2
    shown = fitting[:args.top]
    if args.json:
        json.dump({"model": {**dataclasses.asdict(spec), "num_params": spec.num_params},
                   "options": dataclasses.asdict(options),
                   "plans": {"hybrid": [{**_entry_dict(e), "hybrid": {**m.metrics(), "kv_budget_gb": m.kv_budget_gb,
                                                                      "kv_sequences": m.kv_sequences,
                                                                      "engine_weights_gb": m.engine_weights_gb}}
                                        for e, m in shown]}}, sys.stdout, indent=2)
        print()
        return 0
    print(f"{spec.name}: {spec.num_params / 1e9:.2f}B parameters; {args.gpus} GPUs of {args.gpu_memory_gb:g} GB; "
          "hybrid placement: each GPU holds a trainer rank and its share of a vLLM engine")
    print(f"\nhybrid: the fastest train layouts whose every phase fits, GB per GPU")
    print(format_hybrid(shown, options))
    return 0
