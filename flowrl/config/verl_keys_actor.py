"""verl's ``actor_rollout_ref`` keys of the trainers: ``actor.*``, ``ref.*`` and ``model.*`` (LoRA
included), the old-log-prob pass's batching, and the implementation knobs verl repeats on the actor,
the reference and the critic. A part of :data:`flowrl.config.verl_keys.VERL_KEYS`; the FSDP and
Megatron sub-trees live in :mod:`flowrl.config.verl_keys_fsdp` and :mod:`flowrl.config.verl_keys_megatron`,
the rollout's in :mod:`flowrl.config.verl_keys_rollout`."""

from __future__ import annotations

from flowrl.config.verl_key import _OFF, VerlKey, _k
from flowrl.config.verl_names import AR

ACTOR_KEYS: tuple[VerlKey, ...] = (
    # --- prefixes: actor_rollout_ref.{actor,rollout,ref,model}.* -> actor.*, rollout.*, ref.*, model.*
    _k(f"{AR}.actor.*", "map", "actor.*"),
    _k(f"{AR}.rollout.*", "map", "rollout.*"),
    _k(f"{AR}.ref.*", "map", "ref.*"),
    _k(f"{AR}.model.*", "map", "model.*"),
    # --- model
    _k(f"{AR}.model.use_remove_padding", "noop", does="packed (padding-free) forward passes, a speed option",
       nearest="none needed: experience is stored ragged and each micro-batch is padded only to its "
               "longest row; the results are the same"),
    # a verl YAML's default (true) is not adopted: verl's Megatron engine never reads this key (its
    # recompute is override_transformer_config.recompute_*), and under FSDP it trades speed for memory,
    # the results are the same; set on the command line it maps, except under actor.strategy=megatron,
    # where verl ignores it and so does flowrl (verl_keys_megatron.ENGINE_IGNORES)
    _k(f"{AR}.model.enable_gradient_checkpointing", "dyn", "model.enable_gradient_checkpointing",
       does="recomputes activations in the backward pass to save memory (under actor.strategy=megatron: "
            "no effect, as in verl, whose Megatron engine never reads it)",
       nearest="lower actor.ppo_micro_batch_size_per_gpu (less activation memory)", accept=_OFF,
       default=True, adopt=False),
    _k(f"{AR}.model.external_lib", "refuse", does="imports a module that registers a custom model",
       nearest="model.path of a transformers directory", accept=_OFF),
    _k(f"{AR}.model.trust_remote_code", "refuse", does="runs a model repository's own code",
       nearest="model.path of a Llama/Qwen2-family directory", accept=_OFF),
    # LoRA
    _k(f"{AR}.model.lora.rank", "map", "model.lora_rank"),
    _k(f"{AR}.model.lora.alpha", "map", "model.lora_alpha"),
    # peft (flowrl's LoRA) starts A as nn.Linear does (kaiming-uniform, a=sqrt(5)) and B at zero:
    # Megatron-Bridge's "kaiming" and "zero"
    _k(f"{AR}.model.lora.lora_A_init_method", "refuse", does="how LoRA's A matrices start",
       nearest="flowrl's peft adapters start A kaiming-uniform (Megatron-Bridge's kaiming)", accept=("kaiming",)),
    _k(f"{AR}.model.lora.lora_B_init_method", "refuse", does="how LoRA's B matrices start",
       nearest="flowrl's peft adapters start B at zero", accept=("zero",)),
    _k(f"{AR}.model.lora.*", "refuse", does="options of verl's LoRA block (Megatron LoRA)",
       nearest="model.lora_rank, model.lora_alpha, model.target_modules", accept=_OFF),
    _k(f"{AR}.model.lora_adapter_path", "map", "model.lora_adapter_path"),  # its settings apply (lora_adapter.py)
    _k(f"{AR}.model.exclude_modules", "map", "model.exclude_modules"),  # peft's regex (flowrl.models.lora)
    # loading options and verl's kernels
    _k(f"{AR}.model.mtp.*", "refuse", does="multi-token prediction", nearest="none", accept=_OFF),
    _k(f"{AR}.model.use_shm", "noop", does="copies the model to shared memory for faster loading",
       nearest="a loading speed option"),
    _k(f"{AR}.model.use_fused_kernels", "noop", does="verl's fused log-prob kernels", nearest="a speed option"),
    _k(f"{AR}.model.fused_kernel_options.*", "noop", does="verl's fused kernels", nearest="a speed option"),
    _k(f"{AR}.model.use_liger", "noop", does="Liger kernels", nearest="a speed option"),
    _k(f"{AR}.model.tiled_mlp.*", "noop", does="tiled MLP", nearest="a memory option"),
    _k(f"{AR}.model.enable_activation_offload", "refuse", does="CPU offload of activations",
       nearest="model.enable_gradient_checkpointing", accept=_OFF),
    _k(f"{AR}.model.custom_chat_template", "refuse", does="a chat template other than the tokenizer's",
       nearest="the tokenizer's own template", accept=_OFF),
    _k(f"{AR}.model.hf_config_path", "refuse", does="a model config other than model.path's",
       nearest="model.path", accept=_OFF),
    _k(f"{AR}.model.tokenizer_path", "refuse", does="a tokenizer other than model.path's", nearest="model.path",
       accept=_OFF),
    _k(f"{AR}.model.override_config.*", "refuse", does="overrides of the model's HF config", nearest="model.path",
       accept=_OFF),
    _k(f"{AR}.model.override_config", "refuse", does="overrides of the model's HF config", nearest="model.path",
       accept=({}, None)),
    # --- actor
    _k(f"{AR}.actor.strategy", "dyn", "actor.strategy", does="the training engine (fsdp, fsdp2, megatron)",
       nearest="actor.strategy=dp (data parallel) or megatron"),
    _k(f"{AR}.actor.grad_clip", "map", "actor.optim.grad_clip"),
    _k(f"{AR}.actor.policy_loss.loss_mode", "map", "actor.policy_loss"),
    _k(f"{AR}.actor.policy_loss.*", "refuse", does="options of verl's policy losses",
       nearest="actor.policy_loss, actor.clip_ratio_low/high/c", accept=_OFF),
    _k(f"{AR}.actor.clip_ratio", "derive", does="sets clip_ratio_low and clip_ratio_high together"),
    _k(f"{AR}.actor.ppo_micro_batch_size", "derive", does="the global micro-batch size (deprecated in verl): "
       "actor.ppo_micro_batch_size_per_gpu = it // the GPUs it is split over"),
    # batching: a verl YAML's default (or a value following one) is not adopted, flowrl's auto and
    # derived budgets stay (flowrl.config.batching_auto); a value the user wrote is (issue 30)
    _k(f"{AR}.actor.use_dynamic_bsz", "map", "actor.use_dynamic_bsz", default=False, adopt=False),
    _k(f"{AR}.actor.ppo_max_token_len_per_gpu", "map", "actor.ppo_max_token_len_per_gpu", default=16384, adopt=False),
    _k(f"{AR}.actor.use_prefix_grouper", "map", "actor.use_prefix_grouper", default=False, adopt=False),
    _k(f"{AR}.rollout.log_prob_use_dynamic_bsz", "map", "actor.log_prob_use_dynamic_bsz", adopt=False),
    _k(f"{AR}.rollout.log_prob_max_token_len_per_gpu", "map", "actor.log_prob_max_token_len_per_gpu", adopt=False),
    _k(f"{AR}.ref.log_prob_use_dynamic_bsz", "map", "ref.log_prob_use_dynamic_bsz", adopt=False),
    _k(f"{AR}.ref.log_prob_max_token_len_per_gpu", "map", "ref.log_prob_max_token_len_per_gpu", adopt=False),
    # lr_scheduler_type, lr_warmup_steps(_ratio), min_lr_ratio, num_cycles map by the actor.* prefix
    _k(f"{AR}.actor.optim.warmup_style", "map", "actor.optim.lr_scheduler_type"),  # verl's deprecated name
    _k(f"{AR}.actor.optim.weight_decay", "map", "actor.optim.weight_decay", default=0.01),
    _k(f"{AR}.actor.optim.betas", "map", "actor.optim.betas", default=(0.9, 0.999)),
    _k(f"{AR}.actor.optim.lr", "map", "actor.optim.lr", default=1e-6),
    _k(f"{AR}.actor.ppo_mini_batch_size", "map", "actor.ppo_mini_batch_size", default=256),
    _k(f"{AR}.actor.use_kl_loss", "map", "actor.use_kl_loss", default=False),
    _k(f"{AR}.actor.checkpoint.*", "noop", does="which parts verl saves and loads",
       nearest="flowrl saves model, optimizer and data state together (trainer.save_freq)"),
    _k(f"{AR}.actor.qat.*", "refuse", does="quantization-aware training", nearest="none", accept=_OFF),
    _k(f"{AR}.actor.freeze_vision_tower", "map", "actor.freeze_vision_tower", default=False),  # dp, fsdp (models.vlm)
    _k(f"{AR}.actor.loss_scale_factor", "refuse", does="a constant loss divisor", nearest="actor.loss_agg_mode",
       accept=(None,)),
    _k(f"{AR}.actor.tau_pos", "refuse", does="SAPO's soft-gate temperature", nearest="actor.policy_loss"),
    _k(f"{AR}.actor.tau_neg", "refuse", does="SAPO's soft-gate temperature", nearest="actor.policy_loss"),
    _k(f"{AR}.actor.optim.*", "refuse", does="an optimizer option flowrl lacks (Muon, Megatron's decay styles, "
       "dtypes of the Adam state)", nearest="actor.optim.lr, weight_decay, betas, eps, lr_scheduler_type", accept=_OFF),
    _k(f"{AR}.actor.optim.clip_grad", "map", "actor.optim.grad_clip"),
    *(_k(f"{AR}.actor.optim.{name}", "map", f"actor.optim.{name}") for name in (
        "eps", "lr_scheduler_type", "lr_warmup_steps", "lr_warmup_steps_ratio", "min_lr_ratio", "num_cycles")),
    # --- ref
    _k(f"{AR}.ref.log_prob_micro_batch_size", "derive", does="the reference's global micro-batch (deprecated): "
       "ref.log_prob_micro_batch_size_per_gpu = it // the GPUs it is split over"),
    _k(f"{AR}.ref.strategy", "noop", does="the reference's engine", nearest="the reference uses actor.strategy"),
    # --- actor / ref / critic: verl's implementation knobs (the critic's too, as verl repeats them)
    *(_k(f"{role}.{knob}", "noop", does=why, nearest=near) for role in (f"{AR}.actor", f"{AR}.ref", "critic")
      for knob, why, near in (
          ("use_torch_compile", "torch.compile of verl's kernels", "a speed option"),
          ("use_fused_kernels", "verl's fused log-prob kernels", "a speed option"),
          ("use_remove_padding", "padding-free forward passes", "experience is stored ragged"),
          ("entropy_checkpointing", "recomputes the entropy in the backward pass", "a memory option"),
          ("entropy_from_logits_with_chunking", "chunked entropy", "a memory option"),
          ("entropy_from_logits_chunk_size", "chunked entropy", "a memory option"),
          ("pad_to_length", "pads micro-batches to a fixed length", "flowrl pads each micro-batch to its longest row"),
          ("rollout_n", "verl's copy of rollout.n", "rollout.n"),
          ("data_loader_seed", "the mini-batch shuffle seed", "trainer.seed"),
          ("shuffle", "shuffles mini-batches", "trainer.seed"),
          ("nccl_timeout", "NCCL timeout", "cluster.timeout_s"),
          ("calculate_entropy", "computes the entropy metric", "flowrl logs the entropy every step"),
          ("calculate_sum_pi_squared", "computes sum_pi_squared (optimal_token_baseline's input)",
           "flowrl computes it with algorithm.adv_estimator=optimal_token_baseline"),
      )),
    # --- actor_rollout_ref itself
    _k(f"{AR}.hybrid_engine", "noop", does="actor and rollout share GPUs", nearest="flowrl's placement"),
    _k(f"{AR}.nccl_timeout", "noop", does="NCCL timeout", nearest="cluster.timeout_s"),
)
