"""The deployments notebook runs top to bottom (committed without outputs; about 30 s on a laptop core)."""

from __future__ import annotations

import pytest

from tests.notebooks import ROOT, assert_no_outputs, execute

NB = "04_deployments.ipynb"


def test_notebook_committed_without_outputs():
    assert_no_outputs(NB)


@pytest.mark.slow
def test_notebook_executes():
    text = execute(NB, cwd=ROOT)
    # the first comparison's table (TP=2 vs 2 x TP=1) was printed with both variants
    assert "tp2" in text and "2xtp1" in text and "request_goodput" in text
