"""The vllm backend's calls into its engine, recorded by a fake ``vllm.LLM`` (no vLLM here): the
sleep/wake/load order of a colocated step, the CUDA weight update's calls and payload, one seed per
request batch, and the engine dtype. The payload's passage through vLLM's own serializer and
parsers is checked in the vLLM environment (``tests/vllm_env/check_weight_payload.py``)."""

import sys
import types

import pytest
import torch

from flowrl.backends.generate import vllm as vbackend
from flowrl.backends.generate.vllm_worker import decode_ipc_bucket
from flowrl.backends.interfaces import SamplingParams

# verl's order around a sync of a colocated engine (vllm_rollout: rollout_mode / trainer_mode;
# NeMo-RL's vllm_generation does the same): generation, sleep, then at the sync wake the weights,
# load, wake the KV cache; never a wake of everything on top of woken weights.
VERL_ORDER = [("generate",), ("sleep", 1), ("wake_up", ("weights",)), ("load",), ("wake_up", ("kv_cache",)),
              ("generate",)]


class FakeLLM:
    """Records what the backend asks of ``vllm.LLM``; each ``collective_rpc`` answers for one
    worker, running the seeding method as the worker would (it shares this process's RNG)."""

    def __init__(self):
        self.calls = []

    def generate(self, requests, sampling, use_tqdm, lora_request):
        self.calls.append(("generate", len(requests), sampling))
        draw = torch.rand(1).item()  # what a sampler drawing from the global generator sees
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[7], logprobs=[{7: types.SimpleNamespace(logprob=draw)}])])
                for _ in requests]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags is not None else None))

    def collective_rpc(self, name, args=()):
        self.calls.append(("rpc", name, args))
        if name == "flowrl_seed":
            torch.manual_seed(args[0])
            return [None]
        if name == "flowrl_update_weights_ipc":
            return [len(decode_ipc_bucket(args[0])["names"])]
        if name == "flowrl_load_lora":
            return [len(args[0]) // 2]
        return [len(args[0])]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def start_weight_update(self):
        self.calls.append(("start_weight_update",))

    def finish_weight_update(self):
        self.calls.append(("finish_weight_update",))


@pytest.fixture
def fake_vllm(monkeypatch):
    """``vllm.SamplingParams`` and ``vllm.inputs.TokensPrompt`` as plain records."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


def _generator(*, on_cuda=False, lora=None, in_process=True):
    """A VLLMGenerator around a FakeLLM, with the attributes its __init__ sets."""
    gen = object.__new__(vbackend.VLLMGenerator)
    gen.llm, gen.on_cuda, gen.in_process, gen.lora = FakeLLM(), on_cuda, in_process, lora
    gen.free_cache_engine, gen.eos_ids, gen.tensor_parallel_size = True, {2}, 1
    gen.model_dir = None  # no checkpoint-layout conversion of the fake's tensors
    return gen


def _order(calls):
    """The calls in VERL_ORDER's terms (weight and adapter loads are one ``load``)."""
    loads = {"flowrl_reload_weights", "flowrl_load_lora", "flowrl_update_weights_ipc"}
    out = []
    for call in calls:
        if call[0] in ("generate", "sleep", "wake_up"):
            out.append(call[:1] if call[0] == "generate" else call)
        elif call[0] == "rpc" and call[1] in loads and (not out or out[-1] != ("load",)):
            out.append(("load",))
    return out


SAMPLED = SamplingParams(n=2, temperature=1.0, max_new_tokens=4)


def test_a_colocated_step_wakes_weights_loads_then_wakes_the_kv_cache(fake_vllm):
    gen = _generator()
    gen.generate([[1, 2]], SAMPLED, seed=3)
    gen.sleep()
    assert gen.is_sleeping
    gen.load_hf_state({"model.embed_tokens.weight": torch.zeros(4, 2)})
    assert not gen.is_sleeping  # fully awake after the sync: generate has nothing left to wake
    gen.generate([[1, 2]], SAMPLED, seed=4)
    assert _order(gen.llm.calls) == VERL_ORDER
    assert ("wake_up", None) not in gen.llm.calls  # no wake of everything (it maps the weights again)


def test_a_sleeping_engine_that_generates_before_any_sync_wakes_everything_once(fake_vllm):
    gen = _generator()
    gen.sleep()
    gen.sleep()  # a second sleep is a no-op
    gen.generate([[1]], SAMPLED)
    gen.generate([[1]], SAMPLED)
    assert [c for c in gen.llm.calls if c[0] in ("sleep", "wake_up")] == [("sleep", 1), ("wake_up", ("weights", "kv_cache"))]


def test_lora_adapters_follow_the_same_order(fake_vllm, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, lid, lora_path: (name, lid)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    gen = _generator(lora={"rank": 8, "alpha": 16, "target_modules": "all-linear"})
    gen.generate([[1]], SAMPLED)
    gen.sleep()
    gen.load_hf_state({"model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.zeros(8, 4),
                       "model.layers.0.self_attn.q_proj.lora_B.default.weight": torch.zeros(4, 8)})
    gen.generate([[1]], SAMPLED)
    assert _order(gen.llm.calls) == VERL_ORDER
    assert gen._lora_request == ("flowrl-1", 1)


def _cuda_reduce_args(tensor):
    """What ``torch.multiprocessing.reductions.reduce_tensor`` returns for a CUDA tensor (its
    ``_share_cuda_`` fields as placeholder bytes): the classes, ``torch.Size`` and ``torch.dtype``
    vLLM's msgpack channel refuses."""
    return (type(tensor), tensor.size(), tensor.stride(), 0, torch.storage.TypedStorage, tensor.dtype, 0,
            b"\x01" * 64, tensor.nbytes, 0, False, b"\x02" * 16, 0, b"\x03" * 64, True)


def test_the_cuda_update_sends_pickled_buckets_between_start_and_finish(monkeypatch):
    shared = []

    def fake_bucket(chunk, devices):
        shared.append([name for name, _ in chunk])
        info = {"names": [n for n, _ in chunk], "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in chunk],
                "shapes": [list(t.shape) for _, t in chunk],
                "ipc_handles": [{uuid: _cuda_reduce_args(t) for uuid in devices} for _, t in chunk]}
        return info, [t for _, t in chunk]

    monkeypatch.setattr(vbackend, "ipc_bucket", fake_bucket)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid=f"GPU-{d}"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    monkeypatch.setattr(vbackend, "IPC_BUCKET_BYTES", 64)
    gen = _generator(on_cuda=True)
    gen.sleep()
    state = {"a": torch.zeros(16, dtype=torch.bfloat16), "b": torch.zeros(4, 4), "c": torch.zeros(8)}
    gen.load_hf_state(state)  # buckets of 64 B: a (32 B) + b (64 B), then c (32 B)
    names = [c[0] if c[0] != "rpc" else c[1] for c in gen.llm.calls]
    assert names == ["sleep", "wake_up", "start_weight_update", "flowrl_update_weights_ipc",
                     "flowrl_update_weights_ipc", "finish_weight_update", "wake_up", "reset_prefix_cache"]
    assert [c[1] for c in gen.llm.calls if c[0] == "wake_up"] == [("weights",), ("kv_cache",)]
    assert shared == [["a", "b"], ["c"]]
    payload = [c[2] for c in gen.llm.calls if c[0] == "rpc"][0]
    assert len(payload) == 1 and isinstance(payload[0], bytes)  # bytes: what msgpack passes as they are
    info = decode_ipc_bucket(payload[0])
    assert info["names"] == ["a", "b"] and info["dtype_names"] == ["bfloat16", "float32"]
    assert info["shapes"] == [[16], [4, 4]] and info["ipc_handles"][1]["GPU-0"][5] is torch.float32


def test_a_failed_bucket_still_closes_the_update(monkeypatch):
    monkeypatch.setattr(vbackend, "ipc_bucket", lambda chunk, devices: ({"names": [], "dtype_names": [], "shapes": [],
                                                                         "ipc_handles": []}, []))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid="GPU-0"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    gen = _generator(on_cuda=True)
    with pytest.raises(RuntimeError, match="workers loaded \\[0\\] of a bucket of 1"):
        gen.load_hf_state({"a": torch.zeros(2)})
    assert gen.llm.calls[-1] == ("finish_weight_update",)


def test_the_ipc_bucket_unpickler_takes_tensor_handles_only():
    import pickle

    from flowrl.backends.generate.vllm_worker import encode_ipc_bucket

    info = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]], "ipc_handles": [{"GPU-0": _cuda_reduce_args(torch.zeros(2))}]}
    assert decode_ipc_bucket(encode_ipc_bucket(info))["ipc_handles"][0]["GPU-0"][1] == torch.Size([2])
    evil = pickle.dumps({**info, "names": [types.SimpleNamespace()]})
    with pytest.raises(pickle.UnpicklingError, match="types.SimpleNamespace is not a tensor"):
        decode_ipc_bucket(evil)
    with pytest.raises(ValueError, match="expected"):
        encode_ipc_bucket({"names": []})


