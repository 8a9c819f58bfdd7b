"""Every notebook runs top to bottom on a tiny model (executed with nbclient)."""

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path, tiny_model_dir, addition_data, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("FLOWRL_NB_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("FLOWRL_NB_DATA", str(addition_data[0]))
    monkeypatch.setenv("FLOWRL_NB_RUN_DIR", str(tmp_path / "run"))
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert (tmp_path / "run" / "config.yaml").is_file()
