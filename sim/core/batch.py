"""The batch summary a step is priced on: what the cost model needs and nothing more.

Kept separate from the policy's plan so the cost model never sees requests (DESIGN.md: a pure
function from a batch summary to seconds)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)
_NONE: list[int] = []  # the list view of a column built from an array: taken from it on first use


def _array(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


class BatchSummary:
    """One engine step.

    decode_ctx:     for each decode row (1 new token), its context length *including* the new token.
    prefill_chunk:  for each prefill chunk, the number of new tokens computed this step.
    prefill_ctx:    for each prefill chunk, the tokens already in the KV cache before the chunk.
    num_logits:     rows that sample a token (decodes + prefills that finish their prompt this step).
    swap_out_blocks / swap_in_blocks: KV blocks copied GPU->CPU / CPU->GPU during this step.

    The three columns are int64 arrays to whoever asks for them (and may be assigned). The built-in
    schedulers build them as int lists, and every step is priced, so ``of_lists`` keeps those lists and
    makes an array only on first use: the roofline reads the lists (``prefill_chunks``, ``prefill_ctxs``)
    and sums, and turning ~100 ints into three arrays each step cost more than pricing it. Not a
    dataclass any more (``dataclasses.replace`` does not apply; build a new one), compared by identity.
    """

    __slots__ = ("_dec", "_chunk", "_ctx", "_dec_list", "_chunk_list", "_ctx_list", "num_logits",
                 "swap_out_blocks", "swap_in_blocks", "_prefill_tokens", "_decode_ctx_sum", "_decode_ctx_max")

    def __init__(self, decode_ctx: Sequence[int] | np.ndarray | None = None,
                 prefill_chunk: Sequence[int] | np.ndarray | None = None,
                 prefill_ctx: Sequence[int] | np.ndarray | None = None,
                 num_logits: int = 0, swap_out_blocks: int = 0, swap_in_blocks: int = 0) -> None:
        self._dec: np.ndarray | None = _EMPTY if decode_ctx is None else _array(decode_ctx)
        self._chunk: np.ndarray | None = _EMPTY if prefill_chunk is None else _array(prefill_chunk)
        self._ctx: np.ndarray | None = _EMPTY if prefill_ctx is None else _array(prefill_ctx)
        self._dec_list: list[int] = _NONE
        self._chunk_list: list[int] = _NONE
        self._ctx_list: list[int] = _NONE
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
        """From sequences or arrays (a plug-in policy's): made into int64 arrays, their sums taken once."""
        b = cls(decode_ctx, prefill_chunk, prefill_ctx, num_logits=int(num_logits))
        chunk, dec = b.prefill_chunk, b.decode_ctx
        b._prefill_tokens = int(chunk.sum()) if len(chunk) else 0
        b._decode_ctx_sum = int(dec.sum()) if len(dec) else 0
        return b

    @classmethod
    def of_lists(cls, decode_ctx: list[int], prefill_chunk: list[int], prefill_ctx: list[int], num_logits: int,
                 decode_ctx_sum: int) -> BatchSummary:
        """From the int lists a scheduler built row by row, handed over (not copied: the caller does not
        touch them again), with the decode contexts' sum it kept while building them. Arrays are made
        only if someone asks for them; pricing reads the lists."""
        b = cls(num_logits=num_logits)
        b._dec = b._chunk = b._ctx = None
        b._dec_list, b._chunk_list, b._ctx_list = decode_ctx, prefill_chunk, prefill_ctx
        b._prefill_tokens = sum(prefill_chunk)
        b._decode_ctx_sum = decode_ctx_sum
        return b

    # ---- the columns as arrays (made on first use from a scheduler's lists) ---------------------------
    @property
    def decode_ctx(self) -> np.ndarray:
        if self._dec is None:
            self._dec = _array(self._dec_list)
        return self._dec

    @decode_ctx.setter
    def decode_ctx(self, values: Sequence[int] | np.ndarray) -> None:
        self._dec, self._dec_list, self._decode_ctx_sum, self._decode_ctx_max = _array(values), _NONE, -1, -1

    @property
    def prefill_chunk(self) -> np.ndarray:
        if self._chunk is None:
            self._chunk = _array(self._chunk_list)
        return self._chunk

    @prefill_chunk.setter
    def prefill_chunk(self, values: Sequence[int] | np.ndarray) -> None:
        self._chunk, self._chunk_list, self._prefill_tokens = _array(values), _NONE, -1

    @property
    def prefill_ctx(self) -> np.ndarray:
        if self._ctx is None:
            self._ctx = _array(self._ctx_list)
        return self._ctx

    @prefill_ctx.setter
    def prefill_ctx(self, values: Sequence[int] | np.ndarray) -> None:
        self._ctx, self._ctx_list = _array(values), _NONE

    # ---- the columns as lists (what pricing loops over) -------------------------------------------------
    def prefill_chunks(self) -> list[int]:
        """prefill_chunk as a list of ints."""
        if self._chunk is not None:
            return self._chunk.tolist()  # type: ignore[no-any-return]
        return self._chunk_list

    def prefill_ctxs(self) -> list[int]:
        """prefill_ctx as a list of ints."""
        if self._ctx is not None:
            return self._ctx.tolist()  # type: ignore[no-any-return]
        return self._ctx_list

    @property
    def num_decode(self) -> int:
        return len(self._dec_list) if self._dec is None else int(len(self._dec))

    @property
    def num_prefill(self) -> int:
        """Prefill chunks in the step."""
        return len(self._chunk_list) if self._chunk is None else int(len(self._chunk))

    @property
    def num_prefill_tokens(self) -> int:
        if self._prefill_tokens < 0:
            self._prefill_tokens = int(self.prefill_chunk.sum()) if self.num_prefill else 0
        return self._prefill_tokens

    @property
    def decode_ctx_sum(self) -> int:
        """Total context of the decode rows (the KV they read)."""
        if self._decode_ctx_sum < 0:
            self._decode_ctx_sum = int(self.decode_ctx.sum()) if self.num_decode else 0
        return self._decode_ctx_sum

    @property
    def decode_ctx_max(self) -> int:
        """The longest decode row's context (0 without decode rows)."""
        if self._decode_ctx_max < 0:
            if self._dec is None:  # a scheduler's list: max in C beats numpy's reduction
                self._decode_ctx_max = max(self._dec_list) if self._dec_list else 0
            else:
                self._decode_ctx_max = int(self._dec.max()) if len(self._dec) else 0
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
