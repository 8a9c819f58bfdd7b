"""The built-in ``python`` tool, and where model-written code runs: :func:`run_code`.

Every call that runs code the policy wrote goes through :func:`run_code`, which follows the run's
sandbox settings (``sandbox.*`` in the config, :class:`SandboxSettings` here):

* ``jail`` (the default): a bubblewrap jail per call (:mod:`flowrl.agents.jail`: namespaces, an
  empty read-only root, limits, a timeout that leaves no process behind);
* ``remote``: SandboxFusion over HTTP (:mod:`flowrl.agents.sandbox_fusion`, verl's
  ``sandbox_fusion.url``);
* ``unsafe-local``: an opt-in plain subprocess with the same limits but no namespaces (warns).

The driver checks the settings before any worker starts (``flowrl.run.preflight``) and hands them
to the worker processes in the ``FLOWRL_SANDBOX`` environment variable (JSON), which they
inherit; a process without it runs code in the jail, never less.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from flowrl.agents.jail import JailLimits, JailResult, run_jailed
from flowrl.agents.tools import Tool

__all__ = ["SANDBOX_ENV", "SANDBOX_MODES", "PythonSandbox", "SandboxSettings", "run_code", "run_python",
           "sandbox_settings"]

SANDBOX_MODES = ("jail", "remote", "unsafe-local")
SANDBOX_ENV = "FLOWRL_SANDBOX"


@dataclass(frozen=True, kw_only=True)
class SandboxSettings:
    """Where model-written code runs (the resolved ``sandbox`` config section)."""

    mode: str = "jail"
    url: str = ""
    max_concurrent: int = 64
    memory_limit_mb: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in SANDBOX_MODES:
            raise ValueError(f"sandbox.mode={self.mode!r} is not one of {', '.join(SANDBOX_MODES)}")
        if self.mode == "remote" and not self.url:
            raise ValueError("sandbox.mode=remote needs sandbox.url (SandboxFusion's address, e.g. http://host:8080)")

    def to_env(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@lru_cache(maxsize=8)
def _from_env(value: str) -> SandboxSettings:
    return SandboxSettings(**json.loads(value)) if value else SandboxSettings()


def sandbox_settings() -> SandboxSettings:
    """This process's settings: ``FLOWRL_SANDBOX`` (set by the driver), else the jail."""
    return _from_env(os.environ.get(SANDBOX_ENV, ""))


async def run_code(code: str, *, stdin: str = "", limits: JailLimits | None = None,
                   settings: SandboxSettings | None = None) -> JailResult:
    """Run Python ``code`` with ``stdin`` where the settings say (see the module docstring)."""
    limits = limits or JailLimits()
    settings = settings or sandbox_settings()
    if settings.mode == "remote":
        from flowrl.agents.sandbox_fusion import FusionClient

        client = FusionClient(url=settings.url, max_concurrent=settings.max_concurrent,
                              memory_limit_mb=settings.memory_limit_mb)
        return await asyncio.to_thread(client.run_code, code, stdin=stdin, run_timeout_s=limits.timeout_s,
                                       max_output_chars=limits.max_output_chars)
    return await run_jailed(code, stdin=stdin, limits=limits, unsafe_local=settings.mode == "unsafe-local")


async def run_python(code: str, *, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, file_mb: int = 16,
                     max_output_chars: int = 2000) -> tuple[int | None, str]:
    """``(exit code or None on timeout, output)`` of ``code`` run by :func:`run_code`."""
    limits = JailLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, file_mb=file_mb,
                        max_output_chars=max_output_chars)
    result = await run_code(code, limits=limits)
    return result.returncode, result.text() if not result.timed_out else f"timed out after {timeout_s:g} s"


class PythonSandbox(Tool):
    """``python(code)``: runs the code in the sandbox (the jail by default), answers with its output."""

    name = "python"
    schema = {
        "description": "Run Python code in an isolated sandbox (no network; only its own scratch directory is "
                       "writable; files do not persist between calls); returns what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    }
    runs_code = True
    """Pre-flight: a config naming this tool needs a working sandbox before any worker starts."""

    def __init__(self, *, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, max_output_chars: int = 2000,
                 settings: SandboxSettings | None = None) -> None:
        self.limits = JailLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_output_chars=max_output_chars)
        self.settings = settings

    async def call(self, args: dict, state: Any) -> str:
        code = args.get("code")
        if not isinstance(code, str):
            raise ValueError("expected the argument 'code' (a string)")
        result = await run_code(code, limits=self.limits, settings=self.settings)
        if result.timed_out:
            return f"timed out after {self.limits.timeout_s:g} s"
        output = result.text()
        return output if result.returncode == 0 else f"exit code {result.returncode}\n{output}"
