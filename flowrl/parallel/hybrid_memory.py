"""A hybrid rank's GPU memory phase by phase: the trainer's state and vLLM's pool on one GPU
(``cluster.placement=hybrid``, verl's hybrid engine), as the run reports it with each weight sync
(``perf/hybrid_<phase>_peak_mem_bytes``: ``rollout``, ``actor``, ``ref``, ``sync``;
``flowrl.roles.hybrid.PhaseMemory``). Pure: no torch, no I/O.

What each phase holds on the GPU of the trainer's fullest pipeline stage (``layout_cost``'s
parts of a train layout; the engine's weights are the whole model over the generation tensor
parallel size ``gen_tp`` in bf16, experts included):

- ``rollout``: vLLM's pool, ``gpu_memory_utilization * gpu_memory_gb`` (its weights and KV cache),
  plus what the trainer keeps there while the engine generates: its weights unless
  ``param_offload``, megatron's persistent fp32 gradient buffers unless ``param_offload`` (FSDP
  frees gradients after each step), the optimizer state unless ``optimizer_offload``, and the
  reference's weights unless ``ref_offload``;
- ``actor``: the trainer's update peak (weights, gradients, optimizer, activations; the
  reference's weights unless offloaded) plus the engine's pool when it does not sleep
  (``free_cache_engine`` false), nothing of it when it sleeps (vLLM sleep level 1: weights parked
  in host memory, KV cache freed);
- ``ref``: the reference's weights and one forward's activations, plus what stays resident of the
  trainer and the engine as in ``actor``;
- ``sync``: the trainer's weights (made resident for the sync), the engine's weights (woken first:
  flowrl wakes weights, loads, then wakes the KV cache) and one bucket in flight, plus the optimizer
  and reference unless offloaded, and the whole pool when the engine never sleeps.

The KV budget is the pool less the engine's weights (and one decode step's logits); it holds
``kv_sequences`` sequences of ``seq_len`` tokens. ``RESERVED_GB`` is added to every phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.parallel.layout_cost import GB, MEMORY_HEADROOM, RESERVED_GB, PlanEntry
from flowrl.parallel.mesh import padded_vocab_size
from flowrl.parallel.model_spec import ModelSpec

__all__ = ["BUDGET_METRICS", "PHASES", "HybridMemory", "HybridOptions", "hybrid_memory", "format_hybrid"]

PHASES = ("rollout", "actor", "ref", "sync")
"""The phases the run reports (``perf/hybrid_<phase>_peak_mem_bytes``)."""
BUDGET_METRICS = ("perf/hybrid_trainer_state_bytes", "perf/hybrid_kv_cache_bytes", "perf/hybrid_peak_over_state_and_kv")
"""The run's (``flowrl.roles.hybrid.HybridRole.budget_metrics``) and the plan's measure of a hybrid
rank against what it must hold: the trainer's state (parameters, gradients, optimizer), the
engine's KV budget, and the largest phase over their sum."""
BUCKET_GB = 0.5
"""One reshard bucket in flight during the sync (``actor.reshard_bucket_mb``-sized, rounded up)."""


@dataclass(frozen=True, kw_only=True)
class HybridOptions:
    """The config keys that decide what shares the GPU in each phase."""

    gen_tp: int = 1
    """``rollout.tensor_model_parallel_size``."""
    gpu_memory_utilization: float = 0.5
    """``rollout.gpu_memory_utilization``: vLLM's pool as a fraction of the GPU."""
    free_cache_engine: bool = True
    """``rollout.free_cache_engine``: the engine sleeps outside generation (verl's default)."""
    param_offload: bool = False
    """``actor.{fsdp_config,megatron}.param_offload``."""
    optimizer_offload: bool = False
    """``actor.{fsdp_config,megatron}.optimizer_offload``."""
    ref_offload: bool = False
    """``ref.{fsdp_config,megatron}.param_offload``."""
    persistent_grads: bool = True
    """Megatron keeps fp32 gradient buffers between steps; FSDP frees them (False)."""


@dataclass(frozen=True)
class HybridMemory:
    """GB per GPU of each phase (:data:`PHASES`, ``RESERVED_GB`` included), the engine's weights
    and KV budget, and what a GPU holds."""

    phases_gb: dict[str, float]
    engine_weights_gb: float
    kv_budget_gb: float
    kv_sequences: int
    limit_gb: float
    trainer_state_gb: float = 0.0
    """The trainer's weights, gradients and optimizer state on the GPU (offloaded or not)."""

    @property
    def peak_gb(self) -> float:
        return max(self.phases_gb.values())

    @property
    def fits(self) -> bool:
        return self.peak_gb <= self.limit_gb and self.kv_sequences > 0

    @property
    def peak_over_state_and_kv(self) -> float:
        """The largest phase over the trainer's state plus the KV budget (issue 29's 1.15x line)."""
        budget = self.trainer_state_gb + self.kv_budget_gb
        return self.peak_gb / budget if budget else float("nan")

    def metrics(self) -> dict[str, float]:
        """The phases and the budget measure under the names the run logs them with (bytes)."""
        state, kv, ratio = BUDGET_METRICS
        return {**{f"perf/hybrid_{p}_peak_mem_bytes": gb * GB for p, gb in self.phases_gb.items()},
                state: self.trainer_state_gb * GB, kv: self.kv_budget_gb * GB, ratio: self.peak_over_state_and_kv}


