"""A rank process placed by the device plan (flowrl.actors.device), with a fake torch.cuda: the
variables are set before CUDA initialises, then the device; CPU ranks change nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flowrl.actors.device import apply_placement, placement_of
from flowrl.parallel.device_plan import Inventory, GroupLayout, plan_devices


class FakeCuda:
    """Records the calls in order; sees as many GPUs as CUDA_VISIBLE_DEVICES names."""

    def __init__(self, environ: dict, initialized: bool = False) -> None:
        self.environ, self.initialized, self.calls = environ, initialized, []

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        self.calls.append(("device_count", self.environ.get("CUDA_VISIBLE_DEVICES")))
        return len(self.environ.get("CUDA_VISIBLE_DEVICES", "").split(","))

    def set_device(self, index: int) -> None:
        self.calls.append(("set_device", index, self.environ.get("CUDA_VISIBLE_DEVICES")))
        self.initialized = True


def _plan(gpus_per_node: int):
    layouts = [GroupLayout(name="actor", world_size=4, pool="p", size_key="actor.data_parallel_size", size_value=4)]
    return plan_devices(Inventory(gpus_per_node=gpus_per_node), layouts)


def test_gpu_rank_sees_only_its_gpu_before_set_device():
    environ: dict = {}
    cuda = FakeCuda(environ)
    device = apply_placement(placement_of(_plan(4).of("actor", 2)), torch=SimpleNamespace(cuda=cuda), environ=environ)
    assert device == "cuda:0"
    assert environ == {"CUDA_VISIBLE_DEVICES": "2", "LOCAL_RANK": "2"}
    # the variable was in place when CUDA was first asked, and the device set after it
    assert cuda.calls == [("device_count", "2"), ("set_device", 0, "2")]


def test_cpu_rank_changes_nothing_about_cuda():
    environ: dict = {}
    cuda = FakeCuda(environ)
    assert apply_placement(placement_of(_plan(0).of("actor", 1)), torch=SimpleNamespace(cuda=cuda), environ=environ) == "cpu"
    assert environ == {"LOCAL_RANK": "1"} and cuda.calls == []
    assert apply_placement(placement_of(None), torch=SimpleNamespace(cuda=cuda), environ=environ) == "cpu"


def test_a_process_that_touched_cuda_first_is_refused():
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    cuda = FakeCuda(environ, initialized=True)
    with pytest.raises(RuntimeError, match="initialised CUDA before its rank was placed"):
        apply_placement(placement_of(_plan(4).of("actor", 3)), torch=SimpleNamespace(cuda=cuda), environ=environ)


def test_fewer_gpus_than_planned_is_an_error():
    environ: dict = {}

    class Short(FakeCuda):
        def device_count(self) -> int:
            return 0

    with pytest.raises(RuntimeError, match="sees 0 of them"):
        apply_placement(placement_of(_plan(4).of("actor", 0)), torch=SimpleNamespace(cuda=Short(environ)), environ=environ)
