"""The embedded code task: the model writes a one-line Python function, unit tests decide.

A prompt gives two values of a linear function, ``f(0)=-3,f(1)=-1:``; the answer the warm-up
teaches is ``def f(x):return 2*x-3`` (slope 1..9, intercept -9..9). The reward is the ``code``
reward (:mod:`flowrl.rewards.code_tests`, verl's call-based test cases) run in the sandbox (the
bubblewrap jail by default): the function is called at x = 0, 1, 2, 5 and -3, and the score is
verl's (1.0 when all pass, else the passing fraction), so an answer with the right intercept and a
wrong slope earns 0.2. Nothing of the model's code runs outside the sandbox, also not while the
task is built: the warm-up's probe compares answers as text.

``prepare_code_task(root)`` builds and caches it like the other demo tasks (a character tokenizer,
a tiny Llama, a short supervised warm-up that stops once 60% of greedy answers are right, so
that sampled answers are often wrong, which RL then sharpens); the run builds it when ``algorithm.reward_fn=code`` and no model
or data is given (``configs/code_task.yaml``).
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

DATA_SOURCE = "flowrl/code_linear"
TASK_VERSION = 2  # 2: the warm-up is an sft run
RESPONSE_LENGTH = 32
TEST_POINTS = (0, 1, 2, 5, -3)
SLOPES, INTERCEPTS = range(1, 10), range(-9, 10)


def _split_of(a: int, b: int) -> str:
    return "test" if (a * 7 + b * 13) % 10 == 0 else "train"


def solution(a: int, b: int) -> str:
    """The one-line function the warm-up teaches: ``def f(x):return 2*x-3``."""
    return f"def f(x):return {a}*x{b:+d}" if b else f"def f(x):return {a}*x"


def make_rows(num: int, seed: int, split: str) -> list[dict]:
    """``num`` prompts of ``split`` (functions drawn with replacement), verl's columns; the
    ground truth is verl's call-based tests as JSON."""
    pairs = [(a, b) for a in SLOPES for b in INTERCEPTS if _split_of(a, b) == split]
    rng = random.Random(f"{DATA_SOURCE}/{split}/{seed}")
    rows = []
    for i in range(num):
        a, b = rng.choice(pairs)
        tests = {"fn_name": "f", "inputs": [str(x) for x in TEST_POINTS], "outputs": [str(a * x + b) for x in TEST_POINTS]}
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": f"f(0)={b},f(1)={a + b}:"}],
                     "ability": "code", "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
                     "extra_info": {"split": split, "index": i, "solution": solution(a, b)}})
    return rows


@dataclasses.dataclass(kw_only=True, frozen=True)
class CodeTask:
    root: Path
    model_dir: Path
    train_path: Path
    test_path: Path
    initial_greedy_accuracy: float
    """Greedy answers equal to the taught function (as text) on the first train prompts."""
    initial_sampled_accuracy: float
    """The same for answers sampled at temperature 1.0."""
    warmup_steps: int


def text_accuracy(model: Any, tokenizer: Any, rows: Sequence[dict], *, temperature: float, seed: int = 0) -> float:
    """Fraction of generated answers equal to the row's taught solution (text, no code runs)."""
    import torch

    prompts = [r["prompt"][0]["content"] for r in rows]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(**encoded, max_new_tokens=RESPONSE_LENGTH, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, **sampling)
    texts = tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(t.strip() == r["extra_info"]["solution"] for t, r in zip(texts, rows)) / len(rows)


def _demonstrations(tokenizer: Any, rows: Sequence[dict]) -> Any:
    """Each row's raw prompt, then its taught solution and EOS as the trained response."""
    from flowrl.tasks.warmup import token_rows

    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    prompts = [enc(r["prompt"][0]["content"]) for r in rows]
    answers = [enc(r["extra_info"]["solution"]) + [tokenizer.eos_token_id] for r in rows]
    return token_rows(prompts, answers, [[1] * len(a) for a in answers])


