"""The recorder's compact step store (sim/engine/step_store.py): narrow counts that widen when a value
does not fit, all-zero columns that hold nothing, kv_usage derived from the free blocks; its frame
columns are the int64 / float64 a plain store would give, value for value."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.errors import ResultsIntegrityError
from sim.engine.step_store import COUNT_COLUMNS, StepStore

N = len(COUNT_COLUMNS)
FREE_I = COUNT_COLUMNS.index("num_free_blocks")


def _row(**over: int) -> list[int]:
    row = [0] * N
    for k, v in over.items():
        row[COUNT_COLUMNS.index(k)] = v
    return row


def _plain(rows: list[list[int]]) -> dict[str, np.ndarray]:
    return {c: np.array([r[i] for r in rows], dtype=np.int64) for i, c in enumerate(COUNT_COLUMNS)}


def test_counts_widen_and_zero_columns_stay_empty():
    usable = 100
    s = StepStore(usable)
    rows = [_row(num_free_blocks=usable, num_running=3), _row(num_free_blocks=40, num_prefill_tokens=40_000),
            _row(num_free_blocks=1, num_waiting=3_000_000_000), _row(num_free_blocks=2, num_swap_out_blocks=7,
                                                                      num_swapped_blocks=7),
            _row(num_free_blocks=3, num_decode_tokens=200)]  # fmt: skip
    for j, r in enumerate(rows):
        s.append(float(j), 0.5, r, 1.0 - r[COUNT_COLUMNS.index("num_free_blocks")] / usable)
    s.flush()  # the buffered steps into the typed columns
    typecodes = {c: (a.typecode if a is not None else None) for c, a in zip(COUNT_COLUMNS, s.counts, strict=True)}
    assert typecodes["num_prefill_tokens"] == "i" and typecodes["num_waiting"] == "q"
    assert typecodes["num_running"] == "b" and typecodes["num_swap_out_blocks"] == "b"
    assert typecodes["num_decode_tokens"] == "h"  # int8 widened once a value passed 127
    assert typecodes["num_swap_in_blocks"] is None and typecodes["num_cached_blocks"] is None
    assert s.kv_usage is None  # every step's usage was the derived one: nothing stored
    cols = s.columns()
    for c, want in _plain(rows).items():
        assert cols[c].dtype == np.int64 and np.array_equal(cols[c], want), c
    assert np.array_equal(cols["kv_usage"], [1.0 - r[COUNT_COLUMNS.index("num_free_blocks")] / usable for r in rows])
    assert list(cols) == ["start", "duration", *COUNT_COLUMNS[:6], "kv_usage", *COUNT_COLUMNS[6:]]


def test_kv_usage_is_stored_from_the_first_step_it_is_not_derived():
    s = StepStore(3)
    s.append(0.0, 1.0, _row(num_free_blocks=1), 1.0 - 1 / 3)
    s.append(1.0, 1.0, _row(num_free_blocks=1), 2 / 3)  # a slot engine's used / capacity: another rounding
    run = [0] * N
    run[COUNT_COLUMNS.index("num_free_blocks")] = np.array([3, 2])  # a decode run's kv_usage: derived from these
    s.extend(np.array([2.0, 3.0]), np.array([1.0, 1.0]), run, usable_blocks=4)
    assert s.kv_usage is not None
    assert s.columns()["kv_usage"].tolist() == [1.0 - 1 / 3, 2 / 3, 0.25, 0.5]


@pytest.mark.parametrize("last", ["step", "run"])
def test_kv_usage_first_stored_at_the_last_step_is_kept(last: str):
    """The first value that is not the derived one comes with the store's last step (or run): it and
    every value before it are in the column, as long as the other columns (it was left in the buffer,
    and the frame refused columns of unequal lengths: ollama, one request, at its finishing step)."""
    s = StepStore(3)
    s.append(0.0, 1.0, _row(num_free_blocks=1), 1.0 - 1 / 3)
    if last == "step":
        s.append(1.0, 1.0, _row(num_free_blocks=1), 2 / 3)
        want = [1.0 - 1 / 3, 2 / 3]
    else:
        run = [0] * N
        run[FREE_I] = np.array([3, 2])
        s.extend(np.array([1.0, 2.0]), np.array([1.0, 1.0]), run, usable_blocks=4)
        want = [1.0 - 1 / 3, 0.25, 0.5]
    cols = s.columns()
    assert {len(v) for v in cols.values()} == {len(want)}
    assert cols["kv_usage"].tolist() == want


def test_a_slot_engine_run_whose_last_step_rounds_kv_usage_otherwise_has_its_steps_table():
    """End to end (found by a randomised fast-forward check): ollama's kv_usage (used / capacity) differs
    from 1 - free / usable in the last bit first at the finishing step."""
    from sim.app.config import config_from_dict
    from sim.app.simulate import simulate

    raw = {"engine": {"preset": "ollama", "max_model_len": 512, "cost_model": "constant", "num_parallel": 3,
                      "num_ctx": 1024},
           "workload": {"num_requests": 1, "rate": 1.0, "prompt": {"dist": "uniform", "low": 1, "high": 13},
                        "output": {"dist": "uniform", "low": 1, "high": 2}},
           "simulation": {"seed": 0}}  # fmt: skip
    res = simulate(config_from_dict(raw))
    steps = res.steps
    assert len(steps) == 2 and steps["kv_usage"].notna().all()


def test_decode_runs_extend_from_arrays_and_constants():
    s = StepStore(10)
    counts: list = [0] * N
    counts[COUNT_COLUMNS.index("num_decode_tokens")] = np.array([5, 70_000], dtype=np.int64)
    counts[COUNT_COLUMNS.index("num_free_blocks")] = np.array([9, 8])
    counts[COUNT_COLUMNS.index("num_waiting")] = 2
    s.extend(np.array([0.0, 0.1]), np.array([0.1, 0.1]), counts, usable_blocks=10)
    s.append(0.2, 0.1, _row(num_free_blocks=8, num_decode_tokens=1), 1.0 - 8 / 10)
    cols = s.columns(release=True)
    assert cols["num_decode_tokens"].tolist() == [5, 70_000, 1] and cols["num_waiting"].tolist() == [2, 2, 0]
    assert cols["start"].tolist() == [0.0, 0.1, 0.2] and len(s) == 0  # released: the store starts over
    bad = [0] * N
    bad[COUNT_COLUMNS.index("num_running")] = np.array([1.5])
    s.extend(np.array([0.0]), np.array([0.1]), bad, usable_blocks=10)
    with pytest.raises(TypeError, match="num_running: integer values expected, got 1.5"):
        s.columns()  # refused when the buffer goes into the typed columns


def test_a_count_beyond_int64_is_refused_by_name():
    s = StepStore(10)
    s.append(0.0, 1.0, _row(num_free_blocks=10, num_running=2**63), 0.0)
    with pytest.raises(ResultsIntegrityError, match=f"num_running: value {2**63} does not fit in int64"):
        s.column("num_running")


def _recorders(seed: int) -> list:
    """Two replicas' recorders: one deriving kv_usage, one storing it; a count past int16 in one."""
    from sim.engine.recorder import Recorder

    rng = np.random.default_rng(seed)
    out = []
    for replica, (usable, n) in enumerate(((100, 700), (0, 500))):
        rec = Recorder(replica=replica)
        if usable:
            rec.set_usable_blocks(usable)
        for j in range(n):
            free = int(rng.integers(0, 100))
            row = _row(num_free_blocks=free, num_running=int(rng.integers(0, 9)),
                       num_decode_tokens=int(rng.integers(0, 9)),
                       num_prefill_tokens=int(rng.integers(0, 3)) * (40_000 if j == 321 else 5))  # fmt: skip
            rec.steps.append(j * 0.25, float(rng.random()), row, 1.0 - free / 100 if usable else float(rng.random()))
        out.append(rec)
    return out


