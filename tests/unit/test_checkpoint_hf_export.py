"""HF export: a checkpoint written as a transformers directory gives the trainer's logits."""

from __future__ import annotations

import os

import pytest
import torch

from flowrl.checkpoint import save_checkpoint
from flowrl.checkpoint.hf_export import export_hf
from flowrl.models.char_tokenizer import build_char_tokenizer
from flowrl.models.tiny import build_tiny_model


@pytest.mark.parametrize("tied", [True, False])
def test_export_hf_gives_identical_logits(tmp_path, tied: bool) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, arch="llama", hidden_size=32, num_layers=2, num_heads=4,
                             num_kv_heads=2, intermediate_size=64, tie_word_embeddings=tied)
    start = tmp_path / "start"  # the HF directory the run started from
    model.save_pretrained(start)
    tokenizer.save_pretrained(start)
    with torch.no_grad():  # "training": move every weight so the export cannot be the start
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    params = dict(model.state_dict())
    if tied:
        params.pop("lm_head.weight")  # one logical tensor (ModelShape.param_shapes)
    ckpt = save_checkpoint(tmp_path / "ckpt", step=5, params=params)
    out = export_hf(ckpt, tmp_path / "hf", start)
    assert os.path.isfile(os.path.join(out, "model.safetensors"))
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([tokenizer.encode("12+34=46")])
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, model.eval()(ids).logits)
    assert AutoTokenizer.from_pretrained(out).encode("12+34=46") == ids[0].tolist()


def test_export_hf_rejects_another_model(tmp_path) -> None:
    tokenizer = build_char_tokenizer()
    small = build_tiny_model(tokenizer, arch="llama", hidden_size=32, num_layers=2, num_heads=4,
                             num_kv_heads=2, intermediate_size=64)
    small.save_pretrained(tmp_path / "start")
    params = {n: t for n, t in small.state_dict().items() if n != "lm_head.weight"}
    params["model.layers.0.mlp.up_proj.weight"] = torch.zeros(128, 32)
    ckpt = save_checkpoint(tmp_path / "ckpt", step=0, params=params)
    with pytest.raises(ValueError, match=r"up_proj.weight has shape \(128, 32\), the target model "
                                         r"expects \(64, 32\)"):
        export_hf(ckpt, tmp_path / "hf", tmp_path / "start")
    with pytest.raises(ValueError, match="config.json is missing"):
        export_hf(ckpt, tmp_path / "hf", tmp_path)
