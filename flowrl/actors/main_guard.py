"""A script that starts local workers needs ``if __name__ == "__main__":``.

A ``LocalCluster`` starts its workers with ``multiprocessing``'s spawn or forkserver method, and
both import the driver's main script again in the new process (as ``__mp_main__``). Code at the
top level of the script runs there too: without the guard each worker would start a run of its
own, and the driver would wait for workers that never join (``cluster.startup_timeout_s``).
:func:`check_main_guard` finds the top-level line of the script that is starting workers, reads the
script's syntax tree, and refuses at once when that line is not under the guard;
:func:`check_script_guard` (called by the pre-flight, seconds of imports earlier) refuses a script
that starts workers (``Run.open``, ``Session.start``, flowrl's ``train``) and has no guard at all.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType, ModuleType


class MissingMainGuard(RuntimeError):
    """Workers are being started from the top level of a script without the ``__main__`` guard."""


def check_main_guard(what: str = "Run.open") -> None:
    """Raise :class:`MissingMainGuard` when this process (a script, not a notebook, ``python -c``
    or a console command) starts workers from top-level code outside ``if __name__ == "__main__":``,
    or when this is a worker process importing such a script."""
    main = sys.modules.get("__main__")
    if main is None:
        return
    path = getattr(main, "__file__", None)
    if getattr(main, "__name__", "") == "__mp_main__":  # a worker's start importing the script again
        raise MissingMainGuard(_message(what, path, None))
    found = _running_script(main)
    if found is None:
        return
    frame, tree = found
    line = frame.f_lineno
    if not any(_is_main_test(n.test) and n.lineno <= line <= (n.end_lineno or n.lineno)
               for n in ast.walk(tree) if isinstance(n, ast.If)):
        raise MissingMainGuard(_message(what, path, line))


def check_script_guard(what: str = "resolve_inputs") -> None:
    """Raise :class:`MissingMainGuard` when this process runs, at its top level, a script that
    starts local workers (it calls ``Run.open``, ``Session.start`` or ``train`` imported from
    flowrl) and has no ``if __name__ == "__main__":`` anywhere: its workers' start cannot succeed."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__name__", "") == "__mp_main__":
        return
    found = _running_script(main)
    if found is None:
        return
    frame, tree = found
    path = main.__file__
    nodes = list(ast.walk(tree))
    if any(isinstance(n, ast.If) and _is_main_test(n.test) for n in nodes):
        return
    trains = {a.asname or a.name for n in nodes if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("flowrl")
              for a in n.names if a.name == "train"}
    if any(isinstance(n, ast.Call) and _starts_workers(n.func, trains) for n in nodes):
        raise MissingMainGuard(_message(what, path, frame.f_lineno))


def _starts_workers(func: ast.expr, trains: set[str]) -> bool:
    """``Run.open``, ``Session.start`` or a name bound to flowrl's ``train``."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return (func.value.id, func.attr) in (("Run", "open"), ("Session", "start"))
    return isinstance(func, ast.Name) and func.id in trains


def _running_script(main: ModuleType) -> tuple[FrameType, ast.Module] | None:
    """The frame running the main script's top-level code and the script's syntax tree; None
    for anything but a ``.py`` script on this call stack that parses (a notebook, ``python -c``,
    a console command; a file that cannot be read: the workers' start will say what went wrong)."""
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py"):
        return None
    frame = _top_level_frame(main)
    if frame is None:
        return None
    try:
        return frame, ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _top_level_frame(main: ModuleType) -> FrameType | None:
    """The frame running the main script's top-level code, if it is on this call stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__:
            return frame
        frame = frame.f_back
    return None


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


def _message(what: str, path: str | None, line: int | None) -> str:
    where = f"{path}, line {line}" if line is not None else (path or "the main script")
    return (f"{what}: this script starts local worker processes from its top level ({where}) without "
            "`if __name__ == \"__main__\":`; every worker imports the script again and would start a run of "
            "its own. fix: put the script's code under `if __name__ == \"__main__\":` (or in a function called "
            "from there), as in the README's Python API example")
