"""Every notebook in notebooks/ runs top to bottom (nbclient) on a tiny model, on CPU.

A notebook declares what it needs and what its outputs must show in its metadata::

    "metadata": {"flowrl": {"requires": ["slurm"], "outputs": ["graph", "metrics", "bokeh"], "run_dir": true}}

- ``requires``: a notebook is skipped (with the reason) when one is missing: ``slurm`` (``sinfo``
  on PATH), ``graphviz`` (``dot`` on PATH), ``gpu`` (a CUDA device). An unknown name fails.
- ``outputs``: ``graph`` (an image: the rendered Dask graph), ``metrics`` (a text output naming
  ``critic/score/mean``), ``bokeh`` (a Bokeh plot or dashboard rendered inline), ``trajectory``
  (an agent trajectory printed turn by turn, with a tool's turn).
- ``run_dir``: the notebook writes a run directory at ``$FLOWRL_NB_RUN_DIR``.

The tests point notebooks at a tiny model with ``FLOWRL_NB_MODEL`` / ``FLOWRL_NB_DATA`` /
``FLOWRL_NB_RUN_DIR``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


REQUIREMENTS = {
    "slurm": (lambda: shutil.which("sinfo") is not None, "no SLURM here (sinfo is not on PATH)"),
    "graphviz": (lambda: shutil.which("dot") is not None, "graphviz's dot is not installed"),
    "gpu": (_has_gpu, "no CUDA device"),
}
BOKEH_MIME = "application/vnd.bokehjs_exec.v0+json"


def notebook_meta(path: Path) -> dict:
    return json.loads(path.read_text()).get("metadata", {}).get("flowrl", {})


def output_text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    return str(output.get("data", {}).get("text/plain", ""))


def shows(kind: str, outputs: list[dict]) -> bool:
    if kind == "graph":
        return any({"image/png", "image/svg+xml"} & set(o.get("data", {})) for o in outputs)
    if kind == "metrics":
        return any("critic/score/mean" in output_text(o) for o in outputs)
    if kind == "bokeh":
        return any(BOKEH_MIME in o.get("data", {}) for o in outputs)
    if kind == "trajectory":  # an agent trajectory printed turn by turn, with a tool's turn, and its verdict
        return any("turn 1 tool" in output_text(o) and re.search(r"reward: (1\.0 \(correct\)|0\.0 \(WRONG: )", output_text(o))
                   for o in outputs)
    raise AssertionError(f"unknown output kind {kind!r} in a notebook's metadata (use graph, metrics, bokeh)")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
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
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    # issue 35: BokehJS inside the notebook (charts draw offline), no red "Loading weights" bars
    # (transformers' progress bars, on stderr, for models that load in milliseconds)
    assert not [o for o in outputs if "cdn.bokeh.org" in json.dumps(o)], f"{path.name}: BokehJS from a CDN"
    bars = [output_text(o)[:200] for o in outputs if "Loading weights" in output_text(o)]
    assert not bars, f"{path.name}: {bars}"
    for kind in meta.get("outputs", []):
        assert shows(kind, outputs), f"{path.name}: no {kind} output"
    if meta.get("run_dir"):
        run = tmp_path / "run"
        assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file() and (run / "timeline.jsonl").is_file()


def test_requirements_gate_the_slurm_notebook():
    """The SLURM notebook must declare it, so machines without SLURM skip it instead of failing."""
    slurm = [p for p in NOTEBOOKS if "slurm" in p.stem]
    for path in slurm:
        assert "slurm" in notebook_meta(path).get("requires", []), path.name
    for path in NOTEBOOKS:
        assert set(notebook_meta(path).get("requires", [])) <= set(REQUIREMENTS), path.name
