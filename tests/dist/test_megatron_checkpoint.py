"""Sharded megatron checkpoints through the trainer, loaded under other layouts.

A GRPO step at TP2 x PP2 saves a checkpoint (each of the 4 ranks writes its own chunks; the
tied-free tiny Llama has GQA, so q/k/v come from the fused, group-interleaved ``linear_qkv``).
The checkpoint is then resumed at megatron TP1 x DP4 (also with the distributed optimizer), at
megatron TP4 (more tp ranks than KV heads) and by the ``dp`` strategy; each run saves right away, and its parameters and AdamW states
must equal the original checkpoint's bitwise (fp32).
"""

from __future__ import annotations

import pytest
import torch

from flowrl.checkpoint import latest_checkpoint, load_full, load_meta
from flowrl.config import load_config
from flowrl.run import Run, resolve_inputs, train

pytest.importorskip("megatron.core")


def _args(run_dir, model_dir, data, *layout):
    return [
        f"model.path={model_dir}", f"data.train_files={data[0]}", f"trainer.run_dir={run_dir}",
        "trainer.total_training_steps=1", "trainer.progress=false", "trainer.save_freq=1",
        "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8", "rollout.data_parallel_size=1",
        "actor.use_kl_loss=false", "actor.entropy_coeff=0.01", *layout,  # entropy: non-zero gradients
    ]


TP2_PP2 = ("actor.strategy=megatron", "actor.tensor_model_parallel_size=2", "actor.pipeline_model_parallel_size=2")
TARGETS = {
    "megatron-tp1-dp4": ("actor.strategy=megatron", "actor.data_parallel_size=4"),
    "megatron-tp4": ("actor.strategy=megatron", "actor.tensor_model_parallel_size=4"),
    "dp": ("actor.strategy=dp", "actor.data_parallel_size=1"),
    # megatron's distributed optimizer over 4 dp ranks: each reads its flat ranges, then writes the
    # chunks of its ranges (those a dp cut splits exchanged) through the trainer's save
    "megatron-dp4-distopt": ("actor.strategy=megatron", "actor.data_parallel_size=4", "actor.use_distributed_optimizer=true"),
}


@pytest.fixture(scope="module")
def tp2_pp2_checkpoint(tmp_path_factory, tiny_model_dir, addition_data):
    run_dir = tmp_path_factory.mktemp("tp2pp2")
    summary = train(load_config(None, _args(run_dir, tiny_model_dir, addition_data, *TP2_PP2)))
    assert summary.steps == 1
    path = latest_checkpoint(run_dir / "checkpoints")
    meta = load_meta(path)
    assert meta["layout"]["tp"] == 2 and meta["layout"]["pp"] == 2  # chunked along the saving shards
    assert meta["extra"]["next_step"] == 1 and meta["extra"]["optim_step"] == 1
    q = meta["params"]["model.layers.0.self_attn.q_proj.weight"]
    assert q["chunks"][0] < q["shape"][0]  # really split, not one chunk per tensor
    exp_avg = load_full(path, state="exp_avg", as_torch=True)
    for name in ("model.norm.weight", "model.layers.1.self_attn.k_proj.weight", "model.embed_tokens.weight"):
        assert float(exp_avg[name].abs().sum()) > 0, name  # a real optimizer state, not zeros
    return path


@pytest.mark.timeout(900)
@pytest.mark.parametrize("target", list(TARGETS))
def test_tp2_pp2_checkpoint_loads_bitwise_under_another_layout(tmp_path, tiny_model_dir, addition_data,
                                                               tp2_pp2_checkpoint, target):
    cfg = resolve_inputs(load_config(None, _args(tmp_path / "run", tiny_model_dir, addition_data,
                                                 *TARGETS[target], f"trainer.resume_mode={tp2_pp2_checkpoint}")))
    run = Run.open(cfg)  # resumes: each actor rank reads its own chunks
    try:
        assert run.next_step == 1
        saved = run.save_checkpoint()  # ... and writes them back under this layout
    finally:
        run.close()
    a, b = load_meta(tp2_pp2_checkpoint), load_meta(saved)
    assert b["extra"]["optim_step"] == a["extra"]["optim_step"] == 1
    assert sorted(a["optim"]) == sorted(b["optim"]) == ["exp_avg", "exp_avg_sq"]
    for state in (None, "exp_avg", "exp_avg_sq"):
        pa, pb = load_full(tp2_pp2_checkpoint, state=state, as_torch=True), load_full(saved, state=state, as_torch=True)
        assert pa.keys() == pb.keys()
        for name in pa:
            assert pa[name].dtype == pb[name].dtype == torch.float32
            assert torch.equal(pa[name], pb[name]), (target, state, name)  # bitwise


@pytest.mark.timeout(300)
def test_distributed_optimizer_checkpoint_resumes_under_any_layout(tmp_path):
    """Saved at tp1 dp2 with megatron's distributed optimizer (each dp rank writes the chunks of
    its flat ranges; a parameter split between the two ranks is exchanged), resumed at tp1 dp2
    with and without it, at tp2 with it and at pp2 without it (dp1): the next step's loss and parameters equal the
    uninterrupted run's (bitwise at the saving layout; to float32 rounding where tp/pp or the
    plain optimizer's all-reduce change the summation order), and a save right after loading
    equals the original checkpoint bitwise."""
    import json

    from flowrl.comm import free_port
    from flowrl_testing import megatron as testing
    from flowrl_testing import megatron_checkpoint as worker

    model_dir = str(tmp_path / "model")
    # tied embeddings and ffn 48: the dp cut of megatron's one bucket falls inside a parameter
    # (layer 1's linear_fc1, at row 16 of its gate: that chunk is exchanged); untied, the cut lands
    # on a layer boundary (the bucket is symmetric)
    testing.make_tiny_model(model_dir, tied=True, ffn_hidden_size=48)
    out = tmp_path / "out.json"
    testing.spawn(worker.resume_worker, world_size=2, args=(free_port(), model_dir, str(tmp_path / "ckpt"), str(out)),
                  timeout_s=240)
    r = json.loads(out.read_text())
    assert r["split"] and r["saved_optim_step"] == 1
    for name in worker.TARGETS:
        t = r[name]
        assert t["optim_step"] == 1 and t["resaved_bitwise"], (name, t)
        assert abs(t["loss"] - r["loss"]) < 1e-5 and t["max_param_diff"] < 1e-5, (name, t, r["loss"])
    assert r["tp1-dp2-distopt"]["bitwise_params"] and r["tp1-dp2-distopt"]["loss"] == r["loss"]
