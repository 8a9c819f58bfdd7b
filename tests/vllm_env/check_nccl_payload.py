"""The split placement's NCCL weight sync (``flowrl.backends.generate.vllm_nccl``) through vLLM's
own code, without a GPU: the init info and every bucket's update info flowrl builds cross vLLM's
msgpack channel as ``collective_rpc`` arguments and parse into vLLM's ``NCCLWeightTransferInitInfo``
/ ``NCCLWeightTransferUpdateInfo``; they equal what vLLM's own trainer engine would send; the worker
extension swaps in vLLM's NCCL engine through vLLM's factory; and vLLM's real
``NCCLWeightTransferEngine.update_weights`` (unpacked ``receive_weights``) takes flowrl's sender's
broadcasts, through a communicator that passes tensors in memory, into the model's
``load_weights`` with every tensor intact. Runs in the vLLM environment (``test_vllm_env.py``)."""

import os
import queue
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)  # vLLM's default: msgpack without pickle

from vllm.config.weight_transfer import WeightTransferConfig  # noqa: E402
from vllm.distributed.weight_transfer import nccl_common  # noqa: E402
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # noqa: E402
from vllm.distributed.weight_transfer.nccl_engine import (  # noqa: E402
    NCCLWeightTransferEngine, NCCLWeightTransferInitInfo, NCCLWeightTransferUpdateInfo)
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402

from flowrl.backends.generate.vllm_nccl import NcclSender, nccl_sync_job  # noqa: E402
from flowrl.backends.generate.vllm_worker import WeightReloadExtension  # noqa: E402
from flowrl.backends.reshard.job import make_job  # noqa: E402
from flowrl.comm import JointSpec  # noqa: E402
from flowrl.parallel.mesh import ParallelDims  # noqa: E402
from flowrl.parallel.shard_spec import ModelShape  # noqa: E402

SHAPE = ModelShape(vocab_size=64, hidden_size=16, ffn_hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=4)


def _job(wire="bfloat16"):
    src, dst = ParallelDims(dp=2, tp=1, pp=1), ParallelDims(dp=2, tp=2, pp=1)
    split = make_job(SHAPE, src=src, dst=dst, placement="split", src_style="hf", dst_style="vllm", wire_dtype=wire,
                     joint=JointSpec("actor+rollout", "", 0, 6))
    return nccl_sync_job(split, engine_tp=2, endpoints=[("10.1.2.3", 41000), ("10.1.2.4", 41001)], model_dir=None,
                         bucket_bytes=4096)


def _through_the_engine_core(method, kwargs):
    """A ``collective_rpc`` as the engine core client encodes it and the engine core decodes it
    (``LLM.init_weight_transfer_engine`` / ``update_weights`` pass their dict as ``kwargs``)."""
    bufs = MsgpackEncoder().encode((0, 1, "collective_rpc", (method, None, (), kwargs)))
    return MsgpackDecoder().decode(bufs)[3][3]


def _engine(model=None):
    parallel = SimpleNamespace(data_parallel_index=0, world_size=2, rank=1)
    vllm_config = SimpleNamespace(parallel_config=parallel, model_config=SimpleNamespace())
    return WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend="nccl"), vllm_config,
                                                     torch.device("cpu"), model or torch.nn.Linear(1, 1))


def test_the_init_info_crosses_vllms_channel_and_parses():
    job = _job()
    for e in range(job.num_engines):
        sent = _through_the_engine_core("init_weight_transfer_engine", {"init_info": job.init_info(e)})["init_info"]
        parsed = _engine().parse_init_info(sent)
        assert isinstance(parsed, NCCLWeightTransferInitInfo)
        assert (parsed.master_address, parsed.master_port) == job.endpoints[e]
        assert parsed.rank_offset == 1 and parsed.world_size == 3 and parsed.packed is False
        assert parsed.nccl_unique_id_bytes is None  # the TCPStore rendezvous
        # what vLLM's own trainer engine sends its workers for the same group (worker_init_payload)
        theirs = nccl_common.worker_init_payload(NCCLWeightTransferInitInfo(
            master_address=job.endpoints[e][0], master_port=job.endpoints[e][1], rank_offset=1, world_size=3,
            packed=False))
        assert {**theirs, **job.init_info(e)} == theirs


