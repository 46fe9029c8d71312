"""One step's time under the roofline, compiled by mypyc (sim/native.py): every step that the fast-forward
does not take in a run (each prefill, chunk and mixed step) is priced here, ~1.2 a request, and the
interpreted version cost 2-3 us of reading the batch and looping over its chunks.

``StepPricer`` holds the roofline's per-step coefficients (RooflineCostModel builds it) and does the
same operations in the same order as the interpreted ``step_time`` did, so times are bit-identical (the
pinned digests and tests/test_step_price.py). The C build keeps every multiply and add separate
(sim/native.py turns off floating-point contraction), as numpy and the interpreter do.
"""

from __future__ import annotations

from sim.core.batch import BatchSummary
from sim.cost.decode_price import decode_run_times, decode_times

NEED_TABLES = -1.0  # step_time's answer when the step reads past the token or head table (the owner grows them)


class StepPricer:
    """The roofline's step time from a BatchSummary, over the owner's token and head tables (``tok``,
    ``head``: per-step seconds by padded token count and by sampled rows). The owner grows them and hands
    the new lists over; the pricer holds no reference back (no cycle to leave for the collector)."""

    def __init__(self, tok: list[float], head: list[float], pad: list[int], pad_mixed: bool, step_oh: float,
                 seq_oh: float, layers: int, attn_t0: float, kv_coef: float, dec_seq: float, mixed_factor: float,
                 mix_head: float, mix_seq: float, fa_coef: float, mla_up: float, kv_tok: float, pf_floor: float,
                 pf_sat: float, kv_bw: float, inv_attn_peak: float, pf_ramp: float, pf_t0: float,
                 swap_block_s: float) -> None:  # fmt: skip
        self.tok = tok
        self.head = head
        self.pad = pad
        self.pad_mixed = pad_mixed
        self.step_oh, self.seq_oh, self.layers = step_oh, seq_oh, layers
        self.attn_t0, self.kv_coef, self.dec_seq = attn_t0, kv_coef, dec_seq
        self.mixed_factor, self.mix_head, self.mix_seq = mixed_factor, mix_head, mix_seq
        self.fa_coef, self.mla_up, self.kv_tok = fa_coef, mla_up, kv_tok
        self.pf_floor, self.pf_sat, self.kv_bw, self.inv_attn_peak = pf_floor, pf_sat, kv_bw, inv_attn_peak
        self.pf_ramp, self.pf_t0 = pf_ramp, pf_t0
        self.swap_block_s = swap_block_s

    def padded(self, n: int) -> int:
        """The CUDA graph size a step of ``n`` tokens runs in (``n`` itself past the largest graph)."""
        pad = self.pad
        return pad[n] if n < len(pad) else n

    def prefill_attn(self, chunks: list[int], ctxs: list[int]) -> float:
        """Per-layer seconds of the prefill chunks: causal FLOPs vs KV read at occupancy-limited bandwidth."""
        fa, up, kvt = self.fa_coef, self.mla_up, self.kv_tok
        floor, sat, kvbw, inv_peak = self.pf_floor, self.pf_sat, self.kv_bw, self.inv_attn_peak
        ramp = self.pf_ramp
        total = self.pf_t0 * len(chunks)
        for i in range(len(chunks)):
            c, p = chunks[i], ctxs[i]
            # causal part (c·(c+1)/2 pairs) at an efficiency that ramps up with the chunk length
            tf = (fa * c * (p + (c + 1) * 0.5 * (1.0 + ramp / c)) + up * p) * inv_peak
            occ = c / sat
            occ = floor if occ < floor else (1.0 if occ > 1.0 else occ)
            tb = kvt * (p + c) / (kvbw * occ)
            total += tf if tf > tb else tb
        return total

    def mixed_decode(self, batch: BatchSummary) -> float:
        """Per-layer seconds of the decode rows of a step that also runs a prefill chunk."""
        total = batch.decode_ctx_sum
        t = (self.kv_coef * total + batch.num_decode * self.dec_seq) * self.mixed_factor
        if self.mix_head:
            x = self.mix_head * total
            if x > t:  # max(t, x): t unless x is larger
                t = x
        if self.mix_seq * total > t:  # max ctx <= Σctx: only look for the max when it can matter
            x = self.mix_seq * batch.decode_ctx_max
            if x > t:
                t = x
        return t

    def token_row(self, n: int, npf: int, batch: BatchSummary) -> int:
        """The token table's row a step of ``n`` decode rows and ``npf`` prefill chunks reads (its padded
        token count); the head table's is its sampled rows (``batch.num_logits``)."""
        if npf:
            mt = n + batch.num_prefill_tokens
            return self.padded(mt) if self.pad_mixed else mt
        return self.padded(n) if n else 0

    def decode_list(self, rows: list[int], ctx_sums: list[int]) -> list[float]:
        """Consecutive decode-only steps' seconds (the owner's ``decode_step_list``); raises IndexError
        when a row count is past the tables (the owner grows them)."""
        return decode_times(self.tok, self.head, self.pad, self.step_oh, self.seq_oh, float(self.layers),
                            self.attn_t0, self.kv_coef, self.dec_seq, rows, ctx_sums)  # fmt: skip

    def decode_run(self, count: list[int], ctx: list[int], start: float,
                   limit: float) -> tuple[list[int], list[float]]:
        """A decode run's rows per step and its steps' seconds, priced until ``limit`` (``decode_run_times``);
        raises IndexError when a row count is past the tables (the owner grows them)."""
        return decode_run_times(self.tok, self.head, self.pad, self.step_oh, self.seq_oh, float(self.layers),
                                self.attn_t0, self.kv_coef, self.dec_seq, count, ctx, start, limit)  # fmt: skip

    def step_time(self, batch: BatchSummary) -> float:
        """The step's seconds, or NEED_TABLES when it reads past the tables."""
        n, npf = batch.num_decode, batch.num_prefill
        swaps = batch.swap_in_blocks + batch.swap_out_blocks
        if not npf and not n and not swaps:
            return 0.0
        mg, s = self.token_row(n, npf, batch), batch.num_logits
        if mg >= len(self.tok) or s >= len(self.head):
            return NEED_TABLES
        t = self.tok[mg] + self.head[s] + self.step_oh + self.seq_oh * (n + npf)
        if npf:
            dec = self.mixed_decode(batch) if n else 0.0
            attn = self.attn_t0 + dec + self.prefill_attn(batch.prefill_chunks(), batch.prefill_ctxs())
            t += self.layers * attn
        elif n:
            attn = self.attn_t0 + (self.kv_coef * batch.decode_ctx_sum + n * self.dec_seq)
            t += self.layers * attn
        if swaps:
            t += swaps * self.swap_block_s
        return t
