"""Pre-flight of verl's tool config (``rollout.multi_turn.tool_config_path``): the file is there
and each of its tools is one flowrl has (:func:`flowrl.agents.verl_tools.load_tool_config`), checked
before any worker starts."""

from __future__ import annotations

from typing import Any

from flowrl.agents.verl_tools import load_tool_config
from flowrl.config.errors import ConfigError

__all__ = ["check_tool_config"]


def check_tool_config(cfg: Any) -> None:
    """Pre-flight: ``rollout.multi_turn.tool_config_path``'s tools load (the file is there, each
    tool is one flowrl has); ConfigError naming the key, the path and the fix otherwise."""
    mt = cfg.rollout.multi_turn
    if not (mt.enable and mt.tool_config_path):
        return
    key = "rollout.multi_turn.tool_config_path"
    try:
        tools = load_tool_config(mt.tool_config_path)
    except OSError as exc:
        raise ConfigError(key, mt.tool_config_path, f"cannot be read ({exc.strerror or exc})",
                          "point it at verl's tool config YAML") from None
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        raise ConfigError(key, mt.tool_config_path, str(exc), "fix the tool config, or drop it") from None
    clash = sorted(set(tools) & set(_names(mt.tools)))
    if clash:
        raise ConfigError(key, mt.tool_config_path, f"declares {clash}, which rollout.multi_turn.tools names too",
                          "name each tool once")


def _names(entries: list[str]) -> list[str]:
    from flowrl.agents.tools import resolve_tools

    return list(resolve_tools(entries)) if entries else []
