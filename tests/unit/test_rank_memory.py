"""Pre-flight's GPU memory check (issue 28 item 4): each trainer rank's estimate from
``flowrl parallel-plan``'s memory model (``layout_cost.train_memory``) on a mocked GPU inventory;
refused with what was computed and the keys that lower it; nothing checked on the CPU."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flowrl.config import ConfigError
from flowrl.config.devices import device_plan
from flowrl.config.loader import load_config
from flowrl.parallel.device_plan import Inventory
from flowrl.parallel.layout_cost import GB, RESERVED_GB
from flowrl.parallel.model_spec import ModelSpec
from flowrl.parallel.rank_memory import Capabilities, TrainerLayout, estimate
from flowrl.parallel.mesh import ParallelDims
from flowrl.run.memory_check import check_trainer_memory, critic_layout, gpu_memory_gb, trainer_layout

# Qwen2-7B's shape: 28 layers, hidden 3584, 28 heads (4 kv heads), ffn 18944, vocab 152064, untied.
QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
            "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "hidden_act": "silu",
            "tie_word_embeddings": False}
SHORT = ["data.max_prompt_length=512", "rollout.response_length=512", "actor.ppo_micro_batch_size_per_gpu=1",
         "actor.use_dynamic_bsz=false", "actor.log_prob_use_dynamic_bsz=false"]


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_7B))
    return str(tmp_path)


def _cfg(model_dir: str, *keys: str):
    return load_config(None, [f"model.path={model_dir}", "data.train_files=x.parquet", "cluster.placement=colocated",
                              "actor.data_parallel_size=2", "rollout.data_parallel_size=2", "ref.data_parallel_size=2",
                              *SHORT, *keys])


def _plan(cfg, gpus: int = 2):
    return device_plan(cfg, Inventory(nodes=1, gpus_per_node=gpus))


def test_fsdp_7b_on_two_80gb_gpus_is_refused_with_the_keys_and_offload_policy_makes_it_fit(model_dir):
    cfg = _cfg(model_dir, "actor.strategy=fsdp")
    with pytest.raises(ConfigError) as err:
        check_trainer_memory(cfg, _plan(cfg), memory_gb=80)
    msg = str(err.value)
    # 7.6e9 params over dp 2: weights 2 B + grads 4 B + Adam 12 B + the colocated reference's 2 B
    # = 20 B/param / 2 = 76 GB before activations and the 3 GB reserve: above 0.9 * 80 = 72.
    assert err.value.key == "actor.ppo_micro_batch_size_per_gpu"
    assert "flowrl parallel-plan's memory model" in msg and "holds 72.0" in msg
    assert "actor.fsdp_config.offload_policy=true" in msg and "(fits)" in msg
    assert "model.enable_gradient_checkpointing=true" in msg
    assert "ref.fsdp_config.param_offload=true -> 78.4 GB" in msg  # the reference's 7.6 GB off the GPU
    off = _cfg(model_dir, "actor.strategy=fsdp", "ref.fsdp_config.param_offload=true")
    assert not trainer_layout(off, _plan(off)).reference
    fitted = _cfg(model_dir, "actor.strategy=fsdp", "actor.fsdp_config.offload_policy=true")
    est = check_trainer_memory(fitted, _plan(fitted), memory_gb=80)["actor"]
    assert est.fits and est.parts_gb["optimizer"] == 0.0


def test_the_estimate_is_train_memory_of_the_configured_layout(model_dir):
    cfg = _cfg(model_dir, "actor.strategy=fsdp")
    layout = trainer_layout(cfg, _plan(cfg))
    assert layout.dims == ParallelDims(dp=2, tp=1, pp=1) and layout.seq_len == 1024 and layout.micro_batch_size == 1
    assert layout.fully_sharded and layout.reference and layout.dtype == "bfloat16"
    spec = ModelSpec.from_hf_config(QWEN2_7B)
    est = estimate(spec, layout, 80)
    p = spec.num_params  # vocab 152064 is a multiple of 128: no padding
    block = spec.params_per_layer
    assert est.parts_gb["weights"] == pytest.approx((p * 2 / 2 + block * 2) / GB, rel=1e-3)
    assert est.parts_gb["optimizer"] == pytest.approx(p * 12 / 2 / GB, rel=1e-3)
    assert est.total_gb == pytest.approx(sum(est.parts_gb.values()) + RESERVED_GB)


def test_more_gpus_fit_and_the_cpu_is_not_checked(model_dir):
    cfg = _cfg(model_dir, "actor.strategy=fsdp", "actor.data_parallel_size=8", "rollout.data_parallel_size=8",
               "ref.data_parallel_size=8")
    est = check_trainer_memory(cfg, _plan(cfg, 8), memory_gb=80)["actor"]
    assert est.fits and est.total_gb < 30  # 20 B/param / 8 = 19 GB + activations + reserve
    small = _cfg(model_dir, "actor.strategy=fsdp")
    assert check_trainer_memory(small, _plan(small, 0), memory_gb=80) == {}  # CPU plan: unchanged
    assert check_trainer_memory(small, _plan(small), memory_gb=0) == {}  # GPU memory unknown


def test_megatron_names_tensor_parallel_and_the_distributed_optimizer(model_dir):
    cfg = _cfg(model_dir, "actor.strategy=megatron", "actor.use_kl_loss=false")
    with pytest.raises(ConfigError) as err:
        check_trainer_memory(cfg, _plan(cfg), memory_gb=80)
    msg = str(err.value)
    assert "actor.tensor_model_parallel_size=2 (x2 GPUs)" in msg and "actor.use_distributed_optimizer=true" in msg
    assert "offload_policy" not in msg  # not a megatron key


def test_dynamic_batch_size_counts_the_token_budget(model_dir):
    cfg = _cfg(model_dir, "actor.strategy=fsdp", "actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=4096")
    layout = trainer_layout(cfg, _plan(cfg))
    assert (layout.micro_batch_size, layout.micro_batch_key, layout.micro_batch_value) == (4, "ppo_max_token_len_per_gpu", 4096)


def test_dp_strategy_is_pointed_at_the_sharded_strategy():
    spec = ModelSpec.from_hf_config(QWEN2_7B)
    layout = TrainerLayout(dims=ParallelDims(dp=2, tp=1, pp=1), seq_len=1024, micro_batch_size=1,
                           micro_batch_key="ppo_micro_batch_size_per_gpu", global_batch_tokens=2**20, dtype="bfloat16")
    from flowrl.parallel.rank_memory import memory_problem

    msg = memory_problem(spec, layout, 80, Capabilities(sharded_strategy="fsdp"))
    assert "actor.strategy=fsdp -> " in msg and msg.endswith("GPUs with more memory")


def test_gpu_memory_from_the_config_or_nvidia_smi(model_dir):
    cfg = _cfg(model_dir)
    assert gpu_memory_gb(cfg, runner=lambda cmd: "81559\n81559\n") == pytest.approx(81559 * 2**20 / 1e9)
    assert gpu_memory_gb(cfg, runner=lambda cmd: (_ for _ in ()).throw(OSError("no nvidia-smi"))) == 0.0
    assert gpu_memory_gb(_cfg(model_dir, "cluster.gpu_memory_gb=40")) == 40.0
    with pytest.raises(ConfigError, match="gpu_memory_gb"):
        _cfg(model_dir, "cluster.gpu_memory_gb=-1")


def test_offloaded_state_counts_in_the_host_memory_limit(model_dir):
    from flowrl.cluster.host_memory import RUNTIME_BYTES, load_bytes
    from flowrl.run.memory_check import offloaded_bytes

    p = ModelSpec.from_hf_config(QWEN2_7B).num_params  # 7,615,487,488 (Qwen2-7B without its 0.13M q/k/v biases)
    assert offloaded_bytes(_cfg(model_dir, "actor.strategy=fsdp")) == 0  # nothing offloads
    # fp32 shard + its fp32 gradient: 8 B/param over dp 2; AdamW's two fp32 moments: 8 more
    assert offloaded_bytes(_cfg(model_dir, "actor.strategy=fsdp", "actor.fsdp_config.param_offload=true")) == 8 * p // 2
    both = _cfg(model_dir, "actor.strategy=fsdp", "actor.fsdp_config.param_offload=true",
                "actor.fsdp_config.optimizer_offload=true")
    assert offloaded_bytes(both) == 16 * p // 2 == 60_923_899_904
    policy = _cfg(model_dir, "actor.strategy=fsdp", "actor.fsdp_config.offload_policy=true")
    assert offloaded_bytes(policy) == offloaded_bytes(both)
    assert offloaded_bytes(_cfg(model_dir, "actor.strategy=dp")) == 0  # no sharded engine, no switch
    # megatron tp 2, bf16: the parameter buffer (2 B) and the fp32 main copy + Adam's moments (12 B)
    mega = _cfg(model_dir, "actor.strategy=megatron", "actor.tensor_model_parallel_size=2", "actor.use_kl_loss=false",
                "actor.megatron.param_offload=true", "actor.megatron.optimizer_offload=true")
    assert offloaded_bytes(mega) == (2 + 12) * p // 2
    dist = _cfg(model_dir, "actor.strategy=megatron", "actor.use_distributed_optimizer=true", "actor.use_kl_loss=false",
                "actor.megatron.optimizer_offload=true", "actor.megatron.grad_offload=true")  # gradients: dropped
    assert offloaded_bytes(dist) == 12 * p // 2  # dp 2 shards the optimizer
    assert load_bytes(0, extra_bytes=offloaded_bytes(both)) == RUNTIME_BYTES + 60_923_899_904
    from flowrl.cluster.host_memory import local_memory_limit

    # 2 workers on a 64 GiB node: 28.8 GiB each holds the runtime, not 56.7 GiB of offloaded state
    assert local_memory_limit("auto", workers=2, model_path="", host_bytes=64 << 30) == int((64 << 30) * 0.9) // 2
    with pytest.raises(ConfigError, match="offloaded state"):
        local_memory_limit("auto", workers=2, model_path="", host_bytes=64 << 30, extra_bytes=offloaded_bytes(both))


def test_flowrl_trains_pre_flight_refuses_before_any_worker(model_dir, monkeypatch):
    """The driver's pre-flight (topology.plan_devices_for) runs the check on the plan it makes."""
    from flowrl.graphs.family import resolve_family
    from flowrl.run.topology import plan_devices_for

    monkeypatch.setenv("FLOWRL_DEVICES", "2")  # two GPUs, as the driver would see them
    cfg = _cfg(model_dir, "actor.strategy=fsdp", "cluster.gpu_memory_gb=80")
    with pytest.raises(ConfigError, match="offload_policy=true -> 17.5 GB"):
        plan_devices_for(cfg, resolve_family(cfg)(cfg).group_specs())
    fitted = _cfg(model_dir, "actor.strategy=fsdp", "cluster.gpu_memory_gb=80", "actor.fsdp_config.offload_policy=true")
    assert plan_devices_for(fitted, resolve_family(fitted)(fitted).group_specs()).inventory.has_gpus


