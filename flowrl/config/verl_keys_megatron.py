"""verl's ``megatron.*`` keys of the actor, the reference and the critic, and their per-role
profilers: the parallel sizes, MoE and the offloads map; the rest is verl's implementation (no
effect) or refused by name. A part of :data:`flowrl.config.verl_keys.VERL_KEYS`."""

from __future__ import annotations

from flowrl.config.verl_key import _OFF, VerlKey, _k
from flowrl.config.verl_names import AR

#: (verl key, the actor's strategy) -> why verl's engine of that strategy never reads the key: set
#: under it, the key is accepted with that note and sets nothing (flowrl.config.verl_load.translate_all),
#: where flowrl's own setting of the same name would be refused (verl 0.3/0.4's Megatron examples set
#: enable_gradient_checkpointing=True, which verl 0.9.1's Megatron engine and workers never read)
ENGINE_IGNORES: dict[tuple[str, str], str] = {
    (f"{AR}.model.enable_gradient_checkpointing", "megatron"):
        "verl's Megatron engine never reads it (its recomputation is "
        "megatron.override_transformer_config.recompute_*, accepted, no effect)",
}

MEGATRON_KEYS: tuple[VerlKey, ...] = (
    # Megatron (actor, ref, critic): the parallel sizes map; the rest is verl's implementation or refused
    *(e for role, to in ((f"{AR}.actor", "actor"), (f"{AR}.ref", "ref"), ("critic", "critic")) for e in (
        _k(f"{role}.megatron.tensor_model_parallel_size", "map", f"{to}.tensor_model_parallel_size"),
        _k(f"{role}.megatron.pipeline_model_parallel_size", "map", f"{to}.pipeline_model_parallel_size"),
        _k(f"{role}.megatron.virtual_pipeline_model_parallel_size",
           "map" if to == "actor" else "refuse", "actor.virtual_pipeline_model_parallel_size" if to == "actor" else "",
           does="interleaved (virtual) pipeline stages", nearest="actor.virtual_pipeline_model_parallel_size",
           accept=(None, 1)),
        _k(f"{role}.megatron.use_distributed_optimizer", "map" if to == "actor" else "noop",
           "actor.use_distributed_optimizer" if to == "actor" else "",
           does="shards the optimizer state over data-parallel ranks", nearest="actor.use_distributed_optimizer"),
        _k(f"{role}.megatron.context_parallel_size", "refuse", does="Megatron context parallelism: megatron-core "
           "runs it only in Transformer Engine's attention, which flowrl's megatron models do not use",
           nearest=f"{to}.ulysses_sequence_parallel_size (Ulysses, strategy fsdp or dp)", accept=(1, None)),
        _k(f"{role}.megatron.dynamic_context_parallel", "refuse", does="dynamic context parallelism",
           nearest=f"{to}.tensor_model_parallel_size", accept=_OFF),
        # MoE (issue 31): the actor's and reference's expert mesh and the actor's router losses map; the critic
        # (a value model) has no MoE path yet
        _k(f"{role}.megatron.expert_model_parallel_size", "map" if to != "critic" else "refuse",
           f"{to}.megatron.expert_model_parallel_size" if to != "critic" else "",
           does="Megatron expert parallelism for MoE models", nearest=f"{to}.tensor_model_parallel_size",
           accept=(1, None)),
        _k(f"{role}.megatron.expert_tensor_parallel_size", "map" if to != "critic" else "refuse",
           f"{to}.megatron.expert_tensor_parallel_size" if to != "critic" else "",
           does="tensor parallelism inside MoE experts", nearest=f"{to}.tensor_model_parallel_size",
           accept=(1, None)),
        *(_k(f"{role}.megatron.override_transformer_config.{coeff}",
             "map" if to == "actor" else ("noop" if to == "ref" else "refuse"),
             f"actor.megatron.{coeff}" if to == "actor" else "",
             does=f"Megatron's MoE {what} coefficient", nearest=f"actor.megatron.{coeff}" if to != "actor" else
             "", accept=_OFF)
          for coeff, what in (("moe_aux_loss_coeff", "load-balancing loss"), ("moe_z_loss_coeff", "router z-loss"))),
        # actor and ref: flowrl's megatron offload switches (issue 28); the critic's role does not move them yet
        *(_k(f"{role}.megatron.{switch}", "map" if to != "critic" else "refuse",
             f"{to}.megatron.{switch}" if to != "critic" else "", does=f"CPU offload of Megatron's {what}",
             nearest=f"critic.strategy=fsdp with critic.fsdp_config.{near}", accept=_OFF)
          for switch, what, near in (("param_offload", "parameters", "param_offload"),
                                     ("grad_offload", "gradients", "param_offload"),
                                     ("optimizer_offload", "optimizer state", "optimizer_offload"))),
        _k(f"{role}.megatron.use_megatron_fsdp", "refuse", does="Megatron-FSDP", nearest=f"{to}.strategy=fsdp",
           accept=_OFF),
        _k(f"{role}.megatron.qat.*", "refuse", does="quantization-aware training", nearest="none", accept=_OFF),
        _k(f"{role}.megatron.router_replay.*", "refuse", does="MoE router replay", nearest="none", accept=_OFF),
        _k(f"{role}.megatron.override_transformer_config.*", "noop",
           does="Megatron TransformerConfig overrides (kernel fusions, recomputation, MoE dispatch)",
           nearest="speed and memory options of verl's Megatron build; flowrl's Megatron engine sets its own"),
        _k(f"{role}.megatron.*", "noop", does="verl's Megatron implementation (sequence_parallel, mbridge, dist "
           "checkpointing, padding, dtype, seed)", nearest="flowrl's Megatron engine: model.dtype, trainer.seed; "
           "checkpoints are flowrl's own"),
        _k(f"{role}.profiler.*", "noop", does="verl's per-role profiler", nearest="flowrl dashboard RUN_DIR"),
    )),
)
