"""The embedded vision-language task: count the shapes in a picture, or name their colour.

Each image is 64 x 64 pixels, white, with 1 to 3 filled shapes (squares or discs, in distinct cells
of a 2 x 2 grid) of one colour (red, green or blue). A prompt is ``<image>count?`` (answer ``1``,
``2`` or ``3``) or ``<image>colour?`` (``red``, ``green``, ``blue``), in verl's multimodal format:
the ``images`` column holds ``[{"bytes": <PNG>, "path": None}]`` as verl's geo3k preprocessing
writes it. The reward is exact match (``algorithm.reward_fn=vlm_shapes``).

``prepare_vlm_shapes_task(root)`` builds and caches it like the other embedded tasks: the tiny
Qwen2-VL (:mod:`flowrl.models.tiny_vlm`), a supervised warm-up (the ``sft`` family in this process,
label smoothing, :func:`flowrl.tasks.warmup.sft_warm_up`) on demonstrations with their images, until
greedy answers reach ``target_greedy_accuracy`` on a probe, so that sampled answers are often wrong
and RL has room; the run builds it when ``algorithm.reward_fn=vlm_shapes`` and no model or data is
given (``configs/vlm_shapes.yaml``).

Measured (seed 0, defaults, 2 shared CPU cores): the warm-up stops after 100 steps (57 s) with greedy
accuracy 0.72 and sampled (temperature 1) 0.16; ``flowrl train configs/vlm_shapes.yaml`` then lifts
the mean score from 0.255 (first 5 steps) to 0.667 (last 5 of 40).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from flowrl.tasks.files import TASK_FILE, read_record, write_parquet
from flowrl.tasks.warmup import WarmupConfig

DATA_SOURCE = "flowrl/vlm_shapes"
TASK_VERSION = 1
IMAGE_SIZE = 64
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 30), "blue": (30, 60, 220)}
SHAPES = ("square", "disc")
COUNTS = (1, 2, 3)
QUESTIONS = {"count": "<image>count?", "colour": "<image>colour?"}
RESPONSE_LENGTH = 8
DEFAULT_WARMUP = WarmupConfig(max_steps=400, batch_size=64, lr=3e-3, lr_warmup_steps=10, label_smoothing=0.3,
                              target_greedy_accuracy=0.7, check_every=20, num_probe_rows=64)


def draw(count: int, colour: str, shape: str, cells: Sequence[int], *, jitter: Sequence[tuple[int, int]]) -> bytes:
    """A PNG of ``count`` shapes of ``colour`` in the 2 x 2 grid ``cells`` (0..3), each moved by its
    ``jitter`` (pixels)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    pen = ImageDraw.Draw(img)
    half = IMAGE_SIZE // 2
    for cell, (dx, dy) in zip(cells[:count], jitter):
        x0, y0 = (cell % 2) * half + 6 + dx, (cell // 2) * half + 6 + dy
        box = (x0, y0, x0 + 18, y0 + 18)
        (pen.rectangle if shape == "square" else pen.ellipse)(box, fill=COLOURS[colour])
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def make_rows(num: int, seed: int, split: str) -> list[dict]:
    """``num`` prompts of ``split`` (pictures drawn at random from ``seed`` and the split: the two
    splits' pictures differ in jitter), verl's columns plus ``images``."""
    rng = random.Random(f"{DATA_SOURCE}/{split}/{seed}")
    rows = []
    for index in range(num):
        count, colour, shape = rng.choice(COUNTS), rng.choice(list(COLOURS)), rng.choice(SHAPES)
        cells = rng.sample(range(4), 3)
        jitter = [(rng.randint(0, 7), rng.randint(0, 7)) for _ in range(3)]
        question = "count" if index % 2 == 0 else "colour"
        answer = str(count) if question == "count" else colour
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": QUESTIONS[question]}],
                     "images": [{"bytes": draw(count, colour, shape, cells, jitter=jitter), "path": None}],
                     "ability": "vision", "reward_model": {"style": "rule", "ground_truth": answer},
                     "extra_info": {"split": split, "index": index, "question": question}})
    return rows


@dataclasses.dataclass(kw_only=True, frozen=True)
class VlmShapesTask:
    root: Path
    model_dir: Path
    train_path: Path
    test_path: Path
    initial_greedy_accuracy: float
    initial_sampled_accuracy: float
    warmup_steps: int
    warmup_seconds: float


def _prompt_ids(tokenizer: Any, processor: Any, rows: Sequence[dict]) -> list[list[int]]:
    """Each row's prompt tokens, its ``<image>`` expanded (as :class:`flowrl.data.prompts.PromptDataset`)."""
    from flowrl.data.prompts import image_prompt, render_prompt

    texts = [render_prompt(image_prompt(r["prompt"], r["images"], processor)[0], tokenizer) for r in rows]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def answers(model: Any, tokenizer: Any, processor: Any, rows: Sequence[dict], *, temperature: float,
            num_samples: int = 1, seed: int = 0) -> list[str]:
    """Answers of ``model`` to ``rows`` (``num_samples`` each, prompt-major; greedy at
    temperature 0) by the ``hf`` backend's decode loop with images."""
    import torch

    from flowrl.backends.interfaces import SamplingParams
    from flowrl.backends.vlm import decode_with_images

    params = SamplingParams(n=1 if not temperature else num_samples, temperature=temperature,
                            max_new_tokens=RESPONSE_LENGTH)
    prompts = _prompt_ids(tokenizer, processor, rows)
    images = [[e["bytes"] for e in r["images"]] for r in rows]
    object.__setattr__(model, "_flowrl_image_processor", processor)
    was_training = model.training
    model.eval()
    out: list[str] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(rows), 64):
            responses, _, _ = decode_with_images(model, prompts[start:start + 64], images[start:start + 64], params,
                                                 eos_ids={tokenizer.eos_token_id}, pad_id=tokenizer.pad_token_id)
            out += tokenizer.batch_decode(responses, skip_special_tokens=True)
    model.train(was_training)
    return out


