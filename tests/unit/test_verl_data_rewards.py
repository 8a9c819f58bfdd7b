"""verl's data and reward conventions: overlong prompts (``data.truncation``,
``data.filter_overlong_prompts``), a file whose every prompt is too long, reward functions
written for verl (``extra_info`` as a dict, ``custom_reward_function.path``), epochs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest

from flowrl.data.prompts import OverlongPrompt, PromptDataset, truncate
from flowrl.rewards import resolve_reward_fn
from flowrl.run.loop import epoch_steps
from flowrl_testing.verl import write_gsm8k_style


def test_truncate_as_verl():
    ids = list(range(10))
    assert truncate(ids, 4, "left") == [6, 7, 8, 9]  # keeps the end
    assert truncate(ids, 4, "right") == [0, 1, 2, 3]  # keeps the start
    assert truncate(ids, 5, "middle") == [0, 1, 7, 8, 9]  # 5 // 2 = 2 first, 3 last
    assert truncate(ids, 20, "error") == ids
    with pytest.raises(OverlongPrompt):
        truncate(ids, 4, "error")


def test_overlong_prompts_filtered_or_truncated(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = write_gsm8k_style(tmp_path / "t.parquet", 4)
    kept = PromptDataset([path], tok, max_prompt_length=512)
    longest = kept.longest
    assert longest >= 50 and not kept.rejected
    cut = PromptDataset([path], tok, max_prompt_length=16, filter_overlong=False, truncation="left")
    assert {len(r) for r in cut.table.column("prompt_ids").to_pylist()} == {16}
    with pytest.raises(OverlongPrompt, match="row 0"):
        PromptDataset([path], tok, max_prompt_length=16, filter_overlong=False, truncation="error")


def test_gsm8k_style_prompts_with_default_lengths_fail_fast_naming_the_key(tmp_path, tiny_model_dir):
    train = write_gsm8k_style(tmp_path / "train.parquet", 16)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "train", f"model.path={tiny_model_dir}",
                           f"data.train_files={train}", f"trainer.run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert error.startswith("error: data.max_prompt_length=32: rejects every prompt") and "the longest has" in error
    assert "Traceback" not in proc.stderr and time.perf_counter() - start < 60
    assert "note: flowrl default data.max_prompt_length=32 (verl's" in proc.stderr  # said once at start


VERL_STYLE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # as verl's GSM8K recipes do: read the row's extra_info as a dict
    assert isinstance(extra_info, dict) and "num_turns" in extra_info
    return {"score": float(solution_str.strip() == extra_info["answer"].split("#### ")[-1]),
            "split_is_train": float(extra_info["split"] == "train")}
'''


def test_a_verl_reward_function_reads_extra_info_as_a_dict(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from flowrl.config import load_config
    from flowrl.data import experience
    from flowrl.nodes.rewards import reward

    module = tmp_path / "my_reward.py"
    module.write_text(textwrap.dedent(VERL_STYLE))
    cfg = load_config(None, [f"custom_reward_function.path={module}", "custom_reward_function.name=compute_score"])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    responses = [tok("8", add_special_tokens=False)["input_ids"], tok("9", add_special_tokens=False)["input_ids"]]
    info = json.dumps({"split": "train", "index": 0, "answer": "#### 8"})  # as the experience table holds it
    table = pa.table({
        "data_source": ["openai/gsm8k"] * 2, "ground_truth": ["8"] * 2, "extra_info": [info, info],
        "response_ids": experience.from_lists(responses, experience.TOKEN_IDS),
    })
    out = reward(table, str(tiny_model_dir), cfg.algorithm.reward_fn)
    assert out.value.column("score").to_pylist() == [1.0, 0.0]
    assert out.metrics["reward/split_is_train"] == 1.0


def test_builtin_rewards_are_called_as_before():
    from flowrl.rewards.math import exact_match

    assert resolve_reward_fn("exact_match") is exact_match


def test_epochs_become_steps():
    assert epoch_steps(15, 100, 8, 0) == 15 * 12  # drop-last: 12 batches per epoch
    assert epoch_steps(15, 100, 8, 2) == 2  # total_training_steps caps, as verl stops there too
