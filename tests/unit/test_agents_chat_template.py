"""Tool schemas reach the chat template's ``tools`` when prompts are rendered
(``rollout.multi_turn.tools``), for a template that supports tools; others ignore them."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowrl.config import load_config
from flowrl.tasks.agent_task import build_agent_tokenizer
from flowrl.data.prompts import PromptDataset, render_prompt

# The shape of Qwen2.5's template, in short: with tools, a block listing each tool's JSON first.
TOOLS_TEMPLATE = (
    "{%- if tools -%}{{- '<tools>' -}}{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}{{ m['content'] }}{%- endfor -%}"
)
ON = ["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[calculator]"]
MESSAGES = [{"role": "user", "content": "12*34="}]
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def tools_tokenizer():
    tok = build_agent_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def test_the_config_gives_the_tools_schemas_in_openai_form():
    assert load_config(None, ON).rollout.multi_turn.chat_tools() == [CALCULATOR]
    assert load_config(None, []).rollout.multi_turn.chat_tools() is None  # off: no tools


def test_a_template_with_tool_support_renders_the_schemas():
    tools = load_config(None, ON).rollout.multi_turn.chat_tools()
    text = render_prompt(MESSAGES, tools_tokenizer(), tools)
    block, prompt = text.split("\n</tools>\n")
    assert prompt == "12*34="
    assert [json.loads(line) for line in block.split("\n")[1:]] == [CALCULATOR]
    assert render_prompt(MESSAGES, tools_tokenizer()) == "12*34="  # without tools: no block


def test_a_template_without_tool_support_ignores_them():
    tools = load_config(None, ON).rollout.multi_turn.chat_tools()
    assert render_prompt(MESSAGES, build_agent_tokenizer(), tools) == "12*34="
    assert render_prompt("12*34=", tools_tokenizer(), tools) == "12*34="  # a plain string has no template


def test_the_dataset_tokenizes_the_rendered_tools_and_caches_per_tool_list(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": MESSAGES, "data_source": "x",
                                          "reward_model": {"ground_truth": "408"}}]), path)
    tok = tools_tokenizer()
    tok.name_or_path = str(tmp_path)  # a named tokenizer: loads are cached, keyed by the tools too
    tools = load_config(None, ON).rollout.multi_turn.chat_tools()
    with_tools = PromptDataset([path], tok, max_prompt_length=1024, tools=tools)
    plain = PromptDataset([path], tok, max_prompt_length=1024)
    (ids,) = with_tools.table.column("prompt_ids").to_pylist()
    assert tok.decode(ids) == render_prompt(MESSAGES, tok, tools) and '"name": "calculator"' in tok.decode(ids)
    assert tok.decode(plain.table.column("prompt_ids").to_pylist()[0]) == "12*34="


def test_the_run_loads_prompts_with_the_tools(tmp_path):
    """The pre-flight data check (and the run, the same call) renders the prompts with them."""
    from flowrl.run.data_check import _load

    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": MESSAGES, "data_source": "x",
                                          "reward_model": {"ground_truth": "408"}}]), path)
    cfg = load_config(None, ON + ["data.max_prompt_length=1024"])
    ds = _load(cfg, "data.train_files", str(path), tools_tokenizer(), filter_overlong=True, truncation="error")
    assert ds.tools == [CALCULATOR]
    with pytest.raises(Exception, match="max_prompt_length"):  # the schemas count in the prompt's length
        _load(load_config(None, ON + ["data.max_prompt_length=64", f"trainer.run_dir={tmp_path}"]), "data.train_files", str(path),
              tools_tokenizer(), filter_overlong=True, truncation="error")
