"""Joint process groups (flowrl.comm.joint): built once per name, misuse named clearly."""

from __future__ import annotations

import pytest

from flowrl.comm import joint
from flowrl.comm.joint import JointSpec


def test_join_once_per_name_and_clear_errors():
    pytest.importorskip("torch")
    from flowrl.comm import free_port

    spec = JointSpec("unit-joint", "127.0.0.1", free_port(), 1, 30.0)
    try:
        pg = joint.join(spec, 0)  # a one-process group: the rendezvous completes at once
        assert joint.join(spec, 0) is pg and joint.get("unit-joint") is pg
        assert pg.size() == 1 and pg.rank() == 0
        with pytest.raises(ValueError, match="joined as rank 0 of 1, now asked for rank 1 of 2"):
            joint.join(JointSpec("unit-joint", "127.0.0.1", 0, 2), 1)
        with pytest.raises(ValueError, match="rank 3 is outside"):
            joint.join(JointSpec("other", "127.0.0.1", 0, 2), 3)
    finally:
        joint.close_all()
    with pytest.raises(KeyError, match="not joined here"):
        joint.get("unit-joint")
