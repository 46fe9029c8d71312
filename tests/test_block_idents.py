"""Block hashes walked once over the segments (Request._segment_hashes) equal the per-block walk
(``content_hash`` of Request._content, block by block) for any segment layout, output and block size:
the prefix cache sees the same hashes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.request import NONE_HASH, Request, RequestSpec, content_hash


@settings(max_examples=300, deadline=None)
@given(
    lens=st.lists(st.integers(0, 40), min_size=0, max_size=12),
    keys=st.lists(st.integers(0, 3), min_size=12, max_size=12),
    tail=st.integers(0, 30),
    out=st.integers(1, 60),
    bs=st.sampled_from([1, 2, 3, 4, 8, 16]),
    first=st.integers(0, 5),
)
def test_one_pass_equals_per_block(lens, keys, tail, out, bs, first):
    segs = tuple((("k", keys[i]), n) for i, n in enumerate(lens))
    prompt = sum(lens) + tail
    if prompt == 0:
        prompt, segs = 1, ((("k", 0), 1),)
    elif tail:
        segs += ((("u", "tail"), tail),)
    req = Request(RequestSpec("r", 0.0, prompt, out, segments=segs))
    last = (prompt + out) // bs
    first = min(first, last)
    parent = 12345 if first else NONE_HASH
    one_pass: list[int] = []
    req._segment_hashes(first, last, bs, parent, one_pass)
    per_block = []
    for i in range(first, last):
        parent = content_hash(parent, req._content(i * bs, (i + 1) * bs))
        per_block.append(parent)
    assert one_pass == per_block
    # and the cached chain grown in two calls equals one call
    a = Request(RequestSpec("r", 0.0, prompt, out, segments=segs))
    a.block_hashes(bs, (first * bs))
    assert a.block_hashes(bs, last * bs) == req.block_hashes(bs, last * bs)
