"""The batching-policies notebook runs top to bottom (committed without outputs; it takes about 10 s)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NB = Path(__file__).resolve().parents[1] / "notebooks" / "02_batching_policies.ipynb"


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
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
    # every section produced its table, and the swap run really swapped
    for label in ("hf-static", "sarathi", "v0 swap", "caching on", "trtllm (block reuse)"):
        assert label in text
    assert "swap copied 0 blocks" not in text
