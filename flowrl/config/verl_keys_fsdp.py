"""verl's FSDP engine keys of the actor, the reference and the critic (``fsdp_config.*``,
``critic.fsdp.*``), Ulysses sequence parallelism included. A part of
:data:`flowrl.config.verl_keys.VERL_KEYS`."""

from __future__ import annotations

from flowrl.config.verl_key import _OFF, VerlKey, _k
from flowrl.config.verl_names import AR

FSDP_KEYS: tuple[VerlKey, ...] = (
    # fsdp_config: flowrl's FSDP2 options (param_offload, optimizer_offload, offload_policy,
    # reshard_after_forward, mixed_precision.*) by the prefix; verl's other FSDP knobs one by one (below)
    _k(f"{AR}.actor.fsdp_config.*", "map", "actor.fsdp_config.*"),
    _k(f"{AR}.ref.fsdp_config.*", "map", "ref.fsdp_config.*"),
    _k("critic.model.fsdp_config.*", "map", "critic.fsdp_config.*"),
    *(_k(f"{prefix}.{knob}", kind, does=why, nearest=near.format(to=to), accept=accept)
      for prefix, to in ((f"{AR}.actor.fsdp_config", "actor"), (f"{AR}.ref.fsdp_config", "ref"),
                         ("critic.model.fsdp_config", "critic"))
      for knob, kind, why, near, accept in (
          ("wrap_policy.*", "noop", "which modules FSDP wraps (verl: each decoder layer)",
           "flowrl's FSDP2 shards each decoder layer, then the whole model", ()),
          ("forward_prefetch", "noop", "FSDP1's explicit prefetch of the next forward all-gather, a speed option",
           "flowrl's FSDP2, as verl's fsdp2, overlaps the next all-gather itself", ()),
          ("use_orig_params", "noop", "FSDP1's flat-parameter option", "FSDP2 always keeps the original parameters", ()),
          ("seed", "noop", "the FSDP engine's seed", "trainer.seed", ()),
          ("use_torch_compile", "noop", "torch.compile of verl's kernels", "a speed option", ()),
          ("entropy_from_logits_with_chunking", "noop", "chunked entropy", "a memory option", ()),
          ("entropy_from_logits_chunk_size", "noop", "chunked entropy", "a memory option", ()),
          ("entropy_checkpointing", "noop", "recomputes the entropy in the backward pass", "a memory option", ()),
          ("use_no_sync_for_gradient_accumulation", "noop", "skips the gradient reduce between micro-batches",
           "a speed option; the gradients are the same", ()),
          ("pad_to_length", "noop", "pads micro-batches to a fixed length",
           "flowrl pads each micro-batch to its longest row", ()),
          ("pad_to_length_bucket", "noop", "the bucket of pad_to_length", "flowrl pads each micro-batch to its longest row", ()),
          ("forward_only", "noop", "marks an engine that never steps", "the reference never steps in flowrl", ()),
          ("strategy", "noop", "verl's copy of the engine's name", "{to}.strategy (the reference: actor.strategy)", ()),
          ("model_dtype", "refuse", "the dtype FSDP keeps the model's weights in",
           "model.dtype, {to}.fsdp_config.mixed_precision.param_dtype", ()),
          ("dtype", "refuse", "the FSDP engine's compute dtype", "{to}.fsdp_config.mixed_precision.param_dtype", ()),
          ("full_determinism", "refuse", "deterministic kernels everywhere", "trainer.seed", _OFF),
          ("qat.*", "refuse", "quantization-aware training", "none", _OFF),
          ("turbo_config.*", "refuse", "verl's turbo FSDP engine", "{to}.strategy=fsdp", ()),
      )),
    _k("critic.fsdp.param_offload", "dyn", "critic.fsdp_config.param_offload", does="CPU offload of the critic",
       nearest="critic.fsdp_config.param_offload", accept=_OFF),
    _k("critic.fsdp.optimizer_offload", "dyn", "critic.fsdp_config.optimizer_offload",
       does="CPU offload of the critic's optimizer", nearest="critic.fsdp_config.optimizer_offload", accept=_OFF),
    _k("critic.fsdp.qat.*", "refuse", does="quantization-aware training", nearest="none", accept=_OFF),
    _k("critic.fsdp.*", "noop", does="verl's FSDP engine options of the critic", nearest="critic.fsdp_config.*"),
    # Ulysses sequence parallelism (issue 31): actor, ref and critic, and the FSDP engine's copies of them
    _k(f"{AR}.ref.ulysses_sequence_parallel_size", "map", "ref.ulysses_sequence_parallel_size"),
    _k("critic.ulysses_sequence_parallel_size", "map", "critic.ulysses_sequence_parallel_size"),
    *(_k(f"{prefix}.fsdp_config.ulysses_sequence_parallel_size", "map", f"{to}.ulysses_sequence_parallel_size")
      for prefix, to in ((f"{AR}.actor", "actor"), (f"{AR}.ref", "ref"), ("critic.model", "critic"))),
    _k(f"{AR}.actor.fsdp_config.fsdp_size", "noop", does="the FSDP group size (-1: all ranks)",
       nearest="flowrl shards over the role's data-parallel group, as verl's -1"),
    _k(f"{AR}.ref.fsdp_config.fsdp_size", "noop", does="the FSDP group size", nearest="ref.data_parallel_size"),
)
