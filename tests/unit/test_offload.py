"""The trainer's state in host memory between its phases (``fsdp_config.param_offload`` /
``optimizer_offload``, megatron's offload): the order of the calls around each phase with a
recording engine, and where the state goes under a mocked CUDA device (on the CPU nothing
moves, so a CPU run's numbers are those of before)."""

import pyarrow as pa
import pytest
import torch

from flowrl.backends.interfaces import OffloadsState
from flowrl.backends.train.dp_policy import TorchDPEngine
from flowrl.backends.train.dp_value import TorchDPValueEngine
from flowrl.backends.train.fsdp_offload import OffloadSwitch, move_optimizer_state, offload_target
from flowrl.catalog.backends import TRAIN_BACKENDS, VALUE_BACKENDS
from flowrl.config import ActorConfig, OptimConfig
from flowrl.data import experience as ex
from flowrl.metrics import names
from flowrl.roles.memory import Residency


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.5
        return self.now


class _Engine:
    offloads = True

    def __init__(self):
        self.calls = []

    def offload_state(self):
        self.calls.append("offload")

    def onload_state(self, *, optimizer=False):
        self.calls.append(f"onload(optimizer={optimizer})")


def test_residency_moves_the_state_around_each_phase_once_and_times_it():
    engine = _Engine()
    res = Residency(engine, clock=_Clock())
    assert isinstance(engine, OffloadsState) and res.active
    res.release()  # after the build: to the host before the first generation
    with res.resident():
        engine.calls.append("logprobs")
    with res.resident(optimizer=True):
        engine.calls.append("update")
        with res.resident():  # a phase inside a phase (a checkpoint in an update): no more moves
            engine.calls.append("inner")
    assert engine.calls == ["offload", "onload(optimizer=False)", "logprobs", "offload",
                            "onload(optimizer=True)", "update", "inner", "offload"]
    # each move took one clock tick of 0.5 s: three offloads, two onloads
    assert res.take_metrics() == {names.ACTOR_OFFLOAD_S: 1.5, names.ACTOR_ONLOAD_S: 1.0}
    assert res.take_metrics() == {names.ACTOR_OFFLOAD_S: 0.0, names.ACTOR_ONLOAD_S: 0.0}


def test_an_engine_without_offload_is_never_called():
    engine = _Engine()
    engine.offloads = False
    res = Residency(engine)
    res.release()
    with res.resident(optimizer=True):
        pass
    assert engine.calls == [] and res.take_metrics() == {}
    assert not Residency(object()).active


class _RecordingDP(TorchDPEngine):
    """The dp engine with the offload calls recorded (dp itself has no offload switch)."""

    offloads = True
    calls: list = []

    def offload_state(self):
        self.calls.append("offload")

    def onload_state(self, *, optimizer=False):
        self.calls.append("onload+optim" if optimizer else "onload")

    def forward_logprobs(self, *args, **kwargs):
        self.calls.append("forward")
        return super().forward_logprobs(*args, **kwargs)

    def train_step(self, *args, **kwargs):
        self.calls.append("train_step")
        return super().train_step(*args, **kwargs)

    def reshard_source(self):
        self.calls.append("reshard_source")
        return super().reshard_source()


class _Specs:
    def spec(self, name):
        dp = TRAIN_BACKENDS.spec("dp")

        class Spec:
            checkpoint = dp.checkpoint

            @staticmethod
            def engine_class():
                return _RecordingDP

        return Spec()


def _table():
    return pa.table({
        "prompt_ids": ex.from_lists([[10, 11, 12]] * 2, ex.TOKEN_IDS),
        "response_ids": ex.from_lists([[20, 21], [22, 23]], ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1, 1]] * 2, pa.list_(pa.int8())),
        "advantages": ex.from_lists([[1.0, 1.0], [-1.0, -1.0]], ex.TOKEN_FLOATS),
    })


