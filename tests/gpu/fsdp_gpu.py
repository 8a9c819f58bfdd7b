"""GPU check of the fsdp backend (prepared, one process, timeout in test_gpu.py): FSDP2 over NCCL
on the visible GPUs (world = GPU count, at most 4) against the dp backend on the CPU: token
log-probs and one update's parameters agree (fp32, TF32 off), and a sharded checkpoint saved on
the GPUs restores under dp on the CPU bitwise. LoRA (``model.lora_rank``) the same way: log-probs
and merged weights after one update agree with dp LoRA on the CPU, the reference (adapters
disabled) gives the base model's log-probs, AdamW holds the adapters only, and the adapter
checkpoint saved on the GPUs restores under dp bitwise. All GPU cases run in one spawn.

    PYTHONPATH=tests python tests/gpu/fsdp_gpu.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def main() -> int:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from conftest import build_tiny_model_dir
    from flowrl_testing.fsdp import (batch, load_and_report, lora_load, lora_step, policy_step, run_cases,
                                     save_after_step)

    torch.backends.cuda.matmul.allow_tf32 = False
    world = max(1, min(4, torch.cuda.device_count()))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model_dir(Path(tmp) / "model"))
        table = batch(4 * world)
        dp = policy_step(0, 1, model_dir, "dp", table)
        gpu, saved, lora = run_cases(world, [
            (policy_step, (model_dir, "fsdp", table)),
            (save_after_step, (model_dir, table, str(Path(tmp) / "ckpt" / "step_1"))),
            (lora_step, (model_dir, "fsdp", table, str(Path(tmp) / "lora" / "step_1"))),
        ], backend="nccl")
        logp = max(float((r["logp"] - dp["logp"]).abs().max()) for r in gpu)
        params = max(float((gpu[0]["state"][k] - dp["state"][k]).abs().max()) for k in dp["state"])
        print(f"fsdp on {world} GPU(s) vs dp on CPU: max |logp| diff {logp:.2e}, max |param| diff {params:.2e}")
        back = load_and_report(0, 1, model_dir, "dp", saved[0]["saved"]["path"])
        same = all(torch.equal(back["state"][k], saved[0]["state"][k]) for k in saved[0]["state"])
        print(f"checkpoint saved on GPU restores under dp bitwise: {same}")
        lora_ok = _check_lora(lora, dp, lora_step(0, 1, model_dir, "dp", table),
                              lora_load(0, 1, model_dir, "dp", lora[0]["saved"]["path"]))
    ok = logp < 1e-4 and params < 1e-4 and same and lora_ok
    print("FSDP GPU CHECK", "OK" if ok else "FAILED")
    return 0 if ok else 1


def _check_lora(gpu: list[dict], dp: dict, lora_dp: dict, back: dict) -> bool:
    """LoRA on the GPUs against dp LoRA on the CPU; ``dp``: the plain dp step (its log-probs
    before the update are the base model's)."""
    import torch

    logp = max(float((r["logp"] - lora_dp["logp"]).abs().max()) for r in gpu)
    merged = max(float((gpu[0]["state"][k] - lora_dp["state"][k]).abs().max()) for k in lora_dp["state"])
    ref = max(float((torch.tensor([x for row in r["ref"] for x in row]) - dp["logp"]).abs().max()) for r in gpu)
    optim = sum(r["bytes"]["optim"] for r in gpu) == 2 * lora_dp["adapter_bytes"]
    adapters = gpu[0]["optimized"] == lora_dp["optimized"] and set(gpu[0]["source"]) == set(dp["state"]) - {"lm_head.weight"}  # tied
    same = all(torch.equal(back["state"][k], gpu[0]["state"][k]) for k in gpu[0]["state"])
    print(f"lora on GPU vs dp lora on CPU: max |logp| diff {logp:.2e}, max |merged param| diff {merged:.2e}, "
          f"max |ref - base| {ref:.2e}; AdamW holds the adapters only: {optim and adapters}; "
          f"adapter checkpoint restores under dp bitwise: {same}")
    return logp < 1e-4 and merged < 1e-4 and ref < 1e-4 and optim and adapters and same


if __name__ == "__main__":
    sys.exit(main())
