"""The vllm backend on a GPU with official vLLM: parity with transformers, weight updates through
vLLM's native weight-transfer API (CUDA IPC), colocated sleep/wake freeing device memory, and LoRA:
the trainer's peft adapters installed from memory as a vLLM LoRA adapter give the merged weights'
greedy tokens and log-probs (transformers, and vLLM's own merged-weight path), after two syncs.

    python tests/gpu/vllm_gpu.py        (an environment with `pip install 'vllm>=0.32'`)

Exits non-zero on the first failed check; prints one line per check. tp = 2 runs too when two
GPUs are visible.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: flowrl_testing

PROMPTS = [[10, 11, 12], [13, 14], [15, 16, 17, 18, 19], [20], [21, 22, 23, 24], [25, 26], [30, 31, 32], [40]]


def build_model(out: Path) -> Path:
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, **tiny_preset("10m"), max_position_embeddings=128, seed=0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def greedy_matches(engine, hf, what: str) -> list[list[int]]:
    from flowrl.backends.interfaces import SamplingParams

    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    tokens_v, logp_v = engine.generate(PROMPTS, params)
    tokens_h, logp_h = hf.generate(PROMPTS, params)
    assert tokens_v == tokens_h, f"{what}: greedy tokens differ\n{tokens_v}\n{tokens_h}"
    diff = max(abs(a - b) for x, y in zip(logp_v, logp_h) for a, b in zip(x, y))
    # GPU kernels (fp32, no TF32) against transformers on CPU: a looser bound than CPU-to-CPU.
    assert diff < 1e-4, f"{what}: greedy log-probs differ by {diff}"
    print(f"ok  {what}: greedy tokens equal, max |logprob diff| {diff:.2e}")
    return tokens_v


def check(tp: int, model_dir: Path) -> None:
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.generate.vllm import VLLMGenerator

    torch.backends.cuda.matmul.allow_tf32 = False
    hf = HFGenerator(str(model_dir))
    engine = VLLMGenerator(str(model_dir), tensor_parallel_size=tp, gpu_memory_utilization=0.3,
                           free_cache_engine=True, max_model_len=128, enforce_eager=True)
    assert engine.on_cuda, "vLLM did not pick the CUDA platform"
    before = greedy_matches(engine, hf, f"tp={tp} start (dummy load + one IPC weight transfer)")

    gen = torch.Generator().manual_seed(1)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in hf.model.state_dict().items()
             if k != "lm_head.weight"}
    start = time.perf_counter()
    engine.load_hf_state(state)
    print(f"ok  tp={tp} weight update over CUDA IPC: {time.perf_counter() - start:.2f}s")
    hf.load_hf_state(state)
    after = greedy_matches(engine, hf, f"tp={tp} after update")
    assert after != before, "the update did not change the engine's outputs"

    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    free_asleep = torch.cuda.mem_get_info()[0]
    assert free_asleep > free_awake, f"sleep freed nothing ({free_awake} -> {free_asleep} bytes free)"
    print(f"ok  tp={tp} sleep released {(free_asleep - free_awake) / 2**20:.0f} MiB on cuda:0")
    engine.load_hf_state(state)  # a sync while asleep wakes the weights first
    greedy_matches(engine, hf, f"tp={tp} after sleep, sync and wake")
    engine.close()


def lora_inputs(model_dir: Path, seed: int):
    """The LoRA check's inputs, built on the CPU: the trainer's adapters (peft names) and the
    merged weights of the same model."""
    from flowrl.models.lora import LoraSpec
    from flowrl_testing import lora_adapters

    spec = LoraSpec(rank=8, alpha=16)
    model = lora_adapters.peft_model(str(model_dir), spec)
    adapters = lora_adapters.set_adapters(model, seed, scale=0.05)
    return spec, adapters, lora_adapters.merged_state(model)


def check_lora(tp: int, model_dir: Path) -> None:
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.generate.vllm import VLLMGenerator

    engine = VLLMGenerator(str(model_dir), tensor_parallel_size=tp, gpu_memory_utilization=0.3, max_model_len=128,
                           enforce_eager=True, lora={"rank": 8, "alpha": 16, "target_modules": "all-linear"})
    hf = HFGenerator(str(model_dir))
    for seed in (1, 2):  # the second sync replaces the first adapter
        _, adapters, merged = lora_inputs(model_dir, seed)
        start = time.perf_counter()
        engine.load_hf_state(adapters)
        print(f"ok  tp={tp} LoRA adapter {seed} installed from memory: {time.perf_counter() - start:.2f}s")
        hf.load_hf_state(merged)
        with_adapter = greedy_matches(engine, hf, f"tp={tp} LoRA adapter {seed} vs transformers on merged weights")
    engine.load_hf_state(merged)  # vLLM's merged-weight path (adapter dropped)
    assert engine._lora_request is None
    assert greedy_matches(engine, hf, f"tp={tp} merged weights in the same engine") == with_adapter
    engine.close()


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    model_dir = build_model(Path(tempfile.mkdtemp(prefix="flowrl-vllm-gpu-")) / "model")
    check(1, model_dir)
    check_lora(1, model_dir)
    if torch.cuda.device_count() >= 2:
        check(2, model_dir)
        check_lora(2, model_dir)
    print("all vllm GPU checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
