"""The layout search: which (dp, tp, pp, and for MoE models or long sequences ep and cp) to train or
generate with, for a model and a cluster.

``plan_parallelism("70B", num_gpus=128)`` enumerates the layouts the model and the cluster allow
(tp inside a node and dividing the heads, stages of at least MIN_LAYERS_PER_STAGE layers unless
pp is pinned), estimates per-GPU memory and the time of one optimizer step (train) or of generating
one batch (generate), drops layouts that do not fit, and ranks the rest by time; estimates within
TIE_TOLERANCE of each other count as ties and go to layouts without recompute, then to the
shallower pipeline, then to less communication. ``format_plan`` renders a table;
``flowrl parallel-plan`` (plan_cli.py) is the shell around both. Pure code: no torch, no I/O beyond
reading a ``config.json`` when given a path.

Mixture-of-experts models also search expert parallelism: ep dividing the experts and, with the
expert tensor parallel size etp (1, or tp: megatron's default), dividing tp*cp*dp; training
sequences of ``LONG_SEQUENCE`` tokens or more also search context parallelism (cp dividing
num_gpus / (tp*pp), each rank holding seq_len/cp tokens). Ties prefer the smaller cp, then the
smaller ep.

The estimates are ``layout_cost``'s; ``ModelSpec`` and ``parse_model`` are ``model_spec``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterator, Literal, Mapping

from flowrl.parallel.layout_cost import (
    GPU_TFLOPS,
    INTERCONNECTS,
    LONG_SEQUENCE,
    MIN_LAYERS_PER_STAGE,
    NO_AXES,
    Axes,
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

__all__ = ["explain_memory", "format_plan", "plan_parallelism"]


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def _check_positive(value: Any, name: str, *, integer: bool = True) -> None:
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or not value > 0:
        kind, example = ("integer", "8") if integer else ("number", "80")
        raise ValueError(f"{name}={value!r} must be a positive {kind}, e.g. {example}")


@dataclass(frozen=True)
class Pins:
    """Axes the caller fixed (None: searched)."""

    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    etp: int | None = None
    cp: int | None = None


def _axes(setup: Setup, for_: str, pins: Pins, t: int, rest: int) -> Iterator[Axes]:
    """The (ep, etp, cp) choices for tp ``t`` and ``rest`` = num_gpus / (tp*pp) GPUs."""
    spec = setup.spec
    if pins.cp is not None:
        cps = [pins.cp] if rest % pins.cp == 0 else []
    elif for_ == "train" and setup.seq_len >= LONG_SEQUENCE:
        cps = [c for c in _divisors(rest) if setup.seq_len % (2 * c) == 0 or c == 1]
    else:
        cps = [1]
    for c in cps:
        if not spec.is_moe or for_ == "generate":
            yield Axes(cp=c)
            continue
        for et in sorted({1, t}) if pins.etp is None else [pins.etp]:
            for e in _divisors(math.gcd(spec.num_experts, rest * t // et)) if pins.ep is None else [pins.ep]:
                if spec.num_experts % e == 0 and (rest * t) % (e * et) == 0:
                    yield Axes(ep=e, etp=et, cp=c)


def _layouts(setup: Setup, for_: str, pins: Pins) -> Iterator[tuple[ParallelDims, tuple[int, ...], Axes]]:
    """(dims, layers_per_stage, axes) of every layout the model and cluster allow."""
    spec, n, gpn = setup.spec, setup.num_gpus, setup.gpus_per_node
    heads, kv, layers = spec.num_attention_heads, spec.num_key_value_heads, spec.num_layers
    tp, pp = pins.tp, pins.pp
    for t in _divisors(n) if tp is None else [tp]:
        if t > gpn or gpn % t or heads % t or (kv % t and t % kv):
            continue  # a tp group stays inside one node and splits heads (kv heads may replicate)
        for p in _divisors(n // t) if pp is None else [pp]:
            if p > layers or (pp is None and p > 1 and layers // p < MIN_LAYERS_PER_STAGE):
                continue
            stages = (layers // p,) * p if layers % p == 0 else tuple(balanced_stages(layers, p))
            for axes in _axes(setup, for_, pins, t, n // (t * p)):
                yield ParallelDims(dp=n // (t * p * axes.cp), tp=t, pp=p), stages, axes


def _evaluate(setup: Setup, for_: str, recompute: str, tp: int | None, pp: int | None,
              pins: Pins | None = None) -> list[PlanEntry]:
    pins = pins or Pins(tp=tp, pp=pp)
    entries = []
    limit = (setup.memory_limit_gb - RESERVED_GB) * GB
    for dims, stages, axes in _layouts(setup, for_, pins):
        if for_ == "generate":
            entries.append(generate_entry(setup, dims, stages))
            continue
        most = max(stages)
        k = most if recompute == "full" else 0
        if recompute == "auto":  # the fewest recomputed layers that fit (all of them if none do)
            k = next((k for k in range(most + 1) if train_memory(setup, dims, stages, k, axes)[-1] <= limit), most)
        entries.append(train_entry(setup, dims, stages, k, axes))
    return entries


def _rank(entries: list[PlanEntry]) -> list[PlanEntry]:
    """Fastest first. Among entries within TIE_TOLERANCE of the fastest left, one without recompute
    wins, then the shallower pipeline (real pipelines lose more than the ideal bubble: stage
    imbalance, p2p synchronisation), then less traffic, then fewer model-parallel ranks."""
    left = sorted(entries, key=lambda e: e.step_s)
    ranked = []
    while left:
        ties = [e for e in left if e.step_s <= left[0].step_s * (1 + TIE_TOLERANCE)]
        best = min(ties, key=lambda e: (e.recompute_layers > 0, e.dims.pp, e.cp, e.ep, e.comm_gb,
                                        e.dims.model_parallel_size, e.step_s))
        ranked.append(best)
        left.remove(best)
    return ranked


def _no_fit_error(setup: Setup, for_: str, recompute: str, pins: Pins, entries: list[PlanEntry]) -> ValueError:
    spec = setup.spec
    what = f"{format_count(spec.num_params)} parameters ({spec.name})"
    best = min(entries, key=lambda e: e.memory_gb)
    head = (
        f"no layout of num_gpus={setup.num_gpus} fits {what} for {for_} in gpu_memory_gb="
        f"{setup.gpu_memory_gb:g} ({setup.memory_limit_gb:.1f} GB usable): the smallest needs "
        f"{best.memory_gb:.1f} GB per GPU ({best.dims}{_axes_text(best)}"
        f"{', recomputing every layer' if best.recompute_layers else ''})"
    )
    extra = ", or recompute='auto'" if recompute == "none" else ""
    for k in range(1, 11):  # more GPUs help until pp would exceed num_layers at the largest tp
        bigger = replace(setup, num_gpus=setup.num_gpus * 2**k)
        if any(e.fits for e in _evaluate(bigger, for_, recompute, pins.tp, pins.pp, pins)):
            return ValueError(f"{head}; use num_gpus={bigger.num_gpus} or more, GPUs with more memory, "
                              f"or a shorter seq_len{extra}")
    max_tp = max(t for t in _divisors(setup.gpus_per_node) if spec.num_attention_heads % t == 0)
    return ValueError(
        f"{head}; more GPUs do not help: a replica would need more than num_layers*tp = "
        f"{spec.num_layers}*{max_tp} = {spec.num_layers * max_tp} GPUs, i.e. "
        f"pipeline_model_parallel_size > num_layers={spec.num_layers}; use GPUs with more memory or a "
        f"shorter seq_len{extra}"
    )


def _axes_text(entry: PlanEntry) -> str:
    extra = [f"{name}={value}" for name, value in (("ep", entry.ep), ("etp", entry.etp), ("cp", entry.cp)) if value > 1]
    return ", " + ", ".join(extra) if extra else ""


def _check_pinned_axes(setup: Setup, for_: str, pins: Pins) -> None:
    """The expert and context axes the caller pinned, checked against the model and the GPUs."""
    spec, n = setup.spec, setup.num_gpus
    for name, value in (("expert_model_parallel_size", pins.ep), ("expert_tensor_parallel_size", pins.etp),
                        ("context_parallel_size", pins.cp)):
        if value is not None:
            _check_positive(value, name)
    if (pins.ep or 1) > 1 or (pins.etp or 1) > 1:
        if not spec.is_moe:
            raise ValueError(
                f"expert_model_parallel_size={pins.ep}, expert_tensor_parallel_size={pins.etp}: {spec.name} is "
                "a dense model (no experts); drop --ep/--etp or plan a mixture-of-experts model")
        if for_ == "generate":
            raise ValueError("--ep/--etp plan the trainer's experts; the generation plan splits experts over tp "
                             "(vLLM's default): drop them for --for generate")
        if pins.ep and spec.num_experts % pins.ep:
            valid = ", ".join(str(d) for d in _divisors(spec.num_experts) if n % d == 0)
            raise ValueError(f"expert_model_parallel_size={pins.ep} does not divide the {spec.num_experts} experts "
                             f"of {spec.name}; use one of {valid}")
    if pins.cp is not None:
        if setup.seq_len % (2 * pins.cp) and pins.cp > 1:
            raise ValueError(f"context_parallel_size={pins.cp} needs seq_len divisible by 2*cp = {2 * pins.cp} "
                             f"(load-balanced causal split), got seq_len={setup.seq_len}")
    used = (pins.tp or 1) * (pins.pp or 1) * (pins.cp or 1)
    if pins.cp and n % used:
        raise ValueError(f"tp*pp*cp = {used} does not divide num_gpus={n}; pick sizes whose product divides {n}")
    expert = (pins.ep or 1) * (pins.etp or 1) * (pins.pp or 1)
    if n % expert:
        raise ValueError(f"ep*etp*pp = {expert} does not divide num_gpus={n} (megatron's expert layout: "
                         f"etp*ep*edp*pp = num_gpus); pick sizes whose product divides {n}")


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


def _checked_pins(setup: Setup, for_: str, fully_sharded: bool, pins: Pins) -> Pins:
    """``pins`` (the pinned tp, pp, ep, etp, cp), checked against the setup; ValueError naming the fix."""
    if fully_sharded and ((pins.ep or 1) > 1 or (pins.etp or 1) > 1):
        raise ValueError(f"fully_sharded (actor.strategy=fsdp) shards experts like any parameter over dp; "
                         f"drop --ep={pins.ep}/--etp={pins.etp}, or plan without --fully-sharded (megatron)")
    if (pins.cp or 1) == 1:
        _check_pinned(setup, pins.tp, pins.pp)
    _check_pinned_axes(setup, for_, pins)
    return pins


def plan_parallelism(
    model: ModelSpec | Mapping[str, Any] | str | float, *, num_gpus: int, gpu_memory_gb: float = 80.0,
    interconnect: Literal["nvlink_ib", "ib", "ethernet"] = "ib", gpus_per_node: int = 8, seq_len: int = 4096,
    micro_batch_size: int = 1, global_batch_tokens: int = 2**20, dtype: Literal["bf16", "fp16", "fp32"] = "bf16",
    optimizer: Literal["adam", "sgd"] = "adam", distributed_optimizer: bool = True, reference_model: bool = True,
    for_: Literal["train", "generate"] = "train", top_k: int | None = 5,
    recompute: Literal["auto", "none", "full"] = "auto", tp: int | None = None, pp: int | None = None,
    generate_batch_size: int = 256, gpu_tflops: float = GPU_TFLOPS, fully_sharded: bool = False,
    lora_rank: int = 0, ep: int | None = None, etp: int | None = None, cp: int | None = None,
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
        ep, etp, cp: pin expert_model_parallel_size, expert_tensor_parallel_size (MoE models) and
            context_parallel_size; unpinned, ep and etp are searched for MoE models and cp for
            training sequences of ``LONG_SEQUENCE`` tokens or more.

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
    pins = _checked_pins(setup, for_, fully_sharded, Pins(tp=tp, pp=pp, ep=ep, etp=etp, cp=cp))
    entries = _evaluate(setup, for_, recompute, tp, pp, pins)
    if not entries:  # only when num_gpus cannot be split at all, e.g. a prime count above a node
        raise ValueError(
            f"no (dp, tp, pp) split of num_gpus={num_gpus} suits {setup.spec.name}: tp must divide "
            f"gpus_per_node={gpus_per_node} and num_attention_heads={setup.spec.num_attention_heads}"
        )
    fitting = [e for e in entries if e.fits]
    if not fitting:
        raise _no_fit_error(setup, for_, recompute, pins, entries)
    return _rank(fitting)[:top_k]  # top_k None: all


def format_plan(entries: list[PlanEntry]) -> str:
    """A fixed-width table of plan entries, best first."""
    if not entries:
        return "(no layouts)"
    generate = entries[0].for_ == "generate"
    mem_names = ("weights", "kv cache") if generate else ("weights", "grads", "optim", "ref", "activ")
    experts = any(e.ep > 1 or e.etp > 1 or e.expert_weights_gb for e in entries)
    context = any(e.cp > 1 for e in entries)
    axes = (("ep", "etp") if experts else ()) + (("cp",) if context else ())
    comms = (("ep comm",) if experts else ()) + (("cp comm",) if context else ())
    header = ("#", "dp", "tp", "pp", *axes, "mem GB", *mem_names, "step s", "compute", "bubble",
              "tp comm", "pp comm", "dp comm", *comms, "comm GB", "notes")
    rows = [header]
    for i, e in enumerate(entries, 1):
        mems = (e.weights_gb, e.activations_gb) if generate else (
            e.weights_gb, e.grads_gb, e.optimizer_gb, e.reference_gb, e.activations_gb)
        axis_values = ((e.ep, e.etp) if experts else ()) + ((e.cp,) if context else ())
        comm_values = ((e.ep_comm_s,) if experts else ()) + ((e.cp_comm_s,) if context else ())
        rows.append((
            str(i), str(e.dims.dp), str(e.dims.tp), str(e.dims.pp), *map(str, axis_values),
            f"{e.memory_gb:.1f}/{e.memory_limit_gb:.0f}", *(f"{x:.1f}" for x in mems),
            *(f"{x:.2f}" for x in (e.step_s, e.compute_s, e.bubble_s, e.tp_comm_s, e.pp_comm_s, e.dp_comm_s,
                                   *comm_values)),
            f"{e.comm_gb:.1f}", "; ".join(e.notes),
        ))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    lines = [line.rstrip() for line in lines]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def explain_memory(entry: PlanEntry, spec: ModelSpec) -> str:
    """Where one layout's per-GPU memory goes, in words: which share of the dense weights and of
    the experts a GPU holds and over how many ranks each state is split."""
    d, t, p = entry.dims.dp, entry.dims.tp, entry.dims.pp
    lines = [f"memory per GPU of {entry.dims}{_axes_text(entry)} ({entry.memory_gb:.1f} GB of "
             f"{entry.memory_limit_gb:.0f} usable), fullest pipeline stage "
             f"({max(entry.layers_per_stage)} of {spec.num_layers} layers):"]
    if entry.for_ == "generate":
        lines.append(f"  weights {entry.weights_gb:.1f} GB: the stage's parameters / tp {t}"
                     + (", experts included (split over tp, vLLM's default)" if spec.is_moe else ""))
        lines.append(f"  KV cache and logits {entry.activations_gb:.1f} GB for {entry.micro_batches} sequences"
                     + (" (MLA: the compressed latent, whole on every rank)" if spec.is_mla else ""))
        lines.append(f"  reserved {entry.reserved_gb:.1f} GB (CUDA context, NCCL and cuBLAS workspaces)")
        return "\n".join(lines)
    if spec.is_moe:
        dense_gb = entry.weights_gb - entry.expert_weights_gb
        edp = t * entry.cp * d // (entry.ep * entry.etp)
        lines.append(f"  weights {entry.weights_gb:.1f} GB = dense part {dense_gb:.1f} (attention, norms, "
                     f"routers{', shared experts' if spec.shared_expert_ffn_hidden_size else ''}, embeddings: / tp {t}) "
                     f"+ experts {entry.expert_weights_gb:.1f} ({spec.num_experts // entry.ep} of {spec.num_experts} "
                     f"experts per layer: / ep {entry.ep}{f' x etp {entry.etp}' if entry.etp > 1 else ''}); "
                     f"{format_count(spec.num_params)} parameters, {format_count(spec.num_active_params)} active")
        lines.append(f"  gradients {entry.grads_gb:.1f} GB: fp32, as the weights are split")
        lines.append(f"  optimizer {entry.optimizer_gb:.1f} GB: fp32 master + Adam moments, dense part over dp x cp = "
                     f"{d * entry.cp}, experts over expert-dp = tp*cp*dp/(ep*etp) = {edp}")
    else:
        lines.append(f"  weights {entry.weights_gb:.1f} GB: the stage's parameters / tp {t}; "
                     f"{format_count(spec.num_params)} parameters")
        lines.append(f"  gradients {entry.grads_gb:.1f} GB: fp32, as the weights are split")
        lines.append(f"  optimizer {entry.optimizer_gb:.1f} GB: fp32 master + Adam moments over dp x cp = {d * entry.cp}")
    if entry.reference_gb:
        lines.append(f"  reference {entry.reference_gb:.1f} GB: the frozen reference policy's bf16 weights, same split")
    seq = f"seq_len / cp {entry.cp} tokens" if entry.cp > 1 else "full sequences"
    lines.append(f"  activations {entry.activations_gb:.1f} GB: {min(p, entry.micro_batches)} micro-batch(es) in flight "
                 f"(1F1B) of {seq}, / tp {t}"
                 + (f", top-{spec.experts_per_token} routed copies of each token in sparse layers" if spec.is_moe else "")
                 + (f", {entry.recompute_layers} layers recomputed" if entry.recompute_layers else "")
                 + "; logits on the last stage")
    lines.append(f"  reserved {entry.reserved_gb:.1f} GB (CUDA context, NCCL and cuBLAS workspaces)")
    return "\n".join(lines)
