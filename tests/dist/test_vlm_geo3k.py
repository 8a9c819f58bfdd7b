"""A verl geo3k-format Parquet (issue 33): written here as verl's examples/data_preprocess/geo3k.py
writes it (``prompt`` chat messages with ``<image>``, ``images`` a list of ``{"bytes", "path"}``
structs), loaded and trained for two GRPO steps by ``flowrl train`` with a tiny Qwen2-VL, ``hf``
generation and the dp or FSDP2 trainer; its bad-image rows land in ``rejected_prompts.jsonl`` with file
and row. The split placement trains it too; the pre-flight refuses the same run on megatron before
any worker starts."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def _png(colour, size=(64, 64), mode="RGB") -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new(mode, size, (255, 255, 255) if mode == "RGB" else 0)
    if mode == "RGB":
        ImageDraw.Draw(img).rectangle((10, 10, 40, 40), fill=colour)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _geo3k(path, num_good: int = 16) -> list[int]:
    """``num_good`` usable rows and three bad ones; the bad rows' indices."""
    instruction = " Answer with the colour."  # geo3k appends its instruction to the problem text
    colours = {"red": (220, 30, 30), "green": (30, 170, 30), "blue": (30, 60, 220)}
    rows, bad = [], []
    for i in range(num_good + 3):
        name = list(colours)[i % 3]
        image = {"bytes": _png(colours[name]), "path": None}
        if i == 5:
            image = {"bytes": b"\x89PNG\r\n\x1a\n truncated", "path": None}  # unreadable
        elif i == 9:
            image = {"bytes": _png(0, size=(8, 8), mode="I;16"), "path": None}  # wrong mode
        elif i == 12:
            image = {"bytes": None, "path": "/nonexistent/image.png"}  # missing file
        if i in (5, 9, 12):
            bad.append(i)
        rows.append({
            "data_source": "hiyouga/geometry3k",
            "prompt": [{"role": "user", "content": "<image>What colour?" + instruction}],
            "images": [image],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": name},
            "extra_info": {"split": "train", "index": i, "answer": name, "question": "What colour?"},
        })
    pq.write_table(pa.Table.from_pylist(rows), path)
    return bad


def train_geo3k(tmp_path, *overrides: str, num_good: int = 16, timeout: int = 250):
    """``flowrl train`` of a tiny Qwen2-VL on a geo3k Parquet of ``num_good`` good rows (plus the
    bad ones) with ``overrides``: (the process, its run dir, the data file, the bad rows)."""
    from flowrl.models.tiny_vlm import save_tiny_vlm

    model = save_tiny_vlm(tmp_path / "model")
    data = tmp_path / "geo3k.parquet"
    bad = _geo3k(data, num_good=num_good)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "flowrl.cli", "train", f"model.path={model}", f"data.train_files={data}",
           f"trainer.run_dir={out}", "algorithm.reward_fn=exact_match", "trainer.progress=false", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), out, data, bad


@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_geo3k_format_parquet_loads_and_trains_two_steps(tmp_path, strategy):
    """dp: the generator decodes with the trainer's module; fsdp (2 ranks, 28 s): the weights reach
    the hf generator by the reshard of whole parameters, whose fingerprints agree on every one."""
    proc, out, data, bad = train_geo3k(
        tmp_path, "rollout.name=hf", "rollout.n=4", "rollout.response_length=6", "data.train_batch_size=4",
        "data.max_prompt_length=64", "actor.ppo_mini_batch_size=4", "actor.freeze_vision_tower=true",
        "trainer.total_training_steps=2", f"actor.strategy={strategy}", timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    if strategy == "fsdp":  # vision tower and language model synced (step 2's check): 45 parameters, none differs
        synced = [r for r in rows if "reshard/fingerprint_params" in r]
        assert synced and all(r["reshard/fingerprint_params"] == 45 and r["reshard/fingerprint_mismatch"] == 0
                              for r in synced), rows
    rejected = [json.loads(line) for line in (out / "rejected_prompts.jsonl").read_text().splitlines()]
    assert [(r["file"], r["row"]) for r in rejected] == [(str(data), i) for i in bad]
    reasons = [r["reason"] for r in rejected]
    assert "unreadable" in reasons[0] and "mode" in reasons[1] and "cannot be read" in reasons[2]
    # the experience table holds the encoded images as Arrow binary, one list per sample
    step = pq.read_table(out / "experience" / "step_000001.parquet")
    assert step.schema.field("images").type == pa.list_(pa.binary())
    assert all(len(x) == 1 and x[0].startswith(b"\x89PNG") for x in step.column("images").to_pylist())


@pytest.mark.timeout(300)
def test_a_vlm_trains_in_the_split_placement(tmp_path):
    """Separate rollout workers: the fsdp trainer's weights (vision tower included) reach them by the
    split reshard, every parameter whole by name; the fingerprints agree on all 45."""
    proc, out, _, _ = train_geo3k(
        tmp_path, "cluster.placement=split", "actor.strategy=fsdp", "rollout.n=2", "rollout.response_length=4",
        "data.train_batch_size=2", "data.max_prompt_length=64", "actor.ppo_mini_batch_size=2",
        "trainer.total_training_steps=2", num_good=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    synced = [r for r in rows if "reshard/fingerprint_params" in r]
    assert synced and all(r["reshard/fingerprint_params"] == 45 and r["reshard/fingerprint_mismatch"] == 0
                          and r["reshard/bytes"] > 0 for r in synced), rows


@pytest.mark.timeout(300)
def test_megatron_refuses_a_vlm_before_workers_start(tmp_path):
    proc, out, _, _ = train_geo3k(tmp_path, "actor.strategy=megatron", num_good=4)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "actor.strategy='megatron'" in proc.stderr and "vision-language" in proc.stderr
    assert not (out / "metrics.jsonl").exists()
