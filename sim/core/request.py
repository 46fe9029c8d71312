"""Requests: an immutable spec from the workload, plus the engine's mutable progress.

Prefix identity. Content is described by *segments*: ``(key, length)`` pairs where equal keys mean
equal tokens. A shared system prompt is one segment every user repeats; a multi-turn prompt is the
previous prompt's segments + the previous output's segment + a new message. Literal ``token_ids`` and
Mooncake-style ``hash_ids`` are two other ways of saying the same thing. A KV block's identity is the
content of the tokens it covers, chained with its parent's hash as vLLM does (engines.md KV-4).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from mypy_extensions import mypyc_attr

from sim.core.prefix import NONE_HASH, PrefixHashes, Segment
from sim.core.spec import RequestSpec

__all__ = ["NONE_HASH", "PrefixHashes", "Request", "RequestSpec", "Segment", "Status"]

class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"  # the client gave up (its timeout) and the engine aborted the request


@mypyc_attr(allow_interpreted_subclasses=True)  # tests subclass it
@dataclass(eq=False, slots=True, init=False)
class Request:
    """Engine-side state. Hot fields are plain attributes; latencies derive from the timestamps."""

    spec: RequestSpec
    request_id: str = ""
    prompt_len: int = 0
    output_len: int = 0
    priority: int = 0
    arrival_time: float = 0.0
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_tokens: int = 0  # prompt + generated (vLLM's num_tokens); a plain field because it is read hot
    num_cached_tokens: int = -1  # prefix-hit tokens at first admission; -1 until admitted
    num_preemptions: int = 0
    num_discarded_tokens: int = 0  # computed tokens thrown away by recompute preemption
    num_swaps: int = 0
    queued_time: float | None = None
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None
    seq: int = 0  # admission order tiebreak
    # Async scheduling (vLLM's AsyncScheduler): tokens sampled but not yet applied (vLLM's
    # num_output_placeholders; reset by a preemption) and tokens scheduled in batches not yet applied.
    num_output_placeholders: int = 0
    num_in_flight_tokens: int = 0
    # spec.hash_end, copied (the KV manager reads it for every running row, and a compiled read of the
    # interpreted spec's field is a generic attribute lookup): blocks within the first hash_end tokens may be
    # shared and are hashed; a block that reaches past it is this request's alone (0, content nobody else
    # can hold: every block), so it is never hashed but for the request's own resume (sim/kv/manager.py).
    # A row computing token c + 1 hashes iff c < hash_end.
    hash_end: int = 0
    # spec.private_until_done: the blocks past hash_end are registered when they are freed (a finish too),
    # for later requests that repeat them (a conversation's next turn)
    hash_on_free: bool = False
    _hashes: list[int] = field(default_factory=list)
    _hash_bs: int = 0
    _shared: list[int] | None = None  # spec.prefix_hashes' list for _hash_bs, if it applies
    _shared_blocks: int = 0  # leading blocks that lie within the content shared with it
    _segs: tuple[Segment, ...] | None = None  # _content_segments(), built on first use
    _seg_ends: list[int] | None = None  # cumulative token ends of _segs

    def __init__(self, spec: RequestSpec) -> None:
        """Written out (the dataclass keeps its repr): a generated ``__init__`` is interpreted code that
        sets 30 fields through descriptors, 2.1 us a request against ~0.2 us compiled. Every caller
        passes the spec alone; the progress fields start as the annotations above say."""
        self.spec = spec
        self.request_id = spec.request_id
        self.prompt_len = spec.prompt_len
        self.output_len = spec.output_len
        self.priority = spec.priority
        self.arrival_time = spec.arrival_time
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_tokens = spec.prompt_len
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.num_discarded_tokens = 0
        self.num_swaps = 0
        self.queued_time = None
        self.scheduled_time = None
        self.first_token_time = None
        self.last_token_time = None
        self.finish_time = None
        self.finish_reason = None
        self.seq = 0
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.hash_end = spec.hash_end
        self.hash_on_free = spec.private_until_done and spec.shares_content
        self._hashes = []
        self._hash_bs = 0
        self._shared = None
        self._shared_blocks = 0
        self._segs = None
        self._seg_ends = None

    def add_output_tokens(self, k: int = 1) -> None:
        """The one way to count generated tokens: keeps ``num_tokens`` in step (hot loops inline it)."""
        self.num_output_tokens += k
        self.num_tokens += k

    @property
    def remaining_prefill(self) -> int:
        return max(self.num_tokens - self.num_computed_tokens, 0)

    @property
    def is_finished(self) -> bool:
        return self.status in (Status.FINISHED, Status.REJECTED, Status.TIMED_OUT)

    # ---- prefix identity -------------------------------------------------------------------------
    def block_hashes(self, block_size: int, num_tokens: int) -> list[int]:
        """Chained hashes of the full blocks among the first ``num_tokens`` tokens (cached, grown lazily).

        Blocks within the content shared through ``spec.prefix_hashes`` are copied from it (and given
        to it when this request computes them first): a session's turn hashes only its new blocks."""
        if self._hash_bs != block_size:
            self._hashes = []
            self._hash_bs = block_size
            self._attach_shared(block_size)
        want = num_tokens // block_size
        hashes = self._hashes
        if len(hashes) >= want:
            return hashes
        shared = self._shared
        ph = self.spec.prefix_hashes
        if shared is not None and ph is not None:
            n = len(hashes)
            top = min(want, self._shared_blocks)
            if n < top:
                if len(shared) < top and ph.parent is not None:
                    ph.for_size(block_size)  # tops `shared` up from the ancestors
                hashes.extend(shared[n:top])
                if len(hashes) >= want:
                    return hashes
        parent = hashes[-1] if hashes else NONE_HASH
        token_ids = self.spec.token_ids
        if token_ids is None:  # one pass over the segments for all the new blocks (not one per block)
            self._segment_hashes(len(hashes), want, block_size, parent, hashes)
            if shared is not None and ph is not None and len(shared) < self._shared_blocks:
                ph.publish(block_size, hashes, self._shared_blocks)
            return hashes
        for i in range(len(hashes), want):
            lo, hi = i * block_size, (i + 1) * block_size
            if hi <= self.prompt_len:
                parent = hash((parent, token_ids[lo:hi]))
            else:
                parent = content_hash(parent, self._content(lo, hi))
            hashes.append(parent)
        return hashes

    def _attach_shared(self, block_size: int) -> None:
        """Point ``_shared`` at the prefix hashes when this request's content starts with theirs."""
        self._shared = None
        ph = self.spec.prefix_hashes
        if ph is None or self.spec.token_ids is not None:
            return
        # the segments as objects: compiled, a typed (key, int) item would be unpacked and boxed anew
        content: tuple[object, ...] = self._content_segments()
        theirs: tuple[object, ...] = ph.segments
        m = min(len(content), len(theirs))
        if m == 0:
            return
        for i in range(m):  # the leading segments in common (a turn's are its conversation's own tuples)
            a, b = content[i], theirs[i]
            if a is not b and a != b:
                return
        ends: list[int] = self._seg_ends  # type: ignore[assignment]  # set by _content_segments
        self._shared = ph.for_size(block_size)
        self._shared_blocks = ends[m - 1] // block_size

    def _content_segments(self) -> tuple[Segment, ...]:
        """The prompt's segments, then the output as one segment (what ``_segment_hashes`` walks)."""
        segs = self._segs
        if segs is None:
            spec = self.spec
            out_key = spec.output_key if spec.output_key is not None else ("o", self.request_id)
            prompt = spec.segments if spec.segments is not None else spec.prompt_segments()
            segs = self._segs = prompt + ((out_key, self.output_len),)
            ends: list[int] = []
            total = 0
            for seg in segs:
                total += seg[1]
                ends.append(total)
            self._seg_ends = ends
        return segs

    def _segment_hashes(self, first: int, last: int, bs: int, parent: int, out: list[int]) -> None:
        """Append to ``out`` the chained hashes of blocks ``first..last-1`` (no token ids; ``parent``: the
        hash of block ``first - 1``), each ``content_hash`` of its ``_content``, walking the segments
        once: a cursor stays on the first segment that ends after the block's start (sessions' prompts
        have many). A block within one segment is hashed from its key's hash (once per segment walked) and its
        offsets, with no tuple of its content built: 4-5 allocations a block were half of hashing."""
        segs = self._content_segments()
        ends: list[int] = self._seg_ends  # type: ignore[assignment]  # set by _content_segments
        nseg = len(segs)
        kj, kh = -1, 0  # the segment whose key was hashed last, and that hash
        j = bisect_right(ends, first * bs)  # the first segment that ends after the first block's start
        pos = ends[j - 1] if j else 0
        for i in range(first, last):
            lo, hi = i * bs, (i + 1) * bs
            if j < nseg:
                key, n = segs[j]
                if hi <= pos + n:  # the usual case: the block lies in one segment
                    if kj != j:
                        kj, kh = j, hash(key)
                    parent = hash((parent, kh, lo - pos, hi - pos))
                    out.append(parent)
                    if hi == pos + n:
                        pos += n
                        j += 1
                        while j < nseg and pos + segs[j][1] <= hi:  # (empty segments)
                            pos += segs[j][1]
                            j += 1
                    continue
            parts = []
            k, p = j, pos
            while k < nseg:
                key, n = segs[k]
                a = lo if lo > p else p
                b = hi if hi < p + n else p + n
                if a < b:
                    parts.append((key, a - p, b - p))
                if p + n >= hi:
                    break
                p += n
                k += 1
            parent = content_hash(parent, tuple(parts))
            out.append(parent)
            while j < nseg and pos + segs[j][1] <= hi:
                pos += segs[j][1]
                j += 1

    def _content(self, lo: int, hi: int) -> tuple:
        """Identity of tokens [lo, hi) as (segment key, start, end) triples."""
        parts: list[tuple] = []
        pos = 0
        segs = self.spec.prompt_segments() if self.spec.token_ids is None else ()
        if self.spec.token_ids is not None and lo < self.prompt_len:
            parts.append(("t", self.spec.token_ids[lo : min(hi, self.prompt_len)]))
            pos = self.prompt_len
        out_key = self.spec.output_key if self.spec.output_key is not None else ("o", self.request_id)
        for key, n in (*segs, (out_key, self.output_len)):
            a, b = max(lo, pos), min(hi, pos + n)
            if a < b:
                parts.append((key, a - pos, b - pos))
            pos += n
            if pos >= hi:
                break
        return tuple(parts)


def content_hash(parent: int, parts: tuple) -> int:
    """The hash of a block whose content is ``parts`` (``Request._content``'s form) chained to the hash
    ``parent`` of the block before it. Content within one segment is named by the segment key's hash
    and the offsets (what ``_segment_hashes`` computes without building ``parts``); content across
    segments, or with token ids, by the parts themselves."""
    if len(parts) == 1 and len(parts[0]) == 3:
        key, a, b = parts[0]
        return hash((parent, hash(key), a, b))
    return hash((parent, parts))


def make_requests(specs: Sequence[RequestSpec]) -> list[Request]:
    return [Request(s) for s in specs]
