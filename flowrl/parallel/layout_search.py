"""The layout search: which (dp, tp, pp) to train or generate with, for a model and a cluster.

``plan_parallelism("70B", num_gpus=128)`` enumerates the layouts the model and the cluster allow
(tp inside a node and dividing the heads, stages of at least MIN_LAYERS_PER_STAGE layers unless
pp is pinned), estimates per-GPU memory and the time of one optimizer step (train) or of generating
one batch (generate), drops layouts that do not fit, and ranks the rest by time; estimates within
TIE_TOLERANCE of each other count as ties and go to layouts without recompute, then to the
shallower pipeline, then to less communication. ``format_plan`` renders a table;
``flowrl parallel-plan`` (plan_cli.py) is the shell around both. Pure code: no torch, no I/O beyond
reading a ``config.json`` when given a path.

The estimates are ``layout_cost``'s; ``ModelSpec`` and ``parse_model`` are ``model_spec``'s.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterator, Literal, Mapping

from flowrl.parallel.layout_cost import (
    GPU_TFLOPS,
    INTERCONNECTS,
    MIN_LAYERS_PER_STAGE,
    OPTIMIZER_BYTES,
    RESERVED_GB,
    TIE_TOLERANCE,
    WEIGHT_BYTES,
    GB,
    PlanEntry,
    Setup,
    generate_entry,
    train_entry,
    train_memory,
)
from flowrl.parallel.mesh import ParallelDims, balanced_stages, validate_model_layout
from flowrl.parallel.model_spec import ModelSpec, format_count, parse_model

__all__ = ["format_plan", "plan_parallelism"]


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def _check_positive(value: Any, name: str, *, integer: bool = True) -> None:
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or not value > 0:
        kind, example = ("integer", "8") if integer else ("number", "80")
        raise ValueError(f"{name}={value!r} must be a positive {kind}, e.g. {example}")


def _layouts(setup: Setup, tp: int | None, pp: int | None) -> Iterator[tuple[ParallelDims, tuple[int, ...]]]:
    """(dims, layers_per_stage) of every layout the model and cluster allow."""
    spec, n, gpn = setup.spec, setup.num_gpus, setup.gpus_per_node
    heads, kv, layers = spec.num_attention_heads, spec.num_key_value_heads, spec.num_layers
    for t in _divisors(n) if tp is None else [tp]:
        if t > gpn or gpn % t or heads % t or (kv % t and t % kv):
            continue  # a tp group stays inside one node and splits heads (kv heads may replicate)
        for p in _divisors(n // t) if pp is None else [pp]:
            if p > layers or (pp is None and p > 1 and layers // p < MIN_LAYERS_PER_STAGE):
                continue
            stages = (layers // p,) * p if layers % p == 0 else tuple(balanced_stages(layers, p))
            yield ParallelDims(dp=n // (t * p), tp=t, pp=p), stages


def _evaluate(setup: Setup, for_: str, recompute: str, tp: int | None, pp: int | None) -> list[PlanEntry]:
    entries = []
    limit = (setup.memory_limit_gb - RESERVED_GB) * GB
    for dims, stages in _layouts(setup, tp, pp):
        if for_ == "generate":
            entries.append(generate_entry(setup, dims, stages))
            continue
        most = max(stages)
        k = most if recompute == "full" else 0
        if recompute == "auto":  # the fewest recomputed layers that fit (all of them if none do)
            k = next((k for k in range(most + 1) if train_memory(setup, dims, stages, k)[-1] <= limit), most)
        entries.append(train_entry(setup, dims, stages, k))
    return entries


def _rank(entries: list[PlanEntry]) -> list[PlanEntry]:
    """Fastest first. Among entries within TIE_TOLERANCE of the fastest left, one without recompute
    wins, then the shallower pipeline (real pipelines lose more than the ideal bubble: stage
    imbalance, p2p synchronisation), then less traffic, then fewer model-parallel ranks."""
    left = sorted(entries, key=lambda e: e.step_s)
    ranked = []
    while left:
        ties = [e for e in left if e.step_s <= left[0].step_s * (1 + TIE_TOLERANCE)]
        best = min(ties, key=lambda e: (e.recompute_layers > 0, e.dims.pp, e.comm_gb,
                                        e.dims.model_parallel_size, e.step_s))
        ranked.append(best)
        left.remove(best)
    return ranked


def _no_fit_error(setup: Setup, for_: str, recompute: str, tp: int | None, pp: int | None,
                  entries: list[PlanEntry]) -> ValueError:
    spec = setup.spec
    what = f"{format_count(spec.num_params)} parameters ({spec.name})"
    best = min(entries, key=lambda e: e.memory_gb)
    head = (
        f"no layout of num_gpus={setup.num_gpus} fits {what} for {for_} in gpu_memory_gb="
        f"{setup.gpu_memory_gb:g} ({setup.memory_limit_gb:.1f} GB usable): the smallest needs "
        f"{best.memory_gb:.1f} GB per GPU ({best.dims}"
        f"{', recomputing every layer' if best.recompute_layers else ''})"
    )
    extra = ", or recompute='auto'" if recompute == "none" else ""
    for k in range(1, 11):  # more GPUs help until pp would exceed num_layers at the largest tp
        bigger = replace(setup, num_gpus=setup.num_gpus * 2**k)
        if any(e.fits for e in _evaluate(bigger, for_, recompute, tp, pp)):
            return ValueError(f"{head}; use num_gpus={bigger.num_gpus} or more, GPUs with more memory, "
                              f"or a shorter seq_len{extra}")
    max_tp = max(t for t in _divisors(setup.gpus_per_node) if spec.num_attention_heads % t == 0)
    return ValueError(
        f"{head}; more GPUs do not help: a replica would need more than num_layers*tp = "
        f"{spec.num_layers}*{max_tp} = {spec.num_layers * max_tp} GPUs, i.e. "
        f"pipeline_model_parallel_size > num_layers={spec.num_layers}; use GPUs with more memory or a "
        f"shorter seq_len{extra}"
    )


def _check_pinned(setup: Setup, tp: int | None, pp: int | None) -> None:
    spec, n = setup.spec, setup.num_gpus
    if tp is not None:
        _check_positive(tp, "tensor_model_parallel_size")
        if tp > setup.gpus_per_node:
            raise ValueError(
                f"tensor_model_parallel_size={tp} exceeds gpus_per_node={setup.gpus_per_node}; keep tp "
                "inside one node and span nodes with pipeline_model_parallel_size"
            )
    if pp is not None:
        _check_positive(pp, "pipeline_model_parallel_size")
    if n % ((tp or 1) * (pp or 1)):
        raise ValueError(
            f"tensor_model_parallel_size*pipeline_model_parallel_size = {tp or 1}*{pp or 1} does not "
            f"divide num_gpus={n}; pick sizes whose product divides {n}"
        )
    p = pp or 1
    validate_model_layout(  # names the setting and the values that work
        ParallelDims(dp=n // ((tp or 1) * p), tp=tp or 1, pp=p),
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        num_layers=spec.num_layers, vocab_size=spec.vocab_size,
        layers_per_stage=balanced_stages(spec.num_layers, p) if p <= spec.num_layers else None,
    )


def _checked_setup(model: ModelSpec | Mapping[str, Any] | str | float, *, num_gpus: int, gpu_memory_gb: float,
                   interconnect: str, gpus_per_node: int, seq_len: int, micro_batch_size: int,
                   global_batch_tokens: int, dtype: str, optimizer: str, distributed_optimizer: bool,
                   reference_model: bool, for_: str, top_k: int | None, recompute: str,
                   generate_batch_size: int, gpu_tflops: float) -> Setup:
    """``plan_parallelism``'s arguments checked (ValueError naming the first bad one) and gathered."""
    _check_positive(num_gpus, "num_gpus")
    _check_positive(gpu_memory_gb, "gpu_memory_gb", integer=False)
    _check_positive(gpu_tflops, "gpu_tflops", integer=False)
    for name, value in (("gpus_per_node", gpus_per_node), ("seq_len", seq_len),
                        ("micro_batch_size", micro_batch_size), ("global_batch_tokens", global_batch_tokens),
                        ("generate_batch_size", generate_batch_size)):
        _check_positive(value, name)
    if top_k is not None:
        _check_positive(top_k, "top_k")
    for name, value, valid in (
        ("interconnect", interconnect, INTERCONNECTS),
        ("dtype", dtype, WEIGHT_BYTES),
        ("optimizer", optimizer, OPTIMIZER_BYTES),
        ("for_", for_, ("train", "generate")),
        ("recompute", recompute, ("auto", "none", "full")),
    ):
        if value not in valid:
            raise ValueError(f"unknown {name}={value!r}; use one of {', '.join(map(repr, valid))}")
    return Setup(
        spec=parse_model(model), num_gpus=num_gpus, gpu_memory_gb=float(gpu_memory_gb),
        link=INTERCONNECTS[interconnect], gpus_per_node=gpus_per_node, seq_len=seq_len,
        micro_batch_size=micro_batch_size, global_batch_tokens=global_batch_tokens,
        weight_bytes=WEIGHT_BYTES[dtype], optimizer=optimizer,
        distributed_optimizer=bool(distributed_optimizer), reference_model=bool(reference_model),
        generate_batch_size=generate_batch_size, gpu_tflops=float(gpu_tflops),
    )


