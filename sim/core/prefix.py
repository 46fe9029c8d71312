"""Shared prefix hashes: the block hashes of a content sequence that several requests start with.

Content is described by *segments*, ``(key, length)`` pairs where equal keys mean equal tokens
(sim/core/request.py). Kept apart from the spec (sim/core/spec.py) so the two can be compiled or not
independently (sim/native.py compiles this one: requests read it per block they hash).
"""

from __future__ import annotations

from collections.abc import Hashable

Segment = tuple[Hashable, int]
NONE_HASH = 0x5EED  # parent of block 0; fixed so runs are reproducible (vLLM seeds it from PYTHONHASHSEED)


class PrefixHashes:
    """Block hashes of a content sequence that several requests start with, computed once for all.

    ``segments`` describes the sequence as content segments (prompt segments, then outputs as
    ``(output_key, length)``): a conversation's whole history, or a shared system prompt. A request
    whose ``prefix_hashes`` is this object copies the hashes of the blocks that lie within the leading
    segments it has in common with ``segments`` (checked once, by tuple equality, so a renamed or
    truncated spec just falls back to hashing itself) and adds the ones it computes first. The hashes
    are a pure function of the content, so sharing them changes no result.

    ``parent``, when given, describes a shorter sequence ``segments`` starts with (a trie of trace
    prompts, see sim.core.hash_prefixes): hashes given to either flow along the chain, so requests
    that branch off a common prefix hash its blocks once between them.
    """

    __slots__ = ("segments", "parent", "_by_size", "_num_tokens")

    def __init__(self, segments: tuple[Segment, ...], parent: PrefixHashes | None = None) -> None:
        self.segments = segments
        self.parent = parent
        self._by_size: dict[int, list[int]] = {}
        self._num_tokens = sum(n for _, n in segments)

    def __reduce__(self) -> tuple[type[PrefixHashes], tuple[tuple[Segment, ...], PrefixHashes | None]]:
        """Pickled by its content (the hashes are a pure function of it and are recomputed on use), so
        specs that carry one can cross to another process, compiled or not."""
        return (PrefixHashes, (self.segments, self.parent))

    def for_size(self, block_size: int) -> list[int]:
        """The shared list for ``block_size`` (hashes of blocks 0..len-1, grown by the requests), first
        topped up from the ancestors (a request on another branch may have hashed the common blocks)."""
        got = self._by_size.get(block_size)
        if got is None:
            got = self._by_size[block_size] = []
        if self.parent is not None:
            chain: list[PrefixHashes] = []
            node: PrefixHashes | None = self
            while node is not None:
                chain.append(node)
                node = node.parent
            above: list[int] = []
            for node in reversed(chain):  # root first: each list holds at least its parent's
                mine = node._by_size.setdefault(block_size, [])
                if len(mine) < len(above):
                    mine.extend(above[len(mine) :])
                above = mine
        return got

    def publish(self, block_size: int, hashes: list[int], upto: int) -> None:
        """Take the hashes a request computed (``hashes[:upto]`` lie in the content it shares with this
        object), and hand them up the chain, each ancestor keeping the blocks within its own content."""
        node: PrefixHashes | None = self
        while node is not None:
            mine = node._by_size.setdefault(block_size, [])
            end = min(upto, len(hashes), node._num_tokens // block_size)
            if len(mine) >= end:  # an ancestor holds at least what its descendants hold
                return
            mine.extend(hashes[len(mine) : end])
            node = node.parent
