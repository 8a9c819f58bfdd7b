"""The embedded agentic task: multiplication with a calculator tool, and its warmed-up tiny model.

Prompts ``"347*86="`` (a three-digit by a two-digit number) are beyond what the tiny character
model can compute in its head; with the built-in ``calculator`` it only has to copy. A trajectory
the warm-up teaches (tool answer rendered by the task's chat template, ``response_mask`` 0)::

    <tool_call>{"name":"calculator","arguments":{"expression":"347*86"}}</tool_call><eos>
    =29842                                    <- the tool's answer, "\n=29842\n"
    29842<eos>

The score (:func:`compute_score`) is exact match of the last line of the response. The warm-up
(supervised, on such demonstrations, loss on the model's tokens only) stops once answers sampled
at temperature 1.0 through the real agent loop reach ``target_sampled_accuracy``: a policy that
knows the format but often garbles a call, which RL then sharpens. ``prepare_agent_task(root)``
builds and caches it like :func:`flowrl.tasks.default_task.prepare_default_task`; the run builds it
when ``rollout.multi_turn.enable`` is set and no model or data is given
(``configs/agent_calculator.yaml``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from flowrl.tasks.files import TASK_FILE, read_record, write_parquet

DATA_SOURCE = "flowrl/agent_calculator"
TASK_VERSION = 2  # 2: the warm-up is an sft run
RESPONSE_LENGTH = 96
# The character tokenizer's template with an assistant and a tool role: a tool answer renders as
# "\n=<answer>\n" after the model's turn (so the loop's observation tokens are exactly those).
AGENT_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}{{- '\n=' + m['content'] + '\n' -}}"
    "{%- elif m['role'] in ('user', 'assistant') -%}{{- m['content'] -}}{%- endif -%}"
    "{%- endfor -%}"
)


def _split_of(a: int, b: int) -> str:
    return "test" if (a * 131 + b * 7919) % 10 == 0 else "train"


def make_rows(num: int, seed: int, split: str) -> list[dict]:
    """``num`` distinct prompts ``a*b=`` (100 <= a <= 999, 10 <= b <= 99) of ``split``."""
    pairs = [(a, b) for a in range(100, 1000) for b in range(10, 100) if _split_of(a, b) == split]
    chosen = random.Random(f"{DATA_SOURCE}/{split}/{seed}").sample(pairs, num)
    return [
        {"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": f"{a}*{b}="}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": str(a * b)}, "extra_info": {"split": split, "index": i}}
        for i, (a, b) in enumerate(chosen)
    ]


def tool_call_text(expression: str) -> str:
    return '<tool_call>{"name":"calculator","arguments":{"expression":"' + expression + '"}}</tool_call>'


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> dict:
    """1.0 when the response's last line is the product; ``used_tool`` reports a written call."""
    answer = solution_str.rsplit("\n", 1)[-1].strip()
    return {"score": float(answer == str(ground_truth)), "used_tool": float("<tool_call>" in solution_str)}


@dataclasses.dataclass(kw_only=True, frozen=True)
class AgentTask:
    root: Path
    model_dir: Path
    train_path: Path
    test_path: Path
    initial_sampled_accuracy: float
    """Score of answers sampled at temperature 1.0 through the agent loop, after the warm-up."""
    initial_greedy_accuracy: float
    warmup_steps: int


def build_agent_tokenizer() -> Any:
    from flowrl.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = AGENT_CHAT_TEMPLATE
    return tokenizer


def demonstration(tokenizer: Any, row: dict) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of one demonstration: prompt, call, tool answer, final answer; labels
    -100 on the prompt and on the tool's answer."""
    from flowrl.agents.loop import ChatCodec

    prompt = row["prompt"][0]["content"]
    truth = row["reward_model"]["ground_truth"]
    eos = tokenizer.eos_token_id
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    p, call = enc(prompt), enc(tool_call_text(prompt.rstrip("="))) + [eos]
    obs, answer = ChatCodec(tokenizer).observation_ids([truth]), enc(truth) + [eos]
    ids = p + call + obs + answer
    labels = [-100] * len(p) + call + [-100] * len(obs) + answer
    return ids, labels


def _demonstrations(tokenizer: Any, rows: Sequence[dict]) -> Any:
    """The demonstrations as SFT rows: the prompt, then the rest with the loss on the model's
    own turns (the tool's answer untrained)."""
    from flowrl.tasks.warmup import token_rows

    prompts, responses, masks = [], [], []
    for row in rows:
        ids, labels = demonstration(tokenizer, row)
        start = next(i for i, label in enumerate(labels) if label != -100)
        prompts.append(ids[:start])
        responses.append(ids[start:])
        masks.append([int(label != -100) for label in labels[start:]])
    return token_rows(prompts, responses, masks)


def model_generate_fn(model: Any, tokenizer: Any, *, temperature: float) -> Any:
    """An agent-loop ``generate`` callback on a transformers model (left-padded, cut after EOS)."""
    import torch

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def generate(contexts: list[list[int]], budgets: list[int], seed: int) -> tuple[list, list]:
        longest = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), longest), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, c in enumerate(contexts):
            ids[i, longest - len(c):], att[i, longest - len(c):] = torch.tensor(c), 1
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max(budgets), pad_token_id=pad,
                                 eos_token_id=eos, **sampling)[:, longest:].tolist()
        cut = [row[: row.index(eos) + 1] if eos in row else row for row in out]
        return cut, [[0.0] * len(r) for r in cut]

    return generate


