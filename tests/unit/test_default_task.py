"""The default task: tiny models, cached and atomic preparation (with a few-step warm-up)."""

import json

import pytest

from flowrl.tasks.default_task import prepare_default_task
from flowrl.tasks import warmup as warmup_module
from flowrl.models.char_tokenizer import build_char_tokenizer
from flowrl.models.tiny import TINY_PRESETS, build_tiny_model, count_parameters, tiny_preset
from flowrl.tasks.warmup import WarmupConfig

# A few steps on small batches: exercises every stage in well under a second.
FAST = dict(
    num_train=32,
    num_test=8,
    num_eval_rows=4,
    warmup=WarmupConfig(max_steps=3, batch_size=8, target_greedy_accuracy=0.5, check_every=2,
                        num_probe_rows=4),
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def test_tiny_model_from_tokenizer(tokenizer):
    import torch

    model = build_tiny_model(tokenizer, **tiny_preset("default"), seed=0)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert (model.config.eos_token_id, model.config.pad_token_id) == (1, 0)
    assert count_parameters(model) < 500_000
    again = build_tiny_model(tokenizer, **tiny_preset("default"), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    llama = build_tiny_model(tokenizer, arch="llama", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1, intermediate_size=64)
    assert type(llama).__name__ == "LlamaForCausalLM"


def test_presets_and_errors(tokenizer):
    assert {"default", "10m"} <= set(TINY_PRESETS)
    with pytest.raises(ValueError, match="valid: 10m, default"):
        tiny_preset("huge")
    with pytest.raises(ValueError, match="arch='gpt2'"):
        build_tiny_model(tokenizer, arch="gpt2")
    with pytest.raises(ValueError, match="num_kv_heads"):
        build_tiny_model(tokenizer, num_heads=8, num_kv_heads=3)


def test_warmup_config_validation():
    with pytest.raises(ValueError, match="label_smoothing"):
        WarmupConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match="max_steps"):
        WarmupConfig(max_steps=0)


def test_prepare_writes_a_loadable_task(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task = prepare_default_task(tmp_path / "task", seed=0, **FAST)
    assert task.model_dir == tmp_path / "task" / "model"
    assert task.train_path.exists() and task.test_path.exists()
    assert 0.0 <= task.initial_sampled_accuracy <= 1.0
    assert 1 <= task.warmup_steps <= 3
    model = AutoModelForCausalLM.from_pretrained(task.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    # Only the task directory itself is left: no temporary siblings.
    assert [p.name for p in tmp_path.iterdir()] == ["task"]


def test_prepare_is_cached(tmp_path, monkeypatch):
    task = prepare_default_task(tmp_path / "task", **FAST)
    marker = (task.root / "task.json").stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("a cached task was rebuilt")

    monkeypatch.setattr(warmup_module, "sft_warm_up", no_training)
    again = prepare_default_task(tmp_path / "task", **FAST)
    assert again == task
    assert (task.root / "task.json").stat().st_mtime_ns == marker
    # A different seed is a different task: it is rebuilt (and here the rebuild fails).
    with pytest.raises(AssertionError, match="rebuilt"):
        prepare_default_task(tmp_path / "task", seed=1, **FAST)


def test_crash_leaves_no_partial_directory(tmp_path, monkeypatch):
    task = prepare_default_task(tmp_path / "task", **FAST)
    before = json.loads((task.root / "task.json").read_text())

    def crash(*args, **kwargs):
        raise RuntimeError("killed mid warm-up")

    monkeypatch.setattr(warmup_module, "sft_warm_up", crash)
    with pytest.raises(RuntimeError, match="killed"):
        prepare_default_task(tmp_path / "fresh", **FAST)
    with pytest.raises(RuntimeError, match="killed"):
        prepare_default_task(tmp_path / "task", force=True, **FAST)
    assert not (tmp_path / "fresh").exists()
    assert json.loads((task.root / "task.json").read_text()) == before  # old task intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["task"]


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a flowrl default-task directory"):
        prepare_default_task(tmp_path / "mine", **FAST)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
