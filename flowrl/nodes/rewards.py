"""Reward nodes: the reward function, the reward model and their combination, DAPO's overlong
shaping, and ReMax's greedy-baseline scoring. The outcome reward sits on each response's last
token (``token_rewards``); ``score`` keeps the row's score."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.data import experience
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut


@lru_cache(maxsize=4)
def load_tokenizer(tokenizer_dir: str) -> Any:
    """The tokenizer of ``tokenizer_dir`` (loaded once per process)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def outcome_token_rewards(table: pa.Table, scores_B: Any) -> pa.Array:
    """A ``token_rewards`` column: 0 on every response token but the last, which gets the row's
    score (an empty response gets no tokens)."""
    lengths = [len(r) for r in table.column("response_ids").to_pylist()]
    token_rewards = [[0.0] * (n - 1) + [float(s)] if n else [] for n, s in zip(lengths, scores_B)]
    return experience.from_lists(token_rewards, experience.TOKEN_FLOATS)


DEFAULT_REWARD_TIMEOUT_S = 60.0
"""How long the reward function may take over one batch (``reward_model.reward_timeout_s``)."""


def reward(table: pa.Table, tokenizer_dir: str, reward_fn: str, timeout_s: float = DEFAULT_REWARD_TIMEOUT_S) -> NodeOut:
    """Decode responses (without EOS) and score them; the outcome reward sits on the last token.
    Metrics ``reward/<key>``: the mean of each extra value the reward function returns.

    A reward function that raises (``sys.exit`` too), returns no finite number, or takes longer
    than ``timeout_s`` over the batch fails the node with a
    :class:`~flowrl.rewards.registry.RewardFunctionError` naming the function, the row and the fix.

    Multi-turn rows (a ``tool_reward`` column: the tools' reward hooks, already weighted by
    ``rollout.multi_turn.tool_reward_coef``, see :mod:`flowrl.agents.agent`) score
    ``reward function's score + tool_reward``."""
    from flowrl.rewards import resolve_reward_fn

    fn = resolve_reward_fn(reward_fn)
    texts = load_tokenizer(tokenizer_dir).batch_decode(table.column("response_ids").to_pylist(), skip_special_tokens=True)
    sources = table.column("data_source").to_pylist()
    truths = table.column("ground_truth").to_pylist()
    infos = table.column("extra_info").to_pylist() if "extra_info" in table.column_names else [None] * len(texts)
    scored = _score_with_timeout(fn, reward_fn, list(zip(sources, texts, truths, infos)), timeout_s)
    scores = np.array([score for score, _ in scored], dtype=np.float32).reshape(-1)
    extras: dict[str, list[float]] = {}
    for _, extra in scored:
        for k, v in extra.items():
            extras.setdefault(k, []).append(v)
    if "tool_reward" in table.column_names:
        scores = scores + table.column("tool_reward").to_numpy(zero_copy_only=False).astype(np.float32)
    out = experience.with_columns(table, score=pa.array(scores, pa.float32()), token_rewards=outcome_token_rewards(table, scores))
    return NodeOut(out, {names.reward_extra(k): float(np.mean(v)) for k, v in extras.items()})


def _score_with_timeout(fn: Any, name: str, rows: list[tuple], timeout_s: float) -> list[tuple[float, dict]]:
    """Every row's ``(score, extras)``, scored in a daemon thread that gets ``timeout_s`` for the
    batch (a hung reward function cannot be stopped, only abandoned: the run ends)."""
    import threading

    from flowrl.rewards.registry import RewardFunctionError

    box: dict[str, Any] = {"row": 0}

    def work() -> None:
        try:
            box["result"] = _score_rows(fn, name, rows, box)
        except BaseException as exc:  # noqa: BLE001 - handed to the node's thread below
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"reward-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        i = box["row"]
        raise RewardFunctionError(
            f"reward function {name!r} did not finish scoring a batch of {len(rows)} rows within "
            f"reward_model.reward_timeout_s={timeout_s:g}s (still on {_row_label(i, rows[i]) if i < len(rows) else 'the last rows'}); "
            "fix the function (an endless loop or a call that blocks?) or raise reward_model.reward_timeout_s")
    if "error" in box:
        raise box["error"]
    return box["result"]


def _score_rows(fn: Any, name: str, rows: list[tuple], box: dict[str, Any]) -> list[tuple[float, dict]]:
    """Each row's ``(score, extras)``; the first failure as a RewardFunctionError naming the row."""
    from flowrl.rewards.registry import RewardFunctionError, split_score

    outcomes = _in_parallel(fn, rows)
    scored = []
    for i, row in enumerate(rows):
        box["row"] = i
        try:
            out = outcomes[i] if outcomes else fn(*row)
            if isinstance(out, BaseException):
                raise out
        except SystemExit as exc:
            raise RewardFunctionError(f"reward function {name!r} called sys.exit({exc.code!r}) on {_row_label(i, row)}; "
                                      "a reward function returns a score, it never exits: return 0.0 instead") from exc
        except BaseException as exc:  # noqa: BLE001 - a user's function may raise anything
            raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: {exc} on "
                                      f"{_row_label(i, row)}; fix the function for this row's input "
                                      "(return 0.0 for a response it cannot score)") from exc
        try:
            scored.append(split_score(out))
        except ValueError as exc:
            raise RewardFunctionError(f"reward function {name!r} on {_row_label(i, row)}: {exc}") from None
    return scored


