"""cluster.memory_limit from the node's memory, its workers and the checkpoint's size
(flowrl.cluster.host_memory): fake model folders (sparse files: sizes without bytes) and fake
inventories (FLOWRL_DEVICES, CUDA_VISIBLE_DEVICES, a fake nvidia-smi)."""

from __future__ import annotations

import pytest

from flowrl.cluster import host_memory as hm
from flowrl.config import ClusterConfig
from flowrl.config.errors import ConfigError

GiB = 1 << 30


def _model(tmp_path, **files: int):
    """A model folder whose files have the given sizes (sparse: nothing written)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for name, size in files.items():
        with open(folder / name.replace("_", "-").replace("-safetensors", ".safetensors").replace("-bin", ".bin"),
                  "wb") as f:
            f.truncate(size)
    return folder


def test_checkpoint_bytes_sums_the_safetensors_files_without_reading_them(tmp_path):
    folder = _model(tmp_path, model_00001_of_00002_safetensors=3 * GiB, model_00002_of_00002_safetensors=1 * GiB,
                    pytorch_model_bin=7 * GiB)
    assert hm.checkpoint_bytes(folder) == 4 * GiB  # the .bin is ignored when safetensors exist
    only_bin = tmp_path / "b"
    only_bin.mkdir()
    with open(only_bin / "pytorch_model.bin", "wb") as f:
        f.truncate(5 * GiB)
    assert hm.checkpoint_bytes(only_bin) == 5 * GiB
    assert hm.checkpoint_bytes("") == 0 and hm.checkpoint_bytes("Qwen/Qwen2-0.5B") == 0  # unknown: a hub name


def test_load_bytes_is_two_copies_and_the_runtime():
    # 2 x 2 GiB (mapped pages + one full copy) + 1 GiB runtime = 5 GiB; offloaded state on top
    assert hm.load_bytes(2 * GiB) == 5 * GiB
    assert hm.load_bytes(2 * GiB, extra_bytes=3 * GiB) == 8 * GiB


def test_auto_gives_each_worker_its_share_of_the_node():
    # 8 GPUs' workers + a controller on a 1000 GiB node: 0.9 x 1000 / 9 = 100 GiB each
    assert hm.worker_memory_limit(host_bytes=1000 * GiB, workers=9, ckpt_bytes=16 * GiB) == 100 * GiB


def test_auto_is_refused_when_the_node_cannot_hold_the_load_naming_the_key_and_the_fix():
    # a 7B bf16 checkpoint (~15 GiB) needs 31 GiB per worker; 9 workers on 128 GiB get 12.8
    with pytest.raises(ConfigError, match="cluster.memory_limit") as info:
        hm.worker_memory_limit(host_bytes=128 * GiB, workers=9, ckpt_bytes=15 * GiB)
    err = info.value
    assert "9 worker processes" in err.problem and "31.0 GiB" in err.problem
    assert "at most 3 worker process(es) per node" in err.fix  # 115.2 // 31 = 3


def test_default_is_4gib_on_cpu_and_auto_on_gpu():
    cpu = hm.resolve_memory_limit("default", workers=3, has_gpus=False, host_bytes=64 * GiB, ckpt_bytes=GiB)
    assert cpu == "4GiB"
    gpu = hm.resolve_memory_limit("default", workers=3, has_gpus=True, host_bytes=60 * GiB, ckpt_bytes=GiB)
    assert gpu == int(60 * GiB * 0.9) // 3 == 18 * GiB


def test_a_written_limit_passes_as_written_and_warns_when_below_the_load(capsys):
    assert hm.resolve_memory_limit("8GiB", workers=2, has_gpus=True, host_bytes=64 * GiB, ckpt_bytes=GiB) == "8GiB"
    assert capsys.readouterr().err == ""
    # a 1B fp32 checkpoint (4 GiB) needs 9 GiB: the old default kills it mid-load
    assert hm.resolve_memory_limit("4GiB", workers=2, has_gpus=False, host_bytes=64 * GiB,
                                   ckpt_bytes=4 * GiB) == "4GiB"
    assert "cluster.memory_limit=4GiB" in capsys.readouterr().err
    assert hm.resolve_memory_limit("0.5", workers=2, has_gpus=False, host_bytes=64 * GiB, ckpt_bytes=4 * GiB) == "0.5"
    assert hm.resolve_memory_limit("0", workers=2, has_gpus=False, host_bytes=64 * GiB, ckpt_bytes=4 * GiB) == "0"
    assert capsys.readouterr().err == ""


def _no_smi(cmd):
    raise OSError("no nvidia-smi")


@pytest.mark.parametrize(("environ", "expect_auto"), [
    ({}, False),  # no GPU seen: 4GiB as before
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, True),
    ({"FLOWRL_DEVICES": "8"}, True),
    ({"FLOWRL_DEVICES": "cpu", "CUDA_VISIBLE_DEVICES": "0"}, False),
])
def test_local_default_follows_the_inventory(tmp_path, environ, expect_auto):
    folder = _model(tmp_path, model_safetensors=GiB)
    got = hm.local_memory_limit("default", workers=4, model_path=str(folder), environ=environ, runner=_no_smi,
                                host_bytes=40 * GiB)
    assert got == (9 * GiB if expect_auto else "4GiB")  # 0.9 x 40 / 4


def test_local_default_asks_nvidia_smi_without_cuda_visible_devices(tmp_path):
    got = hm.local_memory_limit("default", workers=2, environ={}, runner=lambda cmd: "GPU 0: H200 (UUID: x)\n",
                                host_bytes=20 * GiB)
    assert got == 9 * GiB


def test_start_cluster_refuses_before_any_worker_starts(tmp_path, monkeypatch):
    from flowrl.cluster import launch
    from flowrl.config.pools import Pool

    def no_cluster(*a, **k):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(launch, "_start_local", no_cluster)
    monkeypatch.setattr(launch.private, "prepare", no_cluster)
    monkeypatch.setattr("distributed.system.MEMORY_LIMIT", 64 * GiB)
    folder = _model(tmp_path, model_safetensors=1 << 40)  # a 1 TiB checkpoint fits no node here
    cfg = ClusterConfig(memory_limit="auto", low_latency=False)
    with pytest.raises(ConfigError, match="cluster.memory_limit='auto'"):
        launch.start_cluster(cfg, [Pool(name="actor", groups=("actor",), workers=2)], model_path=str(folder))


def test_the_config_default_is_default_and_accepts_the_old_forms():
    assert ClusterConfig().memory_limit == "default"
    for ok in ("default", "auto", "4GiB", "0.25", "0"):
        assert ClusterConfig(memory_limit=ok).memory_limit == ok
