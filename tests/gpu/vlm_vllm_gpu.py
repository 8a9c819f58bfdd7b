"""The vllm backend with a vision-language model on a GPU with official vLLM (the CPU build's run of
the same parity is ``tests/vllm_env/check_vlm.py``, which passes at 7.2e-7).

* ``parity``: a tiny Qwen2-VL built here (head_dim 32 for vLLM's attention: hidden 128, 4 heads;
  vision width 64, 2 heads), saved with its tokenizer and image processor. vLLM (fp32, eager) and
  the ``hf`` backend (fp32 on cuda:0) generate greedily on the same prompts with images (one and two
  images per prompt, two sizes); tokens equal, log-probs within 1e-3; vLLM's teacher-forced
  log-probs with the images equal hf's sampled ones; n = 4 samples per prompt come back
  prompt-major; then a weight sync of the perturbed in-memory state (transformers 5's
  ``model.language_model.*`` names, through ``checkpoint_layout``) into both, and parity again.
* ``train``: ``flowrl train configs/vlm_shapes.yaml rollout.name=vllm`` for a few steps (the
  embedded task's model; on the CPU build its head_dim 8 has no kernel, so
  ``tests/vllm_env/check_vlm_grpo.py`` trains a head_dim-32 VLM instead).

    PYTHONPATH=. python tests/gpu/vlm_vllm_gpu.py [--parts parity train] [--steps 3]

Each part runs in its own process under its own timeout; one table at the end; exit 1 if a part
failed. Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, vision_depth=1,
            vision_embed_dim=64, vision_heads=2, patch_size=8, merge_size=2, image_size=64, mrope_section=(8, 4, 4))


def build_vlm(out: Path) -> Path:
    from flowrl.models.tiny_vlm import build_image_processor, build_tiny_vlm, build_vlm_tokenizer

    tok = build_vlm_tokenizer()
    build_tiny_vlm(tok, **TINY, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    build_image_processor(patch_size=8, merge_size=2, image_size=64).save_pretrained(out)
    return out


def _png(width: int, height: int, colour: tuple[int, int, int], box: tuple[int, int, int, int]) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), (255, 255, 255))
    ImageDraw.Draw(img).rectangle(box, fill=colour)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def prompts_with_images(model_dir: Path) -> tuple[list[list[int]], list[list[bytes]]]:
    """Prompts expanded as flowrl's loader writes them (flowrl.data.images) and their images."""
    from transformers import AutoTokenizer

    from flowrl.data.images import check_image, expand_placeholders, image_token_count, load_image_processor

    tok, proc = AutoTokenizer.from_pretrained(model_dir), load_image_processor(model_dir)
    red, blue = _png(64, 64, (255, 0, 0), (8, 8, 40, 40)), _png(80, 48, (0, 0, 255), (20, 10, 60, 30))
    rows = [("<image>count?", [red]), ("<image>colour?", [blue]), ("<image> and <image>: same?", [red, blue]),
            ("<image>colour?", [red])]
    prompts = []
    for text, images in rows:
        counts = [image_token_count(*check_image(b), proc) for b in images]
        prompts.append(tok.encode(expand_placeholders(text, counts), add_special_tokens=False))
    return prompts, [images for _, images in rows]


def compare(engine, hf, prompts, images, what: str) -> list[list[int]]:
    from flowrl.backends.interfaces import SamplingParams

    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    tokens_v, logp_v = engine.generate(prompts, params, images=images)
    tokens_h, logp_h = hf.generate(prompts, params, images=images)
    assert tokens_v == tokens_h, f"{what}: greedy tokens differ\n{tokens_v}\n{tokens_h}"
    diff = max(abs(a - b) for x, y in zip(logp_v, logp_h) for a, b in zip(x, y))
    assert diff < 1e-3, f"{what}: greedy log-probs differ by {diff}"
    forced = engine.logprobs(prompts, tokens_v, images=images)
    fdiff = max(abs(a - b) for x, y in zip(forced, logp_h) for a, b in zip(x, y))
    assert fdiff < 1e-3, f"{what}: vLLM's teacher-forced log-probs differ from hf's by {fdiff}"
    print(f"ok  {what}: greedy tokens equal, |logprob diff| {diff:.1e}, teacher-forced {fdiff:.1e}")
    return tokens_v


