"""A verl shell script run as it is, its ``python3 -m verl.trainer.main_ppo`` call taken over by flowrl.

``flowrl train --verl-script 'run_qwen2-7b.sh [ARGS]' [overrides]`` runs the script under ``bash``
with a stand-in ``python``/``python3`` first on ``PATH``: called as ``-m verl.trainer.main_ppo`` it
records its argument list and returns 0; any other call runs the real interpreter. The script's own
variables, arrays, defaults (``${1:-vllm}``) and arithmetic apply, as they would under verl. The
recorded list then replaces ``--verl-script ...`` on flowrl's command line, and the overrides after
it come later, so they win (as Hydra's later overrides do).

* :func:`capture` runs a script and returns the recorded argument list (no flowrl config read);
* :func:`expand` rewrites a ``flowrl train|submit|config`` command line that holds ``--verl-script``.

The stand-in only sees calls that go through ``PATH``: a script calling ``/usr/bin/python3`` by its
absolute path runs verl itself; one that never calls ``main_ppo`` is refused, naming the script.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from flowrl.config.errors import ConfigError

FLAG = "--verl-script"
MODULE = "verl.trainer.main_ppo"
COMMANDS = ("train", "submit", "config")
TIMEOUT_S = 120.0  # a script that only sets variables and calls main_ppo takes well under a second

_SHIM = '''#!{python}
# flowrl's stand-in for python/python3 while a verl script runs (flowrl.config.verl_script)
import json, os, sys
args = sys.argv[1:]
for i in range(len(args) - 1):
    if args[i] == "-m" and args[i + 1] == {module!r}:
        with open(os.environ["FLOWRL_VERL_CAPTURE"], "a") as out:
            out.write(json.dumps(args[i + 2:]) + "\\n")
        sys.exit(0)
os.execv({python!r}, [{python!r}, *args])
'''


def capture(script_line: str, *, cwd: str | os.PathLike | None = None, timeout_s: float = TIMEOUT_S,
            env: dict[str, str] | None = None) -> list[str]:
    """The argument list that ``bash SCRIPT ARGS...`` (``script_line``, shell-quoted) hands
    ``python3 -m verl.trainer.main_ppo``; :class:`ConfigError` naming the script when it is not a
    file, fails before that call, calls it more than once, never calls it, or runs past
    ``timeout_s``."""
    words = shlex.split(script_line)
    if not words:
        raise ConfigError(FLAG, script_line, "names no script", f"write {FLAG} 'path/to/run.sh [ARGS]'")
    script = Path(words[0]).expanduser()
    if not script.is_file():
        raise ConfigError(FLAG, script_line, f"{script} is not a file", "give the path of a verl shell script")
    with tempfile.TemporaryDirectory(prefix="flowrl-verl-script-") as tmp:
        shims, record = Path(tmp) / "bin", Path(tmp) / "calls.jsonl"
        shims.mkdir()
        for name in ("python", "python3"):
            shim = shims / name
            shim.write_text(_SHIM.format(python=sys.executable, module=MODULE))
            shim.chmod(0o755)
        run_env = {**os.environ, **(env or {})}
        run_env["PATH"] = f"{shims}{os.pathsep}{run_env.get('PATH', '')}"
        run_env["FLOWRL_VERL_CAPTURE"] = str(record)
        try:
            proc = subprocess.run(["bash", str(script), *words[1:]], cwd=cwd, env=run_env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ConfigError(FLAG, script_line, f"ran past {timeout_s:.0f} s before it called python3 -m {MODULE}",
                              "check that the script does not wait on input or a server") from None
        calls = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    if len(calls) > 1:
        raise ConfigError(FLAG, script_line, f"calls python3 -m {MODULE} {len(calls)} times",
                          "run a script that trains once (or copy the call you want into a script of its own)")
    if not calls:
        tail = " | ".join(line for line in (proc.stderr or proc.stdout).strip().splitlines()[-3:])
        why = f"exited {proc.returncode} ({tail})" if proc.returncode else "ended"
        raise ConfigError(FLAG, script_line, f"{why} without calling python3 -m {MODULE} through PATH",
                          "give a script that runs verl's main_ppo as python3 -m verl.trainer.main_ppo")
    return calls[0]


def expand(argv: list[str], **capture_kwargs) -> list[str]:
    """``argv`` (flowrl's command line, without the program name) with ``--verl-script LINE`` (or
    ``--verl-script=LINE``) replaced by the argument list the script hands ``main_ppo``, right after
    the sub-command: the overrides that follow on the command line come later, so they win.
    Unchanged without the flag."""
    if not argv or argv[0] not in COMMANDS:
        return argv
    rest, line = [], None
    it = iter(argv[1:])
    for arg in it:
        name, eq, value = arg.partition("=")
        if name == FLAG:
            if line is not None:
                raise ConfigError(FLAG, value if eq else next(it, ""), "is given twice", "give one verl script")
            line = value if eq else next(it, None)
            if line is None:
                raise ConfigError(FLAG, "", "names no script", f"write {FLAG} 'path/to/run.sh [ARGS]'")
        else:
            rest.append(arg)
    if line is None:
        return argv
    return [argv[0], *capture(line, **capture_kwargs), *rest]