def test_the_critic_rank_is_checked_with_a_value_head(model_dir):
    keys = ("algorithm.adv_estimator=gae", "critic.data_parallel_size=2", "critic.strategy=fsdp", "actor.strategy=fsdp",
            "actor.fsdp_config.offload_policy=true", "critic.ppo_micro_batch_size_per_gpu=1",
            "critic.use_dynamic_bsz=false")
    cfg = _cfg(model_dir, *keys)
    with pytest.raises(ConfigError) as err:  # the actor fits (offload_policy); the critic's full state does not
        check_trainer_memory(cfg, _plan(cfg), memory_gb=80)
    assert err.value.key == "critic.ppo_micro_batch_size_per_gpu"
    assert "each critic rank" in str(err.value) and "critic.fsdp_config.offload_policy=true" in str(err.value)
    fitted = _cfg(model_dir, *keys, "critic.fsdp_config.offload_policy=true")
    out = check_trainer_memory(fitted, _plan(fitted), memory_gb=80)
    spec = ModelSpec.from_hf_config(QWEN2_7B)
    layout = critic_layout(fitted, _plan(fitted))[0]
    policy = estimate(spec, dataclasses.replace(layout, value_head=False), 80)
    # no vocabulary head: 6 B x 1024 tokens x 152064 logits (0.93 GB) less, and no output layer's block
    assert out["critic"].parts_gb["activations"] == pytest.approx(policy.parts_gb["activations"] - 6 * 1024 * 152064 / GB)
    assert set(out) == {"actor", "critic"} and out["critic"].parts_gb["reference"] == 0


