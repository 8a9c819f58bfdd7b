"""The hf decode loop (issue 14 item 3): finished rows leave the batch, and the samples, for the
same seed, are transformers ``generate``'s (sampled with top-k/top-p, and greedy)."""

import pytest
import torch

from flowrl.backends.generate.hf import HFGenerator
from flowrl.backends.generate.hf_decode import decode
from flowrl.backends.interfaces import SamplingParams


def _generate_reference(model, prompts, params, eos, pad):
    """transformers' ``generate`` on left-padded prompts: responses up to the first EOS."""
    longest = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    sampling = {"do_sample": False} if params.greedy else {
        "do_sample": True, "temperature": params.temperature, "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else None}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=params.max_new_tokens,
                         num_return_sequences=params.n, eos_token_id=eos, pad_token_id=pad, **sampling)
    rows = []
    for row in out[:, longest:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t == eos), len(row))
        rows.append(row[:cut])
    return rows


@pytest.mark.parametrize("params", [
    SamplingParams(n=4, max_new_tokens=12, temperature=0.8, top_p=0.9, top_k=20),
    SamplingParams(n=1, max_new_tokens=12, temperature=0),
])
def test_decode_matches_generate_and_retires_finished_rows(tiny_model_dir, params):
    gen = HFGenerator(str(tiny_model_dir))
    eos = min(gen.eos_ids)
    with torch.no_grad():  # an EOS bias: responses stop at different lengths
        gen.model.lm_head.weight[eos] += 0.35 * gen.model.model.embed_tokens.weight.std()
        gen.model.model.norm.weight.mul_(3.0)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    if params.greedy:  # greedy rows stop apart at a token row 0 decodes third
        eos = decode(gen.model, prompts, params, eos_ids=set(), pad_id=gen.pad_id)[0][0][2]
    torch.manual_seed(11)
    expected = _generate_reference(gen.model, prompts, params, eos, gen.pad_id)
    torch.manual_seed(11)
    responses, logprobs, stats = decode(gen.model, prompts, params, eos_ids={eos}, pad_id=gen.pad_id)
    assert responses == expected
    lengths = [len(r) for r in responses]
    assert len(set(lengths)) > 1, lengths  # the bias made a spread
    # decode fed each row's tokens but its last: no slot for a finished row
    prompt_slots = len(prompts) * 4
    assert stats.slots - prompt_slots == sum(lengths) - len(lengths) < len(lengths) * (max(lengths) - 1)
    assert stats.response_tokens == sum(lengths)
    # log-probs are those of logits / temperature under teacher forcing
    temperature = params.temperature or 1.0
    forced = gen.logprobs([p for p in prompts for _ in range(params.n)], responses, temperature=temperature)
    for a, b in zip(logprobs, forced):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
