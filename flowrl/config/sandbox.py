"""``sandbox``: where model-written code runs (the ``python`` tool, the ``code`` reward).

verl's ``sandbox_fusion.url`` / ``max_concurrent`` / ``memory_limit_mb`` (also under ``reward.`` and
``reward_model.``) map onto ``sandbox.url`` / ``max_concurrent`` / ``memory_limit_mb``. A run whose
config names a code-running tool or reward checks the sandbox before any worker starts
(``flowrl.run.sandbox_check``); the resolved ``config.yaml`` of the run records the mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from flowrl.config.errors import check, check_one_of, check_positive

SANDBOX_MODES = ("auto", "jail", "remote", "unsafe-local")


@dataclass(kw_only=True)
class SandboxConfig:
    mode: Literal["auto", "jail", "remote", "unsafe-local"] = "auto"
    """``jail``: a bubblewrap jail per call (namespaces, no host files, limits; needs ``bwrap``);
    ``remote``: SandboxFusion at ``url``; ``unsafe-local``: an unjailed subprocess with limits only
    (an opt-in: it warns at start, and the run's config records it); ``auto``: ``remote`` when
    ``url`` is set, else ``jail``. Never a silent downgrade: where the jail cannot run, a run that
    runs code stops before any worker starts."""
    url: str = ""
    """SandboxFusion's address (verl's ``sandbox_fusion.url``), e.g. ``http://sandbox:8080``;
    calls go to ``{url}/run_code``."""
    max_concurrent: int = 64
    """Calls in flight to SandboxFusion per process, at most (verl's ``max_concurrent``)."""
    memory_limit_mb: int = 1024
    """Memory of one remote call (verl's ``memory_limit_mb``)."""

    def __post_init__(self) -> None:
        check_one_of("mode", self.mode, SANDBOX_MODES)
        check(not self.url or self.url.startswith(("http://", "https://")), "url", self.url,
              "is not an http(s) URL", "use e.g. http://localhost:8080 (SandboxFusion's address)")
        check(self.mode != "remote" or bool(self.url), "mode", self.mode, "needs sandbox.url",
              "set sandbox.url=http://host:port (SandboxFusion), or sandbox.mode=jail")
        check_positive("max_concurrent", self.max_concurrent, "use e.g. 64")
        check_positive("memory_limit_mb", self.memory_limit_mb, "use e.g. 1024")

    @property
    def resolved_mode(self) -> str:
        """``jail``, ``remote`` or ``unsafe-local`` (``auto`` resolved)."""
        if self.mode == "auto":
            return "remote" if self.url else "jail"
        return self.mode

    def settings_json(self) -> str:
        """What worker processes read (``flowrl.agents.sandbox.SandboxSettings``)."""
        return json.dumps({"mode": self.resolved_mode, "url": self.url, "max_concurrent": self.max_concurrent,
                           "memory_limit_mb": self.memory_limit_mb}, sort_keys=True)