def part_parity() -> str:
    import torch

    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.generate.vllm import VLLMGenerator
    from flowrl.backends.interfaces import SamplingParams

    torch.backends.cuda.matmul.allow_tf32 = False
    model_dir = build_vlm(Path(tempfile.mkdtemp(prefix="flowrl-vlm-vllm-")) / "model")
    prompts, images = prompts_with_images(model_dir)
    hf = HFGenerator(str(model_dir), dtype="float32", device="cuda")
    engine = VLLMGenerator(str(model_dir), dtype="float32", gpu_memory_utilization=0.3, max_model_len=256,
                           enforce_eager=True)
    assert engine.on_cuda, "vLLM did not pick the CUDA platform"
    before = compare(engine, hf, prompts, images, "start (file weights through load_hf_state)")
    tokens, logps = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8), seed=1,
                                    images=images)
    assert len(tokens) == 4 * len(prompts) and all(len(t) == len(lp) for t, lp in zip(tokens, logps))
    gen = torch.Generator().manual_seed(1)
    state = {k: (p.detach().cpu() + 0.05 * torch.randn(p.shape, generator=gen)).to(p.device)
             for k, p in hf.model.named_parameters()}  # transformers 5's in-memory names
    start = time.perf_counter()
    engine.load_hf_state(state)
    sync_s = time.perf_counter() - start
    hf.load_hf_state(state)
    after = compare(engine, hf, prompts, images, f"after a weight sync ({sync_s:.2f}s)")
    assert after != before, "the sync did not change the engine's outputs"
    engine.close()
    return f"tokens equal, log-probs < 1e-3, sync {sync_s:.2f}s"


def part_train(steps: int, timeout: int) -> str:
    cli = "import sys; from flowrl.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", cli, "train", "configs/vlm_shapes.yaml", "rollout.name=vllm",
           f"trainer.total_training_steps={steps}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}:\n{out[-3000:]}")
    scores = [line for line in out.splitlines() if "score" in line]
    return f"trained {steps} steps; {scores[-1].strip()[:80] if scores else 'no score line'}"


def run_part(name: str, args: argparse.Namespace) -> tuple[str, str, float]:
    """One part in its own process under its own timeout: (status, detail, seconds)."""
    timeout = args.timeout_parity if name == "parity" else args.timeout_train
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, __file__, "--run-one", name, "--steps", str(args.steps),
           "--timeout-train", str(args.timeout_train)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "TIMEOUT", f"past {timeout}s", time.perf_counter() - start
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    sys.stdout.write("\n".join(lines[-40:]) + "\n")
    detail = next((ln[len("RESULT "):] for ln in reversed(lines) if ln.startswith("RESULT ")), lines[-1] if lines else "")
    return ("ok" if proc.returncode == 0 else "FAIL"), detail, time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=("parity", "train"), default=["parity", "train"])
    parser.add_argument("--steps", type=int, default=3, help="training steps of the train part")
    parser.add_argument("--timeout-parity", type=int, default=300, help="seconds for the parity part")
    parser.add_argument("--timeout-train", type=int, default=420, help="seconds for the train part")
    parser.add_argument("--run-one", choices=("parity", "train"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_one:  # inside a part's process
        detail = part_parity() if args.run_one == "parity" else part_train(args.steps, args.timeout_train - 30)
        print(f"RESULT {detail}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    rows = [(name, *run_part(name, args)) for name in args.parts]
    print(f"\n{'part':<8} {'status':<8} {'seconds':>8}  detail")
    for name, status, detail, seconds in rows:
        print(f"{name:<8} {status:<8} {seconds:>8.1f}  {detail}")
    return 0 if all(status == "ok" for _, status, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
