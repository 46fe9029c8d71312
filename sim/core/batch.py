"""The batch summary a step is priced on: what the cost model needs and nothing more.

Kept separate from the policy's plan so the cost model never sees requests (DESIGN.md: a pure
function from a batch summary to seconds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class BatchSummary:
    """One engine step.

    decode_ctx:     for each decode row (1 new token), its context length *including* the new token.
    prefill_chunk:  for each prefill chunk, the number of new tokens computed this step.
    prefill_ctx:    for each prefill chunk, the tokens already in the KV cache before the chunk.
    num_logits:     rows that sample a token (decodes + prefills that finish their prompt this step).
    swap_out_blocks / swap_in_blocks: KV blocks copied GPU->CPU / CPU->GPU during this step.
    """

    decode_ctx: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_chunk: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_ctx: np.ndarray = field(default_factory=lambda: _EMPTY)
    num_logits: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    # Sums asked for several times a step (pricing, recording, emptiness): computed once, on first use.
    _prefill_tokens: int = field(default=-1, repr=False, compare=False)
    _decode_ctx_sum: int = field(default=-1, repr=False, compare=False)
    _decode_ctx_max: int = field(default=-1, repr=False, compare=False)

    @classmethod
    def of(cls, decode_ctx: Sequence[int] | np.ndarray, prefill_chunk: Sequence[int] | np.ndarray,
           prefill_ctx: Sequence[int] | np.ndarray, num_logits: int | np.integer) -> BatchSummary:
        """From the lists a scheduler builds row by row (or arrays: a plug-in's); their sums are taken
        here, cheaply, once."""
        return cls(
            decode_ctx=np.asarray(decode_ctx, dtype=np.int64),
            prefill_chunk=np.asarray(prefill_chunk, dtype=np.int64),
            prefill_ctx=np.asarray(prefill_ctx, dtype=np.int64),
            num_logits=int(num_logits),
            _prefill_tokens=int(sum(prefill_chunk)),
            _decode_ctx_sum=int(sum(decode_ctx)),
            # a scheduler's list: its max in C now beats numpy's reduction later (mixed steps ask for it)
            _decode_ctx_max=(max(decode_ctx) if decode_ctx else 0) if type(decode_ctx) is list else -1,
        )

    @property
    def num_decode(self) -> int:
        return int(len(self.decode_ctx))

    @property
    def num_prefill_tokens(self) -> int:
        if self._prefill_tokens < 0:
            self._prefill_tokens = int(self.prefill_chunk.sum()) if len(self.prefill_chunk) else 0
        return self._prefill_tokens

    @property
    def decode_ctx_sum(self) -> int:
        """Total context of the decode rows (the KV they read)."""
        if self._decode_ctx_sum < 0:
            self._decode_ctx_sum = int(self.decode_ctx.sum()) if len(self.decode_ctx) else 0
        return self._decode_ctx_sum

    @property
    def decode_ctx_max(self) -> int:
        """The longest decode row's context (0 without decode rows)."""
        if self._decode_ctx_max < 0:
            self._decode_ctx_max = int(self.decode_ctx.max()) if len(self.decode_ctx) else 0
        return self._decode_ctx_max

    @property
    def num_tokens(self) -> int:
        return self.num_decode + self.num_prefill_tokens

    @property
    def is_empty(self) -> bool:
        return self.num_tokens == 0 and self.swap_in_blocks == 0 and self.swap_out_blocks == 0
