"""Every notebook in colab/ runs as a user runs it: its own cells, in order, in a fresh
Jupyter kernel (`nbclient`). Only the install cell (tagged `install`) is left out, and only
when the package is installed already, as it is here."""

import importlib.util
import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "colab").glob("*.ipynb"))


def runnable_cells(nb):
    """The notebook's cells, without the install cell where the package is importable."""
    installed = importlib.util.find_spec("jaxrl_frontier") is not None
    return [c for c in nb.cells if not (installed and "install" in c.metadata.get("tags", []))]


def test_install_cell_is_code_and_first():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "install" in code[0].metadata.get("tags", []), path
        assert code[0].source.startswith("!pip install"), path
        assert len(runnable_cells(nb)) == len(nb.cells) - 1  # installed here: skipped


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    nb.cells = runnable_cells(nb)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)  # raises CellExecutionError, naming the cell, if one fails
    stdout = "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("name") == "stdout"
    )
    assert "8 devices: cpu" in stdout


def test_the_readme_names_every_notebook():
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    assert {p.name for p in NOTEBOOKS} == {"quickstart.ipynb", "objectives.ipynb"}
    assert [p.name for p in NOTEBOOKS if p.name not in readme] == []
