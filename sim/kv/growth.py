"""Bulk decode growth: the KV manager's paths for the engine's decode fast-forward.

A fast-forwarded run of k decode steps (sim/engine/fastforward.py) asks how many blocks each step
will take (``decode_run_blocks``) and then grows every running row by k tokens in one pop
(``grow_decodes``), leaving the state that k rounds of row-by-row ``allocate_slots`` would. Policies
never call these: they allocate through ``allocate_slots`` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mypy_extensions import trait

from sim.core.request import Request
from sim.kv.table import RequestBlocks

if TYPE_CHECKING:
    from sim.kv.block_pool import BlockPool, KVBlock


@trait  # a mixin mypyc can compile (sim/native.py)
class DecodeGrowth:
    """Mixed into KVCacheManager, whose block tables (``_reqs``) and pool it works on."""

    block_size: int
    enable_caching: bool
    max_model_len: int
    pool: BlockPool
    _reqs: dict[str, RequestBlocks]

    def allocate_slots(self, req: Request, num_new_tokens: int) -> Any:  # KVCacheManager's
        raise NotImplementedError

    def _register(self, req: Request, st: RequestBlocks, num_full: int) -> None:  # KVCacheManager's
        raise NotImplementedError

    def grow_decodes(self, reqs: list[Request], k: int, computed: list[int] | None = None, lag: int = 0) -> None:
        """Slots for ``k`` more tokens of each running request (a fast-forwarded decode run).

        The caller has checked that the free blocks suffice. Rows whose ``k`` tokens neither cross nor
        complete a block need nothing; the blocks of the others are popped in one go, in row order, as
        row-by-row ``allocate_slots`` calls would pop them, and rows with shared content then register
        their completed blocks in row order. The end state equals the row-by-row one: a pop evicts only
        free blocks and a registration names only held ones, so the two commute (same hash map, same
        order of duplicates under a hash, same counts).
        ``computed``: each row's computed tokens, for a caller that advances the requests' counters
        later (rows without hashed content only); their prompt and output then count as ``computed + k``,
        less ``lag`` tokens still in flight under async scheduling (not yet known, so not yet cached).
        """
        bs = self.block_size
        caching = self.enable_caching
        max_len = self.max_model_len
        table = self._reqs
        # (state, new blocks, full blocks to count as cached, the request when it registers them)
        grow: list[tuple[RequestBlocks, int, int, Request | None]] = []
        total = 0
        for i, req in enumerate(reqs):
            c = req.num_computed_tokens if computed is None else computed[i]
            if c % bs and (c + k) // bs == c // bs and (c + k) % bs:
                continue
            st = table.get(req.request_id)
            hashed = caching and c < req.hash_end  # a block it completes may be shared
            if st is None or c + k > max_len or (hashed and computed is not None):
                if computed is not None:
                    raise ValueError(f"request {req.request_id}: grow_decodes(computed=...) needs a held, "
                                     "unhashed row within max_model_len")
                if grow:  # keep the pop order: flush what is pending first
                    self._grow(grow, total)
                    grow, total = [], 0
                if self.allocate_slots(req, k) is None:
                    raise RuntimeError(f"request {req.request_id}: decode run promised {k} slots")
                continue
            need = -(-(c + k) // bs) - len(st.blocks)
            if need < 0:
                need = 0
            if caching:
                tokens = c + k - lag if computed is not None else req.num_tokens
                full = (c + k if c + k < tokens else tokens) // bs
            else:
                full = 0
            grow.append((st, need, full, req if hashed else None))
            total += need
        if grow:
            self._grow(grow, total)

    def grow_stepped(self, reqs: list[Request], steps: list[int], lag: int) -> bool:
        """``steps[i]`` one-token schedules of each row, with the state as many rounds of
        ``grow_decodes(rows still scheduled, 1)`` leave, the rows' counters moved by the caller after.

        Row i's schedule j (1-based) has ``num_computed_tokens + j - 1`` tokens computed and ``lag`` fewer
        known (async scheduling: the newest token is in flight), so it may pop a block (its next slot
        starts one) and register the full blocks its known tokens complete. Only those steps matter
        (about 2 in ``block_size``): they are taken as events, in the order the rounds take them (step,
        then row), which is all that is observable: pops come off the free queue in that order, and
        registrations under one hash keep it (a pop evicts only free blocks and a registration names
        only held ones, so the pops of all the steps can go first, grow_decodes' argument). Returns
        False, changing nothing, when a row is not a held row within max_model_len for every step (the
        caller then steps it round by round)."""
        bs = self.block_size
        caching = self.enable_caching
        max_len = self.max_model_len
        table = self._reqs
        states: list[RequestBlocks] = []
        for i in range(len(reqs)):
            req = reqs[i]
            st = table.get(req.request_id)
            if st is None or req.num_computed_tokens + steps[i] > max_len:
                return False
            states.append(st)
        # events (step, row): where the row's slot starts a block, and where it completes one
        events: list[tuple[int, int]] = []
        for i in range(len(reqs)):
            c0 = reqs[i].num_computed_tokens
            m = steps[i]
            j = 1 + (-c0) % bs
            while j <= m:
                events.append((j, i))
                j += bs
            if bs > 1:
                j = 1 + (bs - 1 - c0) % bs
                while j <= m:
                    events.append((j, i))
                    j += bs
        events.sort()
        # Walk the events: each row's blocks held and registered so far; pops counted, registrations kept.
        held = [len(st.blocks) for st in states]
        cached = [st.num_cached for st in states]
        pops: list[int] = []  # row of each popped block, in pop order
        regs: list[tuple[int, int, int]] = []  # (row, from, to) in registration order
        for j, i in events:
            c = reqs[i].num_computed_tokens + j - 1
            need = -(-(c + 1) // bs) - held[i]
            while need > 0:
                pops.append(i)
                held[i] = held[i] + 1
                need -= 1
            if caching:
                full = (c + 1 - lag) // bs
                if full > cached[i]:
                    if full > held[i]:
                        full = held[i]
                    regs.append((i, cached[i], full))
                    cached[i] = full
        pool = self.pool
        if len(pops) > pool.num_free_blocks:
            raise RuntimeError(f"decode run promised {len(pops)} blocks, {pool.num_free_blocks} are free")
        new = pool.get_new_blocks(len(pops)) if pops else []
        for p in range(len(pops)):
            states[pops[p]].blocks.append(new[p])
        # each row's hashes, computed once (to its last registration within hash_end: blocks past it are
        # the row's own, counted cached but not registered)
        hashes: list[list[int] | None] = [None] * len(reqs)
        caps = [0] * len(reqs)
        for i in range(len(reqs)):
            cap = reqs[i].hash_end // bs
            if cap > cached[i]:
                cap = cached[i]
            caps[i] = cap
            if cap > states[i].num_cached:
                hashes[i] = reqs[i].block_hashes(bs, cap * bs)
        for i, lo, hi in regs:
            h = hashes[i]
            if h is not None:
                if hi > caps[i]:
                    hi = caps[i]
                if hi > lo:
                    pool.cache_full_blocks(states[i].blocks, h, lo, hi)
        for i in range(len(reqs)):
            states[i].num_cached = cached[i]
        return True

    def _grow(self, grow: list[tuple[RequestBlocks, int, int, Request | None]], total: int) -> None:
        """Pop ``total`` blocks and hand each row its share, in row order; hashed rows register theirs."""
        pool = self.pool
        if total > pool.num_free_blocks:
            raise RuntimeError(f"decode run promised {total} blocks, {pool.num_free_blocks} are free")
        new = pool.get_new_blocks(total) if total else []
        p = 0
        for st, need, full, req in grow:
            blocks = st.blocks
            if need:
                blocks.extend(new[p:p + need])
                p += need
            if full > st.num_cached:
                if full > len(blocks):
                    full = len(blocks)
                if req is not None:
                    self._register(req, st, full)
                st.num_cached = full

    def pop_run_blocks(self, n: int) -> list[KVBlock]:
        """``n`` blocks off the free queue for rows of a decode run that are handed them later
        (``hand_blocks``), popped when stepping would pop them: what a pop evicts and the free counts
        are stepping's. A popped block is blank (its stale hash evicted), so which row gets which is
        not observable; only rows without hashed content grow this way."""
        pool = self.pool
        if n > pool.num_free_blocks:
            raise RuntimeError(f"decode run promised {n} blocks, {pool.num_free_blocks} are free")
        return pool.get_new_blocks(n) if n > 0 else []

    def hand_blocks(self, req: Request, popped: list[KVBlock], tokens: int, known: int) -> None:
        """Slots for ``req``'s first ``tokens`` tokens from ``popped`` (``pop_run_blocks``' blocks, taken
        off its end), and its full blocks among the first ``known`` known tokens counted cached as
        ``grow_decodes`` counts them (nothing registered: the row's hashed content is behind it);
        ``known`` < 0: left to the caller's ``cache_blocks``."""
        st = self._reqs[req.request_id]
        bs = self.block_size
        blocks = st.blocks
        need = -(-tokens // bs) - len(blocks)
        if need > 0:
            if need > len(popped):
                raise RuntimeError(f"request {req.request_id}: decode run popped too few blocks for it")
            blocks.extend(popped[len(popped) - need:])
            del popped[len(popped) - need:]
        if self.enable_caching and known >= 0:
            full = known // bs
            if full > len(blocks):
                full = len(blocks)
            if full > st.num_cached:
                st.num_cached = full

    def decode_run_blocks(self, computed: list[int], held: list[int], finish_step: list[int], k: int) -> list[int]:
        """Blocks that decode rows allocate over ``k`` steps, cumulative: ``out[s]`` for steps 1..s.

        Row i holds ``held[i]`` blocks, has ``computed[i]`` tokens and decodes one token per step up to
        step ``finish_step[i]``. Step s needs slot ``computed + s``, so a row first needs a new block at
        step ``held * block_size - computed + 1`` and then every ``block_size`` steps: the allocations
        are counted as events (about rows x k / block_size of them), in plain lists (a run is tens of
        steps and rows: numpy's per-call cost would dominate).
        """
        bs = self.block_size
        out = [0] * (k + 1)
        for i in range(len(computed)):
            s = held[i] * bs - computed[i] + 1
            last = finish_step[i]
            if last > k:
                last = k
            if s < 0 and s <= last:
                raise ValueError(f"decode_run_blocks: row {i} holds {held[i]} blocks for {computed[i]} tokens")
            while s <= last:
                out[s] = out[s] + 1
                s += bs
        total = 0
        for j in range(k + 1):
            total += out[j]
            out[j] = total
        return out

    def num_blocks_held_rows(self, reqs: list[Request]) -> list[int]:
        """The blocks each request holds (0 for one without a block table), in order."""
        table = self._reqs
        out = [0] * len(reqs)
        for i in range(len(reqs)):
            st = table.get(reqs[i].request_id)
            if st is not None:
                out[i] = len(st.blocks)
        return out