def hybrid_memory(spec: ModelSpec, entry: PlanEntry, options: HybridOptions, *, gpu_memory_gb: float,
                  seq_len: int, gpus_per_node: int = 8, generate_batch_size: int = 256) -> HybridMemory:
    """Each phase's GB per GPU for the train layout ``entry`` of ``spec`` sharing its GPUs with a
    vLLM engine; ``seq_len`` tokens per sequence, at most ``generate_batch_size`` sequences."""
    if entry.for_ != "train":
        raise ValueError("hybrid_memory takes a train layout (plan_parallelism(for_='train'))")
    if options.gen_tp < 1 or options.gen_tp > gpus_per_node:
        raise ValueError(f"rollout.tensor_model_parallel_size={options.gen_tp} must be between 1 and "
                         f"gpus_per_node={gpus_per_node} (a vLLM replica stays inside a node)")
    if not 0 < options.gpu_memory_utilization <= 1:
        raise ValueError(f"rollout.gpu_memory_utilization={options.gpu_memory_utilization} must be in (0, 1]")
    t = options.gen_tp
    if spec.num_attention_heads % t:
        raise ValueError(f"rollout.tensor_model_parallel_size={t} does not divide the {spec.num_attention_heads} "
                         "attention heads; pick a divisor")
    pool = options.gpu_memory_utilization * gpu_memory_gb
    engine = spec.num_params / t * 2 / GB  # bf16, whole model over gen tp (experts too)
    vocab = padded_vocab_size(spec.vocab_size, t)
    workspace = generate_batch_size * vocab / t * 4 / GB
    kv_budget = max(0.0, pool - engine - workspace)
    if spec.is_mla:
        kv_token = spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * 2
    else:
        kv_token = 2 * spec.num_layers * max(1, spec.num_key_value_heads // t) * spec.dh * 2
    kv_sequences = int(kv_budget * GB // (kv_token * seq_len))

    o = options
    weights, grads, optim, ref = entry.weights_gb, entry.grads_gb, entry.optimizer_gb, entry.reference_gb
    ref_resident = 0.0 if o.ref_offload else ref
    optim_resident = 0.0 if o.optimizer_offload else optim
    grads_resident = grads if o.persistent_grads and not o.param_offload else 0.0
    weights_resident = 0.0 if o.param_offload else weights
    asleep = 0.0 if o.free_cache_engine else pool  # the engine's share outside generation
    ref_activations = entry.activations_gb / 3  # a forward keeps no activations for a backward: ~1/3 of one step's
    phases = {
        "rollout": pool + weights_resident + grads_resident + optim_resident + ref_resident,
        "actor": weights + grads + optim + entry.activations_gb + ref_resident + asleep,
        "ref": ref + ref_activations + weights_resident + grads_resident + optim_resident + asleep,
        "sync": weights + grads_resident + optim_resident + ref_resident
                + (pool if not o.free_cache_engine else engine) + BUCKET_GB,
    }
    phases = {k: v + RESERVED_GB for k, v in phases.items()}
    return HybridMemory(phases, engine, kv_budget, kv_sequences, (1 - MEMORY_HEADROOM) * gpu_memory_gb,
                        trainer_state_gb=weights + grads + optim)


def format_hybrid(rows: list[tuple[PlanEntry, HybridMemory]], options: HybridOptions) -> str:
    """A fixed-width table: the train layout, each phase's GB, the engine's weights, the KV budget."""
    if not rows:
        return "(no layouts)"
    header = ("#", "dp", "tp", "pp", "ep", "cp", *(f"{p} GB" for p in PHASES), "engine w", "kv GB", "kv seqs",
              "peak/(state+kv)", "fits")
    table = [header]
    for i, (e, m) in enumerate(rows, 1):
        table.append((str(i), str(e.dims.dp), str(e.dims.tp), str(e.dims.pp), str(e.ep), str(e.cp),
                      *(f"{m.phases_gb[p]:.1f}" for p in PHASES), f"{m.engine_weights_gb:.1f}",
                      f"{m.kv_budget_gb:.1f}", str(m.kv_sequences), f"{m.peak_over_state_and_kv:.2f}",
                      "yes" if m.fits else "no"))
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in table]
    lines.insert(1, "-" * len(lines[0]))
    o = options
    lines.append(
        f"(vLLM tp {o.gen_tp}, gpu_memory_utilization {o.gpu_memory_utilization:g}, free_cache_engine "
        f"{str(o.free_cache_engine).lower()}, param_offload {str(o.param_offload).lower()}, optimizer_offload "
        f"{str(o.optimizer_offload).lower()}, ref offload {str(o.ref_offload).lower()}; limit "
        f"{rows[0][1].limit_gb:.1f} GB per GPU; each phase as perf/hybrid_<phase>_peak_mem_bytes reports it)")
    return "\n".join(lines)
