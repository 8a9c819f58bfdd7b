"""The agent loop: generate a turn, run the tool calls it makes, append their observations, repeat.

For a batch of prompts (one trajectory each), until every trajectory is finished:

1. generate every active trajectory's next turn from ``prompt + response so far``, at most the
   tokens left of the budget (``response_length`` counts every turn, tool tokens included), until
   EOS;
2. parse the turn (:mod:`flowrl.agents.parsers`); a turn with no call ends the trajectory
   (``stop``, or ``length`` without EOS);
3. run all calls of all trajectories concurrently (:class:`~flowrl.agents.runner.ToolRunner`),
   render their observations with the chat template's tool role and append those tokens with
   ``response_mask`` 0.

A trajectory also ends when its model turns reach ``max_turns`` (the last turn's calls are not
run: ``max_turns``) or when an observation would leave no room for another model token
(``length``; the observation is dropped). So a response always ends on a model token, where the
outcome reward goes. ``rollout_logprobs`` of observation tokens are filled in afterwards by the
caller (teacher-forced): they are context for the trainer, never loss.

Shape letters: none (token lists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from flowrl.agents.parsers import ParsedTurn, ToolCall
from flowrl.agents.runner import KEEP_STATE, CallResult, ToolRunner

__all__ = ["AgentSettings", "ChatCodec", "FINISH_REASONS", "Trajectory", "run_agent_loop"]

FINISH_REASONS = ("stop", "length", "max_turns")
MODEL, TOOL = 1, 0  # span kinds, as in response_mask

GenerateFn = Callable[[list[list[int]], list[int], int], tuple[list[list[int]], list[list[float]]]]
"""``generate(contexts, max_new_tokens per context, seed) -> (new tokens, their log-probs)``: one
sample per context, each stopping after EOS or its own token limit."""


@dataclass(frozen=True)
class AgentSettings:
    max_turns: int
    """Model turns per trajectory at most."""
    response_length: int
    """Token budget of the whole response (model and tool tokens)."""
    tool_timeout_s: float = 10.0
    max_observation_chars: int = 1000
    """A tool's answer is cut to this many characters before it is rendered."""


@dataclass
class Trajectory:
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[list[int]] = field(default_factory=list)
    """``[start, end, kind]`` per turn in ``response`` (kind 1: model, 0: tool)."""
    num_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0
    """Calls the parser could not read (counted in ``tool_calls`` and ``tool_errors`` too)."""
    finish_reason: str = ""
    state: dict = field(default_factory=dict)
    """Tool name -> this trajectory's state of that tool (``Tool.create_state``)."""

    def append(self, tokens: Sequence[int], kind: int, logprobs: Sequence[float] | None = None) -> None:
        start = len(self.response)
        self.response += list(tokens)
        self.mask += [kind] * len(tokens)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(tokens)
        self.spans.append([start, len(self.response), kind])


_BASE_TURN = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


