"""A decode run's arithmetic in plain lists, compiled by mypyc (sim/native.py): the rows and context of
each step, the clock over the steps, and the per-step counts the recorder keeps.

A run is typically tens of steps over tens of rows, where numpy's fixed cost per call (a microsecond
or more, ~85 calls per run) was most of the run's price; these loops cost a fraction of that. Every
float is summed in the order the engine's clock adds step by step (((start + d0) + d1) + ...), so a
run's boundaries are those of stepping, to the bit. A list item is incremented as ``a[i] = a[i] + x``:
mypyc compiles ``a[i] += x`` on a list item as a generic ``PyNumber_InPlaceAdd``.
"""

from __future__ import annotations

from typing import Any


def finish_counts(last: list[int], computed: list[int], k: int) -> tuple[list[int], list[int]]:
    """Row i takes a token in steps 1..last[i] (capped at k): for each last step f = 0..k, how many rows
    end there and their computed tokens before the run (what ``run_rows`` and the pricer's one-pass
    ``decode_run`` build a run's steps from)."""
    count = [0] * (k + 1)
    ctx = [0] * (k + 1)
    for i in range(len(last)):
        f = last[i]
        if f > k:
            f = k
        if f < 0:
            raise ValueError(f"run_rows: row {i} ends at step {f}")
        count[f] = count[f] + 1
        ctx[f] = ctx[f] + computed[i]
    return count, ctx


def run_rows(last: list[int], computed: list[int], k: int) -> tuple[list[int], list[int]]:
    """Rows and their total context in steps 1..k: row i takes a token in steps 1..last[i] (capped at
    k) at context ``computed[i] + j`` in step j. Returns (rows per step, Σ context per step)."""
    count, ctx = finish_counts(last, computed, k)
    rows = [0] * k
    sums = [0] * k
    n = 0
    s = 0
    for j in range(k, 0, -1):
        n += count[j]
        s += ctx[j]
        rows[j - 1] = n
        sums[j - 1] = s + n * j
    return rows, sums


def clock(start: float, durations: list[float], limit: float, k: int) -> tuple[list[float], list[float]]:
    """(starts, ends) of consecutive steps from ``start``, with the engine's additions one step at a
    time, of the first steps (at most ``k``) that start before ``limit``."""
    # A step's end is the next one's start: one float object for both (typed ``object``, a float is boxed
    # once; a ``float`` local would be boxed anew for each list).
    starts: list[Any] = []
    ends: list[Any] = []
    t = start
    tb: object = t
    m = len(durations) if len(durations) < k else k
    for j in range(m):
        if t >= limit:
            break
        starts.append(tb)
        t = t + durations[j]
        tb = t
        ends.append(tb)
    return starts, ends


def advance_clock(t: float, durations: list[float]) -> float:
    """``t`` plus each duration in turn (the clock at the end of these steps)."""
    for d in durations:
        t = t + d
    return t


def at_least(fin: list[int], k: int) -> list[int]:
    """out[j] for j = 0..k: the rows whose last step ``fin`` (1-based) is j or later."""
    out = [0] * (k + 1)
    for f in fin:
        j = f if f < k else k
        out[j] = out[j] + 1
    for j in range(k - 1, -1, -1):
        out[j] = out[j] + out[j + 1]
    return out


def finishes_per_step(fin: list[int], k: int) -> list[int]:
    """out[j]: the rows whose last step (1-based ``fin``) is step j + 1 of a run of k steps."""
    out = [0] * k
    for f in fin:
        if 1 <= f <= k:
            out[f - 1] = out[f - 1] + 1
    return out


def start_breaks(end: float, starts: list[float], durations: list[float], n: int, mask: int) -> list[int]:
    """The steps (0-based in the run) whose start must be stored: where a step does not begin at the
    previous step's end (``end`` before the first), and every checkpoint ((n + j) & mask == 0) of a
    store that already holds n steps."""
    out: list[int] = []
    prev = end
    for j in range(len(starts)):
        s = starts[j]
        if s != prev or not (n + j) & mask:
            out.append(j)
        prev = s + durations[j]
    return out


