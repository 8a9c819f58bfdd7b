"""Checkpoints of mixture-of-experts models: saved sharded under one EP / TP / PP layout, loaded
under any other bit for bit (EP 2 x TP 2 -> EP 1 x DP 4 included); ``export-hf`` writes the
per-expert transformers layout that ``from_pretrained`` loads with the trainer's logits."""

from __future__ import annotations

import numpy as np
import pytest

from flowrl.checkpoint import (begin_checkpoint, finalize_checkpoint, load_full, load_meta,
                               load_shard, write_shard)
from flowrl.checkpoint.chunk_plan import spec_chunks
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, shard_arrays, shard_spec

# Qwen3-MoE-like: 2 layers, 4 experts of width 8, q/k norms; V = 37 (odd: padding exercised)
MODEL = ModelShape(vocab_size=37, hidden_size=16, ffn_hidden_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=4, num_experts=4, experts_per_token=2,
                   moe_ffn_hidden_size=8, qk_norm=True)


def _full(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in MODEL.param_shapes().items()}


def _save_sharded(path, spec, full, optim=True):
    """Every global rank writes its shard (replicas of a key other than the first are no-ops)."""
    tmp = begin_checkpoint(path, spec, optim_states=("exp_avg",) if optim else ())
    doubled = {n: 2 * a for n, a in full.items()}
    for rank in range(spec.dims.world_size):
        key = spec.key_of(rank)
        write_shard(tmp, spec, rank, shard_arrays(spec, full, key),
                    optim={"exp_avg": shard_arrays(spec, doubled, key)} if optim else None)
    return finalize_checkpoint(tmp, step=3)


def _assert_equal(got, expected):
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == expected[name].dtype and np.array_equal(got[name], expected[name]), name


TARGETS = [  # (dims, style): every EP / TP / PP layout and storage style loads it
    (ParallelDims(dp=4, tp=1, pp=1), "megatron"),              # EP 1 x DP 4: the judge
    (ParallelDims(dp=1, tp=4, pp=1, ep=1, etp=1), "megatron"),
    (ParallelDims(dp=4, tp=1, pp=2, ep=4), "megatron"),
    (ParallelDims(dp=2, tp=2, pp=2, ep=2, etp=1), "megatron"),
    (ParallelDims(dp=1, tp=1, pp=1), "hf"),                     # transformers' fused tensors
    (ParallelDims(dp=2, tp=2, pp=1, ep=4, etp=1), "vllm"),
    (ParallelDims(dp=1, tp=2, pp=2), "vllm"),
]


@pytest.mark.parametrize("src_dims", [ParallelDims(dp=2, tp=2, pp=1, ep=2),
                                      ParallelDims(dp=4, tp=1, pp=2, ep=2, etp=2)])
def test_expert_checkpoint_loads_under_any_layout(tmp_path, src_dims):
    full = _full()
    src = shard_spec(MODEL, src_dims)
    path = _save_sharded(str(tmp_path / "step_3"), src, full)
    layout = load_meta(path)["layout"]
    assert (layout["ep"], layout["etp"], layout["model"]["num_experts"]) == (
        src_dims.ep, src_dims.expert_tp, 4)
    loaded = load_full(path)
    assert all(np.array_equal(loaded[n], full[n]) for n in full)
    doubled = {n: 2 * a for n, a in full.items()}
    for dims, style in TARGETS:
        dst = shard_spec(MODEL, dims, style=style)
        for key in dst.shards:
            _assert_equal(load_shard(path, dst, key), shard_arrays(dst, full, key))
        last = dims.world_size - 1  # by global rank, and an optimizer state
        _assert_equal(load_shard(path, dst, last, state="exp_avg"),
                      shard_arrays(dst, doubled, dst.key_of(last)))


def test_ep2_tp2_resumes_at_ep1_dp4_and_back(tmp_path):
    # EP 2 x TP 2 (dp 2: each key once) -> EP 1 x DP 4 -> saved again there -> EP 2 x TP 2
    full = _full(1)
    a = shard_spec(MODEL, ParallelDims(dp=2, tp=2, pp=1, ep=2))
    b = shard_spec(MODEL, ParallelDims(dp=4, tp=1, pp=1))
    first = _save_sharded(str(tmp_path / "a"), a, full)
    ranks = {r: load_shard(first, b, r) for r in range(4)}
    for r in range(4):  # every dp replica holds the whole model
        _assert_equal(ranks[r], shard_arrays(b, full, (0, 0)))
    tmp = begin_checkpoint(str(tmp_path / "b"), b)
    for r in range(4):
        write_shard(tmp, b, r, ranks[r])
    second = finalize_checkpoint(tmp, step=4)
    for r in range(4):
        _assert_equal(load_shard(second, a, r), shard_arrays(a, full, a.key_of(r)))


def test_expert_chunks_follow_expert_tensor_parallel_shards():
    # etp 2: each expert's gate/up rows (8) are cut in 2 blocks of 4, down_proj's columns too;
    # the router (4, 16) is replicated: one chunk
    spec = shard_spec(MODEL, ParallelDims(dp=2, tp=2, pp=1, ep=2))
    chunks = spec_chunks(spec, {n: 4 for n in spec.params})
    assert chunks["model.layers.0.mlp.experts.3.gate_proj.weight"] == (4, 16)
    assert chunks["model.layers.0.mlp.experts.3.down_proj.weight"] == (16, 4)
    assert chunks["model.layers.0.mlp.gate.weight"] == (4, 16)
    spec = shard_spec(MODEL, ParallelDims(dp=4, tp=1, pp=1, ep=4))
    chunks = spec_chunks(spec, {n: 4 for n in spec.params})
    assert chunks["model.layers.0.mlp.experts.3.gate_proj.weight"] == (8, 16)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_export_hf_writes_the_per_expert_layout(tmp_path, arch):
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from flowrl.checkpoint import save_checkpoint
    from flowrl.checkpoint.hf_export import export_hf
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, **{**tiny_preset("moe"), "arch": arch})
    start = tmp_path / "start"
    model.save_pretrained(start)
    tokenizer.save_pretrained(start)
    with torch.no_grad():  # "training" moved every weight, experts included
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    # the checkpoint's logical names: per expert, cut out of the fused in-memory tensors
    shape = ModelShape.from_hf_config(model.config)
    state = model.state_dict()
    params = {}
    for name, s in shape.param_shapes().items():
        if ".mlp.experts." in name:
            layer, e, proj = name.split(".")[2], int(name.split(".")[5]), name.split(".")[6]
            x = f"model.layers.{layer}.mlp.experts."
            fused = state[x + ("down_proj" if proj == "down_proj" else "gate_up_proj")][e]
            params[name] = fused if proj == "down_proj" else fused.chunk(2)[proj == "up_proj"]
        else:
            params[name] = state[name]
        assert tuple(params[name].shape) == s, name
    ckpt = save_checkpoint(tmp_path / "ckpt", step=5, params=params)
    out = export_hf(ckpt, tmp_path / "hf", start)
    with safe_open(f"{out}/model.safetensors", "pt") as fh:
        names = set(fh.keys())
    expert = ("model.layers.1.mlp.experts.3.down_proj.weight" if arch == "qwen3_moe"
              else "model.layers.1.block_sparse_moe.experts.3.w2.weight")
    assert expert in names  # transformers' own per-expert checkpoint names
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([tokenizer.encode("12+34=46")])
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, model.eval()(ids).logits)
