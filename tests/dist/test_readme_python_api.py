"""The README's Python API block, taken from README.md as it is printed, runs to the end: as a
script (with its ``__main__`` guard) and in a notebook kernel; without the guard the script is
refused within seconds, naming the fix (issue 35, item 1).

The block builds a graph with ``run.graph()`` that is never submitted, then runs ``run.step()``:
before the fix the draft's reserved call order made that step wait for ``cluster.timeout_s``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
GUARD = 'if __name__ == "__main__":'
STEP_TIMEOUT = "cluster.timeout_s"


def readme_block() -> str:
    """The first ```python block after the README's "### Python API" heading."""
    text = README.read_text()
    section = text[text.index("### Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def without_guard(block: str) -> str:
    """The block with its ``if __name__ == "__main__":`` line removed and its body dedented."""
    head, _, body = block.partition(GUARD)
    body = body.split("\n", 1)[1]  # the guard line's comment goes with it
    return head + textwrap.dedent(body)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop("FLOWRL_DEVICES", None)
    return env


def test_block_is_guarded_and_transformed():
    block = readme_block()
    assert GUARD in block and "run.graph()" in block and "run.step()" in block
    bare = without_guard(block)
    assert GUARD not in bare and "\nrun = Run.open(cfg)" in bare
    compile(bare, "bare", "exec")


@pytest.mark.timeout(420)
def test_readme_block_runs_as_a_script(tmp_path):
    script = tmp_path / "api.py"
    script.write_text(readme_block())
    start = time.monotonic()
    # the run's own waits are bounded (cluster.timeout_s=600 by default); the test's is shorter
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=360)
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    global_step, score = proc.stdout.strip().splitlines()[-1].split()
    assert float(global_step) == 1.0 and 0.0 <= float(score) <= 1.0  # verl's numbering: the first step is 1
    assert (tmp_path / "grpo.png").is_file()
    assert wall < 300, f"{wall:.0f}s: the step waited for a draft's reserved calls?"


@pytest.mark.timeout(120)
def test_readme_block_without_guard_is_refused_at_once(tmp_path):
    script = tmp_path / "api.py"
    script.write_text(without_guard(readme_block()))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=100)
    wall = time.monotonic() - start
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "MissingMainGuard" in last and GUARD in last and "fix:" in last, proc.stderr[-2000:]
    assert wall < 10, f"refused after {wall:.1f}s"
    assert not (tmp_path / "runs").exists()  # refused before the run directory or any worker


@pytest.mark.timeout(420)
def test_readme_block_runs_in_a_notebook_kernel(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(readme_block())])
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    nbclient.NotebookClient(nb, timeout=360, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].get("outputs", [])
    assert not [o for o in outputs if o.get("output_type") == "error"], outputs
    printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stdout")
    global_step, score = printed.strip().splitlines()[-1].split()
    assert float(global_step) == 1.0 and 0.0 <= float(score) <= 1.0