def test_policy_role_onloads_before_each_phase_and_offloads_after(tiny_model_dir, monkeypatch):
    from flowrl.roles import policy

    monkeypatch.setattr(policy, "TRAIN_BACKENDS", _Specs())
    _RecordingDP.calls = calls = []
    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False)
    role = policy.PolicyRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor, use_old_logprobs=False)
    assert calls == ["offload"]  # built, then off the device until its first phase
    role.compute_logprobs(_table())
    metrics = role.update(_table(), mini_batch_rows=2)
    role.hf_state_dict()
    assert calls == ["offload", "onload", "forward", "offload", "onload+optim", "train_step", "offload",
                     "onload", "offload"]
    assert metrics[names.ACTOR_OFFLOAD_S] >= 0 and metrics[names.ACTOR_ONLOAD_S] >= 0


class _RecordingValue(TorchDPValueEngine):
    """The dp value engine with the offload calls recorded (the critic's fsdp engine has the switch)."""

    offloads = True
    calls: list = []

    def offload_state(self):
        self.calls.append("offload")

    def onload_state(self, *, optimizer=False):
        self.calls.append("onload+optim" if optimizer else "onload")

    def forward_values(self, *args, **kwargs):
        self.calls.append("forward")
        return super().forward_values(*args, **kwargs)

    def train_step_values(self, *args, **kwargs):
        self.calls.append("train_step")
        return super().train_step_values(*args, **kwargs)


def test_critic_role_onloads_before_each_phase_and_offloads_after(tiny_model_dir, monkeypatch, tmp_path):
    from flowrl.config import CriticConfig
    from flowrl.roles import critic

    dp = VALUE_BACKENDS.spec("dp")
    monkeypatch.setattr(critic, "VALUE_BACKENDS", type("Specs", (), {"spec": staticmethod(lambda name: type(
        "Spec", (), {"checkpoint": dp.checkpoint, "engine_kwargs": None, "engine_class": staticmethod(
            lambda: _RecordingValue)})())}))
    _RecordingValue.calls = calls = []
    cfg = CriticConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3))
    role = critic.CriticRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), critic=cfg, response_length=2)
    assert calls == ["offload"]  # built, then off the device until its first phase
    values = role.compute_values(_table()).column("values")
    table = _table().append_column("values", values).append_column("returns", values)
    metrics = role.update(table, mini_batch_rows=2)
    role.save_checkpoint(str(tmp_path / "ckpt"), step=1, extra={})
    assert calls == ["offload", "onload", "forward", "offload", "onload+optim", "train_step", "offload",
                     "onload+optim", "offload"]
    assert metrics[names.CRITIC_OFFLOAD_S] >= 0 and metrics[names.CRITIC_ONLOAD_S] >= 0
    assert names.ACTOR_OFFLOAD_S not in metrics


# ----------------------------------------------------------------------------- where state goes
class _Module:
    def __init__(self):
        self.weight = torch.nn.Parameter(torch.zeros(4, 2))
        self.sent = []

    def parameters(self):
        return [self.weight]

    def to(self, device):
        self.sent.append(str(device))
        return self


def test_offload_goes_to_the_host_from_a_gpu_and_nowhere_on_the_cpu():
    assert offload_target("cuda:0") == torch.device("cpu") and offload_target("cpu") is None
    module = _Module()
    gpu = OffloadSwitch(torch.device("cuda:0"), params=True, optimizer=False, modules=lambda: [module],
                        get_optimizer=lambda: None)
    gpu.offload()
    gpu.onload(optimizer=True)
    assert module.sent == ["cpu", "cuda:0"] and gpu.moves == 2 and gpu.last_bytes == 4 * 2 * 4
    cpu = OffloadSwitch(torch.device("cpu"), params=True, optimizer=True, modules=lambda: [module],
                        get_optimizer=lambda: None)
    cpu.offload()
    cpu.onload(optimizer=True)
    assert module.sent == ["cpu", "cuda:0"] and cpu.moves == 0  # the CPU: in host memory already


