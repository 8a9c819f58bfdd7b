"""vLLM (CPU build) generating with a vision-language model (issue 33): a tiny Qwen2-VL built from a
config (``tests/gpu/vlm_vllm_gpu.py``'s model and prompts: one and two images of two sizes per
prompt) gives the ``hf`` backend's greedy tokens and log-probs on the same fp32 weights, vLLM's
teacher-forced log-probs with the images equal hf's sampled ones, ``n`` samples come back
prompt-major, and a weight sync of the perturbed in-memory state (transformers 5's
``model.language_model.*`` / ``model.visual.*`` names, vision tower included) moves both engines
to the same outputs again.

vLLM's Qwen2-VL needs torchvision (``setup_env.sh``: the PyPI wheel with ``torchvision_cpu.py``).
Runs in the vLLM environment (``test_vllm_env.py`` starts it); not collected by the main run."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from vlm_vllm_gpu import build_vlm, compare, prompts_with_images  # noqa: E402

from flowrl.backends.generate.hf import HFGenerator  # noqa: E402
from flowrl.backends.generate.vllm import VLLMGenerator  # noqa: E402
from flowrl.backends.interfaces import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_vlm(tmp_path_factory.mktemp("vlm") / "model")


def test_vllm_generates_with_images_as_hf_does_before_and_after_a_weight_sync(model_dir):
    prompts, images = prompts_with_images(model_dir)
    hf = HFGenerator(str(model_dir), dtype="float32")
    engine = VLLMGenerator(str(model_dir), dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=16)
    try:
        before = compare(engine, hf, prompts, images, "start (file weights through load_hf_state)")
        tokens, logps = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8), seed=1,
                                        images=images)
        assert len(tokens) == 4 * len(prompts) and all(len(t) == len(lp) for t, lp in zip(tokens, logps))
        gen = torch.Generator().manual_seed(1)
        state = {k: p.detach() + 0.05 * torch.randn(p.shape, generator=gen) for k, p in hf.model.named_parameters()}
        assert any(".visual." in k for k in state), sorted(state)[:5]
        engine.load_hf_state(state)
        hf.load_hf_state(state)
        after = compare(engine, hf, prompts, images, "after a weight sync")
        assert after != before, "the sync did not change the engine's outputs"
    finally:
        engine.close()
