"""Reshard benchmark: planned transport vs the naive gather-and-broadcast, 4 CPU workers (gloo).

    python benchmarks/reshard.py [--repeats 3] [--bucket-mb 16] [--out benchmarks/results/reshard.json]

A Llama-shaped model of about 79M parameters (hidden 1024, 4 layers, 16 heads / 4 KV heads, ffn
2816, vocabulary 16384, untied), bf16 on the wire, is resharded between several (training,
generation) layout pairs on 4 spawned processes, colocated (both layouts on the same 4 processes,
micro-DP placement) and split (2 training + 2 generation processes). Each process builds only its
own synthetic source shard (``tests/flowrl_testing/reshard.py``) and every destination shard is
checked bit for bit after the first run. Per (pair, transport): bytes moved over the network, the
plan's theoretical minimum, the largest staging peak of any process (counted by the transport)
against the target M/(t_g*p_g) + one bucket, and the median wall time; the planned/naive wall time
ratio is measured in the same run, the two transports alternating within each repeat.

The machine's other load shifts absolute times; ratios within one run much less.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # flowrl_testing (test helpers)

from _common import machine_info, table, write_json  # noqa: E402

from flowrl.parallel.shard_spec import ModelShape  # noqa: E402

MODEL = ModelShape(vocab_size=16384, hidden_size=1024, ffn_hidden_size=2816, num_layers=4, num_heads=16,
                   num_kv_heads=4, head_dim=64)
TINY = ModelShape(vocab_size=61, hidden_size=16, ffn_hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                  head_dim=4)


def _case(name: str, src: tuple[int, int, int], dst: tuple[int, int, int], placement: str, **styles: str) -> dict:
    dims = lambda t: dict(zip(("dp", "tp", "pp"), t))  # noqa: E731
    return {"name": name, "src": dims(src), "dst": dims(dst), "placement": placement, **styles}


CASES = [
    # colocated on 4 processes: (dp, tp, pp) -> (dp, tp, pp)
    _case("TP2xPP2 -> TP1xDP4", (1, 2, 2), (4, 1, 1), "colocated"),
    _case("TP4 -> TP1xDP4", (1, 4, 1), (4, 1, 1), "colocated"),
    _case("TP4 -> TP2xDP2", (1, 4, 1), (2, 2, 1), "colocated", dst_style="vllm"),
    _case("TP2xPP2 -> TP2xDP2", (1, 2, 2), (2, 2, 1), "colocated", dst_style="vllm"),
    _case("TP2xDP2 -> TP1xDP4", (2, 2, 1), (4, 1, 1), "colocated"),
    # split: 2 training processes -> 2 generation processes
    _case("TP2 -> TP1xDP2 (split)", (1, 2, 1), (2, 1, 1), "split"),
    _case("TP2 -> TP2 (split)", (1, 2, 1), (1, 2, 1), "split", dst_style="vllm"),
    _case("DP2 -> DP2 (split, dp trainer)", (2, 1, 1), (2, 1, 1), "split", src_style="hf"),
]


def summarize(records: list[dict]) -> list[dict]:
    """One row per case: planned vs naive bytes, staging peaks against the bound, wall times."""
    by_case: dict[str, dict[str, dict]] = {}
    for r in records:
        by_case.setdefault(r["case"], {})[r["transport"]] = r
    rows = []
    for case, runs in by_case.items():
        planned, naive = runs["planned"], runs.get("naive")
        row = {
            "case": case,
            "placement": planned["placement"],
            "model_bytes": planned["model_bytes"],
            "bytes_moved": planned["bytes_moved"],
            "bytes_min": planned["bytes_min"],
            "moved_over_min": planned["bytes_moved"] / planned["bytes_min"] if planned["bytes_min"] else 1.0,
            "peak_extra_bytes_max": max(planned["peak_extra_bytes"]),
            "peak_bound_bytes": planned["peak_bound_bytes"],
            "peak_within_bound": max(planned["peak_extra_bytes"]) <= planned["peak_bound_bytes"],
            "wall_s": planned["wall_s_median"],
            "exact": planned["exact"] and (naive is None or naive["exact"]),
        }
        if naive is not None:
            pairs = zip(planned["wall_s"], naive["wall_s"])
            row.update({
                "wall_over_naive_per_repeat": [p / n for p, n in pairs],
                "naive_bytes_moved": naive["bytes_moved"],
                "naive_peak_extra_bytes_max": max(naive["peak_extra_bytes"]),
                "naive_wall_s": naive["wall_s_median"],
                "wall_over_naive": planned["wall_s_median"] / naive["wall_s_median"],
            })
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    mb = 2**20
    headers = ["layout pair", "moved MB", "min MB", "moved/min", "naive MB", "peak MB", "bound MB",
               "naive peak MB", "wall s", "naive s", "wall/naive", "exact"]
    body = [[r["case"], r["bytes_moved"] / mb, r["bytes_min"] / mb, r["moved_over_min"],
             r.get("naive_bytes_moved", 0) / mb, r["peak_extra_bytes_max"] / mb, r["peak_bound_bytes"] / mb,
             r.get("naive_peak_extra_bytes_max", 0) / mb, r["wall_s"], r.get("naive_wall_s", float("nan")),
             r.get("wall_over_naive", float("nan")), str(r["exact"])] for r in rows]
    return table(headers, body)


def run(model: ModelShape = MODEL, cases: list[dict] = CASES, *, bucket_bytes: int = 16 << 20, repeats: int = 3,
        dtype: str = "bfloat16", timeout_s: float = 1800) -> dict[str, Any]:
    """Run every case on 4 spawned processes; the JSON-ready result (records and summary rows)."""
    from flowrl_testing.reshard import run_cases

    start = time.perf_counter()
    records = run_cases(4, model, cases, bucket_bytes=bucket_bytes, dtype=dtype, repeats=repeats,
                        timeout_s=timeout_s)
    rows = summarize(records)
    return {
        "model": dataclasses.asdict(model),
        "num_params": sum(int(__import__("math").prod(s)) for s in model.param_shapes().values()),
        "dtype": dtype, "bucket_bytes": bucket_bytes, "repeats": repeats, "workers": 4,
        "wall_s": time.perf_counter() - start, "machine": machine_info(),
        "summary": rows, "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=16.0)
    parser.add_argument("--tiny", action="store_true", help="a tiny model (seconds; for a smoke run)")
    parser.add_argument("--out", default="benchmarks/results/reshard.json")
    args = parser.parse_args(argv)
    result = run(TINY if args.tiny else MODEL, bucket_bytes=int(args.bucket_mb * 2**20), repeats=args.repeats)
    print(f"model: {result['num_params'] / 1e6:.1f}M parameters, {result['dtype']}, bucket "
          f"{args.bucket_mb:g} MiB, 4 workers, median of {args.repeats}")
    print(format_table(result["summary"]))
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