def test_one_seed_per_request_batch_and_the_callers_generators_are_left_alone(fake_vllm):
    gen = _generator()
    torch.manual_seed(123)
    expected_next = torch.rand(1).item()
    torch.manual_seed(123)
    _, first = gen.generate([[1], [2]], SAMPLED, seed=5)
    assert torch.rand(1).item() == expected_next  # an in-process engine's seeding does not leak out
    _, again = gen.generate([[1], [2]], SAMPLED, seed=5)
    _, other = gen.generate([[1], [2]], SAMPLED, seed=6)
    assert first == again and first != other
    seeds = [c[2] for c in gen.llm.calls if c[0] == "rpc"]
    assert seeds == [(5,), (5,), (6,)]  # once per call, not per sample
    batches = [c for c in gen.llm.calls if c[0] == "generate"]
    assert batches[0][1] == 4 and not hasattr(batches[0][2], "seed")  # 2 prompts x n=2, no per-request seed
    gen.llm.calls.clear()
    gen.generate([[1]], SamplingParams(n=1, temperature=0.0, max_new_tokens=4), seed=5)
    assert [c[0] for c in gen.llm.calls] == ["generate"]  # greedy draws nothing: no seeding


def test_external_launcher_needs_the_callers_process_group():
    with pytest.raises(ValueError, match="external_launcher=True.*none is initialised; fix: call "
                                         "torch.distributed.init_process_group"):
        vbackend._check_launcher_group(1)


def test_engine_dtype_is_bf16_on_a_gpu_and_lora_in_fp32_there_is_refused():
    assert vbackend.engine_dtype("auto", on_cuda=True, lora=None) == "bfloat16"
    assert vbackend.engine_dtype("auto", on_cuda=False, lora=None) == "float32"
    assert vbackend.engine_dtype("float32", on_cuda=True, lora=None) == "float32"
    assert vbackend.engine_dtype("auto", on_cuda=True, lora={"rank": 8}) == "bfloat16"
    assert vbackend.engine_dtype("float32", on_cuda=False, lora={"rank": 8}) == "float32"  # the CPU build runs it
    with pytest.raises(ValueError, match="model.dtype=float32 with model.lora_rank.*fix: model.dtype=auto"):
        vbackend.engine_dtype("float32", on_cuda=True, lora={"rank": 8})
