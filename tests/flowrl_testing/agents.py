"""Test helpers for multi-turn rollouts: parsers that make an untrained model "call" tools."""

from __future__ import annotations

from flowrl.agents.parsers import ParsedTurn, ToolCall


def always_calculator(text: str) -> ParsedTurn:
    """Every turn calls ``calculator(1+1)``: a random model then runs until max turns or budget."""
    return ParsedTurn(calls=[ToolCall("calculator", {"expression": "1+1"})])


# --- tools that run as Dask tasks (Tool.run_on = "dask"), for tests/dist/test_agent_dask.py ---------

import asyncio  # noqa: E402

from flowrl.agents.env import Environment  # noqa: E402
from flowrl.agents.tools import Tool  # noqa: E402


def _where() -> str:
    """``task`` inside a Dask tool task (its key starts with ``tool-``), else ``here``."""
    import sys

    worker = sys.modules.get("distributed.worker")  # not imported: surely not in a Dask task
    key = getattr(worker.thread_state, "key", None) if worker is not None else None
    return "task" if isinstance(key, str) and key.startswith("tool-") else "here"


class Where(Tool):
    """Answers where it ran; counts its calls in the trajectory's state (which, run as a task,
    comes back by value); its reward hook is the count, its release hook records the state."""

    name = "where"
    run_on = "dask"
    schema = {"description": "Say where the call ran.", "parameters": {"type": "object", "properties": {}}}
    released: list = []

    def create_state(self, row):
        return {"calls": 0}

    async def call(self, args, state):
        state["calls"] += 1
        return f"{_where()} {state['calls']}"

    def reward(self, state):
        return float(state["calls"])

    def release(self, state):
        Where.released.append(dict(state))


class DaskRaises(Tool):
    name = "dask_raises"
    run_on = "dask"

    async def call(self, args, state):
        raise RuntimeError(f"boom in the {_where()}")


class DaskHangs(Tool):
    name = "dask_hangs"
    run_on = "dask"

    async def call(self, args, state):
        await asyncio.sleep(3600)


def calls_where(text: str) -> ParsedTurn:
    """Every turn calls ``where`` and ``calculator(6*7)``."""
    return ParsedTurn(calls=[ToolCall("where", {}), ToolCall("calculator", {"expression": "6*7"})])


class Countdown(Environment):
    """A gym-style environment: ``ground_truth`` steps, each answered ``left N`` and rewarded 0.25."""

    def reset(self, row):
        self.left = int(row["ground_truth"])

    def step(self, action):
        self.left -= 1
        return f"left {self.left}", 0.25, self.left <= 0


def bias_towards_eos(model_dir, *, eos_logit: float = 3.0, scale: float = 20.0) -> None:
    """Edit a saved tiny model so that every position samples EOS often (about 1 in 5 tokens with
    a 99-token vocabulary), so random turns end early. A large shared vector ``c`` added to every
    token embedding dominates each hidden state, and EOS's (tied) output row gets ``+ a c/|c|``:
    a logit about ``eos_logit`` above the rest everywhere. Log-probs stay those of the model (no
    sampling-time processor: the engines and the trainer see the same logits)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    emb = model.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(emb.shape[1], generator=gen)
    c = scale * c / c.norm()
    eos = model.config.eos_token_id
    with torch.no_grad():
        emb += c
        emb[eos] += eos_logit / emb.shape[1] ** 0.5 * c / c.norm()
        if not model.config.tie_word_embeddings:
            out = model.get_output_embeddings().weight
            out[eos] += eos_logit / emb.shape[1] ** 0.5 * c / c.norm()
    model.save_pretrained(model_dir)

