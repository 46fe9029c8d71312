"""What the workload says about a request (``RequestSpec``): immutable, so one list drives many policies.

A plain Python class, never compiled (sim/native.py): workloads and plug-ins build specs from numpy
draws and lists, and the spec turns them, once, into what the engine's compiled modules check for: a
str id, plain int lengths and priority, a float arrival time, tuples of ids, (key, int) segments.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import MISSING, dataclass, field, fields
from numbers import Integral, Real
from typing import Any

from sim.core.errors import ConfigError
from sim.core.prefix import PrefixHashes, Segment

# The latest arrival a run can take: at 1e9 s (~32 years) a float64 clock still resolves 0.1 us, so a
# step of a few microseconds still moves it; far beyond, adding a step changes nothing and every latency
# reads 0 (an arrival at 1e300 s, or a rate of 1e-300 req/s).
MAX_ARRIVAL_S = 1e9
HASH_ALL = 1 << 61  # ``hash_end`` of content that may be shared to its end (a short int compiled: < 2^62)


def _check_arrival(request_id: str, t: float) -> None:
    if not 0 <= t <= MAX_ARRIVAL_S:
        raise ConfigError(f"request {request_id}: arrival_time must be >= 0 and <= {MAX_ARRIVAL_S:g} s "
                          f"(the clock's range at sub-microsecond resolution), got {t}")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the workload says about a request; never mutated, so one list can drive many policies."""

    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    priority: int = 0
    session_id: str | None = None
    # Prefix identity: at most one of these three is used, in this order.
    token_ids: tuple[int, ...] | None = None
    hash_ids: tuple[int, ...] | None = None
    hash_block_size: int = 512
    segments: tuple[Segment, ...] | None = None
    # Content of the generated tokens, so a later turn that repeats them can hit the cache.
    output_key: Hashable | None = None
    # Hashes this request shares with others (a session's earlier turns, a shared system prompt).
    prefix_hashes: PrefixHashes | None = field(default=None, compare=False, repr=False)
    # Where this request's content becomes its own (a token position, prompt then output): no other
    # request can hold a block that reaches past it, so those blocks need no hash (but for the request's
    # own resume). None: as the content says (``hash_end``). A workload that knows sets it: a generated
    # shared-prefix request is its own past the prefix.
    private_from: int | None = field(default=None, compare=False, repr=False)
    # The private part is repeated by later requests that are all sent after this one finished (a
    # conversation's next turn): its blocks are registered when the request frees them, not as they fill.
    private_until_done: bool = field(default=False, compare=False, repr=False)
    # False when no other request can ever hold the same tokens (no hashing needed but for resumes).
    # Derived from the content fields in __post_init__: read for every running row on the KV manager's
    # hot paths, so a plain slot rather than a property.
    shares_content: bool = field(init=False, default=False, compare=False, repr=False)
    # The tokens other requests may share (0 without shared content): ``private_from`` when given, else
    # the prompt for token ids and hash ids (their keys never name an output: the generated tokens are the
    # request's alone), else everything (segments may name an output: a session's next turn repeats it).
    hash_end: int = field(init=False, default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.token_ids is None and self.hash_ids is None and self.segments is None
                and type(self.request_id) is str and type(self.arrival_time) is float
                and type(self.prompt_len) is int and type(self.output_len) is int and type(self.priority) is int
                and type(self.hash_block_size) is int and self.private_from is None):
            # The usual spec (a trace's or a generator's row: plain values, no content): the same checks in
            # a few comparisons (specs are built once or twice per request: 19,366 of them 76 -> 57 ms)
            if (self.prompt_len < 1 or self.output_len < 1 or not 0 <= self.arrival_time <= MAX_ARRIVAL_S):
                self._check()
            return
        self._check()

    def _check(self) -> None:
        """Every field turned into its plain type and checked (one clear line for a bad one)."""
        object.__setattr__(
            self, "shares_content", self.token_ids is not None or self.hash_ids is not None or self.segments is not None
        )
        for name in ("prompt_len", "output_len", "priority", "hash_block_size"):
            v = getattr(self, name)
            if type(v) is not int:  # the usual case costs one check (specs are built per request, twice)
                object.__setattr__(self, name, _integer(self.request_id, name, v))
        if type(self.request_id) is not str:
            if self.request_id is None:
                raise ConfigError("request_id must be set, got None")
            object.__setattr__(self, "request_id", str(self.request_id))
        for name in ("token_ids", "hash_ids"):  # tuples (list or numpy input): the compiled reads check it
            ids = getattr(self, name)
            if ids is not None and type(ids) is not tuple:
                object.__setattr__(self, name, tuple(ids))
        segs = self.segments
        seg_total = None if segs is None else _segments_total(segs)
        if segs is not None and seg_total is None:
            segs = tuple((key, _integer(self.request_id, "segment length", n)) for key, n in segs)
            object.__setattr__(self, "segments", segs)
            seg_total = sum(n for _, n in segs)
        t = self.arrival_time
        if type(t) is not float:
            if isinstance(t, bool) or not isinstance(t, Real):
                raise ConfigError(f"request {self.request_id}: arrival_time must be a number, got {t!r}")
            object.__setattr__(self, "arrival_time", float(t))
        if self.prompt_len < 1:
            raise ConfigError(f"request {self.request_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ConfigError(f"request {self.request_id}: output_len must be >= 1, got {self.output_len}")
        _check_arrival(self.request_id, self.arrival_time)
        if self.token_ids is not None and len(self.token_ids) != self.prompt_len:
            raise ConfigError(
                f"request {self.request_id}: {len(self.token_ids)} token_ids for prompt_len {self.prompt_len}"
            )
        if seg_total is not None and seg_total != self.prompt_len:
            raise ConfigError(f"request {self.request_id}: segment lengths do not add up to prompt_len")
        pf = self.private_from
        if pf is not None:
            pf = _integer(self.request_id, "private_from", pf)
            if pf < 0:
                raise ConfigError(f"request {self.request_id}: private_from must be >= 0, got {pf}")
            object.__setattr__(self, "private_from", pf)
        if self.shares_content:
            end = (pf if pf is not None else self.prompt_len if self.segments is None and self.output_key is None
                   else HASH_ALL)
            object.__setattr__(self, "hash_end", min(end, HASH_ALL))

    def arriving_at(self, t: float) -> RequestSpec:
        """This request arriving at ``t`` instead (a front end's input path, once per request): a copy of
        the checked fields, cheaper than ``dataclasses.replace``, which checks them all again."""
        _check_arrival(self.request_id, t)
        new = _new(RequestSpec)  # every slot written out: 2.6 us against 3.8 us for a loop over the slots
        _set(new, "request_id", self.request_id)
        _set(new, "arrival_time", float(t))
        _set(new, "prompt_len", self.prompt_len)
        _set(new, "output_len", self.output_len)
        _set(new, "priority", self.priority)
        _set(new, "session_id", self.session_id)
        _set(new, "token_ids", self.token_ids)
        _set(new, "hash_ids", self.hash_ids)
        _set(new, "hash_block_size", self.hash_block_size)
        _set(new, "segments", self.segments)
        _set(new, "output_key", self.output_key)
        _set(new, "prefix_hashes", self.prefix_hashes)
        _set(new, "private_from", self.private_from)
        _set(new, "private_until_done", self.private_until_done)
        _set(new, "shares_content", self.shares_content)
        _set(new, "hash_end", self.hash_end)
        return new

    def prompt_segments(self) -> tuple[Segment, ...]:
        if self.segments is not None:
            return self.segments
        if self.hash_ids is not None:
            hb = self.hash_block_size
            segs: list[Segment] = []
            left = self.prompt_len
            for h in self.hash_ids:
                if left <= 0:
                    break
                segs.append((("h", h), min(hb, left)))
                left -= hb
            if left > 0:  # trace gives fewer ids than the prompt needs: the rest is unique
                segs.append((("u", self.request_id), left))
            return tuple(segs)
        return ((("u", self.request_id), self.prompt_len),)


def _segments_total(segs: object) -> int | None:
    """The tokens of segments already in their plain form (a tuple of (key, int) tuples), in one pass;
    None for any other form (turned into it, then counted)."""
    if type(segs) is not tuple:
        return None
    total = 0
    for s in segs:
        if type(s) is not tuple:
            return None
        n = s[1]
        if type(n) is not int:
            return None
        total += n
    return total


_new, _set = object.__new__, object.__setattr__  # a frozen dataclass's fields are set past its __setattr__

# Each slot's own setter (its member descriptor's ``__set__``): a spec built slot by slot through them skips the
# frozen class's ``object.__setattr__`` lookup for every field (plain_spec; a conversation's turns in
# workloads/gen/session_source.py).
SLOT_SETTERS = {name: RequestSpec.__dict__[name].__set__ for name in RequestSpec.__slots__}


def slot_defaults(given: tuple[str, ...]) -> tuple[tuple[Any, Any], ...]:
    """(setter, declared default) of every slot not in ``given``: what a spec built slot by slot sets the
    rest to (the dataclass's own defaults, so a new field cannot be missed)."""
    out = tuple((SLOT_SETTERS[f.name], f.default) for f in fields(RequestSpec) if f.name not in given)
    if any(v is MISSING for _, v in out):
        raise RuntimeError(f"a spec built from {given} needs a plain default for every other field")
    return out


_PLAIN_ARGS = ("request_id", "arrival_time", "prompt_len", "output_len", "priority")
_SET_DEFAULTS = slot_defaults(_PLAIN_ARGS)
_S_ID, _S_T, _S_P, _S_O, _S_PRIO = (SLOT_SETTERS[n] for n in _PLAIN_ARGS)


def plain_spec(request_id: str, arrival_time: float, prompt_len: int, output_len: int, priority: int) -> RequestSpec:
    """``RequestSpec(request_id, arrival_time, prompt_len, output_len, priority)`` for a generated request
    without content (plain values, every other field its default), built slot by slot: ~0.9 us against
    ~1.8 us through the dataclass's ``__init__`` (a workload builds one per request). Anything else, or
    a value the checks refuse, goes through the constructor (which names it)."""
    if (type(request_id) is str and type(arrival_time) is float and type(prompt_len) is int
            and type(output_len) is int and type(priority) is int and prompt_len >= 1 and output_len >= 1
            and 0 <= arrival_time <= MAX_ARRIVAL_S):
        spec = _new(RequestSpec)
        _S_ID(spec, request_id)
        _S_T(spec, arrival_time)
        _S_P(spec, prompt_len)
        _S_O(spec, output_len)
        _S_PRIO(spec, priority)
        for setter, value in _SET_DEFAULTS:
            setter(spec, value)
        return spec
    return RequestSpec(request_id=request_id, arrival_time=arrival_time, prompt_len=prompt_len,
                       output_len=output_len, priority=priority)


def _integer(request_id: str, name: str, v: object) -> int:
    """``v`` as a plain int: an integer (numpy's too) or an integral float; anything else is refused."""
    if isinstance(v, Integral) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, Real) and not isinstance(v, bool) and float(v).is_integer():
        return int(float(v))
    raise ConfigError(f"request {request_id}: {name} must be an integer, got {v!r}")
