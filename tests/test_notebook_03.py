"""The sizing notebook runs top to bottom and answers for both GPUs; how long it takes is a benchmark
matter, not a test."""

from __future__ import annotations

import pytest

from tests.notebooks import assert_no_outputs, execute

NB = "03_sizing_max_num_seqs.ipynb"


def test_notebook_committed_without_outputs():
    assert_no_outputs(NB)


@pytest.mark.slow
def test_notebook_executes():
    text = execute(NB)
    for gpu in ("24 GB card", "A100-80GB"):
        assert f"{gpu}**: interactive SLO -> max_num_seqs = " in text
    assert "recommended: engine.max_num_seqs=" in text and "95% CI" in text
