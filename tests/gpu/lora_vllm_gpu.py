"""GRPO with LoRA (``model.lora_rank=8``) and ``rollout.name=vllm`` on a GPU (issue 17): the engine
reads the base weights once at its start and each weight sync sends only the adapters, installed
as its LoRA adapter (``flowrl.backends.reshard.adapters``); the CPU twin is
``tests/vllm_env/check_lora_grpo.py``.

    PYTHONPATH=tests python tests/gpu/lora_vllm_gpu.py   (an environment with `pip install 'vllm>=0.32'`)

A 4-step run on the embedded default task's data with a model vLLM runs (``tiny_preset("vllm")``),
one actor rank (dp, CPU) and one rollout rank (vLLM on cuda:0). Checks: every sync's
``reshard/bytes`` equals the adapters' bytes (a fraction of the model's); the engine's log-probs
equal the trainer's at every step (``rollout/logprob_diff_max``); after the last step the engine's
log-probs of a fixed prompt and response equal those of the ``hf`` backend on the trainer's merged
weights ``W + (alpha/r) B A`` (fp32, TF32 off) and differ from the base model's. Exits non-zero on
the first failed check; prints one line per check.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: flowrl_testing

STEPS, RANK, ALPHA = 4, 8, 16
LOGPROB_ATOL = 1e-3  # vLLM's GPU kernels (fp32, LoRA through punica) against transformers on the CPU


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    import pyarrow as pa

    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.config import load_config
    from flowrl.tasks.default_task import prepare_default_task
    from flowrl.models.lora import LoraSpec, is_adapter
    from flowrl.run import Run, resolve_inputs
    from flowrl_testing import lora_adapters

    torch.backends.cuda.matmul.allow_tf32 = False
    tmp = Path(tempfile.mkdtemp(prefix="flowrl-lora-vllm-gpu-"))
    task = prepare_default_task(tmp / "task", preset="vllm")
    cfg = resolve_inputs(load_config(None, [
        f"model.path={task.model_dir}", f"data.train_files={task.train_path}", f"trainer.run_dir={tmp / 'run'}",
        "rollout.name=vllm", "rollout.enforce_eager=true", "rollout.gpu_memory_utilization=0.3",
        "rollout.data_parallel_size=1", "actor.data_parallel_size=1", f"trainer.total_training_steps={STEPS}",
        "data.train_batch_size=16", "rollout.n=4", "actor.ppo_mini_batch_size=8", "trainer.progress=false",
        f"model.lora_rank={RANK}", f"model.lora_alpha={ALPHA}", "actor.optim.lr=2e-2",
    ]))
    prompt = pa.table({"prompt_ids": [[3, 4, 5, 6, 7, 8]], "response_ids": [list(range(10, 22))]})
    run = Run.open(cfg)
    try:
        rows = [run.step()[1] for _ in range(STEPS)]
        rows.append(run.sync.take())  # the last step's sync
        rollout, actor = run.groups["rollout"], run.groups["actor"]
        (engine_table,), _ = rollout.run(rollout.reserve(), "compute_logprobs", prompt)
        (merged,), _ = actor.run(actor.reserve(), "hf_state_dict")
    finally:
        run.close()

    model = lora_adapters.peft_model(str(task.model_dir), LoraSpec(rank=RANK, alpha=ALPHA))
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if is_adapter(n))
    model_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not is_adapter(n))
    synced = [r["reshard/bytes"] for r in rows if "reshard/bytes" in r]
    assert len(synced) == STEPS and all(b == adapter_bytes for b in synced), (synced, adapter_bytes)
    assert adapter_bytes < model_bytes / 4
    print(f"ok  every sync sent the adapters only: {synced[0]:.0f} B (the base model: {model_bytes} B)")

    diffs = [r["rollout/logprob_diff_max"] for r in rows[:STEPS]]
    assert max(diffs) < LOGPROB_ATOL, diffs
    print(f"ok  vLLM's log-probs equal the trainer's every step: max {max(diffs):.2e}")

    def hf_logprobs(state):
        hf = HFGenerator(str(task.model_dir))
        if state is not None:
            hf.load_hf_state(state)
        (logp,) = hf.logprobs(prompt.column("prompt_ids").to_pylist(), prompt.column("response_ids").to_pylist(),
                              temperature=1.0)
        return torch.tensor(logp)

    engine = torch.tensor(engine_table.column("gen_logprobs").to_pylist()[0])
    want, base = hf_logprobs(merged), hf_logprobs(None)
    diff, moved = float((engine - want).abs().max()), float((want - base).abs().max())
    assert diff < LOGPROB_ATOL, f"vLLM with the adapter vs hf on merged weights: {diff}"
    assert moved > 1e-2, f"the adapters did not change the policy ({moved})"
    print(f"ok  fixed prompt: vLLM with the adapter = hf on merged weights within {diff:.2e} "
          f"(merged vs base {moved:.2e})")
    print("all LoRA vllm GPU checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