def accuracy(model: Any, tokenizer: Any, processor: Any, rows: Sequence[dict], *, temperature: float,
             num_samples: int = 1, seed: int = 0) -> float:
    """Exact-match accuracy of :func:`answers`."""
    texts = answers(model, tokenizer, processor, rows, temperature=temperature, num_samples=num_samples, seed=seed)
    per_row = num_samples if temperature else 1
    truths = [r["reward_model"]["ground_truth"] for r in rows for _ in range(per_row)]
    return sum(t.strip() == g for t, g in zip(texts, truths)) / max(len(texts), 1)


def _demonstrations(tokenizer: Any, processor: Any, rows: Sequence[dict]) -> Any:
    """SFT rows: each prompt (with its image) then its answer and EOS, trained."""
    import pyarrow as pa

    from flowrl.data.images import IMAGES_COLUMN, IMAGES_TYPE
    from flowrl.tasks.warmup import token_rows

    prompts = _prompt_ids(tokenizer, processor, rows)
    replies = [tokenizer.encode(r["reward_model"]["ground_truth"], add_special_tokens=False) + [tokenizer.eos_token_id]
               for r in rows]
    data = token_rows(prompts, replies, [[1] * len(a) for a in replies])
    blobs = pa.array([[e["bytes"] for e in r["images"]] for r in rows], IMAGES_TYPE)
    data.table = data.table.append_column(IMAGES_COLUMN, blobs)
    return data


def _key(seed: int, preset: str, num_train: int, num_test: int, warmup: WarmupConfig) -> dict:
    return {"version": TASK_VERSION, "seed": seed, "preset": preset, "num_train": num_train, "num_test": num_test,
            "warmup": dataclasses.asdict(warmup)}


def _load(root: Path, key: dict) -> VlmShapesTask | None:
    record = read_record(root, key)
    if record is None:
        return None
    return VlmShapesTask(root=root, model_dir=root / "model", train_path=root / "train.parquet",
                         test_path=root / "test.parquet", initial_greedy_accuracy=record["initial_greedy_accuracy"],
                         initial_sampled_accuracy=record["initial_sampled_accuracy"],
                         warmup_steps=record["warmup_steps"], warmup_seconds=record["warmup_seconds"])


def _build(out: Path, *, seed: int, preset: str, num_train: int, num_test: int, warmup: WarmupConfig, key: dict) -> None:
    from transformers import AutoModelForCausalLM

    from flowrl.data.images import load_image_processor
    from flowrl.models.tiny_vlm import save_tiny_vlm
    from flowrl.models.vlm import register_auto_classes
    from flowrl.tasks.warmup import sft_warm_up, torch_threads

    train, test = make_rows(num_train, seed, "train"), make_rows(num_test, seed, "test")
    write_parquet(out, train, "train.parquet")
    write_parquet(out, test, "test.parquet")
    init = save_tiny_vlm(out / "init_model", preset=preset, seed=seed)
    from transformers import AutoTokenizer

    tokenizer, processor = AutoTokenizer.from_pretrained(init), load_image_processor(init)
    probe_rows = train[: warmup.num_probe_rows]
    with torch_threads(warmup.num_threads):
        result = sft_warm_up(init, "", warmup, seed=seed, out_dir=out / "model",
                             dataset=_demonstrations(tokenizer, processor, train),
                             probe=lambda model: accuracy(model, tokenizer, processor, probe_rows, temperature=0.0))
    tokenizer.save_pretrained(out / "model")
    processor.save_pretrained(out / "model")
    shutil.rmtree(init)
    register_auto_classes()
    model = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    eval_rows = train[:128]
    with torch_threads(warmup.num_threads):
        greedy = accuracy(model, tokenizer, processor, eval_rows, temperature=0.0)
        sampled = accuracy(model, tokenizer, processor, eval_rows, temperature=1.0, num_samples=4, seed=seed)
    record = {"key": key, "initial_greedy_accuracy": greedy, "initial_sampled_accuracy": sampled,
              "warmup_steps": result.num_steps, "warmup_seconds": round(result.seconds, 3),
              "warmup_final_loss": result.final_loss, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (out / TASK_FILE).write_text(json.dumps(record, indent=2) + "\n")


def prepare_vlm_shapes_task(root: str | os.PathLike, *, seed: int = 0, preset: str = "default", num_train: int = 1024,
                            num_test: int = 128, warmup: WarmupConfig | None = None, force: bool = False) -> VlmShapesTask:
    """Build (or reuse) the task under ``root``; see the module docstring."""
    root = Path(root)
    warmup = DEFAULT_WARMUP if warmup is None else warmup
    key = _key(seed, preset, num_train, num_test, warmup)
    if not force and (task := _load(root, key)) is not None:
        return task
    if root.exists() and any(root.iterdir()) and not (root / TASK_FILE).exists():
        raise ValueError(f"{root} exists and is not a flowrl task directory; pass an empty or new directory")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    tmp.chmod(0o755)
    try:
        _build(tmp, seed=seed, preset=preset, num_train=num_train, num_test=num_test, warmup=warmup, key=key)
        if root.exists():
            shutil.rmtree(root)
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    task = _load(root, key)
    assert task is not None, f"{root} does not hold the task just built"
    return task
