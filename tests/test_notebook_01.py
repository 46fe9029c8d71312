"""The concurrency notebook (the seeds' story with plots) runs top to bottom."""

from __future__ import annotations

import pytest

from tests.notebooks import assert_no_outputs, execute

NB = "01_concurrency_4_to_32.ipynb"


def test_notebook_committed_without_outputs():
    assert_no_outputs(NB)


@pytest.mark.slow
def test_notebook_executes():
    text = execute(NB)
    assert "maximum concurrency" in text  # the memory arithmetic printed
