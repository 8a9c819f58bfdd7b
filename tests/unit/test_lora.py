"""LoRA (``model.lora_rank`` > 0) on one process: only adapters train and sit in AdamW, the
reference (adapters disabled) is the base model, the weights leave merged under the model's own
names, checkpoints hold the adapters, ``export-hf`` merges them or writes peft's directory; the
config, pre-flight and the graph's groups."""

from __future__ import annotations

import pytest
import torch

from flowrl.models.lora import LoraSpec

LORA = LoraSpec(rank=4, alpha=8)


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    """A LoRA engine after one update on a fixed batch (so B != 0), and a plain frozen engine."""
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.packed import PackedBatch
    from flowrl_testing.fsdp import batch

    engine = TorchDPEngine(str(tiny_model_dir), lora=LORA.to_dict(), lr=1e-2)
    base = TorchDPEngine(str(tiny_model_dir), trainable=False)
    packed = PackedBatch.from_table(batch())
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def loss_fn(logp_T, entropy_T, mb):  # push the sampled tokens up: a gradient on every adapter B
        return -logp_T.sum() / 10, {}

    engine.train_step(packed, micro_batch_size=4, loss_fn=loss_fn)
    return engine, base, packed, before


def test_only_adapters_train_and_the_optimizer_holds_only_them(trained):
    engine, base, _, before = trained
    named = dict(engine.model.named_parameters())
    adapters = {n for n in named if ".lora_A." in n or ".lora_B." in n}
    # all-linear on 2 Qwen2 blocks: q, k, v, o, gate, up, down -> 14 layers, an A and a B each
    assert len(adapters) == 2 * 7 * 2
    held = [p for g in engine.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in held} == {id(named[n]) for n in adapters}
    after = engine.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # B starts at 0, so A's first gradient is 0 (dA = B^T dY X^T) and only the 14 B's move
    assert changed == {n for n in adapters if ".lora_B." in n}
    state = [t for s in engine.optimizer.state.values() for t in s.values() if t.dim() > 0]
    adapter_bytes = sum(named[n].numel() * named[n].element_size() for n in adapters)
    full_bytes = sum(p.numel() * p.element_size() for p in base.model.parameters())
    assert sum(t.numel() * t.element_size() for t in state) == 2 * adapter_bytes  # exp_avg + exp_avg_sq
    assert adapter_bytes < full_bytes / 3
    assert engine.lora == LORA and set(engine.checkpoint_state()["params"]) == adapters


def test_reference_is_the_base_model_with_adapters_disabled(trained):
    engine, base, packed, _ = trained
    ref_T = engine.reference_logprobs(packed, micro_batch_size=4)
    base_T, _ = base.forward_logprobs(packed, micro_batch_size=4)
    assert torch.equal(ref_T, base_T)  # the frozen base layers, the same ops: bitwise
    lora_T, _ = engine.forward_logprobs(packed, micro_batch_size=4)
    assert (lora_T - base_T).abs().max() > 1e-3  # the adapters are back on after the context
    with pytest.raises(RuntimeError, match="no LoRA adapters"):
        base.reference_logprobs(packed, micro_batch_size=4)


def test_weights_leave_merged_under_the_models_own_names(trained, tiny_model_dir):
    from flowrl.backends.train.dp_policy import TorchDPEngine

    engine, _, packed, _ = trained
    plain = TorchDPEngine(str(tiny_model_dir), trainable=False)
    assert set(engine.reshard_source()) == set(dict(plain.model.named_parameters()))
    state = engine.hf_state_dict()
    assert set(state) == set(plain.model.state_dict())
    plain.model.load_state_dict(state)
    merged_T, _ = plain.forward_logprobs(packed, micro_batch_size=4)
    lora_T, _ = engine.forward_logprobs(packed, micro_batch_size=4)
    assert torch.allclose(merged_T, lora_T, atol=1e-5), (merged_T - lora_T).abs().max()


def test_checkpoint_holds_adapters_and_restores_them(trained, tiny_model_dir):
    from flowrl.backends.train.dp_policy import TorchDPEngine

    engine, _, packed, _ = trained
    state = engine.checkpoint_state()
    fresh = TorchDPEngine(str(tiny_model_dir), lora=LORA.to_dict(), lr=1e-2)
    fresh.load_checkpoint(state["params"], state["optim"], state["optim_step"])
    assert torch.equal(fresh.forward_logprobs(packed, micro_batch_size=4)[0],
                       engine.forward_logprobs(packed, micro_batch_size=4)[0])
    plain_params = {n: torch.zeros(1) for n in ("model.embed_tokens.weight",)}
    with pytest.raises(ValueError, match="another model"):
        fresh.load_checkpoint(plain_params)


