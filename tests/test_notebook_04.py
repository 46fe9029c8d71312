"""The deployments notebook runs top to bottom (committed without outputs; about 30 s on a laptop core)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks" / "04_deployments.ipynb"


def test_notebook_committed_without_outputs():
    nb = nbformat.read(NB, as_version=4)
    assert all(
        not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"
    )


@pytest.mark.slow
def test_notebook_executes():
    nb = nbformat.read(NB, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors[0] if errors else None
