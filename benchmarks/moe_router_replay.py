"""Routing replay (R3): the rollout/trainer log-prob mismatch of a mixture-of-experts policy whose
rollout engine routes differently from the trainer, with and without replay.

On the CPU the ``hf`` decode loop and the trainer's forward agree to the last bit in fp32 and in
bf16 (measured: the same experts for every token and layer, log-probs equal), so the mismatch an
inference engine's own kernels cause on a GPU is made here: the rollout engine's routers get a
perturbation the trainer does not see (each router weight plus ``noise`` x its standard
deviation x N(0, 1), seeded), everything else identical. The rollout samples ``--prompts``
train prompts x ``--n`` of the tiny MoE default task (``model.tiny=moe``'s warmed-up Qwen3-MoE)
and records its experts; the dp trainer computes the log-probs of those samples plainly and with
``routed_experts`` replayed (old-log-prob layout: token budget and shared prompts, the run's
defaults). Reported per noise level: the share of (token, layer) top-k sets the trainer's own
routing agrees with, and over response tokens mean |rollout - trainer| log-prob, the max, and
verl's ``rollout_corr/kl`` = mean(rollout - trainer) and ``k3_kl``.

    python benchmarks/moe_router_replay.py --out benchmarks/results/moe_router_replay.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, package_versions, table, write_json  # noqa: E402


def mismatch(rollout_T, trainer_T) -> dict[str, float]:
    import torch

    r = trainer_T - rollout_T  # old - rollout, verl's log-ratio
    return {"mean_abs": float(r.abs().mean()), "max_abs": float(r.abs().max()), "kl": float((-r).mean()),
            "k3_kl": float((torch.exp(r) - r - 1).mean())}


def measure(model_dir: str, prompts: list[list[int]], n: int, noise: float, seed: int, budget: int) -> dict:
    import pyarrow as pa
    import torch

    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data import experience as ex
    from flowrl.data.packed import PackedBatch
    from flowrl.models import moe_routing as mr

    gen = HFGenerator(model_dir)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for router in mr.moe_routers(gen.model):
            w = router.weight
            w.add_(noise * w.std() * torch.randn(w.shape, generator=g))
    responses, logprobs = gen.generate(prompts, SamplingParams(n=n, max_new_tokens=8), seed=seed)
    table_ = pa.table({
        "prompt_ids": ex.from_lists([p for p in prompts for _ in range(n)], ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "rollout_logprobs": ex.from_lists(logprobs, ex.TOKEN_FLOATS),
        mr.ROUTES_COLUMN: ex.from_lists(gen.last_routed_experts, pa.list_(pa.int16())),
    })
    rollout_T, _ = ex.token_column(table_, "rollout_logprobs")
    engine = TorchDPEngine(model_dir, trainable=False)
    out: dict = {"noise": noise, "samples": table_.num_rows, "response_tokens": int(rollout_T.numel())}
    routed = mr.with_routes(PackedBatch.from_table(table_), table_).with_token_budget(budget).with_shared_prompts(True)
    agree = total = 0
    plain_parts = []
    for mb in routed.micro_batches(1):  # the plain pass, keeping each micro-batch's routing
        plain = PackedBatch(mb.prompt_P, mb.prompt_cu_B1, mb.response_T, mb.response_cu_B1, {}, budget, True)
        plain_parts.append(engine.forward_logprobs(plain, micro_batch_size=1)[0])
        map_N = mr.position_map(mb, engine.pair_cost).reshape(-1)
        record = mb.routes_XW.reshape(-1, len(engine.moe_tap.indices), engine.moe_tap.indices[0].shape[-1])
        record = record[map_N.clamp(min=0)].long()
        for layer, used_Nk in enumerate(engine.moe_tap.indices):
            known = (record[:, layer] >= 0).all(-1) & (map_N >= 0)
            agree += int((used_Nk[known].sort(-1).values == record[known, layer].sort(-1).values).all(-1).sum())
            total += int(known.sum())
    out["routing_agreement"] = agree / max(total, 1)
    out["plain"] = mismatch(rollout_T, torch.cat(plain_parts))
    replay_T, _ = engine.forward_logprobs(routed, micro_batch_size=1)
    out["replay"] = mismatch(rollout_T, replay_T)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "flowrl"), help="trainer.cache_dir")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.02, 0.05, 0.1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import torch

    from transformers import AutoTokenizer

    from flowrl.data.prompts import render_prompt
    from flowrl.tasks.default_task import default_task_dir, prepare_default_task

    torch.set_num_threads(1)
    start = time.perf_counter()
    task = prepare_default_task(Path(args.cache) / default_task_dir("moe"), preset="moe")
    rows = pq.read_table(task.train_path).slice(0, args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    prompts = [tokenizer.encode(render_prompt(p, tokenizer), add_special_tokens=False)
               for p in rows.column("prompt").to_pylist()]
    results = [measure(str(task.model_dir), prompts, args.n, noise, args.seed, budget=10240) for noise in args.noise]
    print(table(["router noise", "routing agreement", "mean |dlogp| plain", "replay", "max plain", "replay",
                 "rollout_corr/kl plain", "replay"],
                [[r["noise"], f"{r['routing_agreement']:.4f}", f"{r['plain']['mean_abs']:.5f}",
                  f"{r['replay']['mean_abs']:.5f}", f"{r['plain']['max_abs']:.3f}", f"{r['replay']['max_abs']:.3f}",
                  f"{r['plain']['kl']:.5f}", f"{r['replay']['kl']:.5f}"] for r in results]))
    if args.out:
        write_json({"benchmark": "moe_router_replay", "results": results, "seconds": time.perf_counter() - start,
                    "settings": vars(args), "machine": machine_info(),
                    "packages": package_versions(["torch", "transformers"])}, args.out)


if __name__ == "__main__":
    main()
