"""The engine in the caller's process (issue 29 item 1's building block): ``VLLMGenerator(
external_launcher=True)`` on the CPU build, tp 1, as a rank of a one-process gloo group: its model
lives in this process, greedy tokens and log-probs equal transformers' before and after a weight
load that passes tensors by reference. Runs in the vLLM environment (``test_vllm_env.py``)."""

import os

import pytest
import torch
import torch.distributed as dist
from conftest import build_tiny_model_dir

from flowrl.backends.generate.hf import HFGenerator
from flowrl.backends.generate.vllm import VLLMGenerator, _read_safetensors
from flowrl.backends.interfaces import SamplingParams

PROMPTS = [[10, 11, 12], [13, 14], [15, 16, 17, 18, 19], [20]]
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir = build_tiny_model_dir(tmp_path_factory.mktemp("m"), hidden_size=64, num_heads=2, num_kv_heads=1,
                                     intermediate_size=128)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg')}/init", rank=0, world_size=1)
    gen = VLLMGenerator(str(model_dir), enforce_eager=True, max_model_len=64, max_num_seqs=16, external_launcher=True)
    yield gen, model_dir
    gen.close()  # vLLM's shutdown tears down the distributed state it joined, default group included
    if dist.is_initialized():
        dist.destroy_process_group()


def _assert_same_greedy(gen, hf):
    tokens_v, logp_v = gen.generate(PROMPTS, GREEDY)
    tokens_h, logp_h = hf.generate(PROMPTS, GREEDY)
    assert tokens_v == tokens_h
    torch.testing.assert_close(torch.tensor([x for r in logp_v for x in r]), torch.tensor([x for r in logp_h for x in r]),
                               atol=1e-5, rtol=0)
    return tokens_v


def test_the_engine_runs_in_this_process_and_matches_hf_across_a_load(engine):
    gen, model_dir = engine
    assert gen.in_process and not gen.uses_ipc
    model = gen.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    saved = _read_safetensors(str(model_dir))
    vocab = saved["model.embed_tokens.weight"].shape[0]  # vLLM pads the embedding's rows
    torch.testing.assert_close(model.model.embed_tokens.weight[:vocab], saved["model.embed_tokens.weight"], atol=0, rtol=0)
    hf = HFGenerator(str(model_dir))
    before = _assert_same_greedy(gen, hf)
    noise = torch.Generator().manual_seed(2)
    state = {k: v + 0.2 * torch.randn(v.shape, generator=noise) for k, v in saved.items() if k != "lm_head.weight"}
    gen.load_hf_state(state)
    hf.load_hf_state(state)
    assert _assert_same_greedy(gen, hf) != before
    # the load wrote this process's parameters (by reference: no bytes crossed a process)
    torch.testing.assert_close(model.model.embed_tokens.weight[:vocab], state["model.embed_tokens.weight"], atol=0, rtol=0)
