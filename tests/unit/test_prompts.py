"""Prompt datasets: verl-format rows tokenized once; unusable rows reported, never dropped silently."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowrl.data.prompts import PromptDataset
from flowrl.models.char_tokenizer import build_char_tokenizer


def _row(content, truth="5", source="flowrl/addition"):
    return {"data_source": source, "prompt": [{"role": "user", "content": content}], "reward_model": {"style": "rule", "ground_truth": truth}}


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def test_rows_are_tokenized_through_the_chat_template(tmp_path, tokenizer):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([_row("2+3="), _row("10+10=", "20")]), path)
    ds = PromptDataset([path], tokenizer, max_prompt_length=16)
    assert len(ds) == 2 and not ds.rejected
    assert ds.table.column("prompt_ids").to_pylist()[0] == tokenizer("2+3=", add_special_tokens=False)["input_ids"]
    assert ds.table.column("ground_truth").to_pylist() == ["5", "20"]


def test_bad_rows_are_reported_with_file_row_and_reason(tmp_path, tokenizer):
    path = tmp_path / "p.parquet"
    rows = [_row("2+3="), _row("1" * 40), {"data_source": "x", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"style": "rule", "ground_truth": None}}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = PromptDataset([path], tokenizer, max_prompt_length=16)
    assert len(ds) == 1
    assert [(r.row, r.reason.split(" ")[0]) for r in ds.rejected] == [(1, "prompt"), (2, "no")]
    assert "data.max_prompt_length=16" in ds.rejected[0].reason
    ds.write_rejected(tmp_path / "rejected.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "rejected.jsonl").read_text().splitlines()]
    assert [x["row"] for x in lines] == [1, 2] and all(x["file"] == str(path) for x in lines)


def test_no_usable_row_and_missing_column_are_errors(tmp_path, tokenizer):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([_row("1" * 40)]), path)
    with pytest.raises(ValueError, match="no usable prompt rows"):
        PromptDataset([path], tokenizer, max_prompt_length=8)
    with pytest.raises(ValueError, match="data.prompt_key"):
        PromptDataset([path], tokenizer, prompt_key="question")
    with pytest.raises(FileNotFoundError, match="data.train_files"):
        PromptDataset([tmp_path / "nope.parquet"], tokenizer)


def test_batches_are_deterministic_epoch_permutations(tmp_path, tokenizer):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([_row(f"{i}+1=", str(i + 1)) for i in range(10)]), path)
    ds = PromptDataset([path], tokenizer)
    b0, b1 = ds.batch(0, 4, seed=1), ds.batch(1, 4, seed=1)
    assert b0.equals(ds.batch(0, 4, seed=1))
    truths = b0.column("ground_truth").to_pylist() + b1.column("ground_truth").to_pylist()
    assert len(set(truths)) == 8  # no prompt twice within an epoch (10 // 4 = 2 batches per epoch)
    assert b1.column("group").to_pylist() == [4, 5, 6, 7]  # group ids are unique across steps
    with pytest.raises(ValueError, match="exceeds"):
        ds.batch(0, 11)