def test_a_critic_on_the_actors_gpus_is_summed(model_dir):
    """Colocated: while one trains, the other's resident state shares the GPU (issue 28 item 4)."""
    from flowrl.run.memory_check import check_shared_gpus

    keys = ("algorithm.adv_estimator=gae", "actor.data_parallel_size=4", "rollout.data_parallel_size=4",
            "ref.data_parallel_size=4", "critic.data_parallel_size=4", "critic.strategy=fsdp", "actor.strategy=fsdp",
            "critic.ppo_micro_batch_size_per_gpu=1", "critic.use_dynamic_bsz=false")
    cfg = _cfg(model_dir, *keys)
    plan = _plan(cfg, 4)
    with pytest.raises(ConfigError) as err:
        check_trainer_memory(cfg, plan, memory_gb=80)
    msg = str(err.value)
    assert "roles share each GPU" in msg and "during the actor phase" in msg
    assert err.value.key == "critic.fsdp_config.param_offload"
    assert "critic.fsdp_config.optimizer_offload=true" in msg and "cluster.placement=split" in msg
    # each alone fits: the refusal is the sum
    alone = {k: estimate(ModelSpec.from_hf_config(QWEN2_7B), lay, 80) for k, lay in
             (("actor", trainer_layout(cfg, plan)), ("critic", critic_layout(cfg, plan)[0]))}
    assert all(m.fits for m in alone.values())
    c = alone["critic"].parts_gb
    assert f"{alone['actor'].total_gb + c['weights'] + c['optimizer']:.1f} GB" in msg  # FSDP frees its gradients
    fitted = _cfg(model_dir, *keys, "critic.fsdp_config.param_offload=true", "critic.fsdp_config.optimizer_offload=true",
                  "actor.fsdp_config.param_offload=true", "actor.fsdp_config.optimizer_offload=true")
    out = check_trainer_memory(fitted, _plan(fitted, 4), memory_gb=80)
    peaks = check_shared_gpus(fitted, _plan(fitted, 4), out, 80)
    assert set(peaks) == {"actor", "critic"}
    assert peaks["actor"] == pytest.approx(out["actor"].total_gb)  # the critic keeps nothing on the GPU
    split = _cfg(model_dir, *keys[:1], "cluster.placement=split", "critic.data_parallel_size=2",
                 "critic.strategy=fsdp", "actor.strategy=fsdp", "critic.fsdp_config.offload_policy=true",
                 "actor.fsdp_config.offload_policy=true", "critic.ppo_micro_batch_size_per_gpu=1",
                 "critic.use_dynamic_bsz=false", "actor.data_parallel_size=2", "rollout.data_parallel_size=2")
    split_plan = _plan(split, 8)
    assert check_shared_gpus(split, split_plan, check_trainer_memory(split, split_plan, memory_gb=80), 80) == {}


