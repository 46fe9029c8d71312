"""The batch summary a step is priced on: what the cost model needs and nothing more.

Kept separate from the policy's plan so the cost model never sees requests (DESIGN.md: a pure
function from a batch summary to seconds)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)
Column = list[int] | np.ndarray  # a scheduler's int list until someone asks for the array


def _array(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _as_array(col: Column) -> np.ndarray:
    return col if not isinstance(col, list) else _array(col)


def _as_list(col: Column) -> list[int]:
    return col if isinstance(col, list) else col.tolist()  # type: ignore[union-attr]


class BatchSummary:
    """One engine step.

    decode_ctx:     for each decode row (1 new token), its context length *including* the new token.
    prefill_chunk:  for each prefill chunk, the number of new tokens computed this step.
    prefill_ctx:    for each prefill chunk, the tokens already in the KV cache before the chunk.
    num_logits:     rows that sample a token (decodes + prefills that finish their prompt this step).
    swap_out_blocks / swap_in_blocks: KV blocks copied GPU->CPU / CPU->GPU during this step.

    The three columns are int64 arrays to whoever asks for them (and may be assigned). The built-in
    schedulers build them as int lists, and every step is priced, so ``of_lists`` keeps those lists and
    each becomes an array only when it is first read as one: the roofline reads the lists
    (``prefill_chunks``, ``prefill_ctxs``) and sums, and turning ~100 ints into three arrays each step cost
    more than pricing it. Not a dataclass (``dataclasses.replace`` does not apply); compared by identity.
    """

    __slots__ = ("_dec", "_chunk", "_ctx", "num_logits", "swap_out_blocks", "swap_in_blocks",
                 "_prefill_tokens", "_decode_ctx_sum", "_decode_ctx_max")

    def __init__(self, decode_ctx: Sequence[int] | np.ndarray | None = None,
                 prefill_chunk: Sequence[int] | np.ndarray | None = None,
                 prefill_ctx: Sequence[int] | np.ndarray | None = None,
                 num_logits: int = 0, swap_out_blocks: int = 0, swap_in_blocks: int = 0) -> None:
        self._dec: Column = _EMPTY if decode_ctx is None else _array(decode_ctx)
        self._chunk: Column = _EMPTY if prefill_chunk is None else _array(prefill_chunk)
        self._ctx: Column = _EMPTY if prefill_ctx is None else _array(prefill_ctx)
        self.num_logits = num_logits
        self.swap_out_blocks = swap_out_blocks
        self.swap_in_blocks = swap_in_blocks
        # Sums asked for several times a step (pricing, recording, emptiness): computed once, on first use.
        self._prefill_tokens = -1
        self._decode_ctx_sum = -1
        self._decode_ctx_max = -1

    @classmethod
    def of(cls, decode_ctx: Sequence[int] | np.ndarray, prefill_chunk: Sequence[int] | np.ndarray,
           prefill_ctx: Sequence[int] | np.ndarray, num_logits: int | np.integer) -> BatchSummary:
        """From sequences or arrays (a plug-in policy's), made int64 arrays; the sums are taken when asked."""
        return cls(decode_ctx, prefill_chunk, prefill_ctx, num_logits=int(num_logits))

    @classmethod
    def of_lists(cls, decode_ctx: list[int], prefill_chunk: list[int], prefill_ctx: list[int], num_logits: int,
                 decode_ctx_sum: int) -> BatchSummary:
        """From the int lists a scheduler built row by row, handed over (not copied: the caller does not
        touch them again), with the decode contexts' sum it kept while building them."""
        # compiled, ``BatchSummary()`` is a direct call; ``cls(num_logits=...)`` a generic one with keywords (~4x)
        b = BatchSummary() if cls is BatchSummary else cls()
        b.num_logits = num_logits
        b._dec, b._chunk, b._ctx = decode_ctx, prefill_chunk, prefill_ctx
        b._decode_ctx_sum = decode_ctx_sum
        return b

    # ---- the columns as arrays (a list becomes one when first read so) --------------------------------
    @property
    def decode_ctx(self) -> np.ndarray:
        a = self._dec = _as_array(self._dec)
        return a

    @decode_ctx.setter
    def decode_ctx(self, values: Sequence[int] | np.ndarray) -> None:
        self._dec, self._decode_ctx_sum, self._decode_ctx_max = _array(values), -1, -1

    @property
    def prefill_chunk(self) -> np.ndarray:
        a = self._chunk = _as_array(self._chunk)
        return a

    @prefill_chunk.setter
    def prefill_chunk(self, values: Sequence[int] | np.ndarray) -> None:
        self._chunk, self._prefill_tokens = _array(values), -1

    @property
    def prefill_ctx(self) -> np.ndarray:
        a = self._ctx = _as_array(self._ctx)
        return a

    @prefill_ctx.setter
    def prefill_ctx(self, values: Sequence[int] | np.ndarray) -> None:
        self._ctx = _array(values)

    # ---- the columns as lists (what pricing loops over) -------------------------------------------------
    def prefill_chunks(self) -> list[int]:
        """prefill_chunk as a list of ints."""
        return _as_list(self._chunk)

    def prefill_ctxs(self) -> list[int]:
        """prefill_ctx as a list of ints."""
        return _as_list(self._ctx)

    @property
    def num_decode(self) -> int:
        return len(self._dec)

    @property
    def num_prefill(self) -> int:
        """Prefill chunks in the step."""
        return len(self._chunk)

    @property
    def num_prefill_tokens(self) -> int:
        if self._prefill_tokens < 0:
            c = self._chunk
            self._prefill_tokens = sum(c) if isinstance(c, list) else (int(c.sum()) if len(c) else 0)
        return self._prefill_tokens

    @property
    def decode_ctx_sum(self) -> int:
        """Total context of the decode rows (the KV they read)."""
        if self._decode_ctx_sum < 0:
            d = self._dec
            self._decode_ctx_sum = sum(d) if isinstance(d, list) else (int(d.sum()) if len(d) else 0)
        return self._decode_ctx_sum

    @property
    def decode_ctx_max(self) -> int:
        """The longest decode row's context (0 without decode rows)."""
        if self._decode_ctx_max < 0:
            d = self._dec  # a scheduler's list: max in C beats numpy's reduction
            self._decode_ctx_max = (max(d) if d else 0) if isinstance(d, list) else (int(d.max()) if len(d) else 0)
        return self._decode_ctx_max

    @property
    def num_tokens(self) -> int:
        return self.num_decode + self.num_prefill_tokens

    @property
    def is_empty(self) -> bool:
        return self.num_tokens == 0 and self.swap_in_blocks == 0 and self.swap_out_blocks == 0

    def __repr__(self) -> str:
        return (f"BatchSummary(decode_ctx={self.decode_ctx!r}, prefill_chunk={self.prefill_chunk!r}, "
                f"prefill_ctx={self.prefill_ctx!r}, num_logits={self.num_logits}, "
                f"swap_out_blocks={self.swap_out_blocks}, swap_in_blocks={self.swap_in_blocks})")
