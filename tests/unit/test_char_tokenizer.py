"""The character tokenizer: one id per character, nothing added, same after save/load."""

import pytest

from flowrl.models.char_tokenizer import CHARACTERS, build_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def test_one_id_per_character_and_no_special_tokens_added(tokenizer):
    ids = tokenizer("37+48=")["input_ids"]
    assert len(ids) == 6
    assert tokenizer.eos_token_id not in ids and tokenizer.pad_token_id not in ids
    # "3" and "8" and the two digits "4" / "7" are distinct ids; "3" appears once
    assert ids[0] == tokenizer.convert_tokens_to_ids("3")


def test_decode_joins_characters_without_spaces(tokenizer):
    text = "a b\n37+48=85 #### 1,234"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_special_tokens_and_ids(tokenizer):
    assert tokenizer.pad_token_id == 0
    assert tokenizer.eos_token_id == 1
    assert tokenizer.unk_token_id == 2
    assert len(tokenizer) == 3 + len(CHARACTERS) == 99
    ids = tokenizer.encode("85") + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids) == "85<eos>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "85"
    assert tokenizer.encode("é") == [tokenizer.unk_token_id]


def test_chat_template_renders_last_user_content(tokenizer):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "37+48="},
    ]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "37+48="


def test_left_padding_for_generation(tokenizer):
    batch = tokenizer(["1+1=", "37+48="], padding=True)
    assert batch["input_ids"][0][:2] == [tokenizer.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1, 1]


def test_round_trip_through_save_pretrained(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "37+48=85\n#### 1,234!"
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    assert (loaded.pad_token_id, loaded.eos_token_id) == (0, 1)
    assert loaded.apply_chat_template(
        [{"role": "user", "content": "37+48="}], add_generation_prompt=True, tokenize=False
    ) == "37+48="


def test_characters_outside_the_vocabulary_do_not_survive_a_round_trip(tmp_path):
    """What ``PromptDataset`` checks (``dropped_text``): built in code they become ``<unk>``,
    reloaded from a model directory they are dropped; in both cases the prompt's rows are rejected."""
    from transformers import AutoTokenizer

    from flowrl.data.prompts import dropped_text

    tok = build_char_tokenizer()
    ids = tok("五+五=", add_special_tokens=False)["input_ids"]
    assert ids.count(tok.unk_token_id) == 2 and dropped_text(tok, "五+五=", ids) == "五五"
    assert dropped_text(tok, "37+48=", tok("37+48=", add_special_tokens=False)["input_ids"]) == ""
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    ids = again("五+五=", add_special_tokens=False)["input_ids"]
    assert dropped_text(again, "五+五=", ids) == "五五"