def test_optimizer_state_moves_its_moments_and_leaves_the_step_alone():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    moved = move_optimizer_state(opt, torch.device("meta"))  # a device that is not the CPU's
    state = opt.state[p]
    assert moved == 2 * 3 * 4  # exp_avg and exp_avg_sq, 3 fp32 each
    assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta and not state["step"].is_meta


def test_fsdp_engine_on_a_gpu_moves_its_module_to_the_host_and_back(tiny_model_dir, monkeypatch):
    import torch.distributed as dist

    from flowrl.backends.train.fsdp_policy import FSDPEngine

    sent, plain = [], torch.nn.Module.to

    def to(self, *args, **kwargs):
        target = torch.device(kwargs.get("device", args[0] if args else "cpu"))
        sent.append(str(target))
        return self if target.type == "cuda" else plain(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(FSDPEngine, "_broadcast_parameters", lambda self: None)
    monkeypatch.setattr(FSDPEngine, "_meta_model", lambda self, model_dir, dtype: None)
    policies = []
    monkeypatch.setattr(FSDPEngine, "_shard", lambda self, reshard, offload, pd, rd: policies.append(offload) or self.model)
    engine = FSDPEngine(str(tiny_model_dir), device="cuda:0", param_offload=True, optimizer_offload=True, lr=1e-3)
    assert engine.offloads and policies == [False]  # moved between phases, not CPUOffloadPolicy
    sent.clear()
    engine.offload_state()
    engine.onload_state(optimizer=True)
    assert sent == ["cpu", "cuda:0"]
    ref = FSDPEngine(str(tiny_model_dir), device="cuda:0", trainable=False, param_offload=True, lr=1e-3)
    assert not ref.offloads and policies[-1] is True  # a frozen engine: verl's ref, CPUOffloadPolicy
    cpu = FSDPEngine(str(tiny_model_dir), param_offload=True, optimizer_offload=True, lr=1e-3)
    sent.clear()
    cpu.offload_state()
    cpu.onload_state(optimizer=True)
    assert cpu.offloads and sent == []  # the calls happen, nothing moves


class _Buffer:
    def __init__(self, calls):
        self.calls = calls

    def offload_to_cpu(self, move_params, move_grads):
        self.calls.append(("buffer_off", move_params, move_grads))

    def reload_from_cpu(self, move_params, move_grads):
        self.calls.append(("buffer_on", move_params, move_grads))


class _MegatronOptimizer:
    def __init__(self, calls):
        self.calls, self.chained_optimizers = calls, [self]

    def offload_to_cpu(self):
        self.calls.append("optim_off")

    def restore_from_cpu(self):
        self.calls.append("optim_on")


class _Chunk:
    def __init__(self, calls):
        self.buffers, self.expert_parallel_buffers = [_Buffer(calls)], []


@pytest.mark.parametrize("device,moved", [("cuda:0", True), ("cpu", False)])
def test_megatron_offload_uses_megatrons_buffers_and_optimizer_on_a_gpu_only(device, moved):
    from flowrl.backends.train.megatron.offload import MegatronOffload

    calls = []
    chunks, opt = [_Chunk(calls), _Chunk(calls)], _MegatronOptimizer(calls)
    off = MegatronOffload(device, params=True, grads=True, optimizer=True, chunks=lambda: chunks,
                          get_optimizer=lambda: opt, main_params=True)
    off.offload()
    off.onload(optimizer=False)  # a log-prob pass: the optimizer stays on the host
    off.onload(optimizer=True)
    want = [("buffer_off", True, True)] * 2 + ["optim_off"] + [("buffer_on", True, True)] * 2 \
        + [("buffer_on", True, True)] * 2 + ["optim_on"]
    assert calls == (want if moved else []) and off.offloads


def test_megatron_fp32_weights_move_only_the_optimizer_state():
    from flowrl.backends.train.megatron.offload import MegatronOffload

    p = torch.nn.Parameter(torch.ones(2))
    inner = torch.optim.Adam([p])
    p.grad = torch.ones(2)
    inner.step()

    class Fp32Optimizer:  # megatron's: the parameters are the model's buffer views
        optimizer = inner

    off = MegatronOffload("cuda:0", params=False, grads=False, optimizer=True, chunks=lambda: [],
                          get_optimizer=Fp32Optimizer, main_params=False)
    off.target = torch.device("meta")  # stand-in for the host, so the move is visible without CUDA
    off.offload()
    assert inner.state[p]["exp_avg"].is_meta and p.device.type == "cpu"


def test_megatron_engine_kwargs_carry_verls_offload_switches():
    from types import SimpleNamespace

    from flowrl.backends.train.megatron.options import offload_kwargs, train_engine_kwargs
    from flowrl.config import RunConfig

    assert "offload" not in train_engine_kwargs(RunConfig().actor)  # no megatron section: nothing moves
    on = SimpleNamespace(param_offload=True, grad_offload=False, optimizer_offload=True)
    assert offload_kwargs(on) == {"offload": {"param_offload": True, "grad_offload": False, "optimizer_offload": True}}
    assert offload_kwargs(SimpleNamespace(param_offload=False, grad_offload=False, optimizer_offload=False)) == {}


def test_an_export_outside_the_roles_phases_onloads_offloaded_parameters_for_itself():
    """The hybrid role exports the trainer's weights by calling the engine directly: parameters
    the role left on the host come to the device for the gather and go back after."""
    module = _Module()
    switch = OffloadSwitch(torch.device("cuda:0"), params=True, optimizer=True, modules=lambda: [module],
                           get_optimizer=lambda: None)
    with switch.loaded():  # resident already: nothing moves
        pass
    switch.offload()
    with switch.loaded():
        assert module.sent == ["cpu", "cuda:0"] and not switch.params_on_host
    assert module.sent == ["cpu", "cuda:0", "cpu"] and switch.params_on_host


def test_megatron_offload_switches_are_config_fields_of_the_actor_and_the_reference():
    from flowrl.backends.train.megatron.options import train_engine_kwargs
    from flowrl.config import ConfigError
    from flowrl.config.loader import load_config
    from flowrl.config.verl import translate_item

    cfg = load_config(None, ["actor.strategy=megatron", "cluster.placement=colocated", "actor.megatron.param_offload=true",
                             "actor.megatron.optimizer_offload=true", "ref.megatron.param_offload=true"])
    assert train_engine_kwargs(cfg.actor)["offload"] == {"param_offload": True, "grad_offload": False,
                                                         "optimizer_offload": True}
    assert train_engine_kwargs(cfg.ref)["offload"] == {"param_offload": True, "grad_offload": False,
                                                       "optimizer_offload": False}
    # under a strategy whose spec does not own the section: refused, naming the key and the owner
    for key in ("actor.megatron.grad_offload", "ref.megatron.param_offload"):
        with pytest.raises(ConfigError, match=rf"{key}=True: is not an actor.strategy=fsdp option.*actor.strategy=megatron"):
            load_config(None, ["actor.strategy=fsdp", f"{key}=true"])
    assert load_config(None, ["actor.megatron.param_offload=false"]).actor.megatron.param_offload is False
    # verl's keys map onto them
    assert translate_item("actor_rollout_ref.actor.megatron.grad_offload", True)[0] == "actor.megatron.grad_offload"
    assert translate_item("actor_rollout_ref.ref.megatron.param_offload", True)[0] == "ref.megatron.param_offload"


def test_reference_role_onloads_for_its_forward_only(tiny_model_dir, monkeypatch):
    from flowrl.roles import reference

    monkeypatch.setattr(reference, "TRAIN_BACKENDS", _Specs())
    _RecordingDP.calls = calls = []
    role = reference.ReferenceRole(rank=0, world_size=1, model_dir=str(tiny_model_dir))
    role.compute_logprobs(_table())
    assert calls == ["offload", "onload", "forward", "offload"]  # a frozen engine: never its optimizer
