"""The critic of a vision-language policy (issue 33): the VLM's backbone with a value head, its
values computed with the images through the policy's VLM forward, the same in every layout; its
checkpoint round trip; the pre-flight refusals of what cannot score a VLM's samples."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

pytest.importorskip("PIL")

from test_vlm import _png, _samples  # noqa: E402 (three prompts with images of two sizes, hf samples)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from flowrl.models.tiny_vlm import save_tiny_vlm

    return str(save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model"))


@pytest.fixture(scope="module")
def table(vlm_dir):
    return _samples(vlm_dir)[0]


def test_the_vlm_critic_is_the_backbone_with_a_new_head(vlm_dir):
    """Every backbone weight from the checkpoint (the causal VLM's renames applied), vision tower
    included, no lm_head; the head is value_head.new_head of the seed."""
    from transformers import AutoModelForCausalLM

    from flowrl.backends.train.dp_value import TorchDPValueEngine
    from flowrl.models.value_head import new_head
    from flowrl.models.vlm import register_auto_classes

    engine = TorchDPValueEngine(vlm_dir, seed=3)
    assert type(engine.model).__name__ == "Qwen2VLForTokenClassification"
    register_auto_classes()
    causal = dict(AutoModelForCausalLM.from_pretrained(vlm_dir).named_parameters())
    params = dict(engine.model.named_parameters())
    assert set(params) == (set(causal) - {"lm_head.weight"}) | {"score.weight", "score.bias"}
    assert any(n.startswith("model.visual.") for n in params)
    assert all(torch.equal(params[n], causal[n]) for n in params if not n.startswith("score."))
    assert torch.equal(params["score.weight"], new_head(engine.model.config, seed=3, bias=True)["weight"])
    assert engine.pad_id == engine.model.config.get_text_config().pad_token_id


@pytest.mark.parametrize("budget,shared", [(40, False), (1000, False), (0, True), (1000, True)])
def test_vlm_values_are_the_same_in_every_layout(vlm_dir, table, budget, shared):
    """Packed lines, token budgets and shared prompts give each row's values (1e-5), as the
    policy's log-probs (test_vlm.test_hf_generation_logprobs_equal_the_dp_trainers_in_every_layout)."""
    from flowrl.backends.train.dp_value import TorchDPValueEngine
    from flowrl.data.packed import PackedBatch

    engine = TorchDPValueEngine(vlm_dir)
    per_row = engine.forward_values(PackedBatch.from_table(table), micro_batch_size=1)
    values = engine.forward_values(PackedBatch.from_table(table).with_token_budget(budget).with_shared_prompts(shared),
                                   micro_batch_size=3)
    assert values.shape == per_row.shape == (sum(len(r) for r in table.column("response_ids").to_pylist()),)
    assert float((values - per_row).abs().max()) < 1e-5


def test_vlm_values_see_the_images(vlm_dir, table):
    """The same ids without their pictures (the <|image_pad|> embeddings alone), or with another
    picture in one prompt, give other values there: the critic reads the images."""
    from flowrl.backends.train.dp_value import TorchDPValueEngine
    from flowrl.data.packed import PackedBatch

    engine = TorchDPValueEngine(vlm_dir)
    values = engine.forward_values(PackedBatch.from_table(table), micro_batch_size=6)
    blind = engine.forward_values(PackedBatch.from_table(table.drop_columns(["images"])), micro_batch_size=6)
    assert float((values - blind).abs().max()) > 1e-3
    images = table.column("images").to_pylist()
    images[0] = images[1] = [_png((0, 0, 255))]  # another picture of the same size (as many image tokens)
    other = table.set_column(table.column_names.index("images"), "images", pa.array(images, pa.list_(pa.binary())))
    moved = engine.forward_values(PackedBatch.from_table(other), micro_batch_size=6)
    first = len(table.column("response_ids")[0]) + len(table.column("response_ids")[1])
    assert float((moved[:first] - values[:first]).abs().max()) > 1e-4
    assert torch.equal(moved[first:], values[first:])  # the other rows' pictures are theirs


def test_vlm_critic_update_trains_tower_and_head_and_its_checkpoint_round_trips(vlm_dir, table):
    """One value-loss step moves the head and the vision tower (their gradients come through the
    image features); checkpoint_state into a fresh engine gives the same values exactly."""
    from flowrl.backends.train.dp_value import TorchDPValueEngine
    from flowrl.data import experience
    from flowrl.data.packed import PackedBatch
    from flowrl.models.vlm import vision_tower

    returns = experience.from_lists([[1.0] * len(r) for r in table.column("response_ids").to_pylist()],
                                    experience.TOKEN_FLOATS)
    train = table.append_column("returns", returns)
    engine = TorchDPValueEngine(vlm_dir, lr=1e-2)
    tower = {n: p.detach().clone() for n, p in vision_tower(engine.model).named_parameters()}
    head = engine.model.score.weight.detach().clone()
    batch = PackedBatch.from_table(train, ("returns",))
    stats = engine.train_step_values(batch, micro_batch_size=3, loss_fn=lambda v, mb: (
        ((v - mb.token_fields["returns"]) ** 2).mean(), {}))
    assert 0 < stats["grad_norm"] < float("inf")
    assert not torch.equal(engine.model.score.weight, head)
    assert any(not torch.equal(p, tower[n]) for n, p in vision_tower(engine.model).named_parameters())
    state = engine.checkpoint_state()
    fresh = TorchDPValueEngine(vlm_dir, lr=1e-2, seed=7)
    fresh.load_checkpoint(state["params"], state["optim"], state["optim_step"])
    before = engine.forward_values(PackedBatch.from_table(table), micro_batch_size=6)
    assert torch.equal(fresh.forward_values(PackedBatch.from_table(table), micro_batch_size=6), before)


def test_qwen2_5_vl_critic_loads_and_sees_the_images(tmp_path):
    from flowrl.backends.train.dp_value import TorchDPValueEngine
    from flowrl.data.packed import PackedBatch
    from flowrl.models.tiny_vlm import save_tiny_vlm

    model_dir = str(save_tiny_vlm(tmp_path / "q25", arch="qwen2_5_vl"))
    table, _ = _samples(model_dir)
    engine = TorchDPValueEngine(model_dir)
    assert type(engine.model).__name__ == "Qwen2_5_VLForTokenClassification"
    values = engine.forward_values(PackedBatch.from_table(table).with_shared_prompts(True), micro_batch_size=3)
    per_row = engine.forward_values(PackedBatch.from_table(table), micro_batch_size=1)
    assert float((values - per_row).abs().max()) < 1e-5
    blind = engine.forward_values(PackedBatch.from_table(table.drop_columns(["images"])), micro_batch_size=6)
    assert float((values - blind).abs().max()) > 1e-3


# ----------------------------------------------------------------- pre-flight
def _cfg(vlm_dir, *overrides):
    from flowrl.config import load_config

    return load_config(None, [f"model.path={vlm_dir}", *overrides])


def test_preflight_refuses_what_cannot_score_a_vlm(vlm_dir, tiny_model_dir):
    from flowrl.config import ConfigError
    from flowrl.config.vlm_critic_checks import check_vlm_scorers

    gae = "algorithm.adv_estimator=gae"
    for ok in ([gae], [gae, "critic.strategy=fsdp"], [gae, f"critic.model_path={vlm_dir}"], []):
        check_vlm_scorers(_cfg(vlm_dir, *ok), model_path=vlm_dir)
    check_vlm_scorers(_cfg(tiny_model_dir, gae), model_path=str(tiny_model_dir))  # a text policy: nothing
    refused = [
        ([gae, "critic.strategy=megatron"], r"critic.strategy='megatron'.*no vision tower.*fix: set critic.strategy=dp or fsdp"),
        ([gae, "critic.ulysses_sequence_parallel_size=2", "critic.data_parallel_size=2"],
         r"critic.ulysses_sequence_parallel_size=2.*image features.*fix: set critic.ulysses_sequence_parallel_size=1"),
        ([gae, f"critic.model_path={tiny_model_dir}"], r"critic.model_path=.*is a text model while model.path=.*is a "
                                                       r"vision-language model.*fix: point critic.model_path"),
        (["reward_model.enable=true", f"reward_model.model_path={tiny_model_dir}"],
         r"reward_model.enable=True.*<\|image_pad\|> tokens without the picture.*fix: set reward_model.enable=false"),
    ]
    for overrides, match in refused:
        with pytest.raises(ConfigError, match=match):
            check_vlm_scorers(_cfg(vlm_dir, *overrides), model_path=vlm_dir)
    with pytest.raises(ConfigError, match=r"reward_model.model_path=.*is a vision-language model.*no VLM reward model"):
        check_vlm_scorers(_cfg(tiny_model_dir, "reward_model.enable=true", f"reward_model.model_path={vlm_dir}"),
                          model_path=str(tiny_model_dir))
    with pytest.raises(ConfigError, match=r"critic.model_path=.*is a vision-language model while model.path=.*text model"):
        check_vlm_scorers(_cfg(tiny_model_dir, gae, f"critic.model_path={vlm_dir}"), model_path=str(tiny_model_dir))


def test_the_run_refuses_a_megatron_critic_on_a_vlm_before_any_worker(vlm_dir, tmp_path, monkeypatch):
    """Through the run's pre-flight (resolve_inputs), not only the check function."""
    from flowrl.config import ConfigError
    from flowrl.run.preflight import resolve_inputs

    data = tmp_path / "p.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": "hi"}]]}), data)
    cfg = _cfg(vlm_dir, f"data.train_files={data}", "algorithm.adv_estimator=gae", "critic.strategy=megatron",
               f"trainer.run_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match="critic.strategy='megatron'"):
        resolve_inputs(cfg)
