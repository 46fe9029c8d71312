"""Shared block hashes for trace requests whose Mooncake-style ``hash_ids`` start the same.

A Mooncake trace gives each prompt as ids of 512-token blocks, and most requests repeat a long prefix of
another's ids. Hashing each request's prompt itself costs O(KV blocks per request) per request; with a
:class:`~sim.core.request.PrefixHashes` per shared prefix, chained along the trie of the prompts, each
distinct KV block is hashed once for the whole trace. Hashes are a pure function of content, so the
sharing changes no result (tests/test_hash_prefixes.py compares runs with and without it).

The trie is keyed on what ``RequestSpec.prompt_segments`` makes of the ids: an id with its block's
length (``hash_block_size``, or less for the last), so a prompt ending inside an id's block shares
only up to that block, and ids in blocks of other sizes share nothing. A
prefix gets a ``PrefixHashes`` when some request's longest shared prefix ends there (it is attached to
that request) or when two shared branches part there (so both branches reach its blocks through their
``parent``); the prefixes in between need none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from sim.core.request import PrefixHashes, RequestSpec, Segment


def _shares_by_hash_ids(spec: RequestSpec) -> bool:
    """Specs whose content comes from hash ids (token ids win over them) and that share nothing yet."""
    return bool(spec.hash_ids) and spec.token_ids is None and spec.prefix_hashes is None


def share_hash_id_prefixes(specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """``specs`` with ``prefix_hashes`` set on every hash-id request that shares a leading id block with
    another one (the rest returned as they are, in the same order)."""
    idx = [i for i, s in enumerate(specs) if _shares_by_hash_ids(s)]
    if len(idx) < 2:
        return list(specs)
    blocks = [_id_blocks(specs[i]) for i in idx]
    # Trie nodes named by the chained hash of their path (as vLLM names blocks); a collision is caught
    # where a node is reused (its ids are compared) and only shortens that prompt's sharing.
    keys: list[int] = []
    for (ids, last), i in zip(blocks, idx, strict=True):
        parent, hb = 0, specs[i].hash_block_size
        for h in ids[:-1]:
            parent = hash((parent, h, hb))
            keys.append(parent)
        keys.append(hash((parent, ids[-1], last)))  # the last block may be partial
    lens = np.fromiter((len(ids) for ids, _ in blocks), dtype=np.int64, count=len(blocks))
    starts = np.cumsum(lens) - lens
    _, node, counts = np.unique(np.array(keys, dtype=np.int64), return_inverse=True, return_counts=True)
    shared = counts[node] >= 2
    # leading shared run of each prompt (its longest prefix some other prompt has too)
    broken = np.cumsum(~shared)
    before = broken[starts] - (~shared)[starts]
    run = np.add.reduceat(((broken - np.repeat(before, lens)) == 0).astype(np.int64), starts)
    # branch points: shared nodes with two or more distinct shared children
    nxt = np.flatnonzero(shared[:-1] & shared[1:])
    nxt = nxt[np.isin(nxt + 1, starts, invert=True)]  # a child in the same prompt
    edges = np.unique(node[nxt] * len(counts) + node[nxt + 1])  # distinct (parent, child) pairs
    parents, fanout = np.unique(edges // len(counts), return_counts=True)
    keep = np.zeros(len(counts), dtype=bool)
    keep[parents[fanout >= 2]] = True
    has_run = run > 0
    keep[node[(starts + run - 1)[has_run]]] = True
    by_node: dict[int, tuple[PrefixHashes, tuple[int, ...], int]] = {}
    out = list(specs)
    nodes, kept = node.tolist(), keep[node].tolist()  # plain lists: the loop below is per prompt
    for k, (i, a, r) in enumerate(zip(idx, starts.tolist(), run.tolist(), strict=True)):
        if r:
            ids, last = blocks[k]
            ph = _chain(ids, last, specs[i].hash_block_size, nodes[a : a + r], kept[a : a + r], by_node)
            if ph is not None:
                out[i] = dataclasses.replace(specs[i], prefix_hashes=ph)
    return out


def _id_blocks(spec: RequestSpec) -> tuple[tuple[int, ...], int]:
    """The ids that cover prompt tokens and the length of the last one's block (as prompt_segments)."""
    hb = spec.hash_block_size
    ids = spec.hash_ids[: -(-spec.prompt_len // hb)]  # type: ignore[index]  # hash-id specs only
    return ids, min(hb, spec.prompt_len - (len(ids) - 1) * hb)


_Made = dict[int, tuple[PrefixHashes, tuple[int, ...], int]]  # node -> its object, ids, last block's length


def _chain(
    ids: tuple[int, ...], last: int, hb: int, nodes: list[int], kept: list[bool], by_node: _Made
) -> PrefixHashes | None:
    """The ``PrefixHashes`` of the kept nodes along one prompt's shared run (its first ``len(nodes)``
    ids), made on first use, each the ``parent`` of the next: the deepest one, or the deepest before a
    hash collision."""
    got = by_node.get(nodes[-1])
    d = len(nodes)
    if got is not None and got[1] == ids[:d] and got[2] == (last if d == len(ids) else hb):
        return got[0]  # made by an earlier prompt with these ids
    ph: PrefixHashes | None = None
    for depth in range(1, d + 1):
        if not kept[depth - 1]:
            continue
        end = last if depth == len(ids) else hb  # this prompt's length of the block of ids[depth - 1]
        got = by_node.get(nodes[depth - 1])
        if got is None:
            segs: tuple[Segment, ...] = tuple((("h", h), hb) for h in ids[: depth - 1])
            made = PrefixHashes((*segs, (("h", ids[depth - 1]), end)), ph)
            got = by_node[nodes[depth - 1]] = (made, ids[:depth], end)
        elif got[0].parent is not ph or got[1] != ids[:depth] or got[2] != end:
            return ph  # a hash collision: share only what was checked
        ph = got[0]
    return ph
