"""The embedded agentic task: prompts, demonstrations (loss only on the model's tokens), the
score, and a (very short) build whose directory round-trips through AutoTokenizer."""

from __future__ import annotations

from flowrl.tasks.agent_task import (AgentTask, build_agent_tokenizer, compute_score, demonstration, make_rows,
                                     prepare_agent_task, tool_call_text)


def test_rows_are_disjoint_between_splits_and_seeded():
    train, test = make_rows(200, 0, "train"), make_rows(50, 0, "test")
    assert make_rows(200, 0, "train") == train
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    a, b = train[0]["prompt"][0]["content"].rstrip("=").split("*")
    assert train[0]["reward_model"]["ground_truth"] == str(int(a) * int(b))


def test_demonstration_labels_only_the_model_tokens():
    tok = build_agent_tokenizer()
    row = {"prompt": [{"role": "user", "content": "347*86="}], "reward_model": {"ground_truth": "29842"}}
    ids, labels = demonstration(tok, row)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == "347*86=" + tool_call_text("347*86") + "<eos>\n=29842\n29842<eos>"
    learned = tok.decode([i for i, lab in zip(ids, labels) if lab != -100], skip_special_tokens=False)
    assert learned == tool_call_text("347*86") + "<eos>29842<eos>"


def test_score_is_the_last_line():
    call = tool_call_text("2*3")
    assert compute_score("s", call + "\n=6\n6", "6") == {"score": 1.0, "used_tool": 1.0}
    assert compute_score("s", "6", "6") == {"score": 1.0, "used_tool": 0.0}
    assert compute_score("s", call + "\n=6\n", "6")["score"] == 0.0


def test_a_short_build_round_trips(tmp_path):
    from transformers import AutoTokenizer

    from flowrl.tasks.warmup import WarmupConfig

    warmup = WarmupConfig(max_steps=4, batch_size=8, check_every=2, target_greedy_accuracy=None)
    task = prepare_agent_task(tmp_path / "task", num_train=64, num_test=8, warmup=warmup)
    assert isinstance(task, AgentTask) and task.warmup_steps == 4 and task.train_path.exists()
    tok = AutoTokenizer.from_pretrained(task.model_dir)
    assert tok.decode(tok.encode("\n=6\n", add_special_tokens=False)) == "\n=6\n"  # newlines survive loading
    assert prepare_agent_task(tmp_path / "task", num_train=64, num_test=8, warmup=warmup) == task  # cached
