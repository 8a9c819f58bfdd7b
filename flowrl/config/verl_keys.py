"""verl's configuration keys as data: every leaf of verl 0.9.1's generated trainer configs
(``_generated_ppo_trainer.yaml``, ``_generated_ppo_megatron_trainer.yaml``) is in exactly one class:

* *mapped* (``map``, ``dyn``, ``derive``): it sets the flowrl setting that does the same;
* *accepted, no effect* (``noop``): a knob of verl's own implementation, its reason in one line,
  reported once at start;
* *refused by name* (``refuse``): a feature flowrl lacks, named; verl's "off" values (``accept``) pass.

Exact keys win over ``.*`` prefixes; longer prefixes win. :func:`flowrl.config.verl.classify` reads the
table; ``python -m flowrl.config.verl_keys --write docs/verl-keys.md`` writes its documentation
(:func:`flowrl.config.verl_docs.document`; without ``--write`` it prints).
"""

from __future__ import annotations

# the verl values and names refused by name, and the knock-on refusals, live in verl_names
from flowrl.config.verl_names import AR, KNOCK_ON, REFUSED_VALUES, VERL_NAMES  # noqa: F401
from flowrl.config.verl_key import _NO, _OFF, VerlKey, _k  # noqa: F401 - the record of one key

#: verl key -> flowrl key (or why not). Exact keys win over ``.*`` prefixes; longer prefixes win.
VERL_KEYS: tuple[VerlKey, ...] = (
    # --- prefixes: actor_rollout_ref.{actor,rollout,ref,model}.* -> actor.*, rollout.*, ref.*, model.*
    _k(f"{AR}.actor.*", "map", "actor.*"),
    _k(f"{AR}.rollout.*", "map", "rollout.*"),
    _k(f"{AR}.ref.*", "map", "ref.*"),
    _k(f"{AR}.model.*", "map", "model.*"),
    # --- data
    _k("data.max_response_length", "map", "rollout.response_length", default=512),
    _k("data.max_prompt_length", "map", "data.max_prompt_length", default=512),
    _k("data.train_batch_size", "map", "data.train_batch_size", default=1024),
    _k("data.filter_overlong_prompts", "map", "data.filter_overlong_prompts", default=False),
    _k("data.val_batch_size", "noop", does="validation batch size (deprecated in verl)",
       nearest="flowrl validates all of data.val_files in one graph"),
    _k("data.return_raw_chat", "noop", does="keeps the raw chat for the rollout",
       nearest="flowrl renders the chat template once, at load"),
    _k("data.dataloader_num_workers", "noop", does="torch DataLoader workers", nearest="flowrl tokenizes once at start"),
    _k("data.reward_fn_key", "refuse", does="the column that selects the reward function",
       nearest="algorithm.reward_fn (auto picks by data_source)", accept=("data_source",)),
    _k("data.seed", "map", "trainer.seed"),
    # --- model
    _k(f"{AR}.model.use_remove_padding", "noop", does="packed (padding-free) forward passes, a speed option",
       nearest="none needed: experience is stored ragged and each micro-batch is padded only to its "
               "longest row; the results are the same"),
    # a verl YAML's default (true) is not adopted: verl's Megatron engine never reads this key (its
    # recompute is override_transformer_config.recompute_*), and under FSDP it trades speed for memory,
    # the results are the same; set on the command line it maps (Megatron refuses it by name)
    _k(f"{AR}.model.enable_gradient_checkpointing", "dyn", "model.enable_gradient_checkpointing",
       does="recomputes activations in the backward pass to save memory",
       nearest="lower actor.ppo_micro_batch_size_per_gpu (less activation memory)", accept=_OFF,
       default=True, adopt=False),
    _k(f"{AR}.model.external_lib", "refuse", does="imports a module that registers a custom model",
       nearest="model.path of a transformers directory", accept=_OFF),
    _k(f"{AR}.model.trust_remote_code", "refuse", does="runs a model repository's own code",
       nearest="model.path of a Llama/Qwen2-family directory", accept=_OFF),
    # --- actor
    _k(f"{AR}.actor.strategy", "dyn", "actor.strategy", does="the training engine (fsdp, fsdp2, megatron)",
       nearest="actor.strategy=dp (data parallel) or megatron"),
    # fsdp_config: flowrl's FSDP2 options (param_offload, optimizer_offload, offload_policy,
    # reshard_after_forward, mixed_precision.*) by the prefix; verl's other FSDP knobs one by one (_FSDP_KNOBS, below)
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
    *(_k(f"critic.{key}", "map", f"critic.{key}", adopt=False) for key in (
        "use_dynamic_bsz", "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu")),
    # lr_scheduler_type, lr_warmup_steps(_ratio), min_lr_ratio, num_cycles map by the actor.* prefix
    _k(f"{AR}.actor.optim.warmup_style", "map", "actor.optim.lr_scheduler_type"),  # verl's deprecated name
    _k("critic.optim.warmup_style", "map", "critic.optim.lr_scheduler_type"),
    _k(f"{AR}.actor.optim.weight_decay", "map", "actor.optim.weight_decay", default=0.01),
    _k(f"{AR}.actor.optim.betas", "map", "actor.optim.betas", default=(0.9, 0.999)),
    _k(f"{AR}.actor.optim.lr", "map", "actor.optim.lr", default=1e-6),
    _k(f"{AR}.actor.ppo_mini_batch_size", "map", "actor.ppo_mini_batch_size", default=256),
    _k(f"{AR}.actor.use_kl_loss", "map", "actor.use_kl_loss", default=False),
    # --- rollout
    _k(f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", "noop",
       does="the micro-batch of the old-log-prob pass", nearest="flowrl's actor uses actor.ppo_micro_batch_size_per_gpu"),
    _k(f"{AR}.rollout.log_prob_micro_batch_size", "noop", does="the global micro-batch of the old-log-prob pass",
       nearest="actor.ppo_micro_batch_size_per_gpu"),
    _k(f"{AR}.rollout.prompt_length", "noop", does="the rollout's prompt budget (= data.max_prompt_length in verl)",
       nearest="data.max_prompt_length"),
    _k(f"{AR}.rollout.max_num_batched_tokens", "map", "rollout.max_num_batched_tokens"),
    _k(f"{AR}.rollout.mode", "refuse", does="sync or async (agent-loop) rollout", nearest="rollout.name",
       accept=("sync", "async")),
    _k(f"{AR}.rollout.data_parallel_size", "noop", does="the rollout's data-parallel size, which verl derives "
       "from the GPUs", nearest="trainer.n_gpus_per_node (or flowrl's rollout.data_parallel_size)"),
    _k(f"{AR}.rollout.n", "map", "rollout.n", default=1),
    # verl's rollout dtype is the generation engine's; flowrl's model.dtype is every engine's compute
    # dtype. A verl YAML's default (bfloat16) is not adopted: flowrl's auto is bf16 on GPU already.
    _k(f"{AR}.rollout.dtype", "map", "model.dtype", default="bfloat16", adopt=False),
    _k(f"{AR}.rollout.response_length", "map", "rollout.response_length", default=512),
    # a verl YAML's default (true) is not adopted: flowrl's auto is on where the engine shares the
    # trainer's devices and can sleep (flowrl.config.free_cache_auto); true written out maps
    _k(f"{AR}.rollout.free_cache_engine", "map", "rollout.free_cache_engine", default=True, adopt=False),
    # --- ref
    _k(f"{AR}.ref.log_prob_micro_batch_size", "derive", does="the reference's global micro-batch (deprecated): "
       "ref.log_prob_micro_batch_size_per_gpu = it // the GPUs it is split over"),
    # --- critic and reward model
    _k("critic.model.path", "map", "critic.model_path"),
    _k("critic.model.*", "refuse", does="the critic's model options", nearest="critic.model_path", accept=_OFF),
    _k("critic.grad_clip", "map", "critic.optim.grad_clip"),
    _k("critic.ppo_micro_batch_size", "derive", does="the critic's global micro-batch (deprecated): "
       "critic.ppo_micro_batch_size_per_gpu = it // the GPUs it is split over"),
    _k("reward_model.model.path", "map", "reward_model.model_path"),
    _k("reward_model.model.input_tokenizer", "refuse", does="re-tokenises responses for a reward model with "
       "another tokenizer", nearest="a reward model sharing the policy's tokenizer", accept=_OFF),
    # verl's reward managers (flowrl.config.verl_reward): naive is flowrl's reward stage; dapo adds DAPO's
    # overlong penalty from reward_kwargs (reward_model.overlong_buffer.*); the others are refused by name
    _k("reward_model.reward_manager", "derive", does="how rule rewards are computed: naive (algorithm.reward_fn), "
       "dapo (and the overlong penalty of reward_model.reward_kwargs.overlong_buffer_cfg); others refused by name"),
    _k("reward.reward_manager.name", "derive", does="the reward manager (verl's newer key): as reward_model.reward_manager"),
    *(_k(f"reward_model.reward_kwargs.overlong_buffer_cfg.{name}", "derive",
         does=f"the dapo manager's overlong penalty: reward_model.overlong_buffer.{name}")
      for name in ("enable", "len", "penalty_factor")),
    _k("reward_model.reward_kwargs.max_resp_len", "derive", does="the dapo manager's overlong budget: must be the "
       "response length, from which reward_model.overlong_buffer counts"),
    _k("reward_model.reward_kwargs.overlong_buffer_cfg.log", "noop", does="logs the overlong penalty per sample",
       nearest="flowrl logs reward/overlong_penalty/mean and reward/overlong_frac whenever the penalty is on"),
    _k("sandbox_fusion.*", "map", "sandbox.*"),  # url, max_concurrent, memory_limit_mb (issue 38)
    _k("reward.sandbox_fusion.*", "map", "sandbox.*"),
    _k("reward_model.sandbox_fusion.*", "map", "sandbox.*"),
    _k("custom_reward_function.path", "derive", does="a Python file holding your reward function"),
    _k("custom_reward_function.name", "derive", does="the reward function's name in that file"),
    _k("custom_reward_function.reward_kwargs", "refuse", does="keyword arguments for the reward function",
       nearest="functools.partial in your module, named by algorithm.reward_fn", accept=({}, None)),
    # --- trainer
    _k("trainer.n_gpus_per_node", "derive", does="GPUs per node (with nnodes: the data-parallel sizes)"),
    _k("trainer.nnodes", "derive", does="nodes (with n_gpus_per_node: the data-parallel sizes)"),
    _k("trainer.resume_from_path", "derive", does="the checkpoint of resume_mode=resume_path"),
    _k("trainer.total_epochs", "map", "trainer.total_epochs", default=30),
    _k("trainer.val_before_train", "map", "trainer.val_before_train", default=True),
    _k("trainer.default_local_dir", "map", "trainer.run_dir"),
    _k("trainer.total_training_steps", "map", "trainer.total_training_steps"),
    _k("trainer.test_freq", "map", "trainer.test_freq"),  # verl's -1 (never) is flowrl's 0 too
    _k("trainer.device", "refuse", does="the accelerator kind", nearest="flowrl uses CUDA when present",
       accept=("cuda", "cpu")),
    _k("trainer.balance_batch", "noop", does="reorders samples to balance tokens over data-parallel ranks",
       nearest="none: flowrl splits rows evenly"),
    _k("trainer.log_val_generations", "noop", does="validation samples printed to the logger",
       nearest="flowrl writes every validation sample to <run_dir>/validation/"),
    _k("trainer.val_only", "refuse", does="validates and exits", nearest="trainer.test_freq", accept=_OFF),
    _k("trainer.ray_wait_register_center_timeout", "noop", does="Ray start-up timeout", nearest="cluster.timeout_s"),
    _k("trainer.del_local_ckpt_after_load", "refuse", does="deletes a checkpoint once loaded",
       nearest="trainer.max_ckpt_to_keep", accept=_OFF),
    _k("trainer.max_actor_ckpt_to_keep", "map", "trainer.max_ckpt_to_keep"),
    _k("trainer.max_critic_ckpt_to_keep", "map", "trainer.max_ckpt_to_keep"),
    _k("trainer.profile_steps", "refuse", does="Nsight profiling of steps", nearest="flowrl dashboard RUN_DIR",
       accept=_OFF),
    _k("model_engine", "refuse", does="the engine family of verl's actor, ref and critic configs",
       nearest="actor.strategy", accept=("dp",)),
    _k("ray_init.*", "noop", does="ray.init options", nearest="cluster.* (flowrl runs on Dask)"),
    _k("ray_kwargs.*", "noop", does="ray.init options", nearest="cluster.* (flowrl runs on Dask)"),
    # --- issue 37: the rest of verl 0.9.1's generated configs, so that no key verl defines is unknown
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
    _k("global_profiler.*", "noop", does="verl's profilers (Nsight, torch, NPU)", nearest="flowrl dashboard RUN_DIR"),
    _k(f"{AR}.rollout.profiler.*", "noop", does="verl's rollout profiler", nearest="flowrl dashboard RUN_DIR"),
    _k(f"{AR}.actor.checkpoint.*", "noop", does="which parts verl saves and loads",
       nearest="flowrl saves model, optimizer and data state together (trainer.save_freq)"),
    _k("critic.checkpoint.*", "noop", does="which parts verl saves and loads", nearest="trainer.save_freq"),
    _k("critic.fsdp.param_offload", "dyn", "critic.fsdp_config.param_offload", does="CPU offload of the critic",
       nearest="critic.fsdp_config.param_offload", accept=_OFF),
    _k("critic.fsdp.optimizer_offload", "dyn", "critic.fsdp_config.optimizer_offload",
       does="CPU offload of the critic's optimizer", nearest="critic.fsdp_config.optimizer_offload", accept=_OFF),
    _k("critic.fsdp.qat.*", "refuse", does="quantization-aware training", nearest="none", accept=_OFF),
    _k("critic.fsdp.*", "noop", does="verl's FSDP engine options of the critic", nearest="critic.fsdp_config.*"),
    # actor / ref / critic: verl's implementation knobs
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
    _k(f"{AR}.ref.strategy", "noop", does="the reference's engine", nearest="the reference uses actor.strategy"),
    # Ulysses sequence parallelism (issue 31): actor, ref and critic, and the FSDP engine's copies of them
    _k(f"{AR}.ref.ulysses_sequence_parallel_size", "map", "ref.ulysses_sequence_parallel_size"),
    _k("critic.ulysses_sequence_parallel_size", "map", "critic.ulysses_sequence_parallel_size"),
    *(_k(f"{prefix}.fsdp_config.ulysses_sequence_parallel_size", "map", f"{to}.ulysses_sequence_parallel_size")
      for prefix, to in ((f"{AR}.actor", "actor"), (f"{AR}.ref", "ref"), ("critic.model", "critic"))),
    _k(f"{AR}.actor.fsdp_config.fsdp_size", "noop", does="the FSDP group size (-1: all ranks)",
       nearest="flowrl shards over the role's data-parallel group, as verl's -1"),
    _k(f"{AR}.ref.fsdp_config.fsdp_size", "noop", does="the FSDP group size", nearest="ref.data_parallel_size"),
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
    _k("critic.optim.clip_grad", "map", "critic.optim.grad_clip"),
    _k("critic.optim.*", "refuse", does="a critic optimizer option flowrl lacks", nearest="critic.optim.lr",
       accept=_OFF),
    _k("critic.enable", "noop", does="starts a critic", nearest="flowrl starts one for algorithm.adv_estimator=gae"),
    _k("critic.loss_scale_factor", "refuse", does="a constant loss divisor", nearest="critic.loss_agg_mode",
       accept=(None,)),
    _k("critic.forward_micro_batch_size", "derive", does="the critic's global forward micro-batch (deprecated): "
       "critic.forward_micro_batch_size_per_gpu = it // the GPUs it is split over"),
    # model
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
    _k("algorithm.filter_groups.max_inflight_gen_batches", "noop", does="concurrent regenerations of DAPO",
       nearest="algorithm.filter_groups.max_num_gen_batches"),
    _k("reward_model.model.*", "refuse", does="the reward model's loading options", nearest="reward_model.model_path",
       accept=_OFF),
    _k(f"{AR}.hybrid_engine", "noop", does="actor and rollout share GPUs", nearest="flowrl's placement"),
    _k(f"{AR}.nccl_timeout", "noop", does="NCCL timeout", nearest="cluster.timeout_s"),
    # rollout
    *(_k(f"{AR}.rollout.{knob}", "noop", does=why, nearest=near) for knob, why, near in (
        ("calculate_log_probs", "returns the rollout's log-probs", "flowrl's actor recomputes them"),
        ("layered_summon", "gathers FSDP weights layer by layer for the sync", "flowrl's reshard plan (rollout.reshard_*)"),
        ("multi_stage_wake_up", "wakes vLLM's weights and cache in two stages", "a memory option"),
        ("load_format", "how vLLM loads its first weights", "flowrl syncs the actor's weights before each rollout"),
        ("max_num_seqs", "vLLM's concurrent sequences", "no flowrl setting yet: vLLM's own default"),
        ("max_model_len", "vLLM's context length", "flowrl sets data.max_prompt_length + rollout.response_length"),
        ("enable_prefix_caching", "vLLM's prefix cache", "no flowrl setting yet: vLLM's own default"),
        ("cudagraph_capture_sizes", "vLLM's CUDA-graph batch sizes", "rollout.enforce_eager"),
        ("disable_log_stats", "vLLM's statistics log", "none"),
        ("checkpoint_engine.*", "verl's weight-sync transport", "rollout.reshard_transport, rollout.reshard_bucket_mb"),
        ("prometheus.*", "vLLM's Prometheus metrics", "flowrl dashboard RUN_DIR"),
        ("trace.*", "traces of agent-loop rollouts", "flowrl dashboard RUN_DIR"),
        ("skip_tokenizer_init", "vLLM without its tokenizer", "none"),
        ("scheduling_policy", "vLLM's scheduler policy", "none"),
        ("moe_load_balance_metrics_interval", "MoE load metrics", "none"),
        ("seed", "the rollout engine's seed", "trainer.seed"),
        ("full_determinism", "bitwise-deterministic rollouts", "trainer.seed"),
        ("logprobs_mode", "which log-probs the engine returns", "flowrl's actor recomputes them"),
        ("engine_kwargs.vllm.*", "extra vLLM engine arguments", "no flowrl setting yet: vLLM's own defaults"),
        ("engine_kwargs.*", "arguments of another engine (SGLang, TensorRT-LLM)", "read only with that rollout.name"),
        ("agent.*", "verl's agent-loop workers", "rollout.multi_turn.*"),
        ("n_gpus_per_node", "GPUs of a separate rollout pool", "rollout.data_parallel_size"),
        ("nnodes", "nodes of a separate rollout pool", "rollout.data_parallel_size"),
    )),
    _k(f"{AR}.rollout.do_sample", "refuse", does="greedy training rollouts", nearest="rollout.temperature",
       accept=(True,)),
    _k(f"{AR}.rollout.ignore_eos", "refuse", does="generates past EOS", nearest="rollout.response_length", accept=_OFF),
    _k(f"{AR}.rollout.disaggregation.*", "refuse", does="disaggregated prefill/decode", nearest="none", accept=_OFF),
    _k(f"{AR}.rollout.qat.*", "refuse", does="quantization-aware training", nearest="none", accept=_OFF),
    _k(f"{AR}.rollout.mtp.*", "refuse", does="multi-token prediction", nearest="none", accept=_OFF),
    _k(f"{AR}.rollout.quantization", "refuse", does="a quantized rollout engine", nearest="model.dtype", accept=_OFF),
    _k(f"{AR}.rollout.quantization_config_file", "refuse", does="a quantized rollout engine", nearest="model.dtype",
       accept=_OFF),
    _k(f"{AR}.rollout.expert_parallel_size", "refuse", does="the rollout's expert parallelism (MoE)",
       nearest="rollout.tensor_model_parallel_size", accept=(1, None)),
    _k(f"{AR}.rollout.enable_rollout_routing_replay", "refuse", does="MoE routing replay", nearest="none",
       accept=_OFF),
    _k(f"{AR}.rollout.router_config_path", "refuse", does="a router in front of rollout servers", nearest="none",
       accept=_OFF),
    _k(f"{AR}.rollout.over_sample_rate", "refuse", does="over-samples and drops the slowest rollouts",
       nearest="rollout.n", accept=_OFF),
    _k(f"{AR}.rollout.multi_turn.*", "refuse", does="verl's multi-turn tool and interaction configs",
       nearest="rollout.multi_turn.tools, rollout.multi_turn.parser, rollout.multi_turn.max_turns", accept=_OFF),
    _k(f"{AR}.rollout.multi_turn.enable", "map", "rollout.multi_turn.enable"),
    # verl's tool config: its tools join flowrl's (flowrl.agents.verl_tools); tool_reward_coef=0 as verl (derive)
    _k(f"{AR}.rollout.multi_turn.tool_config_path", "map", "rollout.multi_turn.tool_config_path"),
    # algorithm
    _k("algorithm.use_pf_ppo", "refuse", does="preference-feedback PPO", nearest="algorithm.adv_estimator",
       accept=_OFF),
    _k("algorithm.pf_ppo.*", "noop", does="options of PF-PPO", nearest="read only with algorithm.use_pf_ppo"),
    *(_k(f"algorithm.rollout_correction.{key}", "derive", does=does) for key, does in (
        ("rollout_is", "token or sequence: truncated weights pi_old / pi_rollout"),
        ("rollout_is_threshold", "their bound; IcePop's lower_upper in bypass mode (refused in decoupled mode)"),
        ("bypass_mode", "bypass mode: pi_old := pi_rollout, the loss per micro-batch (flowrl.algos.rollout_correction)"),
        ("loss_type", "bypass mode's loss: ppo_clip or reinforce"),
        ("rollout_is_batch_normalize", "bypass mode: the weights divided by their mean (refused in decoupled mode)"),
        ("rollout_rs", "bypass mode's rejection sampling, verl's k1/k2/k3 options (refused in decoupled mode)"),
        ("rollout_rs_threshold", "the bounds of rollout_rs"))),
    _k("algorithm.rollout_correction.*", "refuse", does="an option of verl's rollout correction flowrl lacks",
       nearest="algorithm.rollout_is*, algorithm.rollout_rs*", accept=_OFF),
    # data
    # flowrl's prompt loader reads a row's images from verl's default column (flowrl.data.images.IMAGES_COLUMN)
    _k("data.image_key", "refuse", does="the column of a row's images (verl's default: images)",
       nearest="name the column images, which flowrl reads", accept=("images", None)),
    _k("data.video_key", "noop", does="the column of videos", nearest="flowrl reads text and image prompts"),
    _k("data.audio_key", "noop", does="the column of audio", nearest="flowrl reads text and image prompts"),
    _k("data.image_patch_size", "refuse", does="the patch size images are resized to a multiple of",
       nearest="flowrl takes it from the model's image processor (Qwen2/2.5-VL: 14)", accept=(14, None)),
    _k("data.mm_processor_kwargs", "refuse", does="options of the multi-modal processor (e.g. max_pixels)",
       nearest="flowrl uses the model's image processor as saved", accept=({}, None)),
    _k("data.return_multi_modal_inputs", "noop", does="multi-modal inputs",
       nearest="flowrl computes a row's image inputs where the model runs"),
    _k("data.return_raw_input_ids", "noop", does="keeps raw token ids", nearest="flowrl keeps them"),
    _k("data.return_full_prompt", "noop", does="keeps the rendered prompt", nearest="flowrl keeps it"),
    _k("data.filter_overlong_prompts_workers", "noop", does="processes filtering prompts", nearest="none"),
    _k("data.use_shm", "noop", does="reads data through shared memory", nearest="a loading speed option"),
    _k("data.validation_shuffle", "noop", does="shuffles validation prompts", nearest="none"),
    _k("data.custom_cls.*", "refuse", does="a dataset class of your own", nearest="data.prompt_key", accept=_OFF),
    _k("data.tool_config_path", "refuse", does="tools of the dataset", nearest="rollout.multi_turn.tools",
       accept=_OFF),
    _k("data.function_tool_path", "refuse", does="tool functions", nearest="rollout.multi_turn.tools", accept=_OFF),
    _k("data.apply_chat_template_kwargs.*", "refuse", does="extra chat-template arguments",
       nearest="the tokenizer's template", accept=_OFF),
    _k("data.apply_chat_template_kwargs", "refuse", does="extra chat-template arguments",
       nearest="the tokenizer's template", accept=({}, None)),
    _k("data.tokenizer", "refuse", does="a tokenizer other than the model's", nearest="model.path", accept=_OFF),
    _k("data.trust_remote_code", "refuse", does="runs a dataset's or tokenizer's own code", nearest="none",
       accept=_OFF),
    _k("data.train_max_samples", "refuse", does="caps the training prompts", nearest="trainer.total_training_steps",
       accept=(-1, None)),
    _k("data.gen_batch_size", "refuse", does="DAPO's generation batch", nearest="algorithm.filter_groups.*",
       accept=_OFF),
    # reward (verl's reward loop), distillation, transfer queue, skip
    _k("reward.custom_reward_function.path", "derive", does="a Python file holding your reward function"),
    _k("reward.custom_reward_function.name", "derive", does="the reward function's name in that file"),
    _k("reward.num_workers", "noop", does="reward workers", nearest="flowrl scores rewards on its workers"),
    _k("reward_model.num_workers", "noop", does="reward workers", nearest="flowrl scores rewards on its workers"),
    _k("reward.reward_manager.*", "refuse", does="how rule rewards are computed (naive, prime, dapo, ...)",
       nearest="algorithm.reward_fn; reward_model.overlong_buffer for DAPO", accept=_OFF),
    _k("reward.reward_model.enable", "refuse", does="a generative reward model served by verl's reward loop",
       nearest="reward_model.enable with reward_model.model_path (a scoring model)", accept=_OFF),
    _k("reward.reward_model.*", "noop", does="options of the reward loop's model",
       nearest="read only with reward.reward_model.enable"),
    _k("reward_model.rollout.*", "noop", does="the reward loop's generation server",
       nearest="read only with a generative reward model, which flowrl refuses"),
    _k("reward_model.reward_loop_source", "refuse", does="a reward loop of your own",
       nearest="algorithm.reward_fn", accept=_OFF + ("register",)),
    _k("reward_model.reward_loop_module_path", "refuse", does="a reward loop of your own",
       nearest="algorithm.reward_fn", accept=_OFF),
    _k("reward_model.reward_loop_class_name", "refuse", does="a reward loop of your own",
       nearest="algorithm.reward_fn", accept=_OFF),
    _k("reward_model.enable_resource_pool", "refuse", does="a GPU pool of the reward model's own",
       nearest="reward_model.data_parallel_size", accept=_OFF),
    _k("reward_model.n_gpus_per_node", "noop", does="GPUs of the reward pool", nearest="reward_model.data_parallel_size"),
    _k("reward_model.nnodes", "noop", does="nodes of the reward pool", nearest="reward_model.data_parallel_size"),
    _k("reward_model.use_reward_loop", "noop", does="verl's reward loop", nearest="flowrl's reward stage"),
    _k("reward_model.reward_kwargs.*", "refuse", does="arguments of verl's reward manager",
       nearest="reward_model.overlong_buffer.*", accept=_OFF),
    _k("distillation.enabled", "refuse", does="on-policy distillation from teacher models", nearest="none",
       accept=_OFF),
    _k("distillation.*", "noop", does="options of distillation", nearest="read only with distillation.enabled"),
    _k("transfer_queue.enable", "refuse", does="verl's TransferQueue data plane", nearest="flowrl's Dask graph",
       accept=_OFF),
    _k("transfer_queue.*", "noop", does="options of the TransferQueue", nearest="read only with transfer_queue.enable"),
    _k("skip.*", "refuse", does="skips rollouts with recorded ones (a debugging switch)", nearest="none",
       accept=_OFF),
    # trainer
    _k("trainer.checkpoint_callback_class", "refuse", does="a checkpoint callback of your own",
       nearest="trainer.save_freq", accept=_OFF),
    _k("trainer.default_hdfs_dir", "refuse", does="copies checkpoints to HDFS", nearest="trainer.run_dir",
       accept=_OFF),
    _k("trainer.esi_redundant_time", "noop", does="saves before an expiring ESI instance stops",
       nearest="trainer.save_on_signal"),
    _k("trainer.rollout_data_dir", "refuse", does="dumps rollouts as JSONL", nearest="trainer.save_experience",
       accept=_OFF),
    _k("trainer.validation_data_dir", "noop", does="dumps validation samples",
       nearest="flowrl writes them to <run_dir>/validation/"),
    _k("trainer.use_v1", "refuse", does="verl's v1 trainer", nearest="none", accept=_OFF),
    _k("trainer.v1.*", "noop", does="options of verl's v1 trainer", nearest="read only with trainer.use_v1"),
    _k("trainer.use_legacy_worker_impl", "noop", does="verl's worker implementation", nearest="flowrl's engines"),

)



def main(argv: list[str] | None = None) -> int:
    """``python -m flowrl.config.verl_keys [--write PATH]``: print (or write) ``docs/verl-keys.md``."""
    from flowrl.config.verl_docs import write_document

    return write_document(argv, VERL_KEYS, REFUSED_VALUES)


if __name__ == "__main__":
    raise SystemExit(main())
