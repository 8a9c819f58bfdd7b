"""The backend catalogue (``flowrl.catalog.backends``): typed specs, and a generation engine added
from outside the package as one class plus one registration, checked by the config through its
capabilities alone."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pyarrow as pa
import pytest

from flowrl.catalog.backends import (GEN_BACKENDS, TRAIN_BACKENDS, VALUE_BACKENDS, BackendSpec, CheckpointKind,
                                     GenerateBackendSpec, ParallelAxis, ReshardMode, ShardStyle, TrainBackendSpec,
                                     checkpoint_problem, either)
from flowrl.config import ConfigError, load_config


class EchoGenerator:
    """A generation engine living in this test module: every response repeats its prompt's last
    token ``max_new_tokens`` times, each with log-prob 0."""

    def __init__(self, model_dir: str, *, dtype: str = "float32", **kwargs) -> None:
        self.weights: dict = {}
        self.last_stats = None

    def generate(self, prompts, params, *, seed=0, micro_batch_size=256):
        responses = [[p[-1]] * params.max_new_tokens for p in prompts for _ in range(params.n)]
        return responses, [[0.0] * len(r) for r in responses]

    def logprobs(self, prompts, responses, *, temperature=1.0):
        return [[0.0] * len(r) for r in responses]

    def load_hf_state(self, state) -> None:
        self.weights = dict(state)

    def reshard_target(self):
        return self.weights

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def registered(spec: GenerateBackendSpec) -> Iterator[GenerateBackendSpec]:
    GEN_BACKENDS.add(spec)
    try:
        yield spec
    finally:
        GEN_BACKENDS.unregister(spec.name)


def test_a_generation_engine_is_one_class_and_one_registration():
    from flowrl.backends.interfaces import GenerateEngine, ReportsStats, SamplingParams
    from flowrl.roles.rollout import RolloutRole

    spec = GenerateBackendSpec(name="echo", engine=f"{__name__}:EchoGenerator", shard_style=ShardStyle.HF,
                               reshard=ReshardMode.IN_PLACE, in_process=False)
    with registered(spec):
        cfg = load_config(None, ["rollout.name=echo"])
        assert cfg.rollout.name == "echo"
        # its capabilities decide, not its name: own processes -> no hybrid; no sleep; dp only
        assert cfg.placement == "colocated" and "rollout.name=echo runs its own engine" in cfg.placement_reason
        with pytest.raises(ConfigError, match="rollout.name=echo cannot sleep.*fix: .*rollout.name=vllm") as err:
            load_config(None, ["rollout.name=echo", "rollout.free_cache_engine=true"])
        assert err.value.key == "rollout.free_cache_engine"
        with pytest.raises(ConfigError, match="echo backend runs one full model per worker") as err:
            load_config(None, ["rollout.name=echo", "rollout.tensor_model_parallel_size=2"])
        assert err.value.key == "rollout.tensor_model_parallel_size"
        load_config(None, ["rollout.name=echo", "rollout.max_num_batched_tokens=1"])  # vllm's key: not echo's rule
        # the rollout role builds and runs it
        role = RolloutRole(rank=0, world_size=1, model_dir="unused", backend="echo",
                           sampling=SamplingParams(n=2, max_new_tokens=3))
        assert isinstance(role.engine, GenerateEngine) and isinstance(role.engine, ReportsStats)
        out = role.generate(pa.table({"prompt_ids": [[5, 7], [9]], "group": [0, 1]}))
        assert out.column("response_ids").to_pylist() == [[7] * 3, [7] * 3, [9] * 3, [9] * 3]
        assert out.column("uid").to_pylist() == ["0-0", "0-1", "1-0", "1-1"]
    assert "echo" not in GEN_BACKENDS
    with pytest.raises(ConfigError, match="hf, vllm"):
        load_config(None, ["rollout.name=echo"])


def test_specs_are_typed_frozen_and_checked():
    vllm = GEN_BACKENDS.spec("vllm")
    assert vllm.sleeps and vllm.adapter_sync and not vllm.in_process and vllm.reshard is ReshardMode.STAGED
    assert vllm.supports(ParallelAxis.TP) and not vllm.supports(ParallelAxis.PP) and vllm.owns("free_cache_engine")
    megatron = TRAIN_BACKENDS.spec("megatron")
    assert megatron.shard_style is ShardStyle.MEGATRON and megatron.checkpoint is CheckpointKind.SHARDED
    assert not (megatron.token_budget or megatron.shared_prompts or megatron.shares_process)
    assert VALUE_BACKENDS.spec("megatron").checkpoint is CheckpointKind.SHARDED and TRAIN_BACKENDS.spec("dp").trains_adapters
    assert ShardStyle.FSDP == "fsdp" and f"{ShardStyle.HF}" == "hf"  # str-valued: YAML, messages unchanged
    with pytest.raises(Exception):
        vllm.sleeps = False  # frozen
    with pytest.raises(TypeError):
        TrainBackendSpec("x", "m:C")  # keyword-only
    with pytest.raises(ValueError, match="shard_style='tpu' is not a ShardStyle; use one of hf, megatron, vllm, fsdp"):
        GenerateBackendSpec(name="x", engine="m:C", shard_style="tpu", reshard="staged", in_process=False)
    with pytest.raises(ValueError, match="not an import string"):
        BackendSpec(name="x", engine="m.C")
    with pytest.raises(TypeError, match="add\\(GenerateBackendSpec"):
        GEN_BACKENDS.register("x", "m:C")
    with pytest.raises(ValueError, match="already registered"):
        GEN_BACKENDS.add(vllm)
    assert either(["dp"]) == "dp" and either(["dp", "fsdp"]) == "dp or fsdp" and either(["a", "b", "c"]) == "a, b or c"


def test_a_checkpoint_blocker_is_one_rule():
    """A plug-in train backend whose state cannot be checkpointed with one of its keys set
    (``checkpoint_blockers``) is refused by one rule at load and at resume. No built-in backend has
    one: megatron's distributed optimizer is saved (issue 37)."""
    import dataclasses

    from flowrl.backends.preflight import check_checkpointable
    from flowrl.catalog.backends import CheckpointBlocker

    megatron = ["actor.strategy=megatron", "actor.pipeline_model_parallel_size=2", "actor.data_parallel_size=1",
                "actor.use_distributed_optimizer=true"]
    assert load_config(None, [*megatron, "trainer.save_freq=5"]).trainer.save_freq == 5
    assert all(not TRAIN_BACKENDS.spec(n).checkpoint_blockers for n in TRAIN_BACKENDS.names())
    blocked = dataclasses.replace(TRAIN_BACKENDS.spec("megatron"), name="blocked", checkpoint_blockers=(
        CheckpointBlocker(key="use_distributed_optimizer", reason="its sharded state is not saved"),))
    TRAIN_BACKENDS.add(blocked)
    try:
        overrides = ["actor.strategy=blocked", *megatron[1:]]
        cfg = load_config(None, [*overrides, "trainer.save_freq=0"])
        problem, fix = checkpoint_problem(blocked, cfg.actor)
        assert problem == "with actor.use_distributed_optimizer=true: its sharded state is not saved"
        with pytest.raises(ConfigError) as at_load:
            load_config(None, [*overrides, "trainer.save_freq=5"])
        with pytest.raises(ConfigError) as at_resume:
            check_checkpointable(cfg, "trainer.resume_mode", "resume_path")
        assert at_load.value.problem == at_resume.value.problem == problem
        assert at_load.value.fix == at_resume.value.fix == fix
        assert checkpoint_problem(TRAIN_BACKENDS.spec("fsdp"), cfg.actor) is None  # fsdp takes the key, no blocker
    finally:
        TRAIN_BACKENDS.unregister("blocked")
