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
    base = ["algorithm.family=sft", "data.train_batch_size=8", "actor.ppo_mini_batch_size=4"]
    with pytest.raises(ConfigError, match=r"algorithm.sft.label_smoothing=0.1: needs the per-token 'uniform_nll'.*"
                                          r"actor.strategy=megatron.*set algorithm.sft.label_smoothing=0, or "
                                          r"actor.strategy to one of dp, fsdp"):
        SFT(load_config(None, [*base, "actor.strategy=megatron", "algorithm.sft.label_smoothing=0.1"]))
    SFT(load_config(None, [*base, "actor.strategy=megatron"]))  # no smoothing: nothing to compute
    assert SFT(load_config(None, [*base, "algorithm.sft.label_smoothing_factor=0.2"])).loss_options() == {
        "label_smoothing": 0.2}  # TRL's name
    with pytest.raises(ConfigError, match="label_smoothing_factor=0.2: disagrees with algorithm.sft.label_smoothing=0.1"):
        load_config(None, [*base, "algorithm.sft.label_smoothing=0.1", "algorithm.sft.label_smoothing_factor=0.2"])
    with pytest.raises(ConfigError, match=r"label_smoothing=1.0: must be in \[0, 1\)"):
        load_config(None, [*base, "algorithm.sft.label_smoothing=1.0"])
