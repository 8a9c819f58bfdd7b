"""Checkpoint storage: full-state round trip, meta, atomic saves, ``latest``, validation errors."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from flowrl.checkpoint import (begin_checkpoint, check_params, checkpoint_dir, latest_checkpoint,
                               load_full, load_meta, load_shard, prune_checkpoints,
                               save_checkpoint, write_shard)
from flowrl.checkpoint.rng import get_rng_state, set_rng_state
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, shard_arrays, shard_spec

MODEL = ModelShape(vocab_size=37, hidden_size=16, ffn_hidden_size=32, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=4)


def _full(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in MODEL.param_shapes().items()}


def test_round_trip_full_bit_exact_with_meta(tmp_path) -> None:
    full = _full()
    bf16 = {"w": torch.randn(5, 3).to(torch.bfloat16), "b": torch.randn(7, dtype=torch.float64)}
    optim = {"exp_avg": {"w": torch.randn(5, 3)}, "step": {"w": np.array([3], np.int64)}}
    extra = {"data_loader": {"epoch": 1, "index": 12}, "kl_coef": 0.05, "config": {"lr": 1e-6}}
    path = save_checkpoint(tmp_path / "step_3", step=3, params={**full, **bf16}, optim=optim,
                           extra=extra, rng=get_rng_state())
    loaded = load_full(path)
    for name, value in full.items():
        assert loaded[name].dtype == np.float32 and np.array_equal(loaded[name], value), name
    as_torch = load_full(path, as_torch=True)
    assert as_torch["w"].dtype == torch.bfloat16 and torch.equal(as_torch["w"], bf16["w"])
    assert as_torch["b"].dtype == torch.float64 and torch.equal(as_torch["b"], bf16["b"])
    assert torch.equal(load_full(path, state="exp_avg", as_torch=True)["w"], optim["exp_avg"]["w"])
    assert load_full(path, state="step")["w"].tolist() == [3]
    meta = load_meta(path)
    assert meta["step"] == 3 and meta["extra"] == extra and meta["layout"] is None
    assert meta["params"]["w"] == {"shape": [5, 3], "dtype": "bfloat16", "chunks": [5, 3]}
    assert sorted(meta["optim"]) == ["exp_avg", "step"]
    assert latest_checkpoint(tmp_path) == path
    with pytest.raises(ValueError, match="no optimizer state 'exp_avg_sq'"):
        load_full(path, state="exp_avg_sq")


def test_rng_state_round_trip() -> None:
    state = json.loads(json.dumps(get_rng_state()))  # survives meta.json
    expected = (random.random(), np.random.rand(), torch.rand(2))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    set_rng_state(state)
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_full_save_chunked_like_a_spec_loads_a_shard(tmp_path) -> None:
    full = _full()
    spec = shard_spec(MODEL, ParallelDims(dp=1, tp=2, pp=1))
    path = save_checkpoint(tmp_path / "c", step=0, params=full, spec=spec)
    assert load_meta(path)["params"]["model.layers.0.self_attn.q_proj.weight"]["chunks"] == [8, 16]
    got = load_shard(path, spec, 1)
    expected = shard_arrays(spec, full, (1, 0))
    assert all(np.array_equal(got[n], expected[n]) for n in expected)


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch) -> None:
    import zarr

    good = save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, params=_full(1))
    original = zarr.Array.__setitem__
    calls = []

    def dying_setitem(self, key, value):  # the writer dies on the third tensor's chunks
        calls.append(key)
        if len(calls) == 3:
            raise RuntimeError("killed while writing chunks")
        return original(self, key, value)

    monkeypatch.setattr(zarr.Array, "__setitem__", dying_setitem)
    with pytest.raises(RuntimeError, match="killed while writing chunks"):
        save_checkpoint(checkpoint_dir(tmp_path, 2), step=2, params=_full(2))
    monkeypatch.undo()
    # Dies in the commit itself: meta.json written, the rename never happens.
    real_replace = os.replace

    def dying_replace(src, dst):
        if ".tmp-" in os.fspath(src) and os.path.isdir(src):
            raise OSError("killed before the rename")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(OSError, match="killed before the rename"):
        save_checkpoint(checkpoint_dir(tmp_path, 2), step=2, params=_full(2))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000001"]
    assert latest_checkpoint(tmp_path) == good
    assert np.array_equal(load_full(good)["model.norm.weight"], _full(1)["model.norm.weight"])


def test_killed_sharded_save_is_ignored_then_cleaned(tmp_path) -> None:
    good = save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, params=_full(1))
    spec = shard_spec(MODEL, ParallelDims(dp=1, tp=2, pp=1))
    # As a kill -9 leaves it: arrays created, one rank's chunks written, never finalized.
    tmp = begin_checkpoint(checkpoint_dir(tmp_path, 2), spec)
    write_shard(tmp, spec, 0, shard_arrays(spec, _full(2), (0, 0)))
    assert os.path.isdir(tmp) and latest_checkpoint(tmp_path) == good
    os.unlink(tmp_path / "latest")  # even without the pointer the temp dir is never chosen
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(ValueError, match="never committed"):
        load_full(tmp)
    newer = save_checkpoint(checkpoint_dir(tmp_path, 3), step=3, params=_full(3))
    assert not os.path.exists(tmp)  # the next save removed the leftover
    assert latest_checkpoint(tmp_path) == newer


def test_finalize_refuses_missing_shards(tmp_path) -> None:
    from flowrl.checkpoint import finalize_checkpoint

    spec = shard_spec(MODEL, ParallelDims(dp=2, tp=2, pp=1))
    tmp = begin_checkpoint(tmp_path / "c", spec)
    write_shard(tmp, spec, 0, shard_arrays(spec, _full(), (0, 0)))
    write_shard(tmp, spec, 3, {})  # rank 3 = (dp 1, tp 1): a replica, writes nothing
    with pytest.raises(RuntimeError, match="chunks written; some rank did not call write_shard"):
        finalize_checkpoint(tmp, step=0)
    assert latest_checkpoint(tmp_path) is None
    zeros = {n: np.zeros_like(a) for n, a in _full().items()}  # e.g. Adam moments at step 0
    write_shard(tmp, spec, 1, shard_arrays(spec, zeros, (1, 0)))  # all-zero chunks are written
    path = finalize_checkpoint(tmp, step=0)
    assert latest_checkpoint(tmp_path) == path


def test_resave_same_path_and_prune(tmp_path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(checkpoint_dir(tmp_path, step), step=step, params={"w": np.full(2, step)})
    again = save_checkpoint(checkpoint_dir(tmp_path, 3), step=3, params={"w": np.full(2, 9)})
    assert load_full(again)["w"].tolist() == [9, 9]
    assert prune_checkpoints(tmp_path, keep=2) == [checkpoint_dir(tmp_path, 1)]
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000002", "step_00000003"]
    assert latest_checkpoint(tmp_path / "missing") is None


def test_wrong_model_and_bad_meta_are_clear_errors(tmp_path) -> None:
    path = save_checkpoint(tmp_path / "c", step=0, params=_full())
    other = ModelShape(vocab_size=37, hidden_size=16, ffn_hidden_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=4)
    spec = shard_spec(other, ParallelDims(dp=1, tp=1, pp=1))
    meta_file = os.path.join(path, "meta.json")
    with pytest.raises(ValueError, match=r"meta.json holds a different model .*"
                                         r"gate_proj.weight has shape \(32, 16\), the target "
                                         r"model expects \(64, 16\).*resume_mode=disable"):
        load_shard(path, spec, 0)
    with pytest.raises(ValueError, match="extra.weight is missing"):
        check_params(path, {**MODEL.param_shapes(), "extra.weight": (1,)})
    with open(meta_file, "w") as fh:
        fh.write('{"format": "flowrl-checkpoint", "step": ')
    with pytest.raises(ValueError, match=f"{meta_file} is corrupt"):
        load_meta(path)
    os.unlink(meta_file)
    with pytest.raises(ValueError, match=f"{meta_file} is missing"):
        load_full(path)
    assert latest_checkpoint(tmp_path) is None  # the pointer's target is incomplete now
    with pytest.raises(ValueError, match="does not exist"):
        load_meta(tmp_path / "nope")


def test_crash_while_replacing_a_save_of_the_same_path_recovers_it(tmp_path, monkeypatch) -> None:
    path = save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, params={"w": np.ones(2)})
    real_replace = os.replace

    def dying_replace(src, dst):  # the old save is moved aside, then the writer dies
        if ".tmp-" in os.fspath(src) and os.path.isdir(src):
            raise OSError("killed between the renames")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    monkeypatch.setattr("flowrl.checkpoint.zarr_store.remove", lambda p: None)  # as after kill -9
    with pytest.raises(OSError, match="killed between the renames"):
        save_checkpoint(path, step=1, params={"w": np.zeros(2)})
    monkeypatch.undo()
    assert not os.path.exists(path)
    assert latest_checkpoint(tmp_path) == path  # moved back
    assert load_full(path)["w"].tolist() == [1.0, 1.0]
