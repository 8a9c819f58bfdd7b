"""graphs/ installs as flowrl.graphs, for the editable install and in a built wheel."""

import subprocess
import sys
import zipfile
from pathlib import Path

import flowrl

ROOT = Path(__file__).parents[2]


def test_graphs_importable_as_flowrl_graphs():
    import flowrl.graphs.grpo as grpo

    installed = Path(grpo.__file__)
    assert installed.parent.name == "graphs"  # the top-level folder, mapped into the package
    assert installed.read_text() == (ROOT / "graphs" / "grpo.py").read_text()


def test_wheel_carries_graphs_and_the_version(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("flowrl-*.whl")
    assert flowrl.__version__ in wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "flowrl/graphs/grpo.py" in names and "flowrl/graphs/__init__.py" in names
    assert "flowrl/actors/session.py" in names and "flowrl/cli.py" in names
    assert not any(n.startswith(("graphs/", "tests/")) for n in names)