def agent_accuracy(model: Any, tokenizer: Any, rows: Sequence[dict], *, temperature: float, seed: int = 0,
                   max_turns: int = 2) -> float:
    """Mean :func:`compute_score` of trajectories through the real agent loop and calculator."""
    from flowrl.agents.loop import AgentSettings, ChatCodec, run_agent_loop
    from flowrl.agents.parsers import hermes
    from flowrl.agents.runner import ToolRunner
    from flowrl.agents.tools import resolve_tools

    import torch

    prompts = [tokenizer.encode(r["prompt"][0]["content"], add_special_tokens=False) for r in rows]
    runner = ToolRunner(resolve_tools(["calculator"]), timeout_s=5.0, max_chars=100)
    with torch.random.fork_rng(devices=[]):
        trajs = run_agent_loop(prompts, generate=model_generate_fn(model, tokenizer, temperature=temperature),
                               codec=ChatCodec(tokenizer), parser=hermes, runner=runner, seed=seed,
                               settings=AgentSettings(max_turns=max_turns, response_length=RESPONSE_LENGTH))
    runner.close()
    texts = tokenizer.batch_decode([t.response for t in trajs], skip_special_tokens=True)
    scores = [compute_score(DATA_SOURCE, t, r["reward_model"]["ground_truth"])["score"] for t, r in zip(texts, rows)]
    return sum(scores) / len(scores)


def warm_up_agent(model_dir: Path, out_dir: Path, tokenizer: Any, rows: Sequence[dict], config: Any, *, seed: int,
                  target_sampled_accuracy: float, num_probe_rows: int = 64) -> tuple[int, float]:
    """The ``sft`` warm-up (:func:`flowrl.tasks.warmup.sft_warm_up`) on demonstrations until
    sampled agent-loop accuracy on the first rows reaches the target; ``(steps, that accuracy)``."""
    from flowrl.tasks.warmup import sft_warm_up

    result = sft_warm_up(model_dir, "", config, seed=seed, out_dir=out_dir, dataset=_demonstrations(tokenizer, rows),
                         target=target_sampled_accuracy,
                         probe=lambda model: agent_accuracy(model, tokenizer, rows[:num_probe_rows], temperature=1.0,
                                                            seed=seed))
    return result.num_steps, result.probe_accuracy or 0.0


def _task_key(**settings: Any) -> dict:
    return {"version": TASK_VERSION, **settings}


def _load(root: Path, key: dict) -> AgentTask | None:
    record = read_record(root, key)
    if record is None:
        return None
    return AgentTask(root=root, model_dir=root / "model", train_path=root / "train.parquet",
                     test_path=root / "test.parquet", initial_sampled_accuracy=record["initial_sampled_accuracy"],
                     initial_greedy_accuracy=record["initial_greedy_accuracy"], warmup_steps=record["warmup_steps"])


def prepare_agent_task(root: str | os.PathLike, *, seed: int = 0, num_train: int = 4096, num_test: int = 256,
                       target_sampled_accuracy: float = 0.2, warmup: Any = None, force: bool = False) -> AgentTask:
    """Build (or reuse) the calculator task under ``root`` (see the module docstring)."""
    from flowrl.models.tiny import build_tiny_model, tiny_preset
    from transformers import AutoModelForCausalLM

    from flowrl.tasks.warmup import WarmupConfig, torch_threads

    root = Path(root)
    warmup = warmup or WarmupConfig(max_steps=3000, batch_size=64, lr=3e-3, label_smoothing=0.0,
                                    check_every=10, target_greedy_accuracy=None)
    key = _task_key(arch="llama", seed=seed, num_train=num_train, num_test=num_test, target=target_sampled_accuracy,
                    warmup=dataclasses.asdict(warmup))
    if not force and (task := _load(root, key)) is not None:
        return task
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        train, test = make_rows(num_train, seed, "train"), make_rows(num_test, seed, "test")
        write_parquet(tmp, train, "train.parquet")
        write_parquet(tmp, test, "test.parquet")
        tokenizer = build_agent_tokenizer()
        # llama, not qwen2: AutoTokenizer would load the character tokenizer of a qwen2 directory
        # as Qwen2Tokenizer, whose byte-level pre-tokenizer drops the newlines of tool answers.
        build_tiny_model(tokenizer, **{**tiny_preset("default"), "arch": "llama"}, max_position_embeddings=128,
                         seed=seed).save_pretrained(tmp / "init_model")
        start = time.perf_counter()
        steps, sampled = warm_up_agent(tmp / "init_model", tmp / "model", tokenizer, train, warmup, seed=seed,
                                       target_sampled_accuracy=target_sampled_accuracy)
        shutil.rmtree(tmp / "init_model")
        tokenizer.save_pretrained(tmp / "model")
        model = AutoModelForCausalLM.from_pretrained(tmp / "model").eval()
        with torch_threads(warmup.num_threads):
            greedy = agent_accuracy(model, tokenizer, train[:128], temperature=0.0)
        record = {"key": key, "initial_sampled_accuracy": sampled, "initial_greedy_accuracy": greedy,
                  "warmup_steps": steps, "warmup_seconds": round(time.perf_counter() - start, 1)}
        (tmp / TASK_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if root.exists():
            shutil.rmtree(root)
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    task = _load(root, key)
    assert task is not None, f"{root} does not hold the task just built"
    return task
