"""A character-level tokenizer built in code, for the embedded default task and for tests.

One token per character of printable ASCII plus newline, and three special tokens (``<pad>``,
``<eos>``, ``<unk>``). Nothing is added around an encoded string (no BOS/EOS), so
``"37+48="`` encodes to 6 ids and decoding joins characters without spaces. It is a normal
``PreTrainedTokenizerFast`` with a (trivial) chat template, so the code path is the same as for
real models and it round-trips through ``save_pretrained`` / ``AutoTokenizer.from_pretrained``
without any hub access.

A character outside the vocabulary becomes ``<unk>`` here; loaded back from a model directory by
``AutoTokenizer`` (as the model's own tokenizer class) it is dropped instead (``五+五=`` ->
``+=``). Either way the prompt no longer says what the row says, so
:class:`flowrl.data.prompts.PromptDataset` rejects such rows (reported in
``rejected_prompts.jsonl``) rather than training on the stripped text.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)

# Every printable ASCII character that is not other whitespace, plus space and newline.
CHARACTERS = tuple(
    sorted(set(string.digits + string.ascii_letters + string.punctuation + " " + "\n"))
)

# Renders the content of the last user message and nothing else: the prompt *is* the content.
# `add_generation_prompt` adds nothing because the model answers right after the prompt.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(content='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set ns.content = message['content'] -%}{%- endif -%}"
    "{%- endfor -%}"
    "{{- ns.content -}}"
)


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens first (``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2)."""
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    return {token: index for index, token in enumerate(tokens)}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (vocabulary of 3 special tokens + 96 characters)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK_TOKEN))
    # Split every character into its own word ("[\s\S]" also matches the newline).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join tokens without spaces
    backend.add_special_tokens(list(SPECIAL_TOKENS))

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        padding_side="left",
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
