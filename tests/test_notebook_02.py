"""The batching-policies notebook runs top to bottom."""

from __future__ import annotations

import pytest

from tests.notebooks import assert_no_outputs, execute

NB = "02_batching_policies.ipynb"


def test_notebook_committed_without_outputs():
    assert_no_outputs(NB)


@pytest.mark.slow
def test_notebook_executes():
    text = execute(NB)
    # every section produced its table, and the swap run really swapped
    for label in ("hf-static", "sarathi", "v0 swap", "caching on", "trtllm (block reuse)"):
        assert label in text
    assert "swap copied 0 blocks" not in text
