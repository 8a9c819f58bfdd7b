"""The CUDA weight update's payload through vLLM's own code, without a GPU or an engine: the
bytes flowrl's driver sends (``encode_ipc_bucket`` of the update info ``ipc_bucket`` builds) cross
vLLM's msgpack channel as ``collective_rpc`` arguments (``MsgpackEncoder`` / ``MsgpackDecoder``, as
the engine core client and the engine core use them), the worker extension decodes them and
vLLM's IPC weight-transfer engine parses them (``parse_update_info``) into its update info. The
form the backend sent before (the update info as a dict, ``LLM.update_weights``) is refused by
the same encoder. Runs in the vLLM environment (``test_vllm_env.py``); a few seconds."""

import os
from types import SimpleNamespace

import pytest
import torch

os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)  # vLLM's default: msgpack without pickle

from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402

from flowrl.backends.generate.vllm_worker import decode_ipc_bucket, encode_ipc_bucket  # noqa: E402


def _cuda_reduce_args(tensor):
    """``reduce_tensor``'s arguments for a CUDA tensor (torch/multiprocessing/reductions.py), its
    ``_share_cuda_`` fields as placeholder bytes: the classes, ``torch.Size`` and ``torch.dtype``."""
    return (type(tensor), tensor.size(), tensor.stride(), 0, torch.storage.TypedStorage, tensor.dtype, 0,
            b"\x01" * 64, tensor.nbytes, 0, False, b"\x02" * 16, 0, b"\x03" * 64, True)


STATE = {"model.embed_tokens.weight": torch.zeros(32, 8, dtype=torch.bfloat16),
         "model.norm.weight": torch.zeros(8)}
UUIDS = ["GPU-aaaa", "GPU-bbbb"]  # a tp-2 replica: every tensor has a handle per engine GPU
INFO = {"names": list(STATE), "dtype_names": ["bfloat16", "float32"], "shapes": [[32, 8], [8]],
        "ipc_handles": [{u: _cuda_reduce_args(t) for u in UUIDS} for t in STATE.values()]}


def _through_the_engine_core(method, args=(), kwargs=None):
    """A ``collective_rpc`` as ``SyncMPClient.call_utility`` encodes it and the engine core's
    generic decoder reads it back."""
    bufs = MsgpackEncoder().encode((0, 1, "collective_rpc", (method, None, args, kwargs)))
    return MsgpackDecoder().decode(bufs)[3]


def test_the_bucket_flowrl_sends_reaches_vllms_ipc_parser_intact():
    method, _, args, _ = _through_the_engine_core("flowrl_update_weights_ipc", (encode_ipc_bucket(INFO),))
    assert method == "flowrl_update_weights_ipc"
    info = decode_ipc_bucket(args[0])  # the worker extension's half
    parsed = IPCWeightTransferEngine.parse_update_info(SimpleNamespace(update_info_cls=IPCWeightTransferEngine.update_info_cls), info)
    assert parsed.names == list(STATE) and parsed.dtype_names == ["bfloat16", "float32"]
    assert parsed.shapes == [[32, 8], [8]]
    for got, tensor in zip(parsed.ipc_handles, STATE.values()):
        assert sorted(got) == UUIDS
        args = got["GPU-bbbb"]
        assert args == _cuda_reduce_args(tensor)
        assert args[0] is torch.Tensor and args[4] is torch.storage.TypedStorage and args[5] is tensor.dtype
        # vLLM's receive_weights overwrites index 6 (the device) and calls rebuild_cuda_tensor(*args)
        assert len(args) == 15


def test_the_update_info_as_a_dict_is_refused_by_vllms_channel():
    # what the backend sent before: LLM.update_weights({"update_info": INFO}) -> collective_rpc kwargs
    with pytest.raises(TypeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        _through_the_engine_core("update_weights", kwargs={"update_info": INFO})


def test_the_init_info_parses():
    _, _, _, kwargs = _through_the_engine_core("init_weight_transfer_engine", kwargs={"init_info": {"packed": False}})
    parsed = IPCWeightTransferEngine.parse_init_info(SimpleNamespace(init_info_cls=IPCWeightTransferEngine.init_info_cls), kwargs["init_info"])
    assert parsed.packed is False
