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


def sync_into_generator(rank: int, world: int, model_dir: str, table: pa.Table) -> dict:
    """One rank of the hybrid weight sync: one fsdp update (the weights leave what is on disk),
    then the run's colocated job (``job_for_run``) into an ``hf`` generator loaded from disk, by
    both transports (the target zeroed first); the generator's parameters after each."""
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.reshard import job_for_run, run_rank
    from flowrl.config import load_config
    from flowrl.roles.policy import PolicyRole

    from flowrl_testing.fsdp import actor_cfg

    role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor_cfg("fsdp", world),
                      use_old_logprobs=False, response_length=6)
    per = table.num_rows // world
    role.update(table.slice(rank * per, per), mini_batch_rows=per)
    gen = HFGenerator(model_dir)
    out: dict = {"trainer": role.hf_state_dict()}
    for transport in ("planned", "naive"):
        cfg = load_config(None, [f"model.path={model_dir}", "actor.strategy=fsdp", f"actor.data_parallel_size={world}",
                                 f"rollout.data_parallel_size={world}", f"rollout.reshard_transport={transport}"])
        job = job_for_run(cfg, colocated=True)
        target = gen.reshard_target()
        for t in target.values():
            t.zero_()
        stats = run_rank(job, src_rank=job.placement.src.index(rank), dst_rank=job.placement.dst.index(rank),
                         src=role.engine.reshard_source(), dst=target)
        out[transport] = {"state": {n: p.detach().clone() for n, p in gen.model.named_parameters()}, "stats": stats}
    return out


@pytest.mark.timeout(600)
def test_fsdp_vlm_weights_reach_the_hf_generator_bit_for_bit(tmp_path):
    """The reshard of a tiny Qwen2-VL from FSDP2 at 2 ranks into the hf generator (every parameter
    whole by its HF name, vision tower included): the generator holds the trainer's weights exactly."""
    from flowrl.models.tiny_vlm import save_tiny_vlm

    model_dir = str(save_tiny_vlm(tmp_path / "model"))
    ranks = run_ranks(2, sync_into_generator, model_dir, vlm_batch(model_dir), timeout_s=500)
    trainer = ranks[0]["trainer"]
    assert any(k.startswith("model.visual.") for k in trainer)
    for r in ranks:
        for transport in ("planned", "naive"):
            state = r[transport]["state"]
            assert set(state) <= set(trainer) and any(k.startswith("model.visual.") for k in state)
            bad = [k for k in state if not torch.equal(state[k], trainer[k])]
            assert not bad, (transport, bad[:5])
        assert r["planned"]["stats"]["bytes_received"] == 0  # each rank's replica is local
