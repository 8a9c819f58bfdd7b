"""Every notebook in notebooks/ runs top to bottom (nbclient) on a tiny model, on CPU.

A notebook declares what it needs and what its outputs must show in its metadata::

    "metadata": {"flowrl": {"requires": ["slurm"], "outputs": ["graph", "metrics", "bokeh"], "run_dir": true}}

- ``requires``: a notebook is skipped (with the reason) when one is missing: ``slurm`` (``sinfo``
  on PATH), ``graphviz`` (``dot`` on PATH), ``gpu`` (a CUDA device). An unknown name fails.
- ``outputs``: ``graph`` (an image: the rendered Dask graph), ``metrics`` (a text output naming
  ``critic/score/mean``), ``bokeh`` (a Bokeh plot or dashboard rendered inline), ``trajectory``
  (an agent trajectory printed turn by turn, with a tool's turn).
- ``run_dir``: the notebook writes a run directory at ``$FLOWRL_NB_RUN_DIR``.

The SLURM notebook is executed once, by ``tests/slurm/test_slurm.py`` (the same checks, and no job
left behind). The tests point notebooks at a tiny model with ``FLOWRL_NB_MODEL`` / ``FLOWRL_NB_DATA`` /
``FLOWRL_NB_RUN_DIR``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from flowrl_testing.notebooks import check_outputs, notebook_meta

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))
#: Run here: all but the SLURM notebook, which ``tests/slurm/test_slurm.py`` executes once, naming
#: its jobs so that it can check none is left.
RUN_HERE = [p for p in NOTEBOOKS if "slurm" not in notebook_meta(p).get("requires", [])]


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


REQUIREMENTS = {
    "slurm": (lambda: shutil.which("sinfo") is not None, "no SLURM here (sinfo is not on PATH)"),
    "graphviz": (lambda: shutil.which("dot") is not None, "graphviz's dot is not installed"),
    "gpu": (_has_gpu, "no CUDA device"),
}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", RUN_HERE, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path, tiny_model_dir, addition_data, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    meta = notebook_meta(path)
    for need in meta.get("requires", []):
        assert need in REQUIREMENTS, f"{path.name}: unknown requirement {need!r}; known: {', '.join(REQUIREMENTS)}"
        available, reason = REQUIREMENTS[need]
        if not available():
            pytest.skip(f"{path.name} needs {need}: {reason}")
    monkeypatch.setenv("FLOWRL_NB_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("FLOWRL_NB_DATA", str(addition_data[0]))
    monkeypatch.setenv("FLOWRL_NB_RUN_DIR", str(tmp_path / "run"))
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    check_outputs(path, nb, tmp_path / "run")


def test_requirements_gate_the_slurm_notebook():
    """The SLURM notebook must declare it, so machines without SLURM skip it instead of failing
    (and ``tests/slurm/test_slurm.py`` runs it, not this file)."""
    slurm = [p for p in NOTEBOOKS if "slurm" in p.stem]
    assert slurm and not set(slurm) & set(RUN_HERE)
    for path in slurm:
        assert "slurm" in notebook_meta(path).get("requires", []), path.name
    for path in NOTEBOOKS:
        assert set(notebook_meta(path).get("requires", [])) <= set(REQUIREMENTS), path.name
