"""SFT with label smoothing (``algorithm.sft.label_smoothing``): the loss equals torch's
``cross_entropy(label_smoothing=eps)`` over the assistant tokens, through the loss function and
through the ``dp`` engine's train step; backends that cannot compute it are refused by name."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from flowrl.algos.sft_loss import SFT_LOSS, sft_loss, uniform_nll_from_logits
from flowrl.algos.supervised import Totals
from flowrl.config import ConfigError, load_config
from flowrl.graphs.sft import SFT


def test_uniform_nll_is_the_mean_negative_log_prob_and_its_gradient_is_softmax_minus_uniform():
    # logits (0, 0, log 2): softmax (1/4, 1/4, 1/2), -log p = (log 4, log 4, log 2), mean = 5/3 log 2
    z = torch.tensor([[0.0, 0.0, torch.log(torch.tensor(2.0)).item()]], requires_grad=True)
    value = uniform_nll_from_logits(z)
    assert value.item() == pytest.approx(5 / 3 * torch.log(torch.tensor(2.0)).item(), rel=1e-6)
    value.sum().backward()
    assert z.grad[0].tolist() == pytest.approx([1 / 4 - 1 / 3, 1 / 4 - 1 / 3, 1 / 2 - 1 / 3], abs=1e-6)


def test_smoothed_sft_loss_equals_torch_cross_entropy_with_label_smoothing():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, dtype=torch.float64)
    target = torch.tensor([3, 0, 6, 2, 2])
    mask = torch.tensor([1, 0, 1, 1, 0])
    logp = logits.log_softmax(-1).gather(1, target[:, None]).squeeze(1)
    fields, cu = {"response_mask": mask}, torch.tensor([0, 2, 5])
    totals = Totals(SFT_LOSS.count(fields, cu))
    options = {"label_smoothing": 0.4}
    assert SFT_LOSS.stat_for(options) == "uniform_nll" and SFT_LOSS.stat_for({}) is None
    loss, sums = sft_loss(logp, fields, cu, totals=totals, uniform_nll_T=uniform_nll_from_logits(logits), **options)
    keep = mask.bool()
    expected = F.cross_entropy(logits[keep], target[keep], label_smoothing=0.4)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)  # the statistic is float32
    assert sums["sft_loss"].item() == pytest.approx(-logp[keep].sum().item())  # the stat stays the plain NLL
    with pytest.raises(ValueError, match="label_smoothing=0.4 needs uniform_nll_T"):
        sft_loss(logp, fields, cu, totals=totals, **options)


def _tiny_model_dir(tmp_path):
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, seed=0)
    model.save_pretrained(tmp_path)
    return tmp_path, model


def test_dp_engine_step_gives_torch_cross_entropy_gradients(tmp_path):
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.chat import token_table
    from flowrl.roles import supervised

    model_dir, model = _tiny_model_dir(tmp_path)
    # two rows: prompt tokens, response tokens, the mask (the second row's first response token untrained)
    prompts, responses, masks = [[5, 6, 7], [8, 9]], [[10, 11, 1], [12, 13]], [[1, 1, 1], [0, 1]]
    engine = TorchDPEngine(str(model_dir), lr=0.0, grad_clip=0.0)
    actor = load_config(None, ["algorithm.family=sft", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2",
                               "actor.ppo_micro_batch_size_per_gpu=2"]).actor  # both rows in one micro-batch
    supervised.train(engine, actor, token_table(prompts, responses, masks), loss="flowrl.algos.sft_loss:SFT_LOSS",
                     mini_batch_rows=2, options={"label_smoothing": 0.3})
    got = engine.grad_state_dict()

    logits, targets = [], []
    for p, r, m in zip(prompts, responses, masks):
        out = model(input_ids=torch.tensor([p + r])).logits[0]
        for i, (tok, keep) in enumerate(zip(r, m)):
            if keep:  # position len(p) + i - 1 predicts response token i
                logits.append(out[len(p) + i - 1])
                targets.append(tok)
    F.cross_entropy(torch.stack(logits), torch.tensor(targets), label_smoothing=0.3).backward()
    for name, param in model.named_parameters():
        assert torch.allclose(got[name], param.grad, atol=1e-6), name


def test_backends_without_the_statistic_refuse_label_smoothing_by_name():
    """Every built-in backend computes the statistic (megatron over its vocab-parallel head); a
    plug-in backend that declares only the entropy is refused by name before any worker starts."""
    import dataclasses

    from flowrl.catalog.backends import TRAIN_BACKENDS

    assert all("uniform_nll" in TRAIN_BACKENDS.spec(n).token_stats for n in ("dp", "fsdp", "megatron"))
    base = ["algorithm.family=sft", "data.train_batch_size=8", "actor.ppo_mini_batch_size=4"]
    SFT(load_config(None, [*base, "actor.strategy=megatron", "algorithm.sft.label_smoothing=0.1"]))
    TRAIN_BACKENDS.add(dataclasses.replace(TRAIN_BACKENDS.spec("dp"), name="plain", token_stats=frozenset({"entropy"})))
    try:
        with pytest.raises(ConfigError, match=r"algorithm.sft.label_smoothing=0.1: needs the per-token 'uniform_nll'.*"
                                              r"actor.strategy=plain.*set algorithm.sft.label_smoothing=0, or "
                                              r"actor.strategy to one of dp, fsdp, megatron"):
            SFT(load_config(None, [*base, "actor.strategy=plain", "algorithm.sft.label_smoothing=0.1"]))
        SFT(load_config(None, [*base, "actor.strategy=plain"]))  # no smoothing: nothing to compute
    finally:
        TRAIN_BACKENDS.unregister("plain")
    assert SFT(load_config(None, [*base, "algorithm.sft.label_smoothing_factor=0.2"])).loss_options() == {
        "label_smoothing": 0.2}  # TRL's name
    with pytest.raises(ConfigError, match="label_smoothing_factor=0.2: disagrees with algorithm.sft.label_smoothing=0.1"):
        load_config(None, [*base, "algorithm.sft.label_smoothing=0.1", "algorithm.sft.label_smoothing_factor=0.2"])
    with pytest.raises(ConfigError, match=r"label_smoothing=1.0: must be in \[0, 1\)"):
        load_config(None, [*base, "algorithm.sft.label_smoothing=1.0"])


def test_vocab_parallel_uniform_nll_over_two_slices_equals_the_whole_vocabulary():
    """Megatron's statistic (``vocab_parallel_logprobs(stat="uniform_nll")``): values and gradients of
    a loss on (logp, uniform_nll) equal :func:`uniform_nll_from_logits` on the whole vocabulary,
    with megatron's padding columns ignored (one rank; two ranks: the next test)."""
    from flowrl.backends.train.megatron.vocab_parallel import vocab_parallel_logprobs

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 11, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 10, 4, 4, 7, 2])
    w = torch.randn(2, 6, generator=g, dtype=torch.float64)
    padded = torch.cat([logits, torch.full((6, 5), 40.0, dtype=torch.float64)], dim=1)  # megatron's padding
    logp, stat = vocab_parallel_logprobs(padded, target, vocab_start=0, num_valid=11, temperature=1.0,
                                         stat="uniform_nll")
    ((w[0] * logp.double()).sum() + (w[1] * stat.double()).sum()).backward()
    got = logits.grad.clone()
    logits.grad = None
    want_logp = logits.log_softmax(-1).gather(1, target[:, None]).squeeze(1)
    want_stat = uniform_nll_from_logits(logits).double()
    torch.testing.assert_close(logp.double(), want_logp, rtol=0, atol=1e-6)
    torch.testing.assert_close(stat.double(), want_stat, rtol=0, atol=1e-5)
    ((w[0] * want_logp).sum() + (w[1] * want_stat).sum()).backward()
    torch.testing.assert_close(got, logits.grad, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="stat='nll' is not one of entropy, uniform_nll"):
        vocab_parallel_logprobs(padded, target, vocab_start=0, num_valid=11, stat="nll")


