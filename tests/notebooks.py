"""Shared by the notebook tests: notebooks are committed without outputs and must run top to bottom."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "notebooks" / name, as_version=4)


def assert_no_outputs(name: str) -> None:
    code = [c for c in read(name).cells if c.cell_type == "code"]
    assert code and all(not c.get("outputs") and c.get("execution_count") is None for c in code)


def execute(name: str, cwd: Path | None = None, timeout: int = 300) -> str:
    """Run the notebook in a fresh kernel; fail on any error cell; return its text outputs joined."""
    nb = read(name)
    path = cwd or (ROOT / "notebooks")
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors[0].get("evalue")
    return "".join(
        o.get("text", "") + "".join(str(v) for v in o.get("data", {}).values())
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
