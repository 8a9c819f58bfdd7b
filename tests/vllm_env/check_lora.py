"""LoRA in vLLM (CPU build): the trainer's peft adapters installed from memory as a vLLM LoRA
adapter give the tokens and log-probs of the merged weights ``W + (alpha/r) B A`` (the ``hf``
path and vLLM's merged-weight path), after every adapter update. Runs in the vLLM environment
(``test_vllm_env.py`` starts it); not collected by the main run (file name ``check_*``)."""

import pytest
import torch
from conftest import build_tiny_model_dir

from flowrl.backends.generate.hf import HFGenerator
from flowrl.backends.generate.vllm import VLLMGenerator
from flowrl.backends.interfaces import SamplingParams
from flowrl.models.lora import LoraSpec
from flowrl_testing import lora_adapters

PROMPTS = [[10, 11, 12], [13, 14], [15, 16, 17, 18, 19], [20], [21, 22, 23, 24], [25, 26], [30, 31, 32], [40]]
SPEC = LoraSpec(rank=8, alpha=16)  # the rank; vLLM serves it at max_lora_rank 8
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # Qwen2, tied embeddings, qkv bias, head_dim 32 (the smallest vLLM's CPU attention takes)
    return build_tiny_model_dir(tmp_path_factory.mktemp("m"), hidden_size=64, num_heads=2, num_kv_heads=1,
                                intermediate_size=128)


@pytest.fixture(scope="module")
def peft_model(model_dir):
    return lora_adapters.peft_model(str(model_dir), SPEC)


_adapters = lora_adapters.set_adapters
_merged = lora_adapters.merged_state


@pytest.fixture(scope="module")
def engine(model_dir):
    gen = VLLMGenerator(str(model_dir), enforce_eager=True, max_model_len=64, max_num_seqs=64, lora=SPEC.to_dict())
    yield gen
    gen.close()


def _flat(rows):
    return torch.tensor([x for row in rows for x in row])


@pytest.mark.parametrize("seed", [1, 2])  # two successive syncs: the second adapter replaces the first
def test_adapter_gives_the_merged_weights_greedy_tokens_and_logprobs(engine, model_dir, peft_model, seed):
    base_tokens, _ = engine.generate(PROMPTS, GREEDY) if seed == 1 else (None, None)
    adapters = _adapters(peft_model, seed)
    sent = {k: v.clone() for k, v in adapters.items()}
    engine.load_hf_state(adapters)  # the adapters only: the LoRA path
    # vLLM merges alpha/r into lora_B in place: the caller's tensors (the trainer's, the weight-sync
    # fingerprints') must not be scaled with them
    assert all(torch.equal(adapters[k], sent[k]) for k in sent), "load_lora scaled the caller's tensors"
    assert engine._lora_request is not None and engine._lora_request.lora_int_id == seed
    tokens_a, logp_a = engine.generate(PROMPTS, GREEDY)
    hf = HFGenerator(str(model_dir))
    hf.load_hf_state(_merged(peft_model))  # the hf backend's path: merged weights
    tokens_h, logp_h = hf.generate(PROMPTS, GREEDY)
    assert tokens_a == tokens_h
    torch.testing.assert_close(_flat(logp_a), _flat(logp_h), atol=1e-4, rtol=0)
    if base_tokens is not None:
        assert tokens_a != base_tokens  # the adapter reached the engine


def test_sampled_logprobs_with_the_adapter_equal_the_merged_models(engine, model_dir, peft_model):
    engine.load_hf_state(_adapters(peft_model, 3))
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10)
    tokens, logps = engine.generate(PROMPTS, params, seed=5)
    hf = HFGenerator(str(model_dir))
    hf.load_hf_state(_merged(peft_model))
    want = hf.logprobs([p for p in PROMPTS for _ in range(3)], tokens, temperature=1.0)
    torch.testing.assert_close(_flat(logps), _flat(want), atol=1e-4, rtol=0)


def test_adapter_path_equals_vllms_merged_weight_path(engine, model_dir, peft_model):
    """The same engine, once with the adapter, once with the merged weights loaded in place
    (the path without LoRA): the same tokens and log-probs."""
    engine.load_hf_state(_adapters(peft_model, 4))
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=10)
    tokens_a, logp_a = engine.generate(PROMPTS, params, seed=7)
    engine.load_hf_state(_merged(peft_model))  # plain names: base weights replaced, adapter dropped
    assert engine._lora_request is None
    tokens_m, logp_m = engine.generate(PROMPTS, params, seed=7)
    assert tokens_a == tokens_m
    torch.testing.assert_close(_flat(logp_a), _flat(logp_m), atol=1e-4, rtol=0)
