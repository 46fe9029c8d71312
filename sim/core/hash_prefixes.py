"""Shared block hashes for trace requests whose Mooncake-style ``hash_ids`` start the same.

A Mooncake trace gives each prompt as ids of 512-token blocks, and most requests repeat a long prefix of
another's ids. Hashing each request's prompt itself costs O(KV blocks per request) per request; with a
:class:`~sim.core.request.PrefixHashes` per shared prefix, chained along the trie of the prompts, each
distinct KV block is hashed once for the whole trace. Hashes are a pure function of content, so the
sharing changes no result (tests/test_hash_prefixes.py compares runs with and without it).

The trie is keyed on the prompts' content segments (``RequestSpec.prompt_segments``: one per id, the
last one possibly partial), so a prompt ending inside an id's block shares only up to that block. A
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
    return spec.hash_ids is not None and spec.token_ids is None and spec.prefix_hashes is None


def share_hash_id_prefixes(specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """``specs`` with ``prefix_hashes`` set on every hash-id request that shares a leading id block with
    another one (the rest returned as they are, in the same order)."""
    idx = [i for i, s in enumerate(specs) if _shares_by_hash_ids(s)]
    if len(idx) < 2:
        return list(specs)
    segs = [specs[i].prompt_segments() for i in idx]
    # Trie nodes named by the chained hash of their path (as vLLM names blocks); a collision can only
    # make two prefixes share an object, and then the tuple checks below give each its own hashing.
    keys: list[int] = []
    for ss in segs:
        parent = 0
        for seg in ss:
            parent = hash((parent, seg))
            keys.append(parent)
    lens = np.fromiter((len(ss) for ss in segs), dtype=np.int64, count=len(segs))
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
    by_node: dict[int, PrefixHashes] = {}
    out = list(specs)
    for k, i in enumerate(idx):
        if not has_run[k]:
            continue
        ph = _chain(segs[k], node[starts[k] : starts[k] + run[k]], keep, by_node)
        if ph is not None:
            out[i] = dataclasses.replace(specs[i], prefix_hashes=ph)
    return out


def _chain(
    segs: tuple[Segment, ...], nodes: np.ndarray, keep: np.ndarray, by_node: dict[int, PrefixHashes]
) -> PrefixHashes | None:
    """The ``PrefixHashes`` of the kept nodes along one prompt's shared run, made on first use, each the
    ``parent`` of the next; the deepest one (None if a collision broke the chain before any)."""
    last = by_node.get(int(nodes[-1]))
    if last is not None and last.segments == segs[: len(nodes)]:  # made by an earlier prompt, checked then
        return last
    ph: PrefixHashes | None = None
    for depth in np.flatnonzero(keep[nodes]).tolist():
        n = int(nodes[depth])
        got = by_node.get(n)
        if got is None:
            got = by_node[n] = PrefixHashes(segs[: depth + 1], ph)
        elif got.parent is not ph or got.segments != segs[: depth + 1]:
            return ph  # a hash collision: share only what was checked
        ph = got
    return ph