def test_step_table_slices_and_columns_are_the_whole_frame():
    """A StepTable's slices (crossing the replicas' boundary) and narrow columns have the values and
    dtypes of the frame Recorder.steps_frame gives, concatenated."""
    import pandas as pd

    from sim.engine.recorder import FRAME_COLUMNS, StepTable

    whole = StepTable(_recorders(1)).whole()
    assert list(whole.columns) == list(FRAME_COLUMNS) and len(whole) == 1200
    table = StepTable(_recorders(1))
    parts = [table.frame(i, i + 333) for i in range(0, len(table), 333)]
    got = pd.concat(parts, ignore_index=True)
    pd.testing.assert_frame_equal(got, whole, check_exact=True)
    cols = table.columns(FRAME_COLUMNS)
    for c in FRAME_COLUMNS:
        np.testing.assert_array_equal(cols[c], whole[c].to_numpy(), err_msg=c)
    assert cols["num_running"].dtype == np.int8  # narrow as stored: only the frame widens
    assert len(table.columns(["kv_usage"], 1000, 1000)["kv_usage"]) == 0


@pytest.mark.parametrize("idle", [0.0, 0.05, 0.9])
def test_starts_are_rebuilt_exactly_where_steps_follow_each_other(idle: float, monkeypatch) -> None:
    """Starts stored only after idle time and at checkpoints (every 8 steps here), the rest rebuilt by
    the clock's additions: every slice equals the starts given, steps one by one or as decode runs; an
    engine idle before most steps (0.9) switches to storing every start."""
    import sim.engine.step_store as ss

    monkeypatch.setattr(ss, "CHECKPOINT_MASK", 7)
    monkeypatch.setattr(ss, "DENSE", 4)
    rng = np.random.default_rng(int(idle * 100))
    s, given, t = StepStore(100), [], 0  # the clock starts as the int 0, as SimPy's does
    while len(given) < 3000:
        if rng.random() < idle:
            t = t + float(rng.random()) * 3  # idle until the next arrival
        if rng.random() < 0.3:  # a decode run: its starts as sim/engine/fastforward.py step_times adds them
            k = int(rng.integers(1, 40))
            d = rng.random(k) * 0.03
            starts = np.cumsum(np.concatenate(([t], d)))[:-1]
            s.extend(starts, d, [0, np.ones(k, dtype=np.int64), 1, 0, 0, 0, np.full(k, 5), 0, 0, 0, 0], 100)
            given += starts.tolist()
            t = float(starts[-1] + d[-1])
        else:
            d1 = float(rng.random()) * 0.03
            s.append(t, d1, _row(num_free_blocks=5), 0.95)
            given.append(float(t))
            t = t + d1
    assert (s.start is not None) == (idle == 0.9)
    want = np.array(given)
    np.testing.assert_array_equal(s.column("start"), want)
    for lo, hi in ((0, 1), (5, 6), (7, 9), (1000, 2999), (2999, 4000), (13, 13)):
        np.testing.assert_array_equal(s.column("start", lo, hi), want[lo:hi])
    np.testing.assert_array_equal(s.columns()["start"], want)
    assert s.end_time() == float((want + s.column("duration")).max())
    s.hold_starts()  # the writers' cache: the same slices, and a step added after it is not missed
    assert (s._held is None) == (idle == 0.9) and (s._held is None or len(s._held) == len(want))
    for lo, hi in ((0, 1), (7, 9), (2999, 4000), (13, 13), (0, 3000)):
        np.testing.assert_array_equal(s.column("start", lo, hi), want[lo:hi])
    frame_start = s.columns()["start"]  # the frame's own copy, writable
    frame_start[0] = -1.0
    np.testing.assert_array_equal(s.column("start", 0, 1), want[:1])
    s.append(t + 1.0, 0.01, _row(num_free_blocks=5), 0.95)
    np.testing.assert_array_equal(s.column("start")[-2:], [want[-1], t + 1.0])
    s.drop_starts()
    assert s._held is None


