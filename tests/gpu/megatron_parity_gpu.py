"""Megatron backend parity on CUDA over NCCL: one script, a pass/fail table, exit 1 on failure.

    python tests/gpu/megatron_parity_gpu.py [--max-world N]

The same checks as tests/dist/test_megatron_parity.py (token log-probs and entropies vs
transformers, the state after one AdamW step vs a single-process fp32 CPU reference, grad norm,
DP replicas bit-identical), for every layout whose world size fits the visible GPUs (one rank per
GPU: NCCL does not run two ranks on one device). Layouts of one world size run in turn in one
spawned process group. The fp32 tolerances are looser than on CPU: cuBLAS sums in another order
than the CPU reference (not yet measured on a GPU machine; the table prints the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))  # flowrl_testing

FP32 = {"logp": 5e-5, "entropy": 5e-5, "state": 2e-5, "grad_norm_rel": 1e-4, "loss": 1e-5}
BF16 = {"logp": 0.1, "entropy": 0.1, "state": 2e-2, "grad_norm_rel": 5e-2, "loss": 1e-2}


def _job(name, model, dp, tp, pp, **kwargs):
    return {"name": name, "model": model, "dp": dp, "tp": tp, "pp": pp, **kwargs}


PLANS = {
    1: [_job("(1,1,1) llama", "llama", 1, 1, 1),
        _job("(1,1,1) llama bf16", "llama", 1, 1, 1, bf16=True),
        _job("(1,1,1) qwen2 tied", "qwen2", 1, 1, 1)],
    2: [_job("(2,1,1) llama", "llama", 2, 1, 1),
        _job("(1,2,1) llama pad64", "llama", 1, 2, 1, make_vocab_size_divisible_by=32),
        _job("(1,1,2) llama", "llama", 1, 1, 2),
        _job("(1,1,2) llama vpp2", "llama", 1, 1, 2, vpp=2),
        _job("(1,1,2) qwen2 tied vpp2 bf16 distopt", "qwen2", 1, 1, 2, vpp=2, bf16=True,
             use_distributed_optimizer=True)],
    4: [_job("(1,2,2) llama", "llama", 1, 2, 2),
        _job("(2,2,1) llama distopt", "llama", 2, 2, 1, use_distributed_optimizer=True),
        _job("(2,1,2) llama", "llama", 2, 1, 2),
        _job("(2,1,2) llama vpp2", "llama", 2, 1, 2, vpp=2, micro_batch_size=1),
        _job("(1,4,1) llama kv<tp", "llama", 1, 4, 1),
        _job("(1,2,2) qwen2 tied", "qwen2", 1, 2, 2)],
    8: [_job("(2,2,2) llama", "llama", 2, 2, 2),
        _job("(2,2,2) llama vpp2 distopt", "llama", 2, 2, 2, vpp=2, micro_batch_size=1,
             use_distributed_optimizer=True)],
}


def _failures(result: dict, tol: dict, ref_grad_norm: float) -> list[str]:
    checks = {
        "logp": max(result["logp@1.0"], result["logp@0.7"]) <= tol["logp"],
        "entropy": max(result["entropy@1.0"], result["entropy@0.7"]) <= tol["entropy"],
        "state": result["state"] <= tol["state"],
        "grad_norm": result["grad_norm"] <= tol["grad_norm_rel"] * ref_grad_norm,
        "loss": result["loss"] <= tol["loss"],
        "dp_identical": result["dp_identical"],
    }
    return [name for name, ok in checks.items() if not ok]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-world", type=int, default=None, help="largest world size to run")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per world size")
    parser.add_argument("--cpu", action="store_true",
                        help="run the plan over gloo on CPU (checks this script without a GPU)")
    args = parser.parse_args(argv)

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (--cpu runs the plan over gloo)")
        return 2
    try:
        from flowrl.comm import free_port
        from flowrl_testing import megatron as testing
    except ImportError as exc:  # megatron-core or transformers missing
        print(f"cannot import the megatron backend: {exc}")
        return 2
    num_gpus = (args.max_world or 4) if args.cpu else torch.cuda.device_count()
    max_world = min(num_gpus, args.max_world or num_gpus)
    backend, start_method = ("gloo", None) if args.cpu else ("nccl", "spawn")
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as root:
        models = {}
        for name, kwargs in (("llama", {"kind": "llama"}),
                             ("qwen2", {"kind": "qwen2", "tied": True})):
            ref = testing.prepare_reference(f"{root}/{name}", f"{root}/{name}.pt", **kwargs)
            models[name] = ({"model_dir": f"{root}/{name}", "ref_path": f"{root}/{name}.pt"},
                            ref["grad_norm"])
        for world, plan in PLANS.items():
            if world > max_world:
                rows.append((f"world {world}", "SKIP", f"needs {world} ranks, {max_world} allowed"))
                continue
            jobs = [{**models[j["model"]][0], **{k: v for k, v in j.items() if k != "model"}}
                    for j in plan]
            out = f"{root}/results_{world}.json"
            start = time.monotonic()
            try:
                testing.spawn(testing.layouts_worker, world_size=world, timeout_s=args.timeout,
                              args=(world, free_port(), jobs, out, backend),
                              start_method=start_method)
            except Exception as exc:  # a rank failed or hung: the whole world size fails
                rows.append((f"world {world}", "FAIL", f"{type(exc).__name__}: {exc}"[:200]))
                failed = True
                continue
            for spec, result in zip(plan, json.load(open(out))):
                tol = BF16 if spec.get("bf16") else FP32
                bad = _failures(result, tol, models[spec["model"]][1])
                failed |= bool(bad)
                detail = (f"logp {max(result['logp@1.0'], result['logp@0.7']):.1e} "
                          f"ent {max(result['entropy@1.0'], result['entropy@0.7']):.1e} "
                          f"state {result['state']:.1e} dgnorm {result['grad_norm']:.1e} "
                          f"dp== {result['dp_identical']} {result['seconds']:.1f}s")
                rows.append((spec["name"], "FAIL " + ",".join(bad) if bad else "PASS", detail))
            print(f"world {world}: {time.monotonic() - start:.1f} s", flush=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'layout':<{width}}  {'result':<12}  numbers")
    for name, status, detail in rows:
        print(f"{name:<{width}}  {status:<12}  {detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
