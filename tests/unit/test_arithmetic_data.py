"""Addition prompts: deterministic, disjoint splits, verl's Parquet columns."""

import pytest

from flowrl.tasks.arithmetic import (
    DATA_SOURCE,
    make_addition_rows,
    split_pairs,
    write_addition_parquet,
)


def test_rows_have_verl_format():
    row = make_addition_rows(1, 0, "train")[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == DATA_SOURCE == "flowrl/addition"
    assert row["ability"] == "math"
    (message,) = row["prompt"]
    assert message["role"] == "user"
    a, b = message["content"].removesuffix("=").split("+")
    assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
    assert row["reward_model"] == {"style": "rule", "ground_truth": str(int(a) + int(b))}
    assert row["extra_info"] == {"split": "train", "index": 0}


def test_deterministic_in_seed():
    assert make_addition_rows(50, 3, "train") == make_addition_rows(50, 3, "train")
    assert make_addition_rows(50, 3, "train") != make_addition_rows(50, 4, "train")


def test_splits_disjoint_and_cover_all_pairs():
    train, test = set(split_pairs("train")), set(split_pairs("test"))
    assert not train & test
    assert len(train) + len(test) == 90 * 90
    assert 500 < len(test) < 1100  # about one pair in ten
    contents = lambda rows: {r["prompt"][0]["content"] for r in rows}  # noqa: E731
    # Disjoint whatever the seeds: the split is a property of the pair.
    assert not contents(make_addition_rows(len(train), 0, "train")) & contents(
        make_addition_rows(len(test), 1, "test")
    )


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="split='val'"):
        make_addition_rows(1, 0, "val")
    with pytest.raises(ValueError, match="at most"):
        make_addition_rows(10**6, 0, "test")


def test_parquet_readable_with_pyarrow(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    train_path, test_path = write_addition_parquet(tmp_path / "data", 20, 5, seed=0)
    assert (train_path.name, test_path.name) == ("train.parquet", "test.parquet")
    train = pq.read_table(train_path)
    assert train.num_rows == 20 and pq.read_table(test_path).num_rows == 5
    rows = make_addition_rows(20, 0, "train")
    assert set(train.column_names) == set(rows[0])
    ground_truth = pc.struct_field(train.column("reward_model"), "ground_truth").to_pylist()
    assert ground_truth == [r["reward_model"]["ground_truth"] for r in rows]
    assert train.to_pylist() == rows
    assert not list(tmp_path.joinpath("data").glob(".*"))  # no temporary files left
