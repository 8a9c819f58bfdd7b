"""``flowrl.backends.generate.checkpoint_layout``: a trainer's in-memory HF state under the names
and shapes of the checkpoint on disk (what vLLM's loaders read). transformers 5 fuses a Mixtral's
experts in memory (``mlp.experts.gate_up_proj``); the checkpoint holds them per expert
(``block_sparse_moe.experts.{e}.w1``): the reversal gives exactly the file's tensors."""

import pytest
import torch
from conftest import build_tiny_model_dir
from safetensors.torch import load_file

from flowrl.backends.generate.checkpoint_layout import checkpoint_layout

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


@pytest.mark.parametrize("arch, extra", [("mixtral", MOE), ("qwen3_moe", MOE), ("qwen2", {})])
def test_in_memory_state_reverts_to_the_files_names_and_tensors(tmp_path, arch, extra):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model_dir(tmp_path, arch=arch, **extra)
    on_disk = load_file(str(path / "model.safetensors"))
    in_memory = {k: v for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()
                 if k in on_disk or ".experts." in k or ".mlp.gate." in k}
    out = checkpoint_layout(in_memory, str(path))
    assert set(out) == set(on_disk)
    for name, tensor in on_disk.items():
        assert torch.equal(out[name], tensor), name
    if arch == "mixtral":  # renamed and split: the in-memory names are not the file's
        assert not set(in_memory) & {k for k in on_disk if ".experts." in k}
    if arch == "qwen2":  # nothing to revert: the same dict
        assert out is in_memory


def test_without_a_directory_the_names_stay():
    state = {"model.layers.0.mlp.experts.gate_up_proj": torch.zeros(2, 4, 3)}
    assert checkpoint_layout(state, None) is state


def test_vision_language_model_reverts_to_the_files_names(tmp_path):
    """transformers 5 holds a Qwen2-VL's decoder as ``model.language_model.*`` (and its vision tower
    as ``model.visual.*``); its checkpoint has the pre-4.52 names (``model.layers.*``, ``visual.*``)
    that vLLM's Qwen2-VL mapper takes (``hf_to_vllm_mapper``: ``model.`` -> ``language_model.model.``).
    The trainer's parameters (tied embedding once) revert to exactly the file's tensors."""
    from flowrl.models.tiny_vlm import save_tiny_vlm
    from flowrl.models.vlm import register_auto_classes
    from transformers import AutoModelForCausalLM

    register_auto_classes()
    path = save_tiny_vlm(tmp_path / "vlm")
    on_disk = load_file(str(path / "model.safetensors"))
    in_memory = {k: p.detach() for k, p in AutoModelForCausalLM.from_pretrained(path).named_parameters()}
    assert any(k.startswith("model.language_model.") for k in in_memory)
    assert not set(in_memory) & {k for k in on_disk if k.startswith("model.layers.")}
    out = checkpoint_layout(in_memory, str(path))
    assert set(out) == set(on_disk)
    for name, tensor in on_disk.items():
        assert torch.equal(out[name], tensor), name