def _two_slice_ranks(rank: int, world: int, logits, target, w) -> dict:
    """Rank ``rank`` of a two-rank gloo group: its half of the vocabulary; the loss's value and the
    gradient of its slice."""
    from flowrl.backends.train.megatron.vocab_parallel import vocab_parallel_logprobs

    half = logits.shape[1] // 2 + 1  # 6 of 11 columns, then 5 real + 1 padding
    cols = torch.cat([logits, torch.full((logits.shape[0], 1), 30.0, dtype=logits.dtype)], dim=1)
    mine = cols[:, rank * half:(rank + 1) * half].clone().requires_grad_(True)
    num_valid = min(half, logits.shape[1] - rank * half)
    logp, stat = vocab_parallel_logprobs(mine, target, vocab_start=rank * half, num_valid=num_valid,
                                         stat="uniform_nll")
    loss = (w[0] * logp.double()).sum() + (w[1] * stat.double()).sum()
    loss.backward()
    return {"loss": float(loss), "grad": mine.grad[:, :num_valid]}


@pytest.mark.timeout(300)
def test_vocab_parallel_uniform_nll_on_two_ranks():
    from flowrl_testing.fsdp import run_ranks

    g = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 11, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 10, 5, 6, 3])  # both slices own targets
    w = torch.randn(2, 5, generator=g, dtype=torch.float64)
    out = run_ranks(2, _two_slice_ranks, logits, target, w, timeout_s=240)
    ref = logits.clone().requires_grad_(True)
    want_logp = ref.log_softmax(-1).gather(1, target[:, None]).squeeze(1)
    want = (w[0] * want_logp).sum() + (w[1] * uniform_nll_from_logits(ref).double()).sum()
    want.backward()
    assert [o["loss"] for o in out] == pytest.approx([float(want.detach())] * 2, abs=1e-5)
    torch.testing.assert_close(torch.cat([out[0]["grad"], out[1]["grad"]], dim=1), ref.grad, rtol=0, atol=1e-6)
