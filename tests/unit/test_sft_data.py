"""SFT and preference data: which tokens are trained (against masks worked out by hand), the
experience layout, rejected rows, and whole pairs in every batch."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowrl.data import experience as ex
from flowrl.data.chat import ChatDataset, OverlongRow, encode_messages, encode_prompt_response
from flowrl.data.pairs import PairDataset
from flowrl.models.char_tokenizer import build_char_tokenizer

# Every message as "<role initial>:<content>\n"; the generation prompt is "a:".
TURN_TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}a:{% endif %}")
TWO_TURNS = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
             {"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()  # one token per character; its template renders the last user message


@pytest.fixture(scope="module")
def turn_tok():
    t = build_char_tokenizer()
    t.chat_template = TURN_TEMPLATE
    return t


def test_two_assistant_turns_train_their_text_and_end_of_turn_only(turn_tok):
    enc = encode_messages(TWO_TURNS, turn_tok)
    # "u:1+1=\na:" untrained (9), "2\n" trained, "u:2+2=\na:" untrained (9), "4\n" trained
    assert turn_tok.decode(enc.ids) == "u:1+1=\na:2\nu:2+2=\na:4\n"
    assert enc.mask == [0] * 9 + [1, 1] + [0] * 9 + [1, 1]


def test_one_final_answer_is_prompt_then_response_and_eos(tok):
    enc = encode_messages([{"role": "system", "content": "be brief"}, {"role": "user", "content": "37+48="},
                           {"role": "assistant", "content": "85"}], tok)
    # the char template renders the user's content: "37+48=" (6 tokens), then "85" and <eos>
    assert enc.ids == tok("37+48=85", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert enc.mask == [0] * 6 + [1, 1, 1]
    assert encode_prompt_response([{"role": "user", "content": "37+48="}], "85", tok) == enc


def test_a_template_that_drops_assistant_turns_is_refused_for_several(tok):
    with pytest.raises(ValueError, match="does not render assistant message 1"):
        encode_messages(TWO_TURNS, tok)
    with pytest.raises(ValueError, match="no assistant message"):
        encode_messages([{"role": "user", "content": "hi"}], tok)


def _write(path, **columns):
    pq.write_table(pa.table(columns), path)
    return str(path)


def test_chat_dataset_layout_rejects_and_truncation(tmp_path, turn_tok):
    msgs = [TWO_TURNS, [{"role": "user", "content": "x"}], TWO_TURNS[:2]]
    ds = ChatDataset([_write(tmp_path / "a.parquet", messages=msgs)], turn_tok, max_length=64)
    assert len(ds) == 2 and [(r.row, r.reason) for r in ds.rejected] == [(1, "no assistant message: nothing to train on")]
    prompt, _ = ex.token_column(ds.table, "prompt_ids")
    mask, cu = ex.token_column(ds.table, "response_mask")
    # row 0: prompt = the 9 tokens before the first trained one; row 1: "u:1+1=\na:" + "2", <eos>
    assert turn_tok.decode(prompt[:9].tolist()) == "u:1+1=\na:"
    assert mask[: int(cu[1])].tolist() == [1, 1] + [0] * 9 + [1, 1]
    assert mask[int(cu[1]):].tolist() == [1, 1]
    with pytest.raises(OverlongRow, match="row 0: row has 22 tokens > algorithm.sft.max_length=10"):
        ChatDataset([str(tmp_path / "a.parquet")], turn_tok, max_length=10)
    cut = ChatDataset([str(tmp_path / "a.parquet")], turn_tok, max_length=10, truncation="right")
    assert len(cut) == 2  # the 22-token row keeps "u:1+1=\na:2" (9 untrained + 1 trained)
    assert ex.token_column(cut.table, "response_mask")[0][:1].tolist() == [1]


def test_prompt_response_columns(tmp_path, tok):
    path = _write(tmp_path / "b.parquet", prompt=["1+2=", "3+4="], response=["3", "7"])
    ds = ChatDataset([path], tok)
    assert ds.table.column("response_ids").to_pylist() == [[tok.convert_tokens_to_ids("3"), tok.eos_token_id],
                                                           [tok.convert_tokens_to_ids("7"), tok.eos_token_id]]
    with pytest.raises(ValueError, match="no column 'answer'"):
        ChatDataset([path], tok, response_key="answer")


def test_pairs_stay_whole_and_adjacent_in_batches(tmp_path, tok):
    path = _write(tmp_path / "p.parquet", prompt=[f"{i}+1=" for i in range(6)],
                  chosen=[str(i + 1) for i in range(6)], rejected=[[{"role": "assistant", "content": "0"}]] * 6)
    ds = PairDataset([path], tok)
    assert len(ds) == 6 and ds.table.num_rows == 12
    batch = ds.batch(1, 2, seed=3)
    prompts = batch.column("prompt_ids").to_pylist()
    responses = batch.column("response_ids").to_pylist()
    assert batch.num_rows == 4 and prompts[0] == prompts[1] and prompts[2] == prompts[3]
    assert responses[1] == responses[3] == [tok.convert_tokens_to_ids("0"), tok.eos_token_id]  # rejected second
    assert ds.batch(1, 2, seed=3).equals(batch)  # a pure function of (seed, step)
