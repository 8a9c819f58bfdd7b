"""Pre-flight of the sandbox: a run whose config runs model-written code (a tool or a reward
function marked ``runs_code``, e.g. the ``python`` tool and the ``code`` reward) needs a working
sandbox before any worker starts (issue 38).

* ``sandbox.mode=jail`` (or ``auto`` without a URL): the jail is probed once
  (:func:`flowrl.agents.jail.jail_problem`); where bubblewrap is missing or the kernel refuses
  the namespaces, :class:`~flowrl.config.ConfigError` names the fixes: never a silent downgrade;
* ``remote``: SandboxFusion answers one ``print(1)`` call, or the run stops naming the URL;
* ``unsafe-local``: a warning at start; the run's ``config.yaml`` records the mode.

The resolved settings go to ``FLOWRL_SANDBOX`` in the driver's environment, which the worker
processes started afterwards inherit (:func:`flowrl.agents.sandbox.sandbox_settings`).
"""

from __future__ import annotations

import os
import sys
import warnings

from flowrl.config import ConfigError, RunConfig

__all__ = ["check_sandbox", "code_runners"]


def code_runners(cfg: RunConfig) -> list[str]:
    """The config keys that make this run execute model-written code (empty: none)."""
    from flowrl.rewards import resolve_reward_fn

    found = []
    mt = cfg.rollout.multi_turn
    if mt.enable and not mt.environment and mt.tools:
        from flowrl.agents.tools import resolve_tools

        for name, tool in resolve_tools(mt.tools).items():
            if getattr(tool, "runs_code", False):
                found.append(f"rollout.multi_turn.tools names {name!r}")
    try:
        fn = resolve_reward_fn(cfg.algorithm.reward_fn)
    except Exception:  # noqa: BLE001 - check_reward_fn reports it
        fn = None
    if getattr(getattr(fn, "fn", fn), "runs_code", False):
        found.append(f"algorithm.reward_fn={cfg.algorithm.reward_fn}")
    return found


def check_sandbox(cfg: RunConfig) -> None:
    """Check the sandbox the config's code runs in (see the module docstring); export its settings."""
    from flowrl.agents.sandbox import SANDBOX_ENV

    os.environ[SANDBOX_ENV] = cfg.sandbox.settings_json()
    users = code_runners(cfg)
    if not users:
        return
    mode, why = cfg.sandbox.resolved_mode, "; ".join(users) + " runs model-written code"
    if mode == "jail":
        from flowrl.agents.jail import jail_problem

        problem = jail_problem()
        if problem is not None:
            raise ConfigError("sandbox.mode", cfg.sandbox.mode, f"means the bubblewrap jail, which cannot run here "
                              f"({problem}), and {why}",
                              "install bubblewrap (apt-get install bubblewrap) with user namespaces allowed, or use "
                              "a SandboxFusion service (sandbox.url=http://host:port), or accept unjailed code with "
                              "sandbox.mode=unsafe-local")
    elif mode == "remote":
        _probe_remote(cfg)
    else:
        message = (f"sandbox.mode=unsafe-local: {why} in a plain subprocess (limits, no jail): it can read this "
                   "machine's files and reach its network; recorded in the run's config.yaml")
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _probe_remote(cfg: RunConfig) -> None:
    from flowrl.agents.sandbox_fusion import FusionClient, SandboxUnreachable

    client = FusionClient(url=cfg.sandbox.url, memory_limit_mb=cfg.sandbox.memory_limit_mb, max_retries=2,
                          request_timeout_s=10.0, retry_delay_s=0.5)
    try:
        result = client.run_code("print(1)", run_timeout_s=5.0)
    except SandboxUnreachable as exc:
        raise ConfigError("sandbox.url", cfg.sandbox.url, f"does not answer: {exc}",
                          "start SandboxFusion there, fix the URL, or use the local jail (sandbox.mode=jail)") from None
    if result.stdout.strip() != "1":
        raise ConfigError("sandbox.url", cfg.sandbox.url, f"ran print(1) and answered {result!r}",
                          "point sandbox.url at a SandboxFusion service (POST /run_code)")