def _row_label(i: int, row: tuple) -> str:
    """``row 3 of the batch (data_source='gsm8k', index=17)``: the index is verl's ``extra_info.index``."""
    import json

    info = row[3]
    if isinstance(info, str):
        try:
            info = json.loads(info) if info else {}
        except ValueError:
            info = {}
    index = info.get("index") if isinstance(info, dict) else None
    return f"row {i} of the batch (data_source={row[0]!r}" + (f", index={index!r})" if index is not None else ")")


def _in_parallel(fn: Any, rows: list[tuple]) -> list[Any] | None:
    """Each row's result or exception, computed by 16 threads when the reward function runs code
    (``runs_code``: it waits on sandboxed processes, issue 38); None for the others (called in order)."""
    if not getattr(getattr(fn, "fn", fn), "runs_code", False) or len(rows) < 2:
        return None
    from concurrent.futures import ThreadPoolExecutor

    def one(row: tuple) -> Any:
        try:
            return fn(*row)
        except BaseException as exc:  # noqa: BLE001 - re-raised with the row's index by the caller
            return exc

    with ThreadPoolExecutor(min(16, len(rows))) as pool:
        return list(pool.map(one, rows))


def rm_scores(rm: BoundCall, table: pa.Table) -> NodeOut:
    """A one-column table of ``rm_score``: the reward model's score of every response."""
    result, compute_s = rm.run("compute_rm_scores", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT)
    return NodeOut(result, {names.compute("rm_score"): compute_s})


def combine_rewards(table: pa.Table, rm: pa.Table, *, rule_coef: float, rm_coef: float) -> NodeOut:
    """``score = rule_coef * (reward function's score) + rm_coef * (reward model's score)``, on
    the last token's reward too; keeps ``rule_score`` and ``rm_score`` as columns. Metrics
    ``reward/rule_score/mean`` and ``reward/rm_score/mean``."""
    rule_B = table.column("score").to_numpy().astype(np.float32)
    rm_B = rm.column("rm_score").to_numpy().astype(np.float32)
    if rm_B.shape != rule_B.shape:
        raise RuntimeError(f"reward model scored {rm_B.shape[0]} rows, the batch has {rule_B.shape[0]}")
    score_B = rule_coef * rule_B + rm_coef * rm_B
    out = experience.with_columns(
        table,
        rule_score=pa.array(rule_B, pa.float32()),
        rm_score=pa.array(rm_B, pa.float32()),
        score=pa.array(score_B, pa.float32()),
        token_rewards=outcome_token_rewards(table, score_B),
    )
    return NodeOut(out, {names.RULE_SCORE_MEAN: float(rule_B.mean()), names.RM_SCORE_MEAN: float(rm_B.mean())})


def overlong(table: pa.Table, *, max_response_length: int, buffer_len: int, penalty_factor: float) -> NodeOut:
    """DAPO's overlong shaping: add the length penalty to each row's last token reward (``score``
    keeps the task's score). Metrics ``reward/overlong_penalty/mean``, ``reward/overlong_frac``."""
    import torch

    from flowrl.algos.dapo import overlong_penalty

    rewards_T, cu = experience.token_column(table, "token_rewards")
    lengths_B = cu.diff()
    penalty_B = overlong_penalty(lengths_B, max_response_length=max_response_length, buffer_len=buffer_len,
                                 penalty_factor=penalty_factor)
    shaped_T = rewards_T.float().clone()
    last_T = (cu[1:] - 1)[lengths_B > 0]
    shaped_T[last_T] += penalty_B[lengths_B > 0]
    out = experience.with_columns(table, token_rewards=experience.list_column(shaped_T, cu, experience.TOKEN_FLOATS))
    return NodeOut(out, {
        names.OVERLONG_PENALTY_MEAN: float(penalty_B.mean()) if penalty_B.numel() else 0.0,
        names.OVERLONG_FRAC: float((penalty_B < 0).to(torch.float32).mean()) if penalty_B.numel() else 0.0,
    })


def reward_baseline(samples: pa.Table, greedy: pa.Table, tokenizer_dir: str, reward_fn: str,
                    timeout_s: float = DEFAULT_REWARD_TIMEOUT_S) -> NodeOut:
    """Score the greedy responses and put each prompt's greedy score on its samples as
    ``reward_baseline`` (ReMax). Metric ``reward_baseline/mean``."""
    scored = reward(greedy, tokenizer_dir, reward_fn, timeout_s).value
    by_group = dict(zip(scored.column("group").to_pylist(), scored.column("score").to_pylist()))
    groups = samples.column("group").to_pylist()
    missing = sorted(set(groups) - set(by_group))
    if missing:
        raise RuntimeError(f"greedy baseline is missing prompt group(s) {missing[:5]}; every prompt needs one")
    baseline = np.array([by_group[g] for g in groups], dtype=np.float32)
    out = experience.with_columns(samples, reward_baseline=pa.array(baseline, pa.float32()))
    return NodeOut(out, {names.REWARD_BASELINE_MEAN: float(scored.column("score").to_numpy().mean())})
