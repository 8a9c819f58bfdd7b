"""``model.modules_to_save`` (peft's name): modules trained whole next to the LoRA adapters. The
tied embedding of the default task's model (``embed_tokens``) trains as one tensor for input and
output (peft's ``ensure_weight_tying``), the reference keeps the original, the optimizer and the
checkpoint hold the adapters and the copy, the weights leave under the plain model's names."""

from __future__ import annotations

import pytest
import torch

from flowrl.models.lora import LoraSpec

LORA = LoraSpec(rank=4, alpha=8, modules_to_save=("embed_tokens",))
COPY = "model.embed_tokens.modules_to_save.default.weight"


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.packed import PackedBatch
    from flowrl_testing.fsdp import batch

    engine = TorchDPEngine(str(tiny_model_dir), lora=LORA.to_dict(), lr=1e-2)
    base = TorchDPEngine(str(tiny_model_dir), trainable=False)
    packed = PackedBatch.from_table(batch())
    engine.train_step(packed, micro_batch_size=4, loss_fn=lambda logp_T, e, mb: (-logp_T.sum() / 10, {}))
    return engine, base, packed


def test_config_and_spec(tiny_model_dir):
    from flowrl.config import ConfigError, load_config

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "model.lora_rank=4", "model.lora_alpha=8",
                             "model.modules_to_save=embed_tokens"])
    assert LoraSpec.from_config(cfg.model) == LORA
    assert LoraSpec.from_dict(LORA.to_dict()) == LORA
    assert "modules_to_save" not in LoraSpec(rank=4, alpha=8).to_dict()  # older checkpoints' extra.lora still match
    with pytest.raises(ConfigError, match="modules_to_save"):
        load_config(None, ["model.modules_to_save=embed_tokens"])  # without lora_rank


def test_the_tied_embedding_trains_and_the_optimizer_holds_adapters_and_it(trained):
    engine, base, _ = trained
    named = dict(engine.model.named_parameters())
    trained_names = {n for n, p in named.items() if p.requires_grad}
    assert COPY in trained_names and len(trained_names) == 2 * 7 * 2 + 1
    held = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert held == {id(named[n]) for n in trained_names}
    assert engine.model.get_output_embeddings().modules_to_save["default"].weight is named[COPY]  # still tied
    assert not torch.equal(named[COPY], base.model.get_input_embeddings().weight)  # it moved
    assert set(engine.checkpoint_state()["params"]) == trained_names


def test_reference_keeps_the_original_embedding(trained):
    engine, base, packed = trained
    ref_T = engine.reference_logprobs(packed, micro_batch_size=4)
    base_T, _ = base.forward_logprobs(packed, micro_batch_size=4)
    assert torch.equal(ref_T, base_T)


def test_weights_leave_under_plain_names_with_the_trained_embedding(trained, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    engine, base, packed = trained
    src = engine.reshard_source()
    assert set(src) == {n for n, _ in base.model.named_parameters()}
    torch.testing.assert_close(src["model.embed_tokens.weight"], dict(engine.model.named_parameters())[COPY])
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    plain.load_state_dict(src, strict=False)
    plain.tie_weights()
    x = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(plain(x).logits, engine.model(x).logits, atol=1e-5, rtol=0)


def test_sync_layout_has_the_adapters_and_the_embedding(tiny_model_dir, trained):
    from flowrl.backends.train.lora import adapter_layout, sync_names

    layout = dict(adapter_layout(str(tiny_model_dir), LORA.to_dict()))
    engine = trained[0]
    sent = sync_names({n: p for n, p in engine.model.named_parameters() if p.requires_grad})
    assert list(sent) == list(layout) and "model.embed_tokens.weight" in layout


def test_checkpoint_round_trip(trained, tiny_model_dir):
    from flowrl.backends.train.dp_policy import TorchDPEngine

    engine = trained[0]
    state = engine.checkpoint_state()
    fresh = TorchDPEngine(str(tiny_model_dir), lora=LORA.to_dict(), lr=1e-2)
    fresh.load_checkpoint(state["params"], state["optim"], state["optim_step"])
    for n, p in fresh.model.named_parameters():
        torch.testing.assert_close(p, dict(engine.model.named_parameters())[n], rtol=0, atol=0)


def test_preflight_names_the_missing_module(tiny_model_dir):
    from flowrl.backends.train.lora import check_lora
    from flowrl.config import ConfigError, load_config

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "model.lora_rank=4", "model.modules_to_save=embed,norm"])
    with pytest.raises(ConfigError, match="model.modules_to_save.*embed_tokens"):
        check_lora(cfg, model_path=str(tiny_model_dir))
    ok = load_config(None, [f"model.path={tiny_model_dir}", "model.lora_rank=4", "model.modules_to_save=embed_tokens,norm"])
    check_lora(ok, model_path=str(tiny_model_dir))


def test_preflight_names_a_target_that_is_no_linear_layer(tiny_model_dir):
    from flowrl.backends.train.lora import check_lora
    from flowrl.config import ConfigError, load_config

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "model.lora_rank=4", "model.target_modules=[q_proj,embed_tokens]"])
    with pytest.raises(ConfigError) as err:
        check_lora(cfg, model_path=str(tiny_model_dir))
    assert err.value.key == "model.target_modules" and "embed_tokens" in str(err.value)
    assert "q_proj" in err.value.fix and "all-linear" in err.value.fix
    ok = load_config(None, [f"model.path={tiny_model_dir}", "model.lora_rank=4", "model.target_modules=[q_proj,v_proj]"])
    check_lora(ok, model_path=str(tiny_model_dir))
