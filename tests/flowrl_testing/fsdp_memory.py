"""The per-rank memory table of the fsdp note: parameters + gradients + AdamW state of one rank
after one update, dp vs fsdp at 4 ranks, on a small Llama built in code.

    PYTHONPATH=tests python tests/flowrl_testing/fsdp_memory.py [world]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def main(world: int = 4) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from conftest import build_tiny_model_dir
    from flowrl_testing.fsdp import batch, memory_step, run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model_dir(Path(tmp), hidden_size=128, num_layers=4, intermediate_size=512)
        table = batch(4 * world)
        rows = {s: run_ranks(world, memory_step, str(model_dir), s, table) for s in ("dp", "fsdp")}
    print(f"| strategy (world {world}) | rank | params MiB | grads MiB | AdamW MiB | total MiB |")
    print("|---|---|---|---|---|---|")
    for strategy, ranks in rows.items():
        for rank, b in enumerate(ranks):
            total = sum(b.values())
            print(f"| {strategy} | {rank} | {b['params'] / 2**20:.3f} | {b['grads'] / 2**20:.3f} | "
                  f"{b['optim'] / 2**20:.3f} | {total / 2**20:.3f} |")
    dp, fsdp = (max(sum(b.values()) for b in rows[s]) for s in ("dp", "fsdp"))
    print(f"\nlargest fsdp rank / dp rank: {fsdp / dp:.3f} (ideal {1 / world:.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
