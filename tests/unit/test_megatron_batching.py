"""Padded micro-batches: where each response token's logits sit (pure)."""

from __future__ import annotations

import pytest

from flowrl.backends.train.megatron.batching import make_micro_batches


def test_positions_labels_and_padding():
    batch = [{"prompt_ids": [5, 6], "response_ids": [7, 8, 9]},
             {"prompt_ids": [1], "response_ids": [2]},
             {"prompt_ids": [3, 4, 5], "response_ids": []}]
    mbs, seq_len = make_micro_batches(batch, micro_batch_size=2)
    # longest row: 2 + 3 tokens -> 4 input positions
    assert seq_len == 4 and len(mbs) == 2
    first, second = mbs
    assert first.tokens_BS.tolist() == [[5, 6, 7, 8], [1, 0, 0, 0]]
    assert first.labels_BS.tolist() == [[6, 7, 8, 9], [2, 0, 0, 0]]
    # response tokens are predicted at positions P-1 .. P+R-2, flattened as b * S + position
    assert first.index_T.tolist() == [1, 2, 3, 4 + 0]
    assert first.labels_BS.reshape(-1)[first.index_T].tolist() == [7, 8, 9, 2]
    assert first.cu_seqlens_B1.tolist() == [0, 3, 4]
    # the last micro-batch is filled with a padding row; an empty response adds no tokens
    assert len(second.items) == 1 and second.num_tokens == 0
    assert second.cu_seqlens_B1.tolist() == [0, 0]


def test_microbatch_count_padded_to_multiple():
    batch = [{"prompt_ids": [1], "response_ids": [2, 3]}] * 3
    mbs, _ = make_micro_batches(batch, micro_batch_size=1, num_microbatches_multiple=2)
    assert len(mbs) == 4 and mbs[3].items == [] and mbs[3].num_tokens == 0
    assert [mb.index for mb in mbs] == [0, 1, 2, 3]


@pytest.mark.parametrize("bad,match", [([], "empty"), ([{"prompt_ids": [1]}], "response_ids"),
                                       ([{"prompt_ids": [], "response_ids": [1]}], "empty prompt")])
def test_rejects_bad_batches(bad, match):
    with pytest.raises(ValueError, match=match):
        make_micro_batches(bad, micro_batch_size=1)
