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


def test_ground_truths_become_the_text_reward_functions_compare(tmp_path, tokenizer):
    from flowrl.data.prompts import ground_truth_text

    # an integral float (a pandas integer column with a gap) is the integer; verl's rewards read str()
    assert [ground_truth_text(t) for t in ("10", 10, 10.0, 2.5, -3.0)] == ["10", "10", "10", "2.5", "-3"]
    for bad, words in ((None, "no reward_model"), ("", "empty"), ("  ", "empty"), (["10"], "a list"),
                       ({"a": 1}, "dict"), (True, "bool"), (float("nan"), "nan")):
        with pytest.raises(ValueError, match=words):
            ground_truth_text(bad)
    path = tmp_path / "floats.parquet"
    rows = [{"data_source": "flowrl/addition", "prompt": "9+1=", "reward_model": {"ground_truth": t}} for t in (10.0, 2.5)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert PromptDataset([path], tokenizer).table.column("ground_truth").to_pylist() == ["10", "2.5"]


def test_list_ground_truths_and_null_content_are_rejected_rows(tmp_path, tokenizer):
    lists = tmp_path / "lists.parquet"
    pq.write_table(pa.Table.from_pylist([_row("2+3=", ["5"]), _row("1+1=", ["2", "two"])]), lists)
    with pytest.raises(ValueError, match="no usable prompt rows") as err:
        PromptDataset([lists], tokenizer)
    assert [r.row for r in err.value.rejected] == [0, 1] and all("a list" in r.reason for r in err.value.rejected)
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.Table.from_pylist([_row("2+3="), _row(None), _row("")]), nulls)
    ds = PromptDataset([nulls], tokenizer)
    assert len(ds) == 1 and [(r.row, r.reason.split(" (")[0]) for r in ds.rejected] == [
        (1, "message 0"), (2, "empty prompt")]
    assert "None" in ds.rejected[0].reason  # the null content is named, not rendered as the prompt "None"


def test_characters_outside_the_vocabulary_are_reported_not_stripped(tmp_path, tokenizer):
    path = tmp_path / "unk.parquet"
    pq.write_table(pa.Table.from_pylist([_row("五+五="), _row("2+3=")]), path)
    ds = PromptDataset([path], tokenizer)
    assert len(ds) == 1 and ds.rejected[0].row == 0
    assert "'五五'" in ds.rejected[0].reason and "vocabulary" in ds.rejected[0].reason
    assert tokenizer.unk_token_id not in [t for ids in ds.table.column("prompt_ids").to_pylist() for t in ids]


def test_unreadable_files_name_the_file(tmp_path, tokenizer):
    from flowrl.data.prompts import PromptFileError

    for name, data in (("zero.parquet", b""), ("csv.parquet", b"a,b\n1,2\n")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(PromptFileError, match=name):
            PromptDataset([tmp_path / name], tokenizer)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([_row("2+3=")]).slice(0, 0), empty)
    with pytest.raises(PromptFileError, match="has no rows"):
        PromptDataset([empty], tokenizer)