def _sharded(setup: Setup, fully_sharded: bool, lora_rank: int, tp: int | None,
             pp: int | None) -> tuple[Setup, int | None, int | None]:
    """``setup`` (and the pinned tp, pp) for ``actor.strategy=fsdp``, with LoRA of ``lora_rank``."""
    if fully_sharded:
        if (tp or 1) > 1 or (pp or 1) > 1:
            raise ValueError(f"fully_sharded (actor.strategy=fsdp) is data parallel only, but tp={tp}, pp={pp}; "
                             "drop --tp/--pp, or plan without --fully-sharded (megatron)")
        setup, tp, pp = replace(setup, fully_sharded=True), 1, 1
    if lora_rank:  # LoRA (issue 17): adapters-only gradients and optimizer, layout_cost.Setup.lora_rank
        if not fully_sharded or lora_rank < 0:
            raise ValueError(f"lora_rank={lora_rank}: LoRA trains under actor.strategy=fsdp; add --fully-sharded "
                             "and a rank >= 1, or drop --lora-rank")
        setup = replace(setup, lora_rank=lora_rank)
    return setup, tp, pp


def plan_parallelism(
    model: ModelSpec | Mapping[str, Any] | str | float, *, num_gpus: int, gpu_memory_gb: float = 80.0,
    interconnect: Literal["nvlink_ib", "ib", "ethernet"] = "ib", gpus_per_node: int = 8, seq_len: int = 4096,
    micro_batch_size: int = 1, global_batch_tokens: int = 2**20, dtype: Literal["bf16", "fp16", "fp32"] = "bf16",
    optimizer: Literal["adam", "sgd"] = "adam", distributed_optimizer: bool = True, reference_model: bool = True,
    for_: Literal["train", "generate"] = "train", top_k: int | None = 5,
    recompute: Literal["auto", "none", "full"] = "auto", tp: int | None = None, pp: int | None = None,
    generate_batch_size: int = 256, gpu_tflops: float = GPU_TFLOPS, fully_sharded: bool = False,
    lora_rank: int = 0,
) -> list[PlanEntry]:
    """Rank the (dp, tp, pp) layouts of ``num_gpus`` GPUs for training or generating with ``model``.

    Args:
        model: a ModelSpec, a transformers config dict, a parameter count (``7e9``, ``"7B"``) or the
            path of a ``config.json`` / checkpoint directory.
        num_gpus: GPUs of the worker group; every layout has dp*tp*pp = num_gpus.
        gpu_memory_gb: memory per GPU.
        interconnect: a key of INTERCONNECTS (its ``description`` says what it models).
        gpus_per_node: tp groups stay inside a node.
        seq_len, micro_batch_size: tokens per sequence, sequences per micro-batch.
        global_batch_tokens: tokens per optimizer step (train) or generated per batch (generate).
        dtype, optimizer, distributed_optimizer: as Megatron's --bf16, --optimizer and
            --use-distributed-optimizer.
        reference_model: a frozen reference policy shares the actor's GPUs and layout (train).
        for_: "train" (the Megatron actor update) or "generate" (the rollout engine).
        top_k: how many layouts to return; None for all that fit.
        recompute: "auto" recomputes the fewest layers per stage that make a layout fit.
        tp, pp: pin tensor_model_parallel_size / pipeline_model_parallel_size and plan the rest.
        generate_batch_size: most concurrent sequences per generation replica (vLLM max_num_seqs).
        gpu_tflops: sustained bf16 TFLOP/s per GPU.
        fully_sharded: plan ``actor.strategy=fsdp`` (data parallel only, every state sharded over dp;
            ``layout_cost.Setup.fully_sharded``).
        lora_rank: with ``fully_sharded``, LoRA adapters of this rank on every linear layer
            (``model.lora_rank``; ``layout_cost.Setup.lora_rank``).

    Returns the layouts that fit, fastest first. Raises ValueError naming the bad argument and a fix,
    or, when nothing fits, the smallest memory any layout needs and how many GPUs would do.
    """
    setup = _checked_setup(
        model, num_gpus=num_gpus, gpu_memory_gb=gpu_memory_gb, interconnect=interconnect,
        gpus_per_node=gpus_per_node, seq_len=seq_len, micro_batch_size=micro_batch_size,
        global_batch_tokens=global_batch_tokens, dtype=dtype, optimizer=optimizer,
        distributed_optimizer=distributed_optimizer, reference_model=reference_model, for_=for_, top_k=top_k,
        recompute=recompute, generate_batch_size=generate_batch_size, gpu_tflops=gpu_tflops,
    )
    setup, tp, pp = _sharded(setup, fully_sharded, lora_rank, tp, pp)
    _check_pinned(setup, tp, pp)
    entries = _evaluate(setup, for_, recompute, tp, pp)
    if not entries:  # only when num_gpus cannot be split at all, e.g. a prime count above a node
        raise ValueError(
            f"no (dp, tp, pp) split of num_gpus={num_gpus} suits {setup.spec.name}: tp must divide "
            f"gpus_per_node={gpus_per_node} and num_attention_heads={setup.spec.num_attention_heads}"
        )
    fitting = [e for e in entries if e.fits]
    if not fitting:
        raise _no_fit_error(setup, for_, recompute, tp, pp, entries)
    ranked = _rank(fitting)
    return ranked[:top_k] if top_k is not None else ranked


