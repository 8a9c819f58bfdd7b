"""The chat template's round trip for multi-turn rollouts (issue 32 item 4), checked at start.

The agent loop (:mod:`flowrl.agents.loop`) builds a trajectory's tokens piece by piece: the
rendered prompt, each model turn as generated (its text and the EOS that ended it), each tool
observation as the template's delta after an assistant turn (``ChatCodec.observation_ids``). A
model served later renders the whole conversation through the template and tokenizes it. Where
the two differ (a separator the template puts after each turn's end that the pieces lose, a
re-tokenization that merges across a boundary), the policy trains on token sequences it will
never see: :func:`round_trip` renders a two-turn tool conversation both ways and shows the first
differing token.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from flowrl.checks.base import Verdict, skipped

USER, FIRST, OBSERVATION, SECOND = "What is 12*34?", "Let me compute it.", "408", "The answer is 408."


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def round_trip(tokenizer: Any, observation_ids: Callable[[list[str]], list[int]],
               tools: Sequence[dict] | None = None) -> Verdict:
    """The agent loop's tokens of ``user, assistant, tool, assistant`` against the template's
    rendering of the same conversation, tokenized: ok when the loop's are a prefix of the
    template's (a template may add text after the last turn's end)."""
    from flowrl.data.prompts import render_prompt

    eos = tokenizer.eos_token_id
    if not getattr(tokenizer, "chat_template", None) or not isinstance(eos, int):
        return skipped("no chat template (or no single EOS token)")
    messages = [{"role": "user", "content": USER}, {"role": "assistant", "content": FIRST},
                {"role": "tool", "content": OBSERVATION}, {"role": "assistant", "content": SECOND}]
    extra = {"tools": list(tools)} if tools else {}
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, **extra)
    except Exception as exc:  # noqa: BLE001 - a template that refuses a role: the loop falls back likewise
        return skipped(f"the chat template does not render this conversation ({type(exc).__name__}: {exc})")
    if FIRST not in rendered or SECOND not in rendered:
        return skipped("the chat template does not render assistant turns")
    end = [eos] if tokenizer.eos_token in rendered else []  # a template without a turn end: EOS only stops
    loop = (_ids(tokenizer, render_prompt(messages[:1], tokenizer, tools)) + _ids(tokenizer, FIRST) + end
            + list(observation_ids([OBSERVATION])) + _ids(tokenizer, SECOND) + end)
    template = _ids(tokenizer, rendered)
    at = next((i for i, (a, b) in enumerate(zip(loop, template)) if a != b), None)
    if at is None and len(loop) <= len(template):
        return Verdict(True, 0.0, f"{len(loop)} tokens of a two-turn tool conversation equal the template's")
    at = len(template) if at is None else at

    def show(ids: list[int]) -> str:
        return repr(tokenizer.decode(ids[at:at + 1])) if at < len(ids) else "the end"

    context = tokenizer.decode(loop[max(0, at - 8):at])
    return Verdict(False, float(at), (
        f"the agent loop's tokens differ from the chat template's rendering at token {at} (after {context!r}): "
        f"the loop has {show(loop)} (id {loop[at] if at < len(loop) else None}), the template "
        f"{show(template)} (id {template[at] if at < len(template) else None}); likely cause: the template "
        "puts a separator after each turn's end (e.g. a newline after <|im_end|>) that the turn-by-turn "
        "tokens lose, so the policy trains on sequences it will not see when served"))
