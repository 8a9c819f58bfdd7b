"""verl's ``critic.*`` keys (model, optimizer, batching; its FSDP and Megatron sub-trees live in
:mod:`flowrl.config.verl_keys_fsdp` and :mod:`flowrl.config.verl_keys_megatron`) and the reward
keys: ``reward_model.*``, verl's reward managers and reward loop (``reward.*``), the custom reward
function and sandbox fusion. A part of :data:`flowrl.config.verl_keys.VERL_KEYS`."""

from __future__ import annotations

from flowrl.config.verl_key import _OFF, VerlKey, _k

CRITIC_REWARD_KEYS: tuple[VerlKey, ...] = (
    # --- critic (batching: as the actor's, a verl YAML's default is not adopted)
    *(_k(f"critic.{key}", "map", f"critic.{key}", adopt=False) for key in (
        "use_dynamic_bsz", "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu")),
    _k("critic.model.path", "map", "critic.model_path"),
    _k("critic.model.*", "refuse", does="the critic's model options", nearest="critic.model_path", accept=_OFF),
    _k("critic.grad_clip", "map", "critic.optim.grad_clip"),
    _k("critic.ppo_micro_batch_size", "derive", does="the critic's global micro-batch (deprecated): "
       "critic.ppo_micro_batch_size_per_gpu = it // the GPUs it is split over"),
    _k("critic.forward_micro_batch_size", "derive", does="the critic's global forward micro-batch (deprecated): "
       "critic.forward_micro_batch_size_per_gpu = it // the GPUs it is split over"),
    _k("critic.optim.warmup_style", "map", "critic.optim.lr_scheduler_type"),
    _k("critic.optim.clip_grad", "map", "critic.optim.grad_clip"),
    _k("critic.optim.*", "refuse", does="a critic optimizer option flowrl lacks", nearest="critic.optim.lr",
       accept=_OFF),
    _k("critic.checkpoint.*", "noop", does="which parts verl saves and loads", nearest="trainer.save_freq"),
    _k("critic.enable", "noop", does="starts a critic", nearest="flowrl starts one for algorithm.adv_estimator=gae"),
    _k("critic.loss_scale_factor", "refuse", does="a constant loss divisor", nearest="critic.loss_agg_mode",
       accept=(None,)),
    # --- reward model
    _k("reward_model.model.path", "map", "reward_model.model_path"),
    _k("reward_model.model.input_tokenizer", "refuse", does="re-tokenises responses for a reward model with "
       "another tokenizer", nearest="a reward model sharing the policy's tokenizer", accept=_OFF),
    _k("reward_model.model.*", "refuse", does="the reward model's loading options", nearest="reward_model.model_path",
       accept=_OFF),
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
    _k("reward_model.reward_kwargs.*", "refuse", does="arguments of verl's reward manager",
       nearest="reward_model.overlong_buffer.*", accept=_OFF),
    _k("reward.reward_manager.*", "refuse", does="how rule rewards are computed (naive, prime, dapo, ...)",
       nearest="algorithm.reward_fn; reward_model.overlong_buffer for DAPO", accept=_OFF),
    # --- the custom reward function and sandbox fusion
    _k("custom_reward_function.path", "derive", does="a Python file holding your reward function"),
    _k("custom_reward_function.name", "derive", does="the reward function's name in that file"),
    _k("custom_reward_function.reward_kwargs", "refuse", does="keyword arguments for the reward function",
       nearest="functools.partial in your module, named by algorithm.reward_fn", accept=({}, None)),
    _k("sandbox_fusion.*", "map", "sandbox.*"),  # url, max_concurrent, memory_limit_mb (issue 38)
    _k("reward.sandbox_fusion.*", "map", "sandbox.*"),
    _k("reward_model.sandbox_fusion.*", "map", "sandbox.*"),
    # --- verl's reward loop
    _k("reward.custom_reward_function.path", "derive", does="a Python file holding your reward function"),
    _k("reward.custom_reward_function.name", "derive", does="the reward function's name in that file"),
    _k("reward.num_workers", "noop", does="reward workers", nearest="flowrl scores rewards on its workers"),
    _k("reward_model.num_workers", "noop", does="reward workers", nearest="flowrl scores rewards on its workers"),
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
)
