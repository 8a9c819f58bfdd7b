"""A ~0.5B-parameter Qwen2 model with random weights and the addition prompts, written for
``tests/gpu/device_check.sh`` (no hub, no network).

    python tests/gpu/build_model.py OUT          # OUT/model (config, safetensors, tokenizer), OUT/data

The model has Qwen2-0.5B's layer shape (hidden 896, 14 heads of 64, 2 KV heads, MLP 4864, tied
embeddings) and the character tokenizer of the embedded task (99 tokens) instead
of Qwen2's 151,936-token vocabulary. Without that vocabulary's 136M embedding parameters, 33 layers
instead of Qwen2-0.5B's 24 give the same size (0.49B parameters) and about the same FLOPs per
token. Weights are saved in bf16, as Qwen2 checkpoints are. Random weights score 0 on the task:
the check measures speed, memory and where the ranks run, not learning.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Qwen2-0.5B's config.json, less the vocabulary (see the module docstring for the layer count).
QWEN2_05B_LAYER = dict(hidden_size=896, num_heads=14, num_kv_heads=2, intermediate_size=4864)
NUM_LAYERS = 33


def build(out: Path, *, num_layers: int = NUM_LAYERS, num_train: int = 256, seed: int = 0) -> int:
    """Write ``out/model`` and ``out/data/{train,test}.parquet``; return the parameter count."""
    import torch

    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, count_parameters
    from flowrl.tasks.arithmetic import write_addition_parquet

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, arch="qwen2", num_layers=num_layers, max_position_embeddings=512,
                             tie_word_embeddings=True, seed=seed, **QWEN2_05B_LAYER)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    (out / "model").mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    write_addition_parquet(out / "data", num_train, 32, seed)
    return count_parameters(model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write model/ and data/ into")
    parser.add_argument("--num-layers", type=int, default=NUM_LAYERS, help=f"default {NUM_LAYERS} (0.49B parameters)")
    args = parser.parse_args(argv)
    n = build(args.out, num_layers=args.num_layers)
    print(f"model: {args.out / 'model'} ({n / 1e9:.2f}B parameters, Qwen2, random bf16 weights); "
          f"data: {args.out / 'data'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
