"""Shared prompts (``actor.use_prefix_grouper``) against the per-row layout: one train step and one
old-log-prob pass of a ~10M Qwen2 on GRPO groups, with the token budget.

    python benchmarks/prefix_grouper.py [--repeats 7] [--out benchmarks/results/prefix_grouper.json]

64 rows = 4 prompts x 16 samples, prompts of 6 tokens, responses of spread lengths (1-8 tokens,
mean 3.6; and 1-128, mean 64.5), and prompts of 128 tokens with responses of 1-128;
``use_dynamic_bsz`` with 16384 tokens (one micro-batch). Both
layouts run in this process on one torch thread from the same weights, alternated step by step
(so load from other users hits all alike); each cell is the median of ``--repeats`` steps.
Layouts: ``rows`` (packed lines, one sequence per row), ``shared`` (the default shared-prompt
layout: a group is split where its one segment's dense attention would cost more than the
shared prompt saves, ``token_layout.cheapest_segments``), ``shared_one_segment`` (every group
one segment however long, for comparison).
Compare the ratios: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median, table, write_json  # noqa: E402

SHORT = [1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 5, 6, 7, 8]  # mean 3.625
LONG = [1 + round(127 * i / 15) for i in range(16)]  # 1, 9, ..., 128: mean 64.5


def group_table(lengths: list[int], *, prompt_len: int = 6, num_prompts: int = 4, seed: int = 0):
    """``num_prompts`` groups of ``len(lengths)`` rows: each group one random prompt, its responses
    the given lengths in a shuffled order; random advantages."""
    import pyarrow as pa
    import torch

    from flowrl.data import experience as ex

    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(num_prompts):
        prompt = torch.randint(3, 99, (prompt_len,), generator=g).tolist()
        for i in torch.randperm(len(lengths), generator=g).tolist():
            prompts.append(prompt)
            responses.append(torch.randint(3, 99, (lengths[i],), generator=g).tolist())
    adv = [[float(a)] * len(r) for a, r in zip(torch.randn(len(responses), generator=g), responses)]
    return pa.table({
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "old_logprobs": ex.from_lists([[-2.0] * len(r) for r in responses], ex.TOKEN_FLOATS),
    })


def build_model(directory: Path) -> int:
    """The ``10m`` tiny preset (hidden 512, 4 layers, 8 heads, 4 kv heads, tied) over the
    99-token character vocabulary, saved in ``directory``; its parameter count."""
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import TINY_PRESETS, build_tiny_model, count_parameters

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, **TINY_PRESETS["10m"], max_position_embeddings=256)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return count_parameters(model)


def role(model_dir: Path, shared: bool):
    from flowrl.config import ActorConfig, OptimConfig
    from flowrl.roles.policy import PolicyRole

    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-5), use_kl_loss=False, use_dynamic_bsz=True,
                        ppo_max_token_len_per_gpu=16384, log_prob_use_dynamic_bsz=True,
                        log_prob_max_token_len_per_gpu=16384, use_prefix_grouper=shared)
    return PolicyRole(rank=0, world_size=1, model_dir=str(model_dir), actor=actor, response_length=128)


LAYOUTS = {  # name: (use_prefix_grouper, token_layout.PAIR_COST_PER_HIDDEN while it runs)
    "rows": (False, None),
    "shared": (True, None),  # the default: long groups split where that is cheaper
    "shared_one_segment": (True, 0.0),  # every group one segment, however long
}


def measure(roles: dict[str, object], table, repeats: int) -> dict:
    """Median seconds of ``update`` (one optimizer step) and ``compute_logprobs`` per layout,
    alternated; plus positions computed per update."""
    from flowrl.data import token_layout

    default = token_layout.PAIR_COST_PER_HIDDEN
    times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in roles for k in ("update", "logprobs")}
    slots: dict[str, int] = {}
    for i in range(repeats + 1):  # the first round warms up (first-call allocations), not timed
        for name, r in roles.items():
            cost = LAYOUTS[name][1]
            token_layout.PAIR_COST_PER_HIDDEN = default if cost is None else cost
            before = r.engine.slots_computed
            t0 = time.perf_counter()
            r.update(table, mini_batch_rows=table.num_rows)
            t1 = time.perf_counter()
            slots[name] = r.engine.slots_computed - before
            r.compute_logprobs(table)
            t2 = time.perf_counter()
            if i:
                times[(name, "update")].append(t1 - t0)
                times[(name, "logprobs")].append(t2 - t1)
    token_layout.PAIR_COST_PER_HIDDEN = default
    out = {f"{n}_{k}_s": median(v) for (n, k), v in times.items()}
    out.update({f"{n}_slots": v for n, v in slots.items()})
    for name in roles:
        if name != "rows":
            out[f"{name}_update_ratio"] = out[f"{name}_update_s"] / out["rows_update_s"]
            out[f"{name}_logprobs_ratio"] = out[f"{name}_logprobs_s"] / out["rows_logprobs_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/prefix_grouper.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {"machine": machine_info(), "torch_threads": 1, "repeats": args.repeats, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        results["parameters"] = build_model(Path(tmp))
        roles = {name: role(Path(tmp), shared) for name, (shared, _) in LAYOUTS.items()}
        for name, lengths, prompt_len in (("prompt 6, responses 1-8", SHORT, 6), ("prompt 6, responses 1-128", LONG, 6),
                                          ("prompt 128, responses 1-128", LONG, 128)):
            batch = group_table(lengths, prompt_len=prompt_len)
            tokens = round((prompt_len + sum(lengths) / len(lengths)) * batch.num_rows)
            results["cases"][name] = {"rows": batch.num_rows, "real_tokens": tokens,
                                      "mean_response": sum(lengths) / len(lengths), **measure(roles, batch, args.repeats)}
    results["machine"]["load_avg_after"] = list(__import__("os").getloadavg())
    rows = [[case, layout, c["real_tokens"], c[f"{layout}_slots"], c[f"{layout}_update_s"],
             c.get(f"{layout}_update_ratio", 1.0), c[f"{layout}_logprobs_s"], c.get(f"{layout}_logprobs_ratio", 1.0)]
            for case, c in results["cases"].items() for layout in LAYOUTS]
    print(table(["case", "layout", "real tokens", "slots", "update s", "vs rows", "old logp s", "vs rows"], rows))
    write_json(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
