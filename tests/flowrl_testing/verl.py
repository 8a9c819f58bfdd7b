"""verl's published GRPO example (examples/grpo_trainer/run_qwen2-7b.sh, verl 0.9.1) as its
argument list, and GSM8K-style prompt files, for the tests of verl compatibility."""

from __future__ import annotations

from pathlib import Path

#: The 37 ``key=value`` arguments of run_qwen2-7b.sh, as published (shell quoting removed).
RUN_QWEN2_7B = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.val_files=$HOME/data/gsm8k/test.parquet",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    'trainer.logger=["console","wandb"]',
    "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


def tiny_overrides(model_dir: Path, train: Path, val: Path, run_dir: Path) -> list[str]:
    """What the script's ``$@`` appends to run on this machine: local paths, the hf rollout
    on one CPU worker per replica, two 'GPUs', small batches and 8 new tokens, two steps."""
    return [
        f"data.train_files={train}", f"data.val_files={val}", f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=2", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.max_response_length=8", "trainer.total_training_steps=2", f"trainer.run_dir={run_dir}",
        "trainer.progress=false",
    ]


def write_gsm8k_style(path: Path, rows: int, *, prompt_chars: int = 64, split: str = "train") -> Path:
    """verl's GSM8K Parquet layout (``prompt`` chat, ``data_source=openai/gsm8k``,
    ``reward_model.ground_truth``, ``extra_info`` with ``answer``) with questions of
    ``prompt_chars`` characters: 64 give 50-token prompts with the tiny char tokenizer (a token
    per character but spaces)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = []
    for i in range(rows):
        a, b = i % 97 + 3, (i * 7) % 89 + 5
        question = (f"Natalia sold {a} clips in April and {b} in May. How many in all? " * 3)[:prompt_chars]
        table.append({
            "data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i, "answer": f"#### {a + b}"},
        })
    pq.write_table(pa.Table.from_pylist(table), path)
    return path
