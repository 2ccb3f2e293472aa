"""Every notebook in colab/ runs top to bottom (code cells executed in a fresh process)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "colab").glob("*.ipynb"))


def notebook_source(path: pathlib.Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    # shell magics (`!pip ...`) belong to Colab, not to the test
    return "\n\n".join(
        "\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(("!", "%")))
        for cell in code
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    script = tmp_path / f"{path.stem}.py"
    script.write_text(notebook_source(path))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "devices: cpu" in result.stdout


def test_there_is_a_notebook():
    assert NOTEBOOKS, "colab/ holds no notebook"