def warm_up_code(model_dir: Path, out_dir: Path, tokenizer: Any, rows: Sequence[dict], config: Any, *, seed: int,
                 target_greedy_accuracy: float, num_probe_rows: int = 128) -> tuple[int, float]:
    """The ``sft`` warm-up (:func:`flowrl.tasks.warmup.sft_warm_up`) until greedy text accuracy on
    the first rows reaches the target; ``(steps, that accuracy)``."""
    from flowrl.tasks.warmup import sft_warm_up

    result = sft_warm_up(model_dir, "", config, seed=seed, out_dir=out_dir, dataset=_demonstrations(tokenizer, rows),
                         target=target_greedy_accuracy,
                         probe=lambda model: text_accuracy(model, tokenizer, rows[:num_probe_rows], temperature=0.0))
    return result.num_steps, result.probe_accuracy or 0.0


def _load(root: Path, key: dict) -> CodeTask | None:
    record = read_record(root, key)
    if record is None:
        return None
    return CodeTask(root=root, model_dir=root / "model", train_path=root / "train.parquet",
                    test_path=root / "test.parquet", initial_greedy_accuracy=record["initial_greedy_accuracy"],
                    initial_sampled_accuracy=record["initial_sampled_accuracy"], warmup_steps=record["warmup_steps"])


def _build(tmp: Path, *, seed: int, num_train: int, num_test: int, target: float, warmup: Any, key: dict) -> None:
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset
    from transformers import AutoModelForCausalLM

    from flowrl.tasks.warmup import torch_threads

    train, test = make_rows(num_train, seed, "train"), make_rows(num_test, seed, "test")
    write_parquet(tmp, train, "train.parquet")
    write_parquet(tmp, test, "test.parquet")
    tokenizer = build_char_tokenizer()
    # llama, not qwen2: AutoTokenizer would load a qwen2 directory's tokenizer as Qwen2Tokenizer,
    # whose byte-level pre-tokenizer changes the spaces of the answers (as in the agent task).
    build_tiny_model(tokenizer, **{**tiny_preset("default"), "arch": "llama"}, max_position_embeddings=64,
                     seed=seed).save_pretrained(tmp / "init_model")
    start = time.perf_counter()
    steps, greedy = warm_up_code(tmp / "init_model", tmp / "model", tokenizer, train, warmup, seed=seed,
                                 target_greedy_accuracy=target)
    shutil.rmtree(tmp / "init_model")
    tokenizer.save_pretrained(tmp / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp / "model").eval()
    with torch_threads(warmup.num_threads):
        sampled = text_accuracy(model, tokenizer, train[:256], temperature=1.0, seed=seed)
    record = {"key": key, "initial_greedy_accuracy": greedy, "initial_sampled_accuracy": sampled,
              "warmup_steps": steps, "warmup_seconds": round(time.perf_counter() - start, 1)}
    (tmp / TASK_FILE).write_text(json.dumps(record, indent=2) + "\n")


def prepare_code_task(root: str | os.PathLike, *, seed: int = 0, num_train: int = 2048, num_test: int = 128,
                      target_greedy_accuracy: float = 0.6, warmup: Any = None, force: bool = False) -> CodeTask:
    """Build (or reuse) the code task under ``root`` (see the module docstring)."""
    from flowrl.tasks.warmup import WarmupConfig

    root = Path(root)
    warmup = warmup or WarmupConfig(max_steps=2000, batch_size=64, lr=3e-3, label_smoothing=0.1, check_every=25,
                                    target_greedy_accuracy=None)
    key = {"version": TASK_VERSION, "seed": seed, "num_train": num_train, "num_test": num_test,
           "target": target_greedy_accuracy, "warmup": dataclasses.asdict(warmup)}
    if not force and (task := _load(root, key)) is not None:
        return task
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        _build(tmp, seed=seed, num_train=num_train, num_test=num_test, target=target_greedy_accuracy, warmup=warmup,
               key=key)
        if root.exists():
            shutil.rmtree(root)
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    task = _load(root, key)
    assert task is not None, f"{root} does not hold the task just built"
    return task