def segment_free(free0: int, cum: list[int], a: int, b: int, cached0: int,
               free_out: list[Any], cached_out: list[Any]) -> None:
    """Free blocks after each step a+1..b of a segment that began with ``free0`` free (``cum``: the run's
    cumulative allocations), and the cached-free ones (uncached free blocks are taken first)."""
    # Consecutive steps often leave the same count (a row takes a block every block_size steps): a count
    # is boxed once and the object reused while it repeats (typed ``object``; an ``int`` is boxed per store).
    base = cum[a]
    prev = 0
    fb: object = None
    cb: object = cached0
    cached_b: object = cb
    for j in range(a, b):
        f = free0 - (cum[j + 1] - base)
        if j == a or f != prev:
            prev = f
            fb = f
            cb = fb if f < cached0 else cached_b
        free_out[j] = fb
        cached_out[j] = cb


def finish_order(fin: list[int], k: int) -> list[int]:
    """The rows that finish within steps 1..k (row i with its last token in step ``fin[i]``), by step
    and then by row: the order the engine applies them. Few rows finish within a run's first steps, so
    they are picked out in one pass and sorted on one int key each (step, then row), not counted into
    a k-long table."""
    n = len(fin)
    keys: list[int] = []
    for i in range(n):
        f = fin[i]
        if 1 <= f <= k:
            keys.append(f * n + i)
    keys.sort()
    return [key % n for key in keys]


def column_bounds(pending: list, ncols: int) -> list[tuple[int, int, int] | None]:
    """Per column of the step store's buffer (the entries ``buffered_columns`` reads): (lowest, highest,
    number of values) when every value is a Python int, else None (a numpy integer from a plug-in, or a
    bad value, which packing then names). A run's single value counts once for its k steps, so a
    column that holds one value throughout costs nothing per step."""
    out: list[tuple[int, int, int] | None] = []
    for i in range(ncols):
        lo = 0
        hi = 0
        cnt = 0
        ok = True
        for e in pending:
            k = 1
            if not isinstance(e, tuple):  # a list (a caller's own); the recorder's entries are tuples
                v: object = e[i] if len(e) != 2 else e[1][i]
                k = 1 if len(e) != 2 else e[0]
            elif len(e) != 2:
                v = e[i]
            else:
                k = e[0]
                v = e[1][i]
            if isinstance(v, int):
                x: int = v
                if not cnt:
                    lo = x
                    hi = x
                elif x < lo:
                    lo = x
                elif x > hi:
                    hi = x
                cnt += k
            elif isinstance(v, list):  # the update above, unrolled: a one-item list per value costs 2.6x
                for y in v:
                    if not isinstance(y, int):
                        ok = False
                        break
                    z: int = y
                    if not cnt:
                        lo = z
                        hi = z
                    elif z < lo:
                        lo = z
                    elif z > hi:
                        hi = z
                    cnt += 1
            else:
                ok = False
            if not ok:
                break
        out.append((lo, hi, cnt) if ok else None)
    return out


def buffered_columns(pending: list, ncols: int, skip: list[bool] | None = None) -> list[list]:
    """The step store's buffer (sim/engine/step_store.py) as one list per column, in step order: an
    entry of ``ncols`` values is one step's counts, an entry (k, counts) a run of k steps whose counts
    are each a list of k values or one value for all k (an int; a numpy integer from a plug-in). The
    values are not checked here: packing them into int64 does that, naming the column. A column with
    ``skip[i]`` (one value throughout, known from ``column_bounds``) is left empty."""
    cols: list[list] = [[] for _ in range(ncols)]
    take = [skip is None or not skip[i] for i in range(ncols)]
    for e in pending:
        if len(e) != 2:
            for i in range(ncols):
                if take[i]:
                    cols[i].append(e[i])
            continue
        k: int = e[0]
        counts = e[1]
        for i in range(ncols):
            if not take[i]:
                continue
            v = counts[i]
            if isinstance(v, int) or not hasattr(v, "__len__"):
                cols[i].extend([v] * k)
            else:
                cols[i].extend(v)
    return cols
