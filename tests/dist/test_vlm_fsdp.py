"""A tiny Qwen2-VL under FSDP2 at 2 ranks (issue 33): the same log-probs and the same update as
the dp strategy on one process, images in every micro-batch, vision tower trained."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
import torch

from flowrl_testing.fsdp import policy_step, run_ranks


def _png(colour, size=(64, 64)) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(img).rectangle((8, 8, 40, 40), fill=colour)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def vlm_batch(model_dir: str, num_prompts: int = 4, n: int = 2) -> pa.Table:
    """``num_prompts`` prompts with one image each (two sizes), ``n`` random responses each,
    advantages and reference log-probs."""
    from transformers import AutoTokenizer

    from flowrl.data import experience as ex
    from flowrl.data.images import expand_placeholders, image_token_count, load_image_processor

    tok, proc = AutoTokenizer.from_pretrained(model_dir), load_image_processor(model_dir)
    rng = np.random.default_rng(0)
    sizes = [(64, 64), (96, 64)]
    prompts, images = [], []
    for i in range(num_prompts):
        w, h = sizes[i % 2]
        text = expand_placeholders("<image>" + "count?colour?"[: 3 + i], [image_token_count(w, h, proc)])
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
        images.append([_png((40 * i, 200 - 40 * i, 90), (w, h))])
    prompts = [p for p in prompts for _ in range(n)]
    images = [x for x in images for _ in range(n)]
    responses = [rng.integers(10, 90, size=rng.integers(1, 6)).tolist() for _ in prompts]
    adv = [rng.normal(size=len(r)).astype(np.float32).tolist() for r in responses]
    ref = [(-rng.random(len(r)) * 3).astype(np.float32).tolist() for r in responses]
    return pa.table({
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "ref_logprobs": ex.from_lists(ref, ex.TOKEN_FLOATS),
        "images": pa.array(images, pa.list_(pa.binary())),
    })


@pytest.mark.timeout(600)
def test_fsdp_vlm_at_two_ranks_matches_dp(tmp_path):
    import pyarrow.compute as pc

    from flowrl.models.tiny_vlm import save_tiny_vlm

    model_dir = str(save_tiny_vlm(tmp_path / "model"))
    table = vlm_batch(model_dir)
    dp = policy_step(0, 1, model_dir, "dp", table)
    ranks = run_ranks(2, policy_step, model_dir, "fsdp", table, timeout_s=500)
    for r in ranks:
        logp = r["logp"] if isinstance(r["logp"], torch.Tensor) else torch.tensor(pc.list_flatten(r["logp"]).to_pylist())
        assert float((logp - dp["logp"]).abs().max()) <= 1e-5
    state = ranks[0]["state"]
    assert set(state) == set(dp["state"]) and any(k.startswith("model.visual.") for k in state)
    diff = max(float((state[k] - dp["state"][k]).abs().max()) for k in state)
    assert diff <= 5e-5, diff
    assert ranks[0]["metrics"]["actor/grad_norm"] == pytest.approx(dp["metrics"]["actor/grad_norm"], rel=1e-5)
