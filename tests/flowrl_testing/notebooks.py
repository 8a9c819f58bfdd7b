"""What an executed notebook must show (its ``metadata.flowrl``: ``outputs`` and ``run_dir``; see
``tests/dist/test_notebooks.py``), for the tests that execute one: ``test_notebooks`` runs every
notebook but the SLURM one, which ``tests/slurm/test_slurm.py`` runs against the SLURM jobs it
accounts for."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


def check_outputs(path: Path, nb, run_dir: Path) -> list[dict]:
    """The executed notebook ``nb`` (of ``path``) raised nothing and shows what its metadata
    promises; returns its code cells' outputs."""
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    # issue 35: BokehJS inside the notebook (charts draw offline), no red "Loading weights" bars
    # (transformers' progress bars, on stderr, for models that load in milliseconds)
    assert not [o for o in outputs if "cdn.bokeh.org" in json.dumps(o)], f"{path.name}: BokehJS from a CDN"
    bars = [output_text(o)[:200] for o in outputs if "Loading weights" in output_text(o)]
    assert not bars, f"{path.name}: {bars}"
    meta = notebook_meta(path)
    for kind in meta.get("outputs", []):
        assert shows(kind, outputs), f"{path.name}: no {kind} output"
    if meta.get("run_dir"):
        assert (run_dir / "config.yaml").is_file() and (run_dir / "metrics.jsonl").is_file() \
            and (run_dir / "timeline.jsonl").is_file()
    return outputs
