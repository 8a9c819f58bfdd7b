"""verl's multi-turn tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``, flowrl's
``rollout.multi_turn.tool_config_path``): a YAML file of ``tools: [{class_name, config, tool_schema}]``,
as verl's ``initialize_tools_from_config`` reads it, made into flowrl tools
(:class:`~flowrl.agents.tools.Tool`), named by their ``tool_schema.function.name``:

* verl's own tool classes flowrl has an equivalent of (:data:`VERL_TOOL_CLASSES`): verl's
  ``Gsm8kTool`` is :class:`Gsm8kTool` here, the same answers, rewards and create kwargs;
* a ``class_name`` that imports (``package.module.Class``, verl's dotted form, or
  ``package.module:Class``) to a flowrl ``Tool`` subclass: built with the entry's ``config`` as
  keyword arguments, its schema the entry's ``tool_schema.function`` when given;
* any other verl tool (search, sandbox fusion, image zoom, MCP, ...) is refused by name, with the
  fix (a flowrl tool in ``rollout.multi_turn.tools``).

Per-trajectory arguments come as in verl: a row's ``extra_info.tools_kwargs.<name>.create_kwargs``
(verl's multi-turn data preprocessing writes them) is what ``create`` receives."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

from flowrl.agents.tools import Tool, resolve_tools

__all__ = ["Gsm8kTool", "VERL_TOOL_CLASSES", "create_kwargs", "load_tool_config", "resolve_all_tools", "verl_gsm8k_score"]

#: verl class names -> flowrl's equivalent (import string). verl moved its tools from
#: ``verl.workers.tool`` to ``verl.tools``; both names are taken.
VERL_TOOL_CLASSES: dict[str, str] = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "flowrl.agents.verl_tools:Gsm8kTool",
    "verl.workers.tool.gsm8k_tool.Gsm8kTool": "flowrl.agents.verl_tools:Gsm8kTool",
}


def create_kwargs(row: dict, name: str) -> dict:
    """verl's per-trajectory ``create`` arguments of tool ``name``: the row's
    ``extra_info.tools_kwargs[name].create_kwargs`` (``{}`` when absent)."""
    extra = row.get("extra_info")
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError:
            extra = None
    tools_kwargs = (extra or {}).get("tools_kwargs") or {} if isinstance(extra, dict) else {}
    entry = tools_kwargs.get(name) or {}
    return dict(entry.get("create_kwargs") or {}) if isinstance(entry, dict) else {}


_SOLUTION_CLIP_CHARS = 300


def verl_gsm8k_score(solution_str: str, ground_truth: Any) -> float:
    """verl 0.9.1's ``gsm8k.compute_score(..., method="flexible", format_score=0.0, score=1.0)``:
    the last number in the last 300 characters equals the ground truth (as strings)."""
    numbers = re.findall("(\\-?[0-9\\.\\,]+)", solution_str[-_SOLUTION_CLIP_CHARS:])
    answer = None
    for answer in reversed(numbers):
        if answer not in ("", "."):
            break
    if answer is None:
        return 0.0
    return 1.0 if answer == ground_truth else 0.0


class Gsm8kTool(Tool):
    """verl's ``Gsm8kTool``: the model submits ``answer``; the tool answers ``Current parsed
    answer='...' reward=...`` (verl's text) with the GSM8K score of ``#### <answer>`` against the
    trajectory's ``ground_truth`` (verl's create kwarg, else the row's ``reward_model.ground_truth``).
    Its step reward is verl 0.9.1's: -0.05 for a submission that scores 0, else 0;
    :meth:`reward` sums them (added to the score times ``rollout.multi_turn.tool_reward_coef``,
    which a verl config sets to 0: verl's reward leaves tool rewards out)."""

    name = "calc_gsm8k_reward"
    schema = {"name": "calc_gsm8k_reward",
              "description": "A tool for calculating the reward of gsm8k. (1.0 if your answer is correct, 0.0 if your "
                             "answer is incorrect)",
              "parameters": {"type": "object", "properties": {"answer": {
                  "type": "string", "description": "The model's answer to the GSM8K math problem, must be a digits"}},
                  "required": ["answer"]}}

    def create_state(self, row: dict) -> dict:
        kwargs = create_kwargs(row, self.name)
        truth = kwargs.get("ground_truth")
        if truth is None:
            truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
        return {"response": "", "ground_truth": truth, "reward": 0.0, "tool_rewards": []}

    async def call(self, args: dict, state: dict) -> str:
        answer = args.get("answer", "") if isinstance(args, dict) else ""
        answer = answer if isinstance(answer, str) else str(answer)
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = verl_gsm8k_score(state["response"], state["ground_truth"])
        # verl 0.9.1's agent loop creates and releases the tool's instance around each call, so
        # each call compares with a fresh instance's 0.0: -0.05 unless this answer scores
        state["tool_rewards"].append(0.0 if reward > 0.0 else -0.05)
        state["reward"] = reward
        return f"Current parsed {answer=} {reward=}"

    def reward(self, state: dict | None) -> float:
        return float(sum(state["tool_rewards"])) if state else 0.0


def _import_class(class_name: str) -> Any:
    module, _, attr = class_name.partition(":") if ":" in class_name else class_name.rpartition(".")
    if not module or not attr:
        raise ValueError(f"class_name {class_name!r} is not package.module.Class")
    return getattr(importlib.import_module(module), attr)


def _schema(entry: dict) -> dict | None:
    """The entry's ``tool_schema.function`` (OpenAI format) as a flowrl schema, or None."""
    schema = entry.get("tool_schema")
    if not schema:
        return None
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or not function.get("name"):
        raise ValueError(f"tool {entry.get('class_name')!r}: tool_schema has no function.name")
    return dict(function)


def load_tool_config(path: str) -> dict[str, Tool]:
    """The tools of verl's tool config at ``path`` by the name the model calls them (see the
    module docstring). ValueError (naming the entry and the fix) on a tool flowrl lacks, a class
    that is not a flowrl tool, a bad schema or a repeated name; OSError when the file is missing."""
    import yaml

    text = Path(path).read_text()
    config = yaml.safe_load(text) or {}
    entries = config.get("tools") if isinstance(config, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path} lists no tools (verl's format: tools: [{{class_name, config, tool_schema}}])")
    out: dict[str, Tool] = {}
    for entry in entries:
        class_name = str(entry.get("class_name", ""))
        options = dict(entry.get("config") or {})
        kind = options.pop("type", "native")
        if kind != "native":
            raise ValueError(f"tool {class_name!r}: config.type={kind!r}; verl and flowrl take native tools only")
        target = VERL_TOOL_CLASSES.get(class_name, class_name)
        if target.startswith("verl.") and target not in VERL_TOOL_CLASSES.values():
            raise ValueError(f"tool {class_name!r}: verl's tool is not built in flowrl (flowrl has "
                             f"{', '.join(sorted(set(VERL_TOOL_CLASSES)))}); fix: write a flowrl Tool "
                             "(flowrl.agents.tools.Tool) and name it in rollout.multi_turn.tools as module:Class")
        cls = _import_class(target)
        if not (isinstance(cls, type) and issubclass(cls, Tool)):
            raise ValueError(f"tool {class_name!r} is not a flowrl.agents.tools.Tool subclass (verl's BaseTool "
                             "classes need verl's workers); fix: subclass flowrl.agents.tools.Tool")
        tool = cls(**options) if target not in VERL_TOOL_CLASSES.values() else cls()
        schema = _schema(entry)
        if schema is not None:
            tool.schema = schema
            tool.name = schema["name"]
        if tool.name in out:
            raise ValueError(f"tool name {tool.name!r} appears twice in {path}; each tool needs its own name")
        out[tool.name] = tool
    return out


def resolve_all_tools(names: list[str] | tuple[str, ...], tool_config_path: str = "") -> dict[str, Tool]:
    """The tools of ``rollout.multi_turn``: verl's tool config file's (``tool_config_path``) and the
    registered names or import strings ``names`` (:func:`flowrl.agents.tools.resolve_tools`); a name
    both declare is refused."""
    out = load_tool_config(tool_config_path) if tool_config_path else {}
    for name, tool in resolve_tools(names).items():
        if name in out:
            raise ValueError(f"two tools are called {name!r} (rollout.multi_turn.tools and {tool_config_path}); "
                             "tool names must be unique")
        out[name] = tool
    return out
