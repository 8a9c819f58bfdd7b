"""Peak memory per rank: the hybrid engine against the trainer alone and today's two processes.

For each model preset, three fresh processes each hold one placement's share of a rank and run
the same real steps (generate n samples per prompt on random prompts, then one PPO update on
them; ``flowrl_testing.hybrid.measure_memory``):

- ``train``: the trainer alone (dp engine, fp32 parameters, gradients, AdamW state);
- ``hybrid``: ``flowrl.roles.hybrid.HybridRole`` (trainer + hf generation on the same module);
- ``rollout``: the generation engine alone, the second process that ``cluster.placement=
  colocated`` starts per rank (today: rank = trainer process + rollout process).

Reported per rank: whole-process peak RSS (``getrusage``) and the tensor bytes each holds, with
the ratios hybrid / train and (train + rollout) / train. Run: ``python benchmarks/hybrid_memory.py``
(about a minute for both presets; ``--presets default`` for the quick one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
TESTS = Path(__file__).resolve().parents[1] / "tests"

from _common import machine_info, table, write_json  # noqa: E402

KINDS = ("train", "hybrid", "rollout")


def build_model(preset: str, directory: Path) -> Path:
    """A random-init model of ``preset`` with the character tokenizer, saved in ``directory``."""
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, **tiny_preset(preset), max_position_embeddings=128, seed=0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def measure(kind: str, model_dir: Path) -> dict:
    """One fresh process's measurement (``python -m flowrl_testing.hybrid KIND MODEL``)."""
    out = subprocess.run([sys.executable, "-m", "flowrl_testing.hybrid", kind, str(model_dir)], cwd=TESTS,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="default,10m")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "hybrid_memory.json"))
    args = parser.parse_args()
    results, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            model_dir = build_model(preset, Path(tmp) / preset)
            got = {kind: measure(kind, model_dir) for kind in KINDS}
            train, hybrid, rollout = (got[k] for k in KINDS)
            mib = 2.0**20
            results[preset] = {
                **got,
                "rss_ratio_hybrid": hybrid["rss_peak"] / train["rss_peak"],
                "rss_ratio_two_processes": (train["rss_peak"] + rollout["rss_peak"]) / train["rss_peak"],
                "tensor_ratio_hybrid": hybrid["tensor_total"] / train["tensor_total"],
                "tensor_ratio_two_processes": (train["tensor_total"] + rollout["tensor_total"]) / train["tensor_total"],
            }
            r = results[preset]
            rows.append([preset, train["rss_peak"] / mib, hybrid["rss_peak"] / mib,
                         (train["rss_peak"] + rollout["rss_peak"]) / mib, r["rss_ratio_hybrid"],
                         r["rss_ratio_two_processes"], train["tensor_total"] / mib, hybrid["tensor_total"] / mib,
                         (train["tensor_total"] + rollout["tensor_total"]) / mib, r["tensor_ratio_hybrid"],
                         r["tensor_ratio_two_processes"]])
    print(table(["preset", "RSS train MiB", "RSS hybrid", "RSS 2 procs", "hybrid/train", "2procs/train",
                 "tensors train MiB", "tensors hybrid", "tensors 2 procs", "hybrid/train", "2procs/train"], rows))
    write_json({"machine": machine_info(), "results": results}, args.out)


if __name__ == "__main__":
    main()
