import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from flowrl.data import experience as ex
from flowrl.data.packed import PackedBatch


def _table():
    return pa.table(
        {
            "group": pa.array([0, 0, 1], pa.int64()),
            "prompt_ids": ex.from_lists([[5, 6], [5, 6], [7]], ex.TOKEN_IDS),
            "response_ids": ex.from_lists([[1, 2, 3], [4], [8, 9]], ex.TOKEN_IDS),
        }
    )


def test_token_column_is_zero_copy_and_offsets_are_cu_seqlens():
    t = _table()
    values, cu = ex.token_column(t, "response_ids")
    assert values.tolist() == [1, 2, 3, 4, 8, 9] and cu.tolist() == [0, 3, 4, 6]
    arrow_values = t.column("response_ids").chunk(0).values
    assert values.data_ptr() == torch.from_dlpack(arrow_values).data_ptr()  # same memory
    # a slice (a dp share) rebases offsets and still points into the same buffer
    v2, cu2 = ex.token_column(t.slice(1, 2), "response_ids")
    assert v2.tolist() == [4, 8, 9] and cu2.tolist() == [0, 1, 3]
    assert v2.data_ptr() == values.data_ptr() + 3 * 4


def test_split_and_concat_give_the_table_back():
    t = _table()
    parts = ex.split(t, 2)
    assert [p.num_rows for p in parts] == [2, 1]
    assert ex.concat(parts).equals(t)
    with pytest.raises(ValueError):
        ex.split(t, 0)


def test_with_columns_does_not_mutate_and_checks_length():
    t = _table()
    t2 = ex.with_columns(t, score=pa.array([1.0, 0.0, 1.0]))
    assert "score" not in t.column_names and t2.column("score").type == pa.float32()
    with pytest.raises(ValueError, match="rows"):
        ex.with_columns(t, score=pa.array([1.0]))


def test_list_column_round_trip_through_torch():
    values, cu = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0, 1, 3])
    arr = ex.list_column(values, cu, ex.TOKEN_FLOATS)
    assert arr.to_pylist() == [[0.5], [-1.0, 2.0]]


def test_parquet_is_written_atomically_and_reads_back(tmp_path):
    t = _table()
    path = ex.write_parquet(t, ex.step_path(tmp_path, 3))
    assert path.name == "step_000003.parquet"
    assert pq.read_table(path).equals(t)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp file left


def test_packed_batch_padded_positions():
    t = _table()
    b = PackedBatch.from_table(t)
    p = b.padded(pad_id=0)
    # rows: [5 6 1 2 3], [5 6 4 0 0], [7 8 9 0 0]
    assert p.input_ids_BL.tolist() == [[5, 6, 1, 2, 3], [5, 6, 4, 0, 0], [7, 8, 9, 0, 0]]
    assert p.attention_mask_BL.sum(1).tolist() == [5, 3, 3]
    assert p.row_T.tolist() == [0, 0, 0, 1, 2, 2] and p.pos_T.tolist() == [2, 3, 4, 2, 1, 2]
    mb = b.rows(1, 3)
    assert mb.response_T.tolist() == [4, 8, 9] and mb.response_cu_B1.tolist() == [0, 1, 3]
    assert [m.num_rows for m in b.micro_batches(2)] == [2, 1]


def test_misaligned_token_field_is_rejected():
    t = _table()
    t = ex.with_columns(t, advantages=ex.from_lists([[1.0], [1.0], [1.0]], ex.TOKEN_FLOATS))
    with pytest.raises(ValueError, match="not aligned"):
        PackedBatch.from_table(t, ("advantages",))
