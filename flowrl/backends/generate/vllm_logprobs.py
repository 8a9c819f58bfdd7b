"""Teacher-forced log-probs on a vLLM engine: the log-prob of each given response token after its
prompt, from vLLM's prompt log-probs of ``prompt + response`` (one forward pass per sequence, no
token sampled that is used). The multi-turn rollout needs them for the tool tokens of a
trajectory, which the engine did not sample (``flowrl.roles.rollout``).

Temperature 1 reads the token's own log-prob (``prompt_logprobs=0``); another temperature takes the
full distribution (``prompt_logprobs=-1``) and renormalises ``logprob / temperature``, which equals
the log-softmax of ``logits / temperature`` (the shift by the log-partition cancels).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["prompt_logprob_params", "read_logprobs", "teacher_forced_logprobs"]


def teacher_forced_logprobs(llm: Any, prompts: list[list[int]], responses: list[list[int]], *,
                            temperature: float = 1.0, lora_request: Any = None) -> list[list[float]]:
    """Per response, its tokens' log-probs under ``logits / temperature`` of ``llm`` (a ``vllm.LLM``)."""
    from vllm.inputs import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=list(p) + list(r)) for p, r in zip(prompts, responses)]
    outputs = llm.generate(requests, [prompt_logprob_params(temperature)] * len(requests), use_tqdm=False,
                           lora_request=lora_request)
    return read_logprobs(prompts, responses, outputs, temperature)


def prompt_logprob_params(temperature: float) -> Any:
    """vLLM's sampling parameters of a teacher-forced pass: one token, the prompt's log-probs (the
    whole distribution where ``temperature`` != 1, to renormalise it)."""
    from vllm import SamplingParams as VSamplingParams

    return VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=-1 if temperature != 1.0 else 0,
                           detokenize=False)


def read_logprobs(prompts: list[list[int]], responses: list[list[int]], outputs: list[Any],
                  temperature: float) -> list[list[float]]:
    """Each response's log-probs from the prompt log-probs of ``prompt + response`` requests."""
    out = []
    for prompt, response, output in zip(prompts, responses, outputs):
        steps = output.prompt_logprobs[len(prompt):]  # entry i: the distribution before token i
        if temperature != 1.0:
            out.append([_scaled(step, tok, temperature) for tok, step in zip(response, steps, strict=True)])
        else:
            out.append([float(step[tok].logprob) for tok, step in zip(response, steps, strict=True)])
    return out


def _scaled(step: dict, token: int, temperature: float) -> float:
    """log-softmax(logprob / temperature) at ``token`` over the whole vocabulary ``step``."""
    scaled = {t: lp.logprob / temperature for t, lp in step.items()}
    top = max(scaled.values())
    return float(scaled[token] - top - math.log(sum(math.exp(v - top) for v in scaled.values())))
