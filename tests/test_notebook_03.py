"""The sizing notebook runs top to bottom and answers for both GPUs (committed without outputs); how long it
takes is a benchmark matter, not a test."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NB = Path(__file__).resolve().parents[1] / "notebooks" / "03_sizing_max_num_seqs.ipynb"


def test_notebook_committed_without_outputs():
    nb = nbformat.read(NB, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.get("outputs") and c.get("execution_count") is None for c in code)


@pytest.mark.slow
def test_notebook_executes():
    nb = nbformat.read(NB, as_version=4)
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NB.parent)}}
    ).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors[0].get("evalue")
    text = "".join(
        o.get("text", "") + "".join(str(v) for v in o.get("data", {}).values())
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )  # fmt: skip
    for gpu in ("24 GB card", "A100-80GB"):
        assert f"{gpu}**: interactive SLO -> max_num_seqs = " in text
    assert "recommended: engine.max_num_seqs=" in text and "95% CI" in text
