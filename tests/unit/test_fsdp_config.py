"""The fsdp strategy in the config and pre-flight: registered names, verl's ``fsdp_config`` keys,
and clear refusals (LoRA off dp/fsdp, Ulysses, gradient checkpointing off fsdp, tp/pp)."""

import pytest

from flowrl.backends.preflight import check_model_options
from flowrl.backends.registry import TRAIN_BACKENDS, VALUE_BACKENDS
from flowrl.config import ConfigError, load_config
from flowrl.parallel.fsdp_spec import fsdp_rows, fsdp_shard_spec
from flowrl.roles.specs import actor_spec, critic_spec, ref_spec


def test_fsdp_is_a_train_and_value_backend_with_verl_keys():
    assert "fsdp" in TRAIN_BACKENDS.names() and "fsdp" in VALUE_BACKENDS.names()
    cfg = load_config(None, ["actor.strategy=fsdp", "critic.strategy=fsdp", "actor.fsdp_config.param_offload=true",
                             "actor.fsdp_config.mixed_precision.reduce_dtype=float32",
                             "ref.fsdp_config.reshard_after_forward=false", "model.enable_gradient_checkpointing=true"])
    kwargs = actor_spec(cfg).role_kwargs["engine_kwargs"]
    assert kwargs["param_offload"] and kwargs["reduce_dtype"] == "float32" and kwargs["gradient_checkpointing"]
    assert ref_spec(cfg).role_kwargs["engine_kwargs"]["reshard_after_forward"] is False
    assert critic_spec(cfg).role_kwargs["critic"].strategy == "fsdp"
    check_model_options(cfg)


def test_default_dp_run_gets_no_new_engine_arguments():
    cfg = load_config(None, [])
    assert actor_spec(cfg).role_kwargs["engine_kwargs"] == {}
    assert ref_spec(cfg).role_kwargs["engine_kwargs"] == {}


@pytest.mark.parametrize("overrides, key", [
    (["actor.strategy=megatron", "model.lora_rank=8"], "model.lora_rank"),
    (["model.enable_gradient_checkpointing=true"], "model.enable_gradient_checkpointing"),
])
def test_preflight_refuses_what_is_not_built(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_model_options(load_config(None, overrides))


def test_ulysses_and_bad_dtypes_are_refused():
    with pytest.raises(ConfigError, match="Ulysses"):  # dp and fsdp split sequences (issue 31), megatron does not
        load_config(None, ["actor.strategy=megatron", "actor.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match="param_dtype"):
        load_config(None, ["actor.strategy=fsdp", "actor.fsdp_config.mixed_precision.param_dtype=float64"])
    # verl's three: moved between phases (param_offload, optimizer_offload, each alone or both), or
    # CPUOffloadPolicy (offload_policy) with nothing left to move
    load_config(None, ["actor.strategy=fsdp", "actor.fsdp_config.optimizer_offload=true"])
    load_config(None, ["actor.strategy=fsdp", "actor.fsdp_config.optimizer_offload=true",
                       "actor.fsdp_config.param_offload=true"])
    load_config(None, ["actor.strategy=fsdp", "actor.fsdp_config.offload_policy=true"])
    with pytest.raises(ConfigError, match=r"actor\.fsdp_config\.offload_policy.*param_offload.*set only offload_policy"):
        load_config(None, ["actor.strategy=fsdp", "actor.fsdp_config.offload_policy=true",
                           "actor.fsdp_config.param_offload=true"])


def test_fsdp_tensor_parallel_is_refused():
    from flowrl.backends.train.fsdp_options import check_fsdp

    cfg = load_config(None, ["actor.strategy=fsdp", "actor.tensor_model_parallel_size=2"])
    with pytest.raises(ConfigError, match="data-parallel ranks only"):
        check_fsdp(cfg, model_path="")


def test_fsdp_spec_rows_follow_torch_chunk():
    import torch

    for n, world in [(10, 4), (3, 4), (64, 2), (1, 3)]:
        chunks = torch.arange(n).chunk(world)
        for rank in range(world):
            start, stop = fsdp_rows(n, world, rank)
            got = list(range(start, stop))
            assert got == (chunks[rank].tolist() if rank < len(chunks) else []), (n, world, rank)
    spec = fsdp_shard_spec({"a.weight": (10, 3), "b": (3,)}, 4, config={"model_type": "gpt2"})
    assert spec.shards[(3, 0)].tensors == {"a.weight": (1, 3), "b": (0,)}
    assert [p.param for p in spec.shards[(3, 0)].pieces] == ["a.weight"]


def test_parallel_plan_knows_fsdp():
    from flowrl.parallel.layout_search import plan_parallelism

    dp_like = plan_parallelism("1.5B", num_gpus=8, top_k=None, tp=1, pp=1, distributed_optimizer=False)[0]
    fsdp = plan_parallelism("1.5B", num_gpus=8, top_k=None, fully_sharded=True, distributed_optimizer=False)
    assert [(e.dims.dp, e.dims.tp, e.dims.pp) for e in fsdp] == [(8, 1, 1)]
    e = fsdp[0]
    # weights, grads, Adam and the reference are sharded over dp (plus one gathered block)
    assert e.optimizer_gb == pytest.approx(dp_like.optimizer_gb / 8)
    assert e.reference_gb == pytest.approx(dp_like.reference_gb / 8)
    assert dp_like.weights_gb / 8 < e.weights_gb < dp_like.weights_gb / 4
    assert e.dp_comm_s > 0
    with pytest.raises(ValueError, match="data parallel only"):
        plan_parallelism("7B", num_gpus=8, fully_sharded=True, tp=2)


def test_parallel_plan_knows_lora():
    from flowrl.parallel.layout_cost import lora_params_per_layer
    from flowrl.parallel.layout_search import plan_parallelism
    from flowrl.parallel.model_spec import ModelSpec

    tiny = ModelSpec(num_layers=2, hidden_size=4, num_attention_heads=2, num_key_value_heads=1, ffn_hidden_size=8,
                     vocab_size=16)
    # q 4->4, k and v 4->2, o 4->4: (4+4) + 2*(4+2) + (4+4) = 28; gate, up, down: 3*(4+8) = 36
    assert lora_params_per_layer(tiny, 8) == 8 * (28 + 36)
    full = plan_parallelism("7B", num_gpus=8, top_k=None, fully_sharded=True, distributed_optimizer=False)[0]
    lora = plan_parallelism("7B", num_gpus=8, top_k=None, fully_sharded=True, distributed_optimizer=False,
                            lora_rank=8)[0]
    assert lora.reference_gb == 0.0 and full.reference_gb > 0  # the base model, adapters disabled
    assert lora.optimizer_gb < full.optimizer_gb / 100 and lora.grads_gb < full.grads_gb / 10
    assert full.weights_gb < lora.weights_gb < full.weights_gb * 1.05  # frozen base + small adapters
    assert lora.memory_gb < full.memory_gb and lora.dp_comm_s < full.dp_comm_s
    with pytest.raises(ValueError, match="fully-sharded"):
        plan_parallelism("7B", num_gpus=8, lora_rank=8)