def test_the_workers_ranks_in_the_group_follow_the_sender(monkeypatch):
    job = _job()
    joined = []
    monkeypatch.setattr(nccl_common, "stateless_init_process_group",
                        lambda host, port, rank, world_size, device: joined.append((host, port, rank, world_size)))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    for tp_rank in (0, 1):
        parallel = SimpleNamespace(data_parallel_index=0, world_size=2, rank=tp_rank)
        nccl_common.worker_init_process_group(_engine().parse_init_info(job.init_info(1)), parallel)
    nccl_common.trainer_init(job.trainer_init_info(1), rank=0)  # the sender's side (flowrl's open_endpoint)
    assert joined == [("10.1.2.4", 41001, 1, 3), ("10.1.2.4", 41001, 2, 3), ("10.1.2.4", 41001, 0, 3)]


def test_every_bucket_crosses_vllms_channel_and_parses_as_vllms_trainer_would_send_it():
    job = _job()
    infos = job.update_infos()
    assert len(infos) > 1
    for info in infos:
        sent = _through_the_engine_core("update_weights", {"update_info": info})["update_info"]
        parsed = _engine().parse_update_info(sent)
        assert isinstance(parsed, NCCLWeightTransferUpdateInfo)
        # vLLM's NCCLTrainerWeightTransferEngine.send_weights builds it so from its metadata
        theirs = NCCLWeightTransferUpdateInfo(
            names=info["names"], dtype_names=[str(torch.bfloat16).split(".")[-1]] * len(info["names"]),
            shapes=[list(s) for s in info["shapes"]])
        assert asdict(parsed) == asdict(theirs)
    with pytest.raises(ValueError, match="Invalid update_info"):
        _engine().parse_update_info({**infos[0], "packed": True})  # packing is the init's, not a bucket's


def test_the_worker_extension_swaps_in_vllms_nccl_engine():
    worker = SimpleNamespace(vllm_config=_engine().vllm_config, device=torch.device("cpu"), _weight_update_active=False,
                             model_runner=SimpleNamespace(get_model=lambda: torch.nn.Linear(1, 1)))
    worker.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="ipc"), worker.vllm_config, worker.device, torch.nn.Linear(1, 1))
    assert WeightReloadExtension.flowrl_use_weight_transfer(worker, "nccl") == "NCCLWeightTransferEngine"
    engine = worker.weight_transfer_engine
    assert isinstance(engine, NCCLWeightTransferEngine)
    WeightReloadExtension.flowrl_use_weight_transfer(worker, "nccl")
    assert worker.weight_transfer_engine is engine  # once: a later call keeps the joined engine


class _Wire:
    """A ``PyNcclCommunicator`` for both ends in one process: the sender's broadcasts queue
    copies, the receiver's fill its tensor from them."""

    def __init__(self):
        self.queue = queue.Queue()

    def broadcast(self, tensor, src, stream=None):
        assert src == 0
        if tensor.data_ptr() in self.receiving:
            tensor.copy_(self.queue.get(timeout=10))
        else:
            self.queue.put(tensor.clone())


def test_vllms_nccl_engine_loads_what_flowrls_sender_broadcasts(monkeypatch):
    job = _job()
    full = job.gather_job().specs()[1].params
    state = {n: torch.randn(s).to(torch.bfloat16) for n, s in full.items()}
    wire = _Wire()
    wire.receiving = set()
    sender = NcclSender(job, 0, opener=lambda info: wire)  # trainer rank 0 sends to engine 0
    assert sender.engines == [0]
    sender.send(job, state)  # every bucket's tensors, queued in order

    loaded = {}

    class Model(torch.nn.Module):
        def load_weights(self, weights):
            for name, tensor in weights:
                loaded[name] = tensor.clone()

    engine = _engine(Model())
    engine.model_update_group = wire  # what init_transfer_engine would have joined
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: None)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **k: None)
    real_empty = torch.empty

    def empty(*args, **kwargs):  # mark the engine's receive buffers
        t = real_empty(*args, **kwargs)
        wire.receiving.add(t.data_ptr())
        return t

    monkeypatch.setattr(torch, "empty", empty)
    for info in job.update_infos():
        engine.update_weights(_through_the_engine_core("update_weights", {"update_info": info})["update_info"])
    monkeypatch.setattr(torch, "empty", real_empty)
    assert wire.queue.empty()
    assert list(loaded) == list(full)
    assert all(loaded[n].dtype == torch.bfloat16 and torch.equal(loaded[n], state[n]) for n in full)
