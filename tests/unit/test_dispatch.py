import pyarrow as pa
import pytest

from flowrl.actors.dispatch import Gather, GroupMesh, Scatter, gather, scatter


def test_mesh_rank_order_is_megatrons_tp_fastest_then_dp_then_pp():
    mesh = GroupMesh(dp=2, tp=2, pp=2)
    # rank = tp + 2 * (dp + 2 * pp)
    assert [mesh.rank_coords(r) for r in range(8)] == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)
    ]
    assert all(mesh.coords_rank(*mesh.rank_coords(r)) == r for r in range(8))
    assert mesh.output_ranks() == [4, 6]  # tp 0 of the last stage, per dp rank
    with pytest.raises(ValueError):
        mesh.rank_coords(8)


def test_split_gives_tp_and_pp_peers_the_same_share():
    mesh = GroupMesh(dp=2, tp=2, pp=1)
    t = pa.table({"x": [0, 1, 2, 3]})
    shares = scatter(Scatter.SPLIT, t, mesh)
    assert [s.column("x").to_pylist() for s in shares] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert gather(Gather.CONCAT, shares, mesh).column("x").to_pylist() == [0, 1, 2, 3]


def test_broadcast_and_gather_modes():
    mesh = GroupMesh(dp=3)
    assert scatter(Scatter.BROADCAST, "w", mesh) == ["w", "w", "w"]
    assert gather(Gather.ALL, [1, 2, 3], mesh) == [1, 2, 3]
    assert gather(Gather.FIRST, [1, 2, 3], mesh) == 1
    assert gather(Gather.OUTPUT, [1, 2, 3], mesh) == 1
    with pytest.raises(TypeError):
        scatter(Scatter.SPLIT, [1, 2], mesh)
    with pytest.raises(ValueError):
        gather(Gather.ALL, [1], mesh)
