"""The which-card notebook runs top to bottom (committed without outputs; about a minute on two cores)."""

from __future__ import annotations

import re

import pytest

from tests.notebooks import ROOT, assert_no_outputs, execute

NB = "05_which_card.ipynb"


def test_notebook_committed_without_outputs():
    assert_no_outputs(NB)


@pytest.mark.slow
def test_notebook_executes_and_answers_the_seeds_questions():
    text = execute(NB, cwd=ROOT, timeout=600)
    m = re.search(r"cheapest feasible for 20 users \(7B, 4K\): (.+?): (\d+) card\(s\).*?([\d.]+) USD per 1M output "
                  r"tokens at capacity; SLO margin at the target ([+-]\d+)%", text)  # fmt: skip
    assert m, text[-2000:]
    assert int(m.group(2)) >= 1 and float(m.group(3)) > 0 and int(m.group(4)) >= 0
    assert "without quantization:" in text and "the article's rule of thumb" in text
    assert "chat p99 TTFT ms" in text and "interactive / offline cost" in text and "knee: max_num_seqs=" in text
