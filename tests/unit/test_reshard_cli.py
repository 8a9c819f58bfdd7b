"""``flowrl reshard-plan`` and ``reshard_plan_for``: smoke runs on a 7B shape and a tiny config."""

from __future__ import annotations

import argparse
import json

import pytest

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_cli import add_arguments, parse_layout, reshard_plan_for, run


def _run(argv, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    code = run(parser.parse_args(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_table_for_7b(capsys):
    code, out, _ = _run(["--train", "tp=4,pp=2,dp=1", "--gen", "tp=2,dp=4"], capsys)
    assert code == 0
    assert "dp=1,tp=4,pp=2 (megatron) -> dp=4,tp=2,pp=1 (vllm), colocated" in out
    assert "sent / minimum = 1.00" in out and "redundancy       0.00 MiB" in out
    assert len([line for line in out.splitlines() if line.strip()[:1].isdigit()]) == 8


def test_json_split_tiny_config(tmp_path, capsys):
    config = {"model_type": "qwen2", "vocab_size": 100, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = _run(["--train", "tp=2,pp=2", "--gen", "tp=1,dp=2", "--split", "--json",
                         "--model", str(tmp_path)], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["placement"] == "split" and data["redundant_bytes"] == 0
    assert data["bytes_sent"] == data["bytes_min"] == 2 * data["model_bytes"]  # 2 full copies
    assert len(data["ranks"]) == 4 + 2


def test_bad_layouts_exit_2(capsys):
    code, _, err = _run(["--train", "tp=4,pp=2", "--gen", "tp=2,dp=3"], capsys)
    assert code == 2 and "set the generation data_parallel_size" in err
    code, _, err = _run(["--train", "tp=3", "--gen", "tp=1"], capsys)
    assert code == 2 and "tensor_model_parallel_size=3 does not divide num_attention_heads" in err
    code, _, err = _run(["--train", "tp4", "--gen", "tp=1"], capsys)
    assert code == 2 and "tp=N,pp=N,dp=N" in err


def test_notebook_function_and_layout_parsing():
    assert parse_layout("tp=2,pp=2", world_size=8) == ParallelDims(dp=2, tp=2, pp=2)
    with pytest.raises(ValueError, match="does not divide the world size 6"):
        parse_layout("tp=4", world_size=6, flag="--gen")
    # Same layout, colocated by micro-DP: nothing moves (megatron's tp=2 padding of V=32000 to a
    # multiple of 256 adds no rows, vLLM's multiple of 64 neither).
    plan = reshard_plan_for("7B", train="tp=2,pp=2,dp=2", gen="tp=2,pp=2,dp=2")
    assert plan.bytes_sent == plan.bytes_min == 0
    # tp=4: megatron pads to 32256 (8064 rows per rank), vLLM keeps 32000 (8000 per rank), so the
    # embedding and head rows between the two sets of boundaries move, and nothing else.
    plan = reshard_plan_for("7B", train="tp=4,pp=2,dp=1", gen="tp=4,pp=2,dp=1")
    assert 0 < plan.bytes_sent == plan.bytes_min
    assert {t.param for t in plan.sends} == {"model.embed_tokens.weight", "lm_head.weight"}


def test_schedule_line_and_a_bucket_below_one_row(tmp_path, capsys):
    config = {"model_type": "llama", "vocab_size": 100, "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    base = ["--train", "tp=2,pp=2", "--gen", "tp=1", "--gen-style", "hf", "--model", str(tmp_path)]
    code, out, _ = _run(base + ["--bucket-mb", "0"], capsys)
    assert code == 0 and "schedule         1 rounds" in out and "(bucket unbounded)" in out
    code, out, _ = _run(base + ["--json", "--bucket-mb", "0.001"], capsys)  # 1048 bytes
    data = json.loads(out)
    assert data["rounds"] > 1 and 0 < data["max_staging_bytes"] <= 1048
    # one row of the embedding is 16 * 2 bytes: a 16-byte bucket cannot hold it
    code, _, err = _run(base + ["--bucket-mb", str(16 / 2**20)], capsys)
    assert code == 2 and "use bucket_bytes >= 64" in err