def format_plan(entries: list[PlanEntry]) -> str:
    """A fixed-width table of plan entries, best first."""
    if not entries:
        return "(no layouts)"
    generate = entries[0].for_ == "generate"
    mem_names = ("weights", "kv cache") if generate else ("weights", "grads", "optim", "ref", "activ")
    header = ("#", "dp", "tp", "pp", "mem GB", *mem_names, "step s", "compute", "bubble",
              "tp comm", "pp comm", "dp comm", "comm GB", "notes")
    rows = [header]
    for i, e in enumerate(entries, 1):
        mems = (e.weights_gb, e.activations_gb) if generate else (
            e.weights_gb, e.grads_gb, e.optimizer_gb, e.reference_gb, e.activations_gb)
        rows.append((
            str(i), str(e.dims.dp), str(e.dims.tp), str(e.dims.pp),
            f"{e.memory_gb:.1f}/{e.memory_limit_gb:.0f}", *(f"{x:.1f}" for x in mems),
            *(f"{x:.2f}" for x in (e.step_s, e.compute_s, e.bubble_s, e.tp_comm_s, e.pp_comm_s, e.dp_comm_s)),
            f"{e.comm_gb:.1f}", "; ".join(e.notes),
        ))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    lines = [line.rstrip() for line in lines]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