@pytest.mark.parametrize("seed", range(4))
def test_buffered_steps_of_every_shape_land_as_given_across_flushes(seed: int, monkeypatch) -> None:
    """Steps and decode runs whose counts are lists, one int for the run, numpy arrays or numpy ints,
    negative or past int32, some columns one value throughout a flush and others not: the typed
    columns (bounded and packed in one compiled pass, or through int64) hold every value as given."""
    import sim.engine.step_store as ss

    monkeypatch.setattr(ss, "FLUSH", 64)
    rng = np.random.default_rng(seed)
    s, want = StepStore(100), []
    t = 0.0
    const_col = int(rng.integers(0, N))  # this one is a single value for whole flushes at a time
    while len(want) < 700:
        k = int(rng.integers(1, 30))
        counts: list = []
        for i in range(N):
            shape = rng.integers(0, 5)
            if i == const_col:
                v: object = 3 if len(want) < 300 else -(2**40)
            elif shape == 0:
                v = int(rng.integers(-5, 5)) * (10 ** int(rng.integers(0, 12)))
            elif shape == 1:
                v = [int(x) for x in rng.integers(-200, 200_000, k)]
            elif shape == 2:
                v = rng.integers(0, 300, k)
            elif shape == 3:
                v = [np.int64(x) for x in rng.integers(0, 9, k)]
            else:
                v = 0
            counts.append(v)
        if rng.random() < 0.3 and k == 1 or rng.random() < 0.1:
            row = [int(c if np.ndim(c) == 0 else c[0]) for c in counts]
            s.append(t, 0.01, row, 1.0 - row[FREE_I] / 100)
            want.append(row)
            t += 0.01
        else:
            s.extend([t + 0.01 * j for j in range(k)], [0.01] * k, counts, 100)
            want += [[int(c) if np.ndim(c) == 0 else int(c[j]) for c in counts] for j in range(k)]
            t += 0.01 * k
    cols = s.columns()
    for i, c in enumerate(COUNT_COLUMNS):
        assert cols[c].tolist() == [r[i] for r in want], c


def test_a_run_with_too_few_values_in_a_column_is_refused_by_name():
    s = StepStore(10)
    counts: list = [0] * N
    counts[COUNT_COLUMNS.index("num_running")] = [1, 2]  # a run of 3 steps
    s.extend([0.0, 0.1, 0.2], [0.1, 0.1, 0.1], counts, 10)
    with pytest.raises(ResultsIntegrityError, match="step column num_running: 2 values for 3 steps"):
        s.column("num_running")
