"""Asynchronous RL: seconds per GRPO step with ``trainer.staleness`` 1 against 0, on the same workers.

One run, split placement (one rollout and one actor worker, 1 torch thread each), the ``10m``
benchmark model of ``vs_trl.py`` (10.7M parameters, random init, EOS pushed down so every
response runs to ``response_length`` tokens). Blocks of K steps alternate between staleness 0 and
1 in ABBA order (0, 1, 1, 0, ...) after untimed warm-up steps, switching the same open run
(``Run.source.staleness``): with 0 each step generates, then trains, then syncs; with 1 the next
step's generation runs on the rollout worker while this one trains. A block's time per step is
its wall time over K (what a user waits for; per-step ``timing_s/step`` would hide the
generation that ran ahead). The first step of a staleness-1 block fills the pipeline and the
last of it hands one generation to the next block: both are inside the block, so the ratio is
that of alternating use, slightly pessimistic for long runs.

    python benchmarks/async_staleness.py --repeats 3 --out benchmarks/results/async_staleness.json
    python benchmarks/async_staleness.py --scale smoke --repeats 1   # a check that it runs (seconds)

Target (issue 15): staleness 1 at <= 0.65x the step time of staleness 0. The bound of perfect
overlap is max(gen, train) / (gen + train); the table shows the measured parts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, package_versions, table  # noqa: E402
from vs_trl import Common, Scale, prepare_inputs  # noqa: E402

SCALES = {
    "10m": Scale(preset="10m", max_position_embeddings=128, response_length=64, num_prompts=4, steps_per_block=4,
                 suppress_eos=True),
    "smoke": Scale(preset="default", max_position_embeddings=64, response_length=8, num_prompts=4, group_size=4,
                   steps_per_block=2),
}
STALENESS = (0, 1)


@dataclass(frozen=True)
class Block:
    staleness: int
    wall_s: float
    steps: list[dict]

    @property
    def per_step_s(self) -> float:
        return self.wall_s / len(self.steps)


def overrides(scale: Scale, common: Common, model_dir: Path, train_path: Path, run_dir: Path) -> list[str]:
    return [
        f"model.path={model_dir}", f"data.train_files={train_path}", f"data.train_batch_size={scale.num_prompts}",
        f"rollout.n={scale.group_size}", f"rollout.response_length={scale.response_length}",
        f"rollout.temperature={common.temperature}", f"actor.optim.lr={common.lr}",
        f"actor.ppo_mini_batch_size={scale.num_prompts}", "actor.use_kl_loss=false",
        "rollout.data_parallel_size=1", "actor.data_parallel_size=1", "cluster.placement=split",
        "trainer.staleness=1", "trainer.total_training_steps=100000", f"trainer.seed={common.seed}",
        f"trainer.run_dir={run_dir}", "trainer.progress=false", "trainer.save_experience=false",
    ]


def run_block(run, staleness: int, num_steps: int) -> Block:
    """K steps at ``staleness`` on the open run (a switch to 0 first trains what is in flight)."""
    run.source.staleness = staleness
    start = time.perf_counter()
    steps = []
    for _ in range(num_steps):
        _, m = run.step()
        steps.append({"step_s": m["timing_s/step"], "gen_s": m.get("timing_s/gen", 0.0),
                      "update_s": m.get("timing_s/update_actor", 0.0), "reshard_s": m.get("timing_s/reshard", 0.0),
                      "staleness": m.get("async/staleness_max", 0.0), "tokens": m["num_response_tokens"]})
    return Block(staleness, time.perf_counter() - start, steps)


def summarize(blocks: list[Block]) -> dict:
    out = {}
    for s in STALENESS:
        mine = [b for b in blocks if b.staleness == s]
        steps = [st for b in mine for st in b.steps]
        out[s] = {"per_step_s": statistics.median(b.per_step_s for b in mine),
                  "gen_s": statistics.median(st["gen_s"] for st in steps),
                  "update_s": statistics.median(st["update_s"] for st in steps),
                  "blocks": len(mine)}
    # ratios of adjacent pairs (ABBA: each 1-block against its neighbouring 0-block)
    pairs = [(blocks[i], blocks[i + 1]) for i in range(0, len(blocks) - 1, 2)]
    ratios = [(b.per_step_s / a.per_step_s) if b.staleness == 1 else (a.per_step_s / b.per_step_s) for a, b in pairs]
    gen, upd = out[0]["gen_s"], out[0]["update_s"]
    return {"by_staleness": out, "pair_ratios": ratios, "ratio": statistics.median(ratios),
            "overlap_bound": max(gen, upd) / (gen + upd) if gen + upd else float("nan")}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="10m")
    parser.add_argument("--repeats", type=int, default=3, help="ABBA rounds (each: 0, 1, 1, 0)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--workdir", default="/tmp/flowrl-bench/async_staleness")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    scale, common = SCALES[args.scale], Common()

    from flowrl.config import load_config
    from flowrl.run import Run, resolve_inputs

    workdir = Path(args.workdir) / f"{args.scale}-{int(time.time())}"
    model_dir, train_path = prepare_inputs(scale, common, workdir)
    cfg = resolve_inputs(load_config(None, overrides(scale, common, model_dir, train_path, workdir / "run")))
    run = Run.open(cfg)
    blocks: list[Block] = []
    try:
        run_block(run, 0, args.warmup)
        for _ in range(args.repeats):
            for s in (0, 1, 1, 0):
                blocks.append(run_block(run, s, scale.steps_per_block))
    finally:
        run.close()
    result = {"benchmark": "async_staleness", "scale": asdict(scale), "repeats": args.repeats,
              "when": datetime.now(timezone.utc).isoformat(), "machine": machine_info(),
              "versions": package_versions(("flowrl", "torch", "dask", "distributed")),
              **summarize(blocks), "blocks": [{**asdict(b), "per_step_s": b.per_step_s} for b in blocks]}
    by = result["by_staleness"]
    print(table(["staleness", "s/step (block wall / K)", "gen s", "update s", "blocks"],
                [[s, f"{by[s]['per_step_s']:.3f}", f"{by[s]['gen_s']:.3f}", f"{by[s]['update_s']:.3f}", by[s]["blocks"]]
                 for s in STALENESS]))
    print(f"step-time ratio staleness 1 / 0: {result['ratio']:.3f} (pairs {', '.join(f'{r:.3f}' for r in result['pair_ratios'])}); "
          f"perfect-overlap bound {result['overlap_bound']:.3f}; target <= 0.65")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
