"""The hf generation backend against the dp trainer: same tokens -> same log-probs."""

import pyarrow as pa
import pytest
import torch

from flowrl.backends.generate.hf import HFGenerator
from flowrl.backends.interfaces import SamplingParams
from flowrl.backends.train.dp_policy import TorchDPEngine
from flowrl.data import experience as ex
from flowrl.data.packed import PackedBatch


@pytest.fixture(scope="module")
def generator(tiny_model_dir):
    return HFGenerator(str(tiny_model_dir))


def test_samples_n_per_prompt_stop_at_eos_and_are_seeded(generator):
    prompts = [[10, 11, 12], [13, 14]]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)
    r1, lp1 = generator.generate(prompts, params, seed=3)
    r2, _ = generator.generate(prompts, params, seed=3)
    assert len(r1) == 8 and r1 == r2
    for resp, lp in zip(r1, lp1):
        assert 1 <= len(resp) <= 6 and len(lp) == len(resp)
        eos = [i for i, t in enumerate(resp) if t in generator.eos_ids]
        assert eos in ([], [len(resp) - 1])  # EOS, if any, is the last token
        assert all(x <= 0 for x in lp)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_trainer_logprobs(generator, tiny_model_dir, temperature):
    prompts = [[10, 11, 12], [13, 14], [15]]
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=5)
    responses, logprobs = generator.generate(prompts, params, seed=0, micro_batch_size=4)
    table = pa.table(
        {
            "prompt_ids": ex.from_lists([p for p in prompts for _ in range(2)], ex.TOKEN_IDS),
            "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        }
    )
    engine = TorchDPEngine(str(tiny_model_dir), trainable=False)
    logp_T, ent_T = engine.forward_logprobs(PackedBatch.from_table(table), micro_batch_size=4, temperature=temperature, with_entropy=True)
    expected = torch.tensor([x for row in logprobs for x in row])
    torch.testing.assert_close(logp_T, expected, atol=1e-5, rtol=0)
    assert ent_T.shape == logp_T.shape and bool((ent_T >= 0).all())


def test_greedy_is_deterministic_and_matches_argmax(generator):
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=3)
    (resp,), _ = generator.generate([[10, 11, 12]], params)
    logits = generator.model(torch.tensor([[10, 11, 12]])).logits[0, -1]
    assert resp[0] == int(logits.argmax())


def test_weight_sync_changes_outputs(generator, tiny_model_dir):
    engine = TorchDPEngine(str(tiny_model_dir), trainable=False)
    state = engine.hf_state_dict()
    state = {k: v * 0.5 if v.ndim == 2 else v for k, v in state.items()}
    fresh = HFGenerator(str(tiny_model_dir))
    fresh.load_hf_state(state)
    before = generator.model(torch.tensor([[10, 11]])).logits
    after = fresh.model(torch.tensor([[10, 11]])).logits
    assert not torch.allclose(before, after)
    with pytest.raises(ValueError, match="missing"):
        fresh.load_hf_state({k: v for k, v in state.items() if "layers.0" not in k})
