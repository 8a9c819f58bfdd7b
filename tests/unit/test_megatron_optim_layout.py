"""flowrl.backends.train.megatron.optim_layout: the distributed optimizer's ranges as whole zarr chunks.

A tiny GQA Llama (2 KV heads; at tp 4 a KV group straddles two ranks; 61-row vocabulary padded)
is split over tp x pp; every local tensor's flat elements are dealt to dp ranks in contiguous ranges
as megatron's buckets do (some empty, some cutting rows in the middle). The boxes of all shards must
cover every chunk of every parameter exactly once, and each box's elements, put back together from
the dp ranks' shares in rank order, must equal the HF region it names.
"""

from __future__ import annotations

import math

import pytest
import torch

from flowrl.backends.train.megatron.optim_layout import Box, assign_writers, box_count, box_elements, owned_boxes
from flowrl.checkpoint.chunk_plan import chunk_owners, spec_chunks
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, shard_arrays, shard_spec

MODEL = ModelShape(vocab_size=61, hidden_size=24, ffn_hidden_size=40, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=6)


def _spec(tp: int, pp: int, max_chunk_bytes: int):
    spec = shard_spec(MODEL, ParallelDims(dp=1, tp=tp, pp=pp), make_vocab_size_divisible_by=8)
    chunks = spec_chunks(spec, {n: 4 for n in spec.params}, max_chunk_bytes)
    return spec, chunks, chunk_owners(spec, chunks)


def _deal(numel: int, dp: int, g: torch.Generator) -> list[tuple[int, int]]:
    """Contiguous ranges of ``[0, numel)`` for ``dp`` ranks, at random cut points (empty allowed)."""
    cuts = sorted(torch.randint(0, numel + 1, (dp - 1,), generator=g).tolist())
    bounds = [0, *cuts, numel]
    return [(bounds[d], bounds[d + 1]) for d in range(dp)]


@pytest.mark.parametrize("tp, pp, max_chunk_bytes", [(2, 2, 2**20), (1, 1, 2**20), (4, 1, 200), (1, 2, 64)])
def test_boxes_cover_every_chunk_once(tp, pp, max_chunk_bytes):
    spec, chunks, owners = _spec(tp, pp, max_chunk_bytes)
    seen: dict[str, set] = {n: set() for n in spec.params}
    for key in spec.shards:
        for box in owned_boxes(spec, key, chunks, owners):
            index = tuple(lo // c for (lo, _), c in zip(box.region, chunks[box.param]))
            assert index not in seen[box.param], (box, "written twice")
            seen[box.param].add(index)
            for (lo, hi), c, n in zip(box.region, chunks[box.param], spec.params[box.param]):
                assert lo % c == 0 and (hi - lo == c or hi == n)  # exactly one whole chunk
    for name, shape in spec.params.items():
        assert len(seen[name]) == math.prod(math.ceil(n / c) for n, c in zip(shape, chunks[name])), name
    if max_chunk_bytes == 64:  # a column of o_proj (24 fp32 rows) is over 64 bytes: cut along both dims
        assert chunks["model.layers.0.self_attn.o_proj.weight"] == (16, 1)


@pytest.mark.parametrize("tp, pp, dp, max_chunk_bytes", [(2, 2, 2, 2**20), (1, 1, 4, 2**20), (4, 1, 3, 200),
                                                         (1, 2, 2, 64)])
def test_dp_shares_rebuild_every_region(tp, pp, dp, max_chunk_bytes):
    g = torch.Generator().manual_seed(tp * 100 + pp * 10 + dp)
    spec, chunks, owners = _spec(tp, pp, max_chunk_bytes)
    full = {n: torch.randn(s, generator=g) for n, s in spec.params.items()}
    cut = 0
    for key in spec.shards:
        local = shard_arrays(spec, full, key)
        ranges = {n: _deal(t.numel(), dp, g) for n, t in local.items()}
        boxes = owned_boxes(spec, key, chunks, owners)
        for box, (writer, counts) in zip(boxes, assign_writers(boxes, ranges)):
            flat = local[box.local].reshape(-1)
            shares = [box_elements(flat[s:e], s, box) for s, e in ranges[box.local]]
            assert [len(x) for x in shares] == list(counts) and counts[writer] == max(counts)
            got = torch.cat(shares).view(box.shape)
            want = full[box.param][tuple(slice(lo, hi) for lo, hi in box.region)]
            assert torch.equal(got, want), box
            cut += sum(c > 0 for c in counts) > 1
    assert cut > 0  # some boxes really were split between dp ranks


def test_box_count_by_hand():
    # a 4 x 5 local tensor; the box is rows 1..3, columns 2..4 (elements 7, 8, 12, 13)
    box = Box("p", "l", ((1, 3), (2, 4)), (1, 3), (2, 4), 5)
    assert box.shape == (2, 2) and box.numel == 4
    assert box_count(box, (0, 20)) == 4 and box_count(box, (0, 8)) == 1 and box_count(box, (8, 13)) == 2
    assert box_count(box, (13, 13)) == 0 and box_count(box, (14, 20)) == 0
    flat = torch.arange(20.0)
    assert box_elements(flat[8:13], 8, box).tolist() == [8.0, 12.0]
    assert box_elements(flat[3:20], 3, box).tolist() == [7.0, 8.0, 12.0, 13.0]
    with pytest.raises(AssertionError):  # the ranges must cover the box
        assign_writers([box], {"l": [(0, 8), (9, 20)]})


def test_boxes_written_as_whole_chunks_make_a_complete_checkpoint(tmp_path):
    """In one process, what the dp ranks of every shard write (each box once, from the shares)
    finalizes into a checkpoint equal to the full tensors; a partial chunk is refused."""
    from flowrl.checkpoint import begin_checkpoint, declared_chunks, finalize_checkpoint, load_full, write_chunks

    g = torch.Generator().manual_seed(7)
    spec = shard_spec(MODEL, ParallelDims(dp=1, tp=2, pp=2), make_vocab_size_divisible_by=8)
    full = {n: torch.randn(s, generator=g) for n, s in spec.params.items()}
    tmp = begin_checkpoint(tmp_path / "step_1", spec, optim_states=("exp_avg",))
    chunks = declared_chunks(tmp)
    owners = chunk_owners(spec, chunks)
    name = "model.layers.0.mlp.down_proj.weight"
    with pytest.raises(ValueError, match="not whole chunks"):
        write_chunks(tmp, [(None, name, ((0, 1), (0, chunks[name][1])), torch.zeros(1, chunks[name][1]))])
    with pytest.raises(ValueError, match="was not declared"):
        write_chunks(tmp, [("exp_avg_sq", name, ((0, 1), (0, 1)), torch.zeros(1, 1))])
    for key in spec.shards:
        local = shard_arrays(spec, full, key)
        ranges = {n: _deal(t.numel(), 3, g) for n, t in local.items()}
        boxes = owned_boxes(spec, key, chunks, owners)
        writes = []
        for box in boxes:
            flat = local[box.local].reshape(-1)
            region = torch.cat([box_elements(flat[s:e], s, box) for s, e in ranges[box.local]]).view(box.shape)
            writes += [(None, box.param, box.region, region), ("exp_avg", box.param, box.region, 2 * region)]
        write_chunks(tmp, writes)
    path = finalize_checkpoint(tmp, step=1)
    params, exp_avg = load_full(path, as_torch=True), load_full(path, state="exp_avg", as_torch=True)
    assert all(torch.equal(params[n], full[n]) and torch.equal(exp_avg[n], 2 * full[n]) for n in full)
