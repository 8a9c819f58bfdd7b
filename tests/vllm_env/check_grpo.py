"""GRPO through the CLI with ``rollout.name=vllm`` (CPU build) on the default addition task, in
the hybrid placement (issue 29, the default for vLLM): each of the 2 rank processes holds its
trainer (dp 2) and its half of one vLLM engine of tp 2 (external launcher: the engine's tp group
is made of the trainer's processes, over gloo); after every update the reshard node loads the
trainer's tensors into the engine by reference (``reshard/bytes`` 0; each rank's vLLM worker keeps
its own tp slice; the engine sleeping in between and woken weights-then-KV-cache), the engine's
log-probs equal the trainer's (the gap's bulk within 1e-5; its largest token no further from the
exact float64 value than the trainer's own, i.e. fp32 rounding, not the sync), the reward rises,
and the rank's memory peak stays within 1.15x its trainer's state plus the engine's KV cache. The colocated vLLM path (an engine of its
own, adapters only) is ``check_lora_grpo.py``'s. Runs in the vLLM environment
(``test_vllm_env.py``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.tasks.default_task import prepare_default_task

STEPS = 12
KV_GIB = 3


@pytest.fixture(scope="module")
def task():
    # The default task with the "vllm" model preset (head_dim 32: vLLM's CPU attention has no
    # kernel for the default preset's head_dim 8). Cached like the default task.
    cache = Path(os.environ.get("FLOWRL_CACHE_DIR", Path.home() / ".cache" / "flowrl"))
    return prepare_default_task(cache / "default_task_vllm", preset="vllm")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, task):
    out = tmp_path_factory.mktemp("grpo_vllm") / "run"
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train",
        f"model.path={task.model_dir}", f"data.train_files={task.train_path}", f"trainer.run_dir={out}",
        "rollout.name=vllm", "rollout.enforce_eager=true", "cluster.placement=hybrid",
        # one vLLM engine of tp 2 over the two trainer processes (its tp group: theirs, over gloo)
        "rollout.data_parallel_size=1", "rollout.tensor_model_parallel_size=2", "actor.data_parallel_size=2",
        "actor.use_kl_loss=false",
        f"trainer.total_training_steps={STEPS}", "data.train_batch_size=32", "rollout.n=8",
        "actor.ppo_mini_batch_size=16",  # two optimizer steps per batch: the old-log-prob pass runs
        # the engine sleeps after each generation (on CPU vLLM pauses, frees nothing) and the
        # reshard wakes it
        "rollout.free_cache_engine=true",
        # the weights step STEPS generates with (after update STEPS - 1), for the float64 reference
        f"trainer.save_freq={STEPS - 1}",
    ]
    # a 3 GiB KV cache per engine rank: vLLM's CPU engine holds ~0.2-0.3 GB of its own beyond it
    # (test_a_hybrid_ranks_peak_...), which at the suite's usual 1 GiB is 28-35 % of the budget
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=450, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"done: {STEPS} steps" in proc.stdout
    print(proc.stdout.splitlines()[-1])
    return out


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_engine_logprobs_equal_the_trainers_after_every_reshard(run_dir):
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        # step k generates with the weights the reshard delivered after update k-1
        assert ("timing_s/reshard" in row) == (row["step"] > 1)
        assert "timing_s/rollout_sleep" in row
        # vLLM's CPU kernels against transformers', both fp32, on ~1000 tokens a step: 99 % of
        # tokens within 1e-5 (2-5e-6 measured), a mean near fp32's resolution; the single largest
        # token (up to 8e-5) is the float64 test's below
        assert row["rollout/logprob_diff_p99"] < 1e-5, row["rollout/logprob_diff_p99"]
        assert row["rollout/logprob_diff_mean"] < 1e-6, row["rollout/logprob_diff_mean"]
        assert row["rollout/logprob_diff_max"] < 2e-4, row["rollout/logprob_diff_max"]


def test_the_largest_gap_is_fp32_rounding_not_the_sync(run_dir, task):
    """The vLLM preset's attention is sharp (scores amplify q/k rounding ~10x), so on its worst
    token any fp32 forward is up to ~5e-5 from the exact value, the trainer's included; two fp32
    forwards with other summation orders then differ by up to twice that. Against a float64
    forward of the weights the last step generated with, the engine is no further from exact than
    the trainer is: a sync that missed or rounded a tensor would be 1e-3 or more off."""
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM

    from flowrl.checkpoint.hf_export import export_hf

    hf_dir = run_dir.parent / "hf_before_last_step"
    export_hf(run_dir / "checkpoints" / f"step_{STEPS - 1:08d}", hf_dir, str(task.model_dir))
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64).eval()
    table = pq.read_table(run_dir / "experience" / f"step_{STEPS:06d}.parquet")
    engine_err, trainer_err = [], []
    with torch.no_grad():
        for prompt, response, engine, trainer in zip(*(table.column(c).to_pylist() for c in (
                "prompt_ids", "response_ids", "rollout_logprobs", "old_logprobs"))):
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
            exact = logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]
            engine_err.append((torch.tensor(engine, dtype=torch.float64) - exact).abs())
            trainer_err.append((torch.tensor(trainer, dtype=torch.float64) - exact).abs())
    engine_err, trainer_err = torch.cat(engine_err), torch.cat(trainer_err)
    print(f"vs float64 on {engine_err.numel()} tokens: engine max {engine_err.max():.2e} mean {engine_err.mean():.2e}, "
          f"trainer max {trainer_err.max():.2e} mean {trainer_err.mean():.2e}")
    assert trainer_err.max() < 1e-4  # the exported checkpoint is the weights of the step's old log-probs
    assert engine_err.max() <= 2 * trainer_err.max() + 2e-6
    assert engine_err.mean() <= 2 * trainer_err.mean() + 1e-7


def test_the_hybrid_sync_moves_no_bytes_and_reports_its_hand_over(run_dir):
    rows = [r for r in _rows(run_dir) if r["step"] > 1]
    for row in rows:
        # the trainer's own tensors, by reference: nothing crosses a process, nothing is staged
        assert row["reshard/bytes"] == 0 and row["reshard/peak_extra_bytes"] == 0, row
        for phase in ("actor", "rollout", "sync"):
            assert row[f"perf/hybrid_{phase}_peak_mem_bytes"] > 0
        assert all(row[f"perf/hybrid_{k}_s"] >= 0 for k in ("wake_weights", "load", "wake_kv_cache"))
    print("hybrid sync: load_s", [round(r["perf/hybrid_load_s"], 4) for r in rows],
          "rollout peak RSS GB", [round(r["perf/hybrid_rollout_peak_mem_bytes"] / 1e9, 3) for r in rows])


def test_a_hybrid_ranks_peak_is_within_1_15x_the_trainers_state_plus_the_kv_budget(run_dir):
    """The rank's memory above what its libraries take (vLLM imported, nothing built), at the end
    of each phase (RSS: the CPU has no allocator peak), over the trainer's parameters, gradients
    and AdamW state plus vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE per engine rank).

    The excess is vLLM's CPU engine itself: ~180 MB beyond its KV cache when built, growing to
    ~300 MB over its first ~40 generations, then flat; a constant of the engine, not of the model
    or the sync. So the ratio depends on the KV budget: 1.10-1.12 measured at 3 GiB, 1.28-1.35 at
    1 GiB. What flowrl adds is asserted exactly: the sync phase ends no higher than the phases
    before it (the trainer's tensors are loaded by reference)."""
    rows = [r for r in _rows(run_dir) if r["step"] > 1]
    for row in rows:
        assert row["perf/hybrid_kv_cache_bytes"] == KV_GIB * 2**30  # each tp rank's engine: its own, once
        assert row["perf/hybrid_trainer_state_bytes"] > 0
        before = max(row["perf/hybrid_actor_peak_mem_bytes"], row["perf/hybrid_rollout_peak_mem_bytes"])
        assert row["perf/hybrid_sync_peak_mem_bytes"] <= before + 16 * 2**20, row
        assert 1.0 < row["perf/hybrid_peak_over_state_and_kv"] <= 1.15, row
    print("hybrid rank peak / (trainer state + KV cache):",
          [round(r["perf/hybrid_peak_over_state_and_kv"], 3) for r in rows],
          f"trainer state {rows[-1]['perf/hybrid_trainer_state_bytes'] / 2**20:.1f} MiB, "
          f"KV {rows[-1]['perf/hybrid_kv_cache_bytes'] / 2**20:.0f} MiB")