def test_hybrid_vllm_pool_shares_the_gpu_with_the_trainer(model_dir):
    from flowrl.run.memory_check import check_shared_gpus

    keys = ("cluster.placement=hybrid", "rollout.name=vllm", "actor.strategy=fsdp", "actor.data_parallel_size=4",
            "rollout.data_parallel_size=4", "ref.data_parallel_size=4", "rollout.gpu_memory_utilization=0.5",
            "rollout.free_cache_engine=true")
    cfg = _cfg(model_dir, *keys)
    plan = _plan(cfg, 4)
    with pytest.raises(ConfigError) as err:
        check_trainer_memory(cfg, plan, memory_gb=80)
    msg = str(err.value)
    assert "during the rollout phase" in msg and "vLLM's pool 40.0 GB" in msg
    assert err.value.key == "actor.fsdp_config.param_offload"
    fitted = _cfg(model_dir, *keys, "actor.fsdp_config.param_offload=true", "actor.fsdp_config.optimizer_offload=true",
                  "ref.fsdp_config.param_offload=true")
    out = check_trainer_memory(fitted, _plan(fitted, 4), memory_gb=80)
    peaks = check_shared_gpus(fitted, _plan(fitted, 4), out, 80)
    assert peaks["rollout"] == pytest.approx(40.0 + RESERVED_GB)  # nothing of the trainer stays beside the engine
    awake = _cfg(model_dir, *keys[:-1], "rollout.free_cache_engine=false", "actor.fsdp_config.param_offload=true",
                 "actor.fsdp_config.optimizer_offload=true", "ref.fsdp_config.param_offload=true")
    with pytest.raises(ConfigError, match="during the actor phase .* vLLM's pool 40.0 \\(it does not sleep\\)"):
        check_trainer_memory(awake, _plan(awake, 4), memory_gb=80)
