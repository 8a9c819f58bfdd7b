"""verl's ``actor_rollout_ref.rollout.*`` keys: the generation engine's sizes and batching, vLLM's
settings (``rollout.max_num_seqs``, ``max_model_len``, ``enable_prefix_caching``, ``engine_kwargs``;
verl's other engine knobs: no effect, each with its reason), multi-turn tools and turns, and what
flowrl's rollout lacks, refused by name. A part of :data:`flowrl.config.verl_keys.VERL_KEYS`."""

from __future__ import annotations

from flowrl.config.verl_key import _OFF, VerlKey, _k
from flowrl.config.verl_names import AR

ROLLOUT_KEYS: tuple[VerlKey, ...] = (
    # --- sizes, batching and the engine
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
    _k(f"{AR}.rollout.profiler.*", "noop", does="verl's rollout profiler", nearest="flowrl dashboard RUN_DIR"),
    # --- vLLM's engine settings (flowrl.config.rollout_engine). A verl YAML's max_num_seqs default (1024)
    # is not adopted: flowrl's null is rollout.micro_batch_size, the sequences of one generate call
    _k(f"{AR}.rollout.max_num_seqs", "map", "rollout.max_num_seqs", default=1024, adopt=False),
    _k(f"{AR}.rollout.max_model_len", "map", "rollout.max_model_len"),  # null: prompt + response, as verl
    _k(f"{AR}.rollout.enable_prefix_caching", "map", "rollout.enable_prefix_caching", default=True),
    _k(f"{AR}.rollout.engine_kwargs.vllm.*", "derive", "rollout.engine_kwargs.*",
       does="extra vLLM engine arguments: rollout.engine_kwargs.* (passed to vllm.LLM last; those flowrl sets "
            "itself refused, naming the key to use)"),
    # the engine's first weights: flowrl's engine starts without reading them (dummy; a vision-language
    # model: auto) and always gets the trainer's before it generates, so any load_format samples the same
    _k(f"{AR}.rollout.load_format", "noop", does="how vLLM loads its first weights (dummy, auto, safetensors, ...)",
       nearest="none needed: flowrl syncs the trainer's weights before every rollout, whatever was loaded"),
    # --- verl's engine and agent-loop knobs (no effect), then what flowrl lacks (refused by name)
    *(_k(f"{AR}.rollout.{knob}", "noop", does=why, nearest=near) for knob, why, near in (
        ("calculate_log_probs", "returns the rollout's log-probs", "flowrl's actor recomputes them"),
        ("layered_summon", "gathers FSDP weights layer by layer for the sync", "flowrl's reshard plan (rollout.reshard_*)"),
        ("multi_stage_wake_up", "wakes vLLM's weights and cache in two stages", "a memory option"),
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
    # verl's turn caps: flowrl's max_turns = min(max_assistant_turns, max_user_turns + 1), null or 0 no
    # cap (flowrl.config.verl_rollout.turn_caps)
    _k(f"{AR}.rollout.multi_turn.max_assistant_turns", "derive", "rollout.multi_turn.max_turns",
       does="caps the model's turns: flowrl's max_turns (the smaller with max_user_turns + 1; null or 0: no cap)"),
    # verl 0.4's multi_turn.max_turns (0.5 renamed it max_assistant_turns): its SGLang loop counted the model's turns
    _k(f"{AR}.rollout.multi_turn.max_turns", "derive", "rollout.multi_turn.max_turns",
       does="verl 0.4's name of max_assistant_turns: caps the model's turns"),
    # the SGLang server mode of verl's example configs (sglang_multiturn/config/*_server.yaml), no key of verl's own
    _k(f"{AR}.rollout.sglang_rollout_mode", "refuse", does="SGLang's rollout mode (engine or server)",
       nearest="rollout.name", accept=_OFF),
    _k(f"{AR}.rollout.server.*", "refuse", does="options of an SGLang rollout server", nearest="rollout.name",
       accept=_OFF),
    _k(f"{AR}.rollout.multi_turn.max_user_turns", "derive", "rollout.multi_turn.max_turns",
       does="caps the tool-answer (user) turns: flowrl's max_turns = max_user_turns + 1 (the model turn after "
            "the last answer; the smaller with max_assistant_turns; null or 0: no cap)"),
)
