"""Two-digit addition prompts in verl's Parquet format: the embedded default task.

Every pair ``a + b`` with ``10 <= a, b <= 99`` (8,100 pairs) belongs to exactly one split, chosen by
a fixed hash of the pair, so train and test are disjoint whatever seeds are used. ``seed`` only
chooses which pairs of a split are drawn and in which order.

Rows have verl's columns::

    data_source   "flowrl/addition"
    prompt        [{"role": "user", "content": "37+48="}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": "85"}
    extra_info    {"split": "train", "index": 0}
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

DATA_SOURCE = "flowrl/addition"
SPLITS = ("train", "test")
OPERANDS = range(10, 100)
# One pair in TEST_MODULUS goes to the test split (810 of 8,100).
TEST_MODULUS = 10


def addition_prompt(a: int, b: int) -> str:
    """The prompt text for ``a + b``: ``"37+48="``."""
    return f"{a}+{b}="


def _split_of(a: int, b: int) -> str:
    digest = hashlib.sha256(f"{a}+{b}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % TEST_MODULUS == 0 else "train"


def split_pairs(split: str) -> list[tuple[int, int]]:
    """All ``(a, b)`` pairs of ``split`` in a fixed order."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not a split; use one of {', '.join(SPLITS)}")
    return [(a, b) for a in OPERANDS for b in OPERANDS if _split_of(a, b) == split]


def make_addition_rows(num: int, seed: int, split: str) -> list[dict]:
    """``num`` distinct addition prompts of ``split``, drawn deterministically from ``seed``."""
    pairs = split_pairs(split)
    if not 0 <= num <= len(pairs):
        raise ValueError(
            f"num={num} is out of range for split {split!r}, which has {len(pairs)} pairs; "
            f"ask for at most {len(pairs)}"
        )
    chosen = random.Random(f"flowrl/addition/{split}/{seed}").sample(pairs, num)
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": addition_prompt(a, b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index},
        }
        for index, (a, b) in enumerate(chosen)
    ]


def write_addition_parquet(
    dir: str | os.PathLike, num_train: int, num_test: int, seed: int
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``dir``; return their paths.

    Each file is written to a temporary name first and renamed, so a reader never sees half a file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir = Path(dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, num in (("train", num_train), ("test", num_test)):
        table = pa.Table.from_pylist(make_addition_rows(num, seed, split))
        path = out_dir / f"{split}.parquet"
        tmp_path = out_dir / f".{split}.parquet.tmp-{os.getpid()}"
        pq.write_table(table, tmp_path)
        os.replace(tmp_path, path)
        paths.append(path)
    return paths[0], paths[1]


def make_sft_rows(num: int, seed: int, split: str) -> list[dict]:
    """``num`` addition demonstrations of ``split`` in verl's SFT format: ``messages`` (the user's
    prompt, the assistant's answer), the same pairs as :func:`make_addition_rows` draws."""
    return [{"messages": row["prompt"] + [{"role": "assistant", "content": row["reward_model"]["ground_truth"]}]}
            for row in make_addition_rows(num, seed, split)]


def wrong_answer(a: int, b: int, seed: int) -> str:
    """A deterministic wrong sum of ``a + b`` (off by 1 to 10, either way, or a digit dropped)."""
    rng = random.Random(f"flowrl/addition/wrong/{seed}/{a}+{b}")
    right = a + b
    if rng.random() < 0.2:
        return str(right)[:-1] or "0"
    return str(right + rng.choice([d for d in range(-10, 11) if d and right + d >= 0]))


def make_pair_rows(num: int, seed: int, split: str) -> list[dict]:
    """``num`` preference pairs of ``split`` in TRL's format: the prompt, the right sum as ``chosen``,
    a wrong one (:func:`wrong_answer`) as ``rejected``."""
    rows = make_addition_rows(num, seed, split)
    out = []
    for row in rows:
        a, b = (int(x) for x in row["prompt"][0]["content"].rstrip("=").split("+"))
        out.append({"prompt": row["prompt"], "chosen": row["reward_model"]["ground_truth"],
                    "rejected": wrong_answer(a, b, seed)})
    return out


def write_rows(path: str | os.PathLike, rows: list[dict]) -> Path:
    """``rows`` as one Parquet file at ``path``, written under a temporary name and renamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.parent / f".{path.name}.tmp-{os.getpid()}"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path)
    os.replace(tmp_path, path)
    return path


def make_model_pair_rows(model_dir: str | os.PathLike, num: int, seed: int, split: str, *, num_samples: int = 8,
                         temperature: float = 1.0, max_pairs_per_prompt: int = 4) -> list[dict]:
    """Preference pairs from a model's own answers (TRL's format): ``num_samples`` answers
    sampled at ``temperature`` to each of ``num`` prompts of ``split``, scored by exact match;
    a prompt with both a right and a wrong (non-empty) answer gives pairs, the right one chosen
    against up to ``max_pairs_per_prompt`` distinct wrong ones
    (:func:`flowrl.data.pairs.pairs_from_samples`): near misses as well as garbage, so that a
    reward model trained on them must tell a right sum from a wrong one. Only the prompts the
    model sometimes gets right and sometimes wrong give pairs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowrl.data.pairs import pairs_from_samples
    from flowrl.rewards import resolve_reward_fn
    from flowrl.tasks.warmup import sample_answers, torch_threads

    rows = make_addition_rows(num, seed, split)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    with torch_threads(1):
        answers = sample_answers(model, tokenizer, rows, num_samples=num_samples, temperature=temperature, seed=seed)
    answers = [[a.strip() for a in row_answers if a.strip()] for row_answers in answers]
    score = resolve_reward_fn("auto")
    scores = [[_value(score(r["data_source"], a, r["reward_model"]["ground_truth"])) for a in row_answers]
              for r, row_answers in zip(rows, answers)]
    return pairs_from_samples([r["prompt"] for r in rows], answers, scores, max_pairs_per_prompt=max_pairs_per_prompt)


def _value(result: float | dict) -> float:
    return result["score"] if isinstance(result, dict) else float(result)
