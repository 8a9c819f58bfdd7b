"""The ``__main__`` guard checks (flowrl/actors/main_guard.py) on real scripts run in a subprocess:
a script that starts workers without the guard is refused at once, with the guard it passes; the
line that starts workers must itself be under the guard."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)


def test_a_script_that_starts_workers_without_the_guard_is_refused(tmp_path):
    out = _run(tmp_path, """
        from flowrl.actors.main_guard import check_script_guard
        from flowrl.run import Run
        check_script_guard("test")
        if False:
            Run.open(None)
        print("passed")
    """)
    assert out.returncode == 1 and "MissingMainGuard" in out.stderr and 'if __name__ == "__main__"' in out.stderr
    ok = _run(tmp_path, """
        from flowrl.actors.main_guard import check_script_guard
        from flowrl.run import Run
        def main():
            check_script_guard("test")
            if False:
                Run.open(None)
            print("passed")
        if __name__ == "__main__":
            main()
    """)
    assert ok.returncode == 0 and "passed" in ok.stdout, ok.stderr[-2000:]


def test_the_line_that_starts_workers_must_be_under_the_guard(tmp_path):
    outside = _run(tmp_path, """
        from flowrl.actors.main_guard import check_main_guard
        check_main_guard("test")
        if __name__ == "__main__":
            pass
    """)
    assert outside.returncode == 1 and "MissingMainGuard" in outside.stderr and "line 3" in outside.stderr, \
        outside.stderr[-2000:]
    inside = _run(tmp_path, """
        from flowrl.actors.main_guard import check_main_guard
        if __name__ == "__main__":
            check_main_guard("test")
            print("passed")
    """)
    assert inside.returncode == 0 and "passed" in inside.stdout, inside.stderr[-2000:]
