"""The LoRA weight sync's source under FSDP (issue 17): every rank gathers the sharded adapters
whole, in the layout both ends derive (``adapter_layout``), equal on both ranks, and they are the
adapters the merged weights were made of (``W + (alpha/r) B A`` of rank 0's ``hf_state_dict``).
The transport itself: ``tests/unit/test_lora_sync.py``; end to end with vLLM:
``tests/vllm_env/check_lora_grpo.py``."""

from __future__ import annotations

import torch

from flowrl.backends.train.lora import adapter_layout, sync_names
from flowrl.models.lora import LoraSpec, add_adapters, is_adapter, merged_weights
from flowrl_testing.fsdp import LORA, batch, lora_role, run_cases


def _gathered_after_a_step(rank: int, world: int, model_dir: str, table) -> dict:
    role = lora_role(rank, world, model_dir, "fsdp")
    per = table.num_rows // world
    role.update(table.slice(rank * per, per), mini_batch_rows=per)
    whole = role.adapters_whole()  # what PolicyRole.reshard(AdapterJob) sends (rank 0)
    return {"adapters": sync_names(whole), "trainer_names": whole, "merged": role.hf_state_dict()}


def test_fsdp_ranks_gather_the_adapters_the_merged_weights_hold(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    (out,) = run_cases(2, [(_gathered_after_a_step, (str(tiny_model_dir), batch()))])
    layout = adapter_layout(str(tiny_model_dir), LORA)
    sent = out[0]["adapters"]
    assert [(n, tuple(t.shape)) for n, t in sent.items()] == list(layout)  # whole, not shards
    for name, t in sent.items():
        torch.testing.assert_close(out[1]["adapters"][name], t, rtol=0, atol=0)
    assert any(float(t.abs().max()) > 0 for n, t in sent.items() if ".lora_B." in n)  # the update moved B
    # the merged weights rank 0 syncs to hf are the base weights plus these adapters
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    add_adapters(model, LoraSpec.from_dict(LORA))
    named = {n: p.detach() for n, p in model.named_parameters()}
    named.update(out[0]["trainer_names"])
    assert all(is_adapter(n) for n in out[0]["trainer_names"])
    want = merged_weights(model, named)
    for name, t in want.items():
        torch.testing.assert_close(out[0]["merged"][name], t, atol=1e-6, rtol=0)