class ChatCodec:
    """Text <-> tokens for the loop: decodes a turn for the parser, renders tool observations
    through the chat template's tool role (what the template adds after an assistant turn for
    ``tool`` messages, with the generation prompt), or as ``<tool_response>`` blocks when the
    template has no tool role."""

    def __init__(self, tokenizer: Any, *, extra_eos_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        self.eos_ids = ({eos} if isinstance(eos, int) else set(eos or ())) | set(extra_eos_ids)
        """Tokens that end a turn: the tokenizer's EOS and the model's generation EOS ids."""

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _rendered_turn(self) -> str:
        return self.tokenizer.apply_chat_template(_BASE_TURN, tokenize=False)

    def _template_delta(self, texts: list[str]) -> str | None:
        base = _BASE_TURN
        try:
            before = self._rendered_turn()
            after = self.tokenizer.apply_chat_template(
                base + [{"role": "tool", "content": t} for t in texts], tokenize=False, add_generation_prompt=True)
        except Exception:
            return None
        if not after.startswith(before) or not all(t in after[len(before):] for t in texts):
            return None
        return self._after_turn_end(before) + after[len(before):]

    def _after_turn_end(self, rendered: str) -> str:
        """What the template writes after an assistant turn's end token (Qwen: the newline after
        ``<|im_end|>``): the model stops at the token, so the observation carries the rest, or the
        trained sequence would lack it while the served one (the template's) has it (verl #6501)."""
        ends = [t for t in self.tokenizer.convert_ids_to_tokens(sorted(self.eos_ids)) if t and t in rendered]
        if not ends:
            return ""
        return rendered[max(rendered.rindex(t) + len(t) for t in ends):]

    def observation_ids(self, texts: list[str], *, after_end: bool = True) -> list[int]:
        """The tokens of tool observations ``texts`` after a model turn; ``after_end``: that turn
        ended with an end token (the template's text after that token comes first)."""
        delta = self._template_delta(texts)
        if delta is None:
            delta = "".join(f"\n<tool_response>\n{t}\n</tool_response>\n" for t in texts)
        elif not after_end:
            delta = delta[len(self._after_turn_end(self._rendered_turn())):]
        return self.tokenizer.encode(delta, add_special_tokens=False)


def _observe(runner: ToolRunner, pending: list[tuple[Trajectory, ParsedTurn]]) -> list[list[str]]:
    """Run every call of every pending turn; each turn's observation texts (errors included)."""
    calls: list[tuple[ToolCall, Any]] = [(c, traj.state.get(c.name)) for traj, turn in pending for c in turn.calls]
    results: list[CallResult] = runner.run(calls)
    out, k = [], 0
    for traj, turn in pending:
        texts = [f"error: {e}" for e in turn.errors]
        traj.tool_calls += len(turn.calls) + len(turn.errors)
        traj.tool_errors += len(turn.errors)
        traj.malformed_calls += len(turn.errors)
        for c in turn.calls:
            res = results[k]
            k += 1
            traj.tool_errors += res.error is not None
            texts.append(res.text)
            if res.state is not KEEP_STATE:  # a remote call: its state comes back by value
                traj.state[c.name] = res.state
        out.append(texts)
    return out


def _model_turn(traj: Trajectory, tokens: list[int], logprobs: list[float], turn: int, *, codec: ChatCodec,
                parser: Callable[[str], ParsedTurn], settings: AgentSettings) -> ParsedTurn | None:
    """Append one generated turn; its calls if the trajectory goes on, None if it is finished."""
    traj.append(tokens, MODEL, logprobs)
    traj.num_turns += 1
    ended = bool(tokens) and tokens[-1] in codec.eos_ids
    parsed = parser(codec.decode(tokens))
    if not parsed.has_calls:
        traj.finish_reason = "stop" if ended else "length"
    elif len(traj.response) >= settings.response_length:
        traj.finish_reason = "length"
    elif turn + 1 >= settings.max_turns:
        traj.finish_reason = "max_turns"
    else:
        return parsed
    return None


def run_agent_loop(prompts: list[list[int]], *, generate: GenerateFn, codec: ChatCodec,
                   parser: Callable[[str], ParsedTurn], runner: ToolRunner, settings: AgentSettings,
                   seed: int = 0, states: list[dict] | None = None,
                   ended: Callable[[Trajectory], bool] | None = None) -> list[Trajectory]:
    """One trajectory per prompt; see the module docstring. ``states``: per trajectory, tool name
    -> that tool's state (``Tool.create_state``), passed to the trajectory's calls of the tool.
    ``ended(trajectory)``: checked after its calls ran; True stops it (``stop``) without the
    observation (an environment's ``done``, :mod:`flowrl.agents.env`)."""
    trajs = [Trajectory(state=(states[i] if states else {})) for i in range(len(prompts))]
    active = list(range(len(prompts)))
    for turn in range(settings.max_turns):
        if not active:
            break
        budgets = [settings.response_length - len(trajs[i].response) for i in active]
        new, logps = generate([prompts[i] + trajs[i].response for i in active], budgets, seed * 7919 + turn)
        pending: list[tuple[int, ParsedTurn]] = []
        for i, tokens, lp, budget in zip(active, new, logps, budgets):
            parsed = _model_turn(trajs[i], list(tokens[:budget]), list(lp[:budget]), turn, codec=codec,
                                 parser=parser, settings=settings)
            if parsed is not None:
                pending.append((i, parsed))
        observations = _observe(runner, [(trajs[i], p) for i, p in pending])
        active = []
        for (i, _), texts in zip(pending, observations):
            if ended is not None and ended(trajs[i]):
                trajs[i].finish_reason = "stop"
                continue
            ids = codec.observation_ids([t[: settings.max_observation_chars] for t in texts],
                                        after_end=bool(trajs[i].response) and trajs[i].response[-1] in codec.eos_ids)
            if len(trajs[i].response) + len(ids) >= settings.response_length:
                trajs[i].finish_reason = "length"  # no room left for the model to answer
                continue
            trajs[i].append(ids, TOOL)
            active.append(i)
    return trajs
