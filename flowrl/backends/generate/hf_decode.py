"""The ``hf`` backend's decode loop: rows that reach EOS leave the batch and its KV cache.

transformers' ``generate`` keeps every row until the longest one ends (finished rows decode pad
tokens); here each step runs the model only on the rows still going
(``DynamicCache.batch_select_indices``), and each prompt is prefilled once, its cache then
repeated for its ``n`` samples. So decode compute follows the tokens actually sampled.

Sampling matches ``generate`` for the same seed: the warpers are transformers' own (temperature,
top-k, top-p, in ``generate``'s order) and every step draws ``torch.multinomial`` over all ``N``
rows, finished ones included, exactly as ``generate`` does. torch draws one exponential per row
and vocabulary entry whatever the probabilities, so the random stream (and each live row's sample)
is the one ``generate`` sees. Where a row's logits differ in the last bits (a matmul over fewer
rows may sum in another order), a sample at an exact tie of the noise could differ; greedy
decoding is the argmax of the same logits.

Log-probs are those of ``logits / temperature`` (plain logits when greedy), not of the warped
distribution, as before.

Shape letters: B prompts, N = B * n rows, A rows still decoding, P padded prompt length, V vocabulary.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from flowrl.backends.interfaces import SamplingParams


@dataclass
class DecodeStats:
    """What one decode computed: model positions (padding included) and real tokens fed."""

    slots: int = 0
    tokens: int = 0
    response_tokens: int = 0

    def add(self, other: "DecodeStats") -> None:
        self.slots += other.slots
        self.tokens += other.tokens
        self.response_tokens += other.response_tokens


def _warpers(params: SamplingParams) -> list:
    """``generate``'s logits warpers for these settings, in its order."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = []
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def _left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(p) for p in prompts)
    ids_BP = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask_BP = torch.zeros((len(prompts), longest), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids_BP[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
        mask_BP[i, longest - len(p):] = 1
    return ids_BP, mask_BP


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """``generate``'s position ids of left-padded rows: real tokens count from 0, padding is 1."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


@torch.no_grad()
def decode(model, prompts: list[list[int]], params: SamplingParams, *, eos_ids: set[int], pad_id: int,
           device: torch.device | str = "cpu", routes: list | None = None,
           ) -> tuple[list[list[int]], list[list[float]], DecodeStats]:
    """``params.n`` responses per prompt (prompt-major), each up to and including its first EOS,
    with the log-prob of every sampled token; and what the model computed. Every tensor of the
    loop lives on ``device`` (the model's); the results come back as host lists.

    With ``routes`` (a list; mixture-of-experts models) each sequence's experts are appended to it:
    ``(P + R, layers, top_k)`` int16 per sequence, the prompt's from the prefill, each response
    token's from the step that fed it, -1 for the last token (never fed)."""
    from transformers import DynamicCache

    from flowrl.models.moe_routing import NO_ROUTE, RouteRecorder

    n, max_new = params.n, params.max_new_tokens
    ids_BP, mask = (t.to(device) for t in _left_padded(prompts, pad_id))
    stats = DecodeStats(slots=ids_BP.numel(), tokens=int(mask.sum()))
    cache = DynamicCache(config=model.config)
    recorder = RouteRecorder(model) if routes is not None else None
    logits_AV = _forward(model, ids_BP, mask, _positions(mask), cache, recorder)
    if recorder is not None:
        prompt_routes_BPRk = recorder.take().reshape(*ids_BP.shape, len(recorder.routers), -1).cpu()
        gen_routes_NLRk = torch.full((len(prompts) * n, max_new, *prompt_routes_BPRk.shape[2:]), NO_ROUTE,
                                     dtype=torch.int16)

    def feed(token_A: torch.Tensor, mask: torch.Tensor, live: torch.Tensor, step: int) -> torch.Tensor:
        logits = _forward(model, token_A[:, None], mask, mask.sum(-1, keepdim=True) - 1, cache, recorder)
        if recorder is not None:  # the experts of the token fed at this step (response position `step`)
            gen_routes_NLRk[live.cpu(), step] = recorder.take().reshape(live.numel(), *gen_routes_NLRk.shape[2:]).cpu()
        return logits

    tokens_NL, logp_NL, lengths_N = sample(logits_AV, mask, cache, params, feed, eos_ids=eos_ids, pad_id=pad_id,
                                           device=device, stats=stats)
    responses, logprobs, lengths = _to_host(tokens_NL, logp_NL, lengths_N)
    if recorder is not None:
        _append_routes(routes, prompts, n, lengths, prompt_routes_BPRk, gen_routes_NLRk)
    return responses, logprobs, stats


def sample(logits_BV: torch.Tensor, mask: torch.Tensor, cache, params: SamplingParams, feed, *, eos_ids: set[int],
           pad_id: int, device: torch.device | str, stats: DecodeStats,
           carry: tuple[torch.Tensor, ...] = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampling loop after a prefill (text prompts here, prompts with images in
    :mod:`flowrl.backends.vlm`): from each prompt's last logits ``logits_BV``, its attention
    ``mask`` and KV ``cache`` (both repeated here for the ``n`` samples), draw up to
    ``params.max_new_tokens`` tokens per row; rows that reach EOS leave the batch and the cache.
    ``feed(token_A, mask, live, step, *carry)`` runs the model on the live rows' new tokens and
    returns their next logits; ``carry``: per-row tensors (``B, ...``) repeated and selected with
    the rows, passed to ``feed``. Returns ``(tokens_NL, logp_NL, lengths_N)`` on ``device``."""
    n, max_new = params.n, params.max_new_tokens
    logits_AV = logits_BV
    if n > 1:
        logits_AV, mask = logits_AV.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        carry = tuple(c.repeat_interleave(n, 0) for c in carry)
        cache.batch_repeat_interleave(n)
    num_rows, vocab = logits_AV.shape
    warpers = [] if params.greedy else _warpers(params)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    live = torch.arange(num_rows, device=device)  # the row of each cache entry
    tokens_NL = torch.full((num_rows, max_new), pad_id, dtype=torch.long, device=device)
    logp_NL = torch.zeros((num_rows, max_new), device=device)
    lengths_N = torch.full((num_rows,), max_new, dtype=torch.long, device=device)
    for step in range(max_new):
        token_A = _choose(logits_AV, live, num_rows, vocab, warpers, params.greedy)
        scaled = logits_AV if params.greedy or params.temperature == 1.0 else logits_AV / params.temperature
        logp_NL[live, step] = torch.log_softmax(scaled, -1).gather(-1, token_A[:, None]).squeeze(-1)
        tokens_NL[live, step] = token_A
        done_A = torch.isin(token_A, eos)
        lengths_N[live[done_A]] = step + 1
        if step == max_new - 1 or bool(done_A.all()):
            break
        if bool(done_A.any()):  # finished rows leave the batch and the cache
            keep = (~done_A).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            live, mask, token_A = live[keep], mask[keep], token_A[keep]
            carry = tuple(c[keep] for c in carry)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        stats.slots += live.numel()
        stats.tokens += live.numel()
        logits_AV = feed(token_A, mask, live, step, *carry)
    stats.response_tokens = int(lengths_N.sum())
    return tokens_NL, logp_NL, lengths_N


def _forward(model, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache, recorder) -> torch.Tensor:
    """The fp32 logits of the last position of ``ids`` fed after ``cache`` (which it extends),
    the experts of the tokens recorded by ``recorder`` (None: not recorded)."""
    with recorder or contextlib.nullcontext():
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                     use_cache=True).logits[:, -1].float()


def _to_host(tokens_NL: torch.Tensor, logp_NL: torch.Tensor,
             lengths_N: torch.Tensor) -> tuple[list[list[int]], list[list[float]], list[int]]:
    """Each row's tokens and log-probs up to its length, as host lists (one copy to the host)."""
    tokens_NL, logp_NL, lengths = tokens_NL.cpu(), logp_NL.cpu(), lengths_N.tolist()
    responses = [row[:k].tolist() for row, k in zip(tokens_NL, lengths)]
    logprobs = [row[:k].tolist() for row, k in zip(logp_NL, lengths)]
    return responses, logprobs, lengths


def _append_routes(routes: list, prompts: list[list[int]], n: int, lengths: list[int],
                   prompt_routes_BPRk: torch.Tensor, gen_routes_NLRk: torch.Tensor) -> None:
    """Each sequence's experts, ``(P + R, layers, top_k)``: its prompt's without the left padding,
    then its response's ``R`` tokens."""
    longest = prompt_routes_BPRk.shape[1]
    for i, k in enumerate(lengths):
        b = i // n
        routes.append(torch.cat([prompt_routes_BPRk[b, longest - len(prompts[b]):], gen_routes_NLRk[i, :k]]))


def _choose(logits_AV: torch.Tensor, live: torch.Tensor, num_rows: int, vocab: int, warpers: list,
            greedy: bool) -> torch.Tensor:
    """The next token of each live row. Sampling draws over all rows (finished ones get flat
    logits), so the random stream is ``generate``'s."""
    if greedy:
        return logits_AV.argmax(-1)
    scores_NV = logits_AV.new_zeros((num_rows, vocab))
    scores_NV[live] = logits_AV
    for warp in warpers:
        scores_NV = warp(None, scores_NV)
    return torch.multinomial(torch.softmax(scores_NV, -1), num_samples=1).squeeze(1)[live]
