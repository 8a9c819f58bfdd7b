"""vLLM (CPU build) against transformers on the same fp32 weights: greedy tokens and log-probs,
sampled log-probs, seeds, EOS, weight updates and sleep/wake. Runs in the vLLM environment
(``test_vllm_env.py`` starts it); not collected by the main run (file name ``check_*``)."""

import pytest
import torch
from conftest import build_tiny_model_dir

from flowrl.backends.generate.hf import HFGenerator
from flowrl.backends.interfaces import SamplingParams
from flowrl.backends.generate.vllm import VLLMGenerator

PROMPTS = [[10, 11, 12], [13, 14], [15, 16, 17, 18, 19], [20], [21, 22, 23, 24], [25, 26], [30, 31, 32], [40]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # Qwen2 with tied embeddings and qkv bias; head_dim 32, the smallest vLLM's CPU attention takes.
    return build_tiny_model_dir(tmp_path_factory.mktemp("m"), hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)


@pytest.fixture(scope="module")
def engine(model_dir):
    gen = VLLMGenerator(str(model_dir), enforce_eager=True, max_model_len=64, max_num_seqs=64)
    yield gen
    gen.close()


def _assert_same_greedy(engine, hf):
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    tokens_v, logp_v = engine.generate(PROMPTS, params)
    tokens_h, logp_h = hf.generate(PROMPTS, params)
    assert tokens_v == tokens_h
    flat_v = torch.tensor([x for row in logp_v for x in row])
    flat_h = torch.tensor([x for row in logp_h for x in row])
    torch.testing.assert_close(flat_v, flat_h, atol=1e-5, rtol=0)
    return tokens_v


def test_greedy_tokens_and_logprobs_equal_hf_before_and_after_a_weight_update(engine, model_dir):
    hf = HFGenerator(str(model_dir))
    before = _assert_same_greedy(engine, hf)
    # A trainer-like update: every tensor moves (full HF-named state, tied lm_head absent).
    gen = torch.Generator().manual_seed(1)
    state = {k: v + 0.2 * torch.randn(v.shape, generator=gen) for k, v in hf.model.state_dict().items() if k != "lm_head.weight"}
    engine.load_hf_state(state)
    hf.load_hf_state(state)
    after = _assert_same_greedy(engine, hf)
    assert after != before  # the update reached the engine (output layer included)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_those_of_logits_over_temperature(engine, model_dir, temperature):
    hf = HFGenerator(str(model_dir))
    hf.load_hf_state(_engine_free_state(engine, model_dir))
    params = SamplingParams(n=3, temperature=temperature, max_new_tokens=10)
    tokens, logps = engine.generate(PROMPTS, params, seed=5)
    assert len(tokens) == len(PROMPTS) * 3
    prompts = [p for p in PROMPTS for _ in range(3)]  # prompt-major
    expected = hf.logprobs(prompts, tokens, temperature=temperature)
    for got, want in zip(logps, expected):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)


def _engine_free_state(engine, model_dir):
    """Reset the engine to the saved weights (an earlier test updated them); returns them."""
    state = _saved(model_dir)
    engine.load_hf_state(state)
    return state


def test_samples_are_seeded_stop_at_eos_and_respect_max_tokens(engine, model_dir):
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)
    a, _ = engine.generate(PROMPTS, params, seed=3)
    b, _ = engine.generate(PROMPTS, params, seed=3)
    c, _ = engine.generate(PROMPTS, params, seed=4)
    assert a == b and a != c
    # the same prompt's samples differ (one seed for the batch, each request its own draws)
    assert len({tuple(r) for r in a[:4]}) > 1
    for resp in a:
        assert 1 <= len(resp) <= 6
        eos = [i for i, t in enumerate(resp) if t in engine.eos_ids]
        assert eos in ([], [len(resp) - 1])  # EOS, if any, is the last token, and is kept


def test_top_k_one_is_greedy(engine, model_dir):
    greedy, _ = engine.generate(PROMPTS, SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    top1, _ = engine.generate(PROMPTS, SamplingParams(n=1, temperature=1.0, top_k=1, max_new_tokens=8), seed=9)
    assert top1 == greedy


def test_sleep_then_generate_wakes_the_engine(engine, model_dir):
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    engine.load_hf_state(_saved(model_dir))
    before, _ = engine.generate(PROMPTS, params)
    engine.free_cache_engine = True
    try:
        engine.sleep()
        assert engine.is_sleeping
        engine.load_hf_state(_saved(model_dir))  # a sync while asleep wakes the weights first
        after, _ = engine.generate(PROMPTS, params)
        assert not engine.is_sleeping
    finally:
        engine.free_cache_engine = False
    assert after == before


def _saved(model_dir):
    from flowrl.backends.generate.vllm import _read_safetensors

    return _read_safetensors(str(model_dir))


def test_many_long_prompts_sample_without_a_chunked_prefill(model_dir):
    """Issue 18 item 8: 32 prompts x 8 samples of 50-token prompts over a 4096-token budget made
    vLLM's CPU build split prefills, whose seeded sampling failed (``CPU Generator does not use
    offset``). On CPU the backend turns chunked prefill off; the same request now samples."""
    engine = VLLMGenerator(str(model_dir), enforce_eager=True, max_model_len=64, max_num_seqs=256,
                           max_num_batched_tokens=4096)
    try:
        assert not engine.llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill
        prompts = [[10 + (i + j) % 50 for j in range(50)] for i in range(32)]
        tokens, logps = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=8), seed=1)
        assert len(tokens) == 256 and all(1 <= len(t) <= 8 and len(t) == len(lp) for t, lp in zip(tokens, logps))
    finally:
        engine.close()
