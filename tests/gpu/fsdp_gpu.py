"""GPU check of the fsdp backend (prepared, one process, timeout in test_gpu.py): FSDP2 over NCCL
on the visible GPUs (world = GPU count, at most 4) against the dp backend on the CPU: token
log-probs and one update's parameters agree (fp32, TF32 off), and a sharded checkpoint saved on
the GPUs restores under dp on the CPU bitwise.

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
    from flowrl_testing.fsdp import batch, load_and_report, policy_step, run_ranks, save_after_step

    torch.backends.cuda.matmul.allow_tf32 = False
    world = max(1, min(4, torch.cuda.device_count()))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model_dir(Path(tmp) / "model"))
        table = batch(4 * world)
        dp = policy_step(0, 1, model_dir, "dp", table)
        gpu = run_ranks(world, policy_step, model_dir, "fsdp", table, backend="nccl")
        logp = max(float((r["logp"] - dp["logp"]).abs().max()) for r in gpu)
        params = max(float((gpu[0]["state"][k] - dp["state"][k]).abs().max()) for k in dp["state"])
        print(f"fsdp on {world} GPU(s) vs dp on CPU: max |logp| diff {logp:.2e}, max |param| diff {params:.2e}")
        saved = run_ranks(world, save_after_step, model_dir, table, str(Path(tmp) / "ckpt" / "step_1"), backend="nccl")
        back = load_and_report(0, 1, model_dir, "dp", saved[0]["saved"]["path"])
        same = all(torch.equal(back["state"][k], saved[0]["state"][k]) for k in saved[0]["state"])
        print(f"checkpoint saved on GPU restores under dp bitwise: {same}")
    ok = logp < 1e-4 and params < 1e-4 and same
    print("FSDP GPU CHECK", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