def test_export_hf_merges_or_writes_the_adapters(trained, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from flowrl.checkpoint import save_checkpoint
    from flowrl.checkpoint.hf_export import export_hf

    engine, _, _, _ = trained
    state = engine.checkpoint_state()
    ckpt = save_checkpoint(tmp_path / "ckpt", step=1, params=state["params"], extra={"lora": LORA.to_dict()})
    ids = torch.tensor([[5, 9, 12, 7, 30, 22]])
    with torch.no_grad():
        want = engine.model(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(export_hf(ckpt, tmp_path / "merged", tiny_model_dir, lora="merge"))
        assert not any(".lora_" in n for n in merged.state_dict())
        assert torch.allclose(merged(ids).logits, want, atol=1e-5)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        adapter = PeftModel.from_pretrained(base, export_hf(ckpt, tmp_path / "adapter", tiny_model_dir, lora="adapter"))
        assert torch.allclose(adapter(ids).logits, want, atol=1e-6)
    with pytest.raises(ValueError, match="--merge-lora"):
        export_hf(ckpt, tmp_path / "x", tiny_model_dir)
    plain = save_checkpoint(tmp_path / "plain", step=1, params=trained[1].checkpoint_state()["params"])
    with pytest.raises(ValueError, match="no LoRA adapters"):
        export_hf(plain, tmp_path / "y", tiny_model_dir, lora="merge")


def test_lora_config_and_preflight(tiny_model_dir):
    from flowrl.backends.preflight import check_model_options
    from flowrl.config import ConfigError, load_config
    from flowrl.roles.specs import actor_spec, needs_ref_group, reference_call

    cfg = load_config(None, ["actor.strategy=fsdp", "model.lora_rank=8", "model.target_modules=q_proj,v_proj",
                             "actor.use_kl_loss=true"])
    assert actor_spec(cfg).role_kwargs["engine_kwargs"]["lora"] == {
        "rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    assert cfg.needs_reference and not needs_ref_group(cfg) and "ref" not in cfg.worker_group_sizes
    assert reference_call(cfg) == ("actor", "compute_ref_logprobs")
    check_model_options(cfg, model_path=str(tiny_model_dir))
    typo = load_config(None, ["model.lora_rank=8", "model.target_modules=[q_prj]"])
    with pytest.raises(ConfigError, match=r"model\.target_modules.*q_prj.*q_proj"):
        check_model_options(typo, model_path=str(tiny_model_dir))
    with pytest.raises(ConfigError, match=r"model\.lora_rank.*megatron"):
        check_model_options(load_config(None, ["actor.strategy=megatron", "model.lora_rank=8"]))
    for bad, key in (("model.lora_alpha=0", "lora_alpha"), ("model.target_modules=[]", "target_modules"),
                     ("model.lora_rank=-1", "lora_rank")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [bad])
    plain = load_config(None, ["actor.use_kl_loss=true"])
    assert needs_ref_group(plain) and reference_call(plain) == ("ref", "compute_logprobs")
    assert "lora" not in actor_spec(plain).role_kwargs["engine_kwargs"]


def test_adapter_tensors_and_config_are_those_peft_saves(trained):
    """What the vLLM LoRA sync sends (``adapter_checkpoint_tensors``, ``adapter_config``) is what
    peft's ``save_pretrained`` writes: the same tensor names and values, a config peft reads back."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from flowrl.models.lora import adapter_checkpoint_tensors

    engine = trained[0]
    ours = adapter_checkpoint_tensors(dict(engine.model.named_parameters()))
    peft_saved = get_peft_model_state_dict(engine.peft_model)
    assert set(ours) == set(peft_saved) and len(ours) == 28
    assert all(torch.equal(ours[k], peft_saved[k]) for k in ours)
    config = LoraConfig.from_peft_type(**LORA.adapter_config())
    assert (config.r, config.lora_alpha, config.target_modules, config.bias) == (4, 8, "all-linear", "none")
