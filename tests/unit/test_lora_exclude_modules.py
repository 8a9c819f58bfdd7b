"""``model.exclude_modules`` (verl's ``actor_rollout_ref.model.exclude_modules``, issue 37): a regular
expression over full module names that peft's ``LoraConfig(exclude_modules=...)`` leaves without
adapters, however ``target_modules`` names them. On the tiny Qwen2 model (2 blocks; all-linear: q,
k, v, o, gate, up, down in each) excluding ``.*layers\\.0\\..*`` leaves the 7 layers of block 1."""

from __future__ import annotations

import json
import re

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.models.lora import LoraSpec

BLOCK_0 = r".*layers\.0\..*"
SPEC = LoraSpec(rank=4, alpha=8, exclude_modules=BLOCK_0)


def _adapted(model) -> set[str]:
    """Module names that hold an adapter (``...q_proj`` of ``...q_proj.lora_A.default.weight``)."""
    return {n.split(".lora_A.")[0] for n, _ in model.named_parameters() if ".lora_A." in n}


def test_a_pattern_leaves_the_modules_it_matches_without_adapters(tiny_model_dir):
    from flowrl.backends.train.dp_policy import TorchDPEngine

    engine = TorchDPEngine(str(tiny_model_dir), lora=SPEC.to_dict(), lr=1e-2)
    adapted = _adapted(engine.model)
    assert len(adapted) == 7 and all(".layers.1." in n for n in adapted), adapted  # block 1's 7 linear layers
    assert not any(".layers.0." in n and p.requires_grad for n, p in engine.model.named_parameters())
    trained = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    assert len(trained) == 2 * 7 and engine.lora == SPEC  # an A and a B for each
    # the merged weights are the model's own names, block 0 untouched (no adapter there to merge)
    from flowrl.models.lora import merged_weights

    merged = merged_weights(engine.model, dict(engine.model.named_parameters()))
    assert "model.layers.0.self_attn.q_proj.weight" in merged and not any("lora_" in n for n in merged)


def test_the_adapter_layout_and_the_engines_config_carry_it(tiny_model_dir):
    """The adapter-only weight sync derives its names by the same peft call on the meta device;
    vLLM gets peft's adapter_config (its PEFTHelper ignores keys it does not know)."""
    from flowrl.backends.train.lora import adapter_layout

    names = [name for name, _ in adapter_layout(str(tiny_model_dir), SPEC.to_dict())]
    assert len(names) == 2 * 7 and not any(".layers.0." in n for n in names)
    assert SPEC.adapter_config()["exclude_modules"] == BLOCK_0
    assert SPEC.peft_config().exclude_modules == BLOCK_0


def test_the_spec_round_trips_and_runs_without_it_keep_their_record():
    assert LoraSpec.from_dict(SPEC.to_dict()) == SPEC and SPEC.to_dict()["exclude_modules"] == BLOCK_0
    plain = LoraSpec(rank=4, alpha=8)
    assert "exclude_modules" not in plain.to_dict()  # a checkpoint's extra.lora of a run without it is unchanged
    assert plain.adapter_config()["exclude_modules"] is None and plain.peft_config().exclude_modules is None
    cfg = load_config(None, ["model.lora_rank=4", f"model.exclude_modules={BLOCK_0}"])
    assert LoraSpec.from_config(cfg.model).exclude_modules == BLOCK_0


def test_a_bad_pattern_is_refused():
    with pytest.raises(ConfigError, match="not a regular expression"):
        load_config(None, ["model.lora_rank=4", "model.exclude_modules=(visual"])


def test_verls_key_maps():
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config.loader import load_config_with_notes
    from flowrl.config.verl_hydra import flags_first

    args = ["config", "--from-verl", "actor_rollout_ref.model.lora_rank=64",
            "actor_rollout_ref.model.exclude_modules=.*visual.*"]
    ns = build_parser().parse_args(flags_first(args))
    cfg = load_config_with_notes(*_split_config_args(ns.items, ns))[0]
    assert cfg.model.exclude_modules == ".*visual.*" and cfg.model.lora_rank == 64


def test_a_saved_adapters_exclusion_applies(tmp_path):
    """``model.lora_adapter_path``: peft's saved ``exclude_modules``, a pattern or a list of names
    (peft: a module of that name, or whose name ends in ``.`` + one), becomes ``model.exclude_modules``."""
    from flowrl.config.lora_adapter_path import adapter_settings, exclude_pattern

    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    base = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    for saved, expected in ((BLOCK_0, BLOCK_0), (None, "")):
        (tmp_path / "adapter_config.json").write_text(json.dumps({**base, "exclude_modules": saved}))
        assert adapter_settings(str(tmp_path))["exclude_modules"] == expected
    pattern = exclude_pattern(["visual", "lm_head"])
    assert re.fullmatch(pattern, "visual") and re.fullmatch(pattern, "model.visual")
    assert re.fullmatch(pattern, "lm_head") and not re.fullmatch(pattern, "model.visual_merger")
