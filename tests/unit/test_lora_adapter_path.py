"""``model.lora_adapter_path`` (verl's ``actor_rollout_ref.model.lora_adapter_path``, issue 37):
training continues from a saved peft adapter. verl loads it with ``PeftModel.from_pretrained(module,
path, is_trainable=True)``; flowrl's engines inject fresh adapters of the adapter's settings and copy
its tensors in: the test compares the two models' logits and trainable tensors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from flowrl.config import ConfigError, load_config
from flowrl.models.lora import LoraSpec, add_adapters
from flowrl.config.lora_adapter_path import adapter_settings, resolve_adapter


def _saved_adapter(model_dir, out, *, rank=4, alpha=8, targets=("q_proj", "v_proj"), seed=0):
    """A peft adapter on the tiny model with non-zero B (as after training), saved to ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=rank, lora_alpha=alpha,
                                                  target_modules=list(targets), lora_dropout=0.0, bias="none"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(out)
    return out


def test_the_adapter_loads_as_verls_peft_from_pretrained(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path = str(_saved_adapter(tiny_model_dir, tmp_path / "adapter"))
    settings = adapter_settings(path)
    assert settings == {"lora_rank": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "modules_to_save": [],
                        "exclude_modules": ""}
    cfg = load_config(None, [f"model.lora_adapter_path={path}"])
    spec = LoraSpec.from_config(resolve_adapter(cfg).model)
    assert (spec.rank, spec.alpha, spec.target_modules, spec.adapter_path) == (4, 8, ("q_proj", "v_proj"), path)
    assert LoraSpec.from_dict(spec.to_dict()) == spec  # what the engines receive

    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_ours = add_adapters(ours, spec)
    verls = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), path, is_trainable=True)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 3]])
    with torch.no_grad():
        torch.testing.assert_close(peft_ours(ids).logits, verls(ids).logits, rtol=0, atol=0)
        fresh = add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), dataclasses.replace(spec, adapter_path=""))
        assert not torch.allclose(fresh(ids).logits, verls(ids).logits)  # the saved B is not zero
    ours_trained = {n: p for n, p in peft_ours.named_parameters() if p.requires_grad}
    verls_trained = {n: p for n, p in verls.named_parameters() if p.requires_grad}
    assert ours_trained.keys() == verls_trained.keys() and len(ours_trained) > 0
    for name, p in ours_trained.items():
        assert torch.equal(p, verls_trained[name]), name


def test_an_adapter_that_does_not_fit_or_is_missing_is_refused(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ConfigError, match="no adapter_config.json"):
        adapter_settings(str(tmp_path / "nowhere"))
    path = str(_saved_adapter(tiny_model_dir, tmp_path / "adapter"))
    with pytest.raises(ConfigError, match="differs from the rank 4"):
        resolve_adapter(load_config(None, [f"model.lora_adapter_path={path}", "model.lora_rank=8"]))
    # the same rank, other targets: the saved q_proj/v_proj tensors find no place
    wrong = LoraSpec(rank=4, alpha=8, target_modules=("k_proj",), adapter_path=path)
    with pytest.raises(ValueError, match="does not fit model.path"):
        add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), wrong)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ConfigError, match="use_dora"):
        adapter_settings(path)


def test_verls_key_maps_and_the_catalogue_script_is_accepted():
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config.loader import load_config_with_notes
    from flowrl.config.verl_hydra import flags_first

    args = ["config", "--from-verl", "actor_rollout_ref.model.lora_adapter_path=/path/saved/lora_adapter"]
    ns = build_parser().parse_args(flags_first(args))
    cfg = load_config_with_notes(*_split_config_args(ns.items, ns))[0]
    assert cfg.model.lora_adapter_path == "/path/saved/lora_adapter" and cfg.model.lora_rank == 0  # set at start
