"""The embedded vision-language task (issue 33): its pictures say what their answers say, the
rows are verl's multimodal format, and a (short) build gives a loadable warmed-up task."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("PIL")


def _pixels(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def test_rows_are_verl_multimodal_and_their_pictures_hold_the_answer():
    from flowrl.tasks.vlm_shapes import COLOURS, DATA_SOURCE, IMAGE_SIZE, make_rows

    rows = make_rows(24, seed=0, split="train")
    assert rows == make_rows(24, seed=0, split="train")  # deterministic
    assert rows != make_rows(24, seed=0, split="test")
    for row in rows:
        assert row["data_source"] == DATA_SOURCE and row["prompt"][0]["content"].startswith("<image>")
        (image,) = row["images"]
        assert set(image) == {"bytes", "path"} and image["path"] is None
        img = _pixels(image["bytes"])
        assert img.size == (IMAGE_SIZE, IMAGE_SIZE)
        colours = {name for name, rgb in COLOURS.items() if rgb in set(img.getdata())}
        assert len(colours) == 1  # one colour per picture
        truth, question = row["reward_model"]["ground_truth"], row["extra_info"]["question"]
        if question == "colour":
            assert colours == {truth}
        else:  # count: connected blobs of the colour, one per quarter cell used
            rgb = COLOURS[colours.pop()]
            half = IMAGE_SIZE // 2
            cells = sum(any(img.getpixel((x, y)) == rgb for x in range(cx * half, (cx + 1) * half)
                            for y in range(cy * half, (cy + 1) * half)) for cx in (0, 1) for cy in (0, 1))
            assert str(cells) == truth


@pytest.mark.timeout(600)
def test_a_short_build_is_cached_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowrl.data.images import load_image_processor
    from flowrl.data.prompts import PromptDataset
    from flowrl.models.vlm import register_auto_classes
    from flowrl.tasks.vlm_shapes import prepare_vlm_shapes_task
    from flowrl.tasks.warmup import WarmupConfig

    warmup = WarmupConfig(max_steps=3, batch_size=8, check_every=10, target_greedy_accuracy=None, num_probe_rows=8)
    task = prepare_vlm_shapes_task(tmp_path / "task", num_train=32, num_test=8, warmup=warmup)
    assert task.warmup_steps == 3 and 0.0 <= task.initial_sampled_accuracy <= 1.0
    again = prepare_vlm_shapes_task(tmp_path / "task", num_train=32, num_test=8, warmup=warmup)
    assert again == task  # cached
    register_auto_classes()
    assert type(AutoModelForCausalLM.from_pretrained(task.model_dir)).__name__ == "Qwen2VLForConditionalGeneration"
    assert load_image_processor(task.model_dir) is not None
    ds = PromptDataset([str(task.train_path)], AutoTokenizer.from_pretrained(task.model_dir), max_prompt_length=64)
    assert len(ds) == 32 and not ds.rejected and "images" in ds.table.column_names
