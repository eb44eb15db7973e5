"""Every notebook in notebooks/ runs top to bottom (nbclient, kernel python3, working
directory notebooks/) with its ``QUICK = True`` parameter cell, and is committed with
its outputs stripped."""

from __future__ import annotations

import os

import nbformat
import pytest

from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120


def test_the_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"what_if.ipynb", "calibration.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    # the test relies on a parameter cell that keeps the run small
    assert "QUICK = True" in code[0].source


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("MPLBACKEND", "Agg")
    # the kernel is a fresh process: give it this checkout's package first on its path
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )  # fmt: skip
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors == []
