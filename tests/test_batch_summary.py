"""sim/core/batch.py: a summary built from a scheduler's lists (of_lists) reads, sums and prices exactly as
one built from arrays (of), and assigning a column drops the sums taken from the old one."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.core.batch import BatchSummary
from tests.test_costmodel import cm4090  # noqa: F401  (fixture)

ints = st.lists(st.integers(1, 8192), max_size=40)


@given(dec=ints, chunks=st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 8192)), max_size=3))
def test_lists_and_arrays_give_the_same_summary(dec, chunks):
    c, p = [a for a, _ in chunks], [b for _, b in chunks]
    lst = BatchSummary.of_lists(list(dec), list(c), list(p), len(dec), sum(dec))
    arr = BatchSummary.of(np.array(dec, dtype=np.int64), np.array(c, dtype=np.int64), p, len(dec))
    for b in (lst, arr):
        assert (b.num_decode, b.num_prefill, b.num_prefill_tokens, b.decode_ctx_sum, b.decode_ctx_max) == \
            (len(dec), len(c), sum(c), sum(dec), max(dec, default=0))
        assert b.prefill_chunks() == c and b.prefill_ctxs() == p
        assert b.decode_ctx.dtype == np.int64 and b.decode_ctx.tolist() == dec
    assert lst.is_empty == arr.is_empty == (not dec and not c)


def test_step_time_is_the_same_from_lists_and_arrays(cm4090):  # noqa: F811
    dec, c, p = list(range(900, 964)), [700], [300]
    lst = BatchSummary.of_lists(dec, c, p, 65, sum(dec))
    arr = BatchSummary.of(np.array(dec), np.array(c), np.array(p), 65)
    assert cm4090.step_time(lst) == cm4090.step_time(arr) > 0


def test_assigning_a_column_drops_its_sums():
    b = BatchSummary.of_lists([5, 6], [3], [0], 3, 11)
    assert (b.decode_ctx_sum, b.decode_ctx_max, b.num_prefill_tokens) == (11, 6, 3)
    b.decode_ctx = [1, 2, 9]
    b.prefill_chunk = np.array([4, 4])
    assert (b.num_decode, b.decode_ctx_sum, b.decode_ctx_max, b.num_prefill_tokens) == (3, 12, 9, 8)
