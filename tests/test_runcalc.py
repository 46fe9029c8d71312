"""A decode run's list arithmetic (sim/engine/runcalc.py, sim/cost/decode_price.py) against the numpy
formulas it replaced: the same values, to the bit, so runs and their outputs are unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.app.devices import DeviceGroup, SharedDeviceCost
from sim.cost.costmodel import ConstantCostModel, RooflineCostModel
from sim.cost.decode_price import price_decode_steps
from sim.cost.hardware import get_gpu
from sim.cost.models import get_model
from sim.engine.runcalc import (
    advance_clock,
    at_least,
    clock,
    finish_order,
    finishes_per_step,
    run_rows,
    start_breaks,
)
from sim.engine.step_store import CHECKPOINT_MASK, COUNT_COLUMNS, StepStore

rows_st = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 5000)), min_size=0, max_size=30)


@settings(max_examples=200, deadline=None)
@given(rows=rows_st, k=st.integers(1, 160))
def test_run_rows_are_the_bincount_sums(rows, k):
    last = np.array([r[0] for r in rows], dtype=np.int64)
    c = np.array([r[1] for r in rows], dtype=np.int64)
    capped = np.minimum(last, k)
    want_rows = np.bincount(capped, minlength=k + 1)[::-1].cumsum()[::-1][1:]
    ctx0 = np.bincount(capped, weights=c, minlength=k + 1)[::-1].cumsum()[::-1][1:]
    want_ctx = ctx0 + want_rows * np.arange(1, k + 1, dtype=np.int64)
    got_rows, got_ctx = run_rows(last.tolist(), c.tolist(), k)
    assert got_rows == want_rows.tolist()
    assert [float(x) for x in got_ctx] == want_ctx.tolist()


def test_run_rows_refuses_a_row_that_ends_before_the_run():
    with pytest.raises(ValueError, match="row 1 ends at step -1"):
        run_rows([3, -1], [10, 10], 4)


@settings(max_examples=200, deadline=None)
@given(start=st.floats(0, 1e6), durations=st.lists(st.floats(1e-6, 0.5), min_size=0, max_size=80),
       span=st.floats(0, 20), kmax=st.integers(0, 100))
def test_clock_adds_in_order_and_cuts_at_the_limit(start, durations, span, kmax):
    ends = np.cumsum(np.concatenate(([start], durations)))  # the engine's clock, one step at a time
    limit = start + span
    m = min(int(np.searchsorted(ends[:-1], limit, side="left")), kmax)
    got_starts, got_ends = clock(start, durations, limit, kmax)
    assert got_starts == ends[:-1][:m].tolist() and got_ends == ends[1:][:m].tolist()
    assert advance_clock(start, durations) == float(ends[-1])


@settings(max_examples=200, deadline=None)
@given(fin=st.lists(st.integers(1, 120), max_size=30), k=st.integers(1, 100))
def test_per_step_counts(fin, k):
    f = np.array(fin, dtype=np.int64)
    capped = np.minimum(f, k)
    at = np.bincount(capped, minlength=k + 1)[::-1].cumsum()[::-1]  # rows with min(fin, k) >= j
    assert at_least(fin, k) == [len(fin), *at[1:].tolist()] and at_least(fin, k)[k] == int((f >= k).sum())
    assert finishes_per_step(fin, k) == np.bincount(capped[f <= k], minlength=k + 1)[1:].tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1, 40), max_size=60), st.integers(0, 45))
def test_finish_order_is_the_stable_sort_by_step(fin, k):
    """The rows finishing in steps 1..k, by step then by row: what sorting their indices by step gives."""
    want = sorted((i for i, f in enumerate(fin) if 1 <= f <= k), key=fin.__getitem__)
    assert finish_order(fin, k) == want



@settings(max_examples=200, deadline=None)
@given(d=st.lists(st.floats(0.001, 1.0), min_size=1, max_size=40), gaps=st.sets(st.integers(0, 39)),
       n=st.sampled_from([0, 5, CHECKPOINT_MASK - 3, CHECKPOINT_MASK + 1]), cont=st.booleans())
def test_start_breaks_are_the_steps_that_do_not_follow_on(d, gaps, n, cont):
    du = np.array(d)
    st_ = np.cumsum(np.concatenate(([10.0], du)))[:-1]
    st_[[g for g in gaps if g < len(d)]] += 0.5  # an idle gap before these steps
    end = 10.0 if cont else 3.0
    kept = np.empty(len(st_), dtype=bool)  # the numpy rule it replaced
    kept[0] = st_[0] != end
    np.not_equal(st_[1:], st_[:-1] + du[:-1], out=kept[1:])
    kept[(-n) & CHECKPOINT_MASK :: CHECKPOINT_MASK + 1] = True
    assert start_breaks(end, st_.tolist(), du.tolist(), n, CHECKPOINT_MASK) == np.flatnonzero(kept).tolist()


def _roofline(gpu: str, **kw) -> RooflineCostModel:
    return RooflineCostModel(get_model("Llama-2-7B"), get_gpu(gpu), **kw)


@pytest.mark.parametrize("gpu,tp", [("H100", 1), ("A100-80GB", 2), ("RTX 4090", 1)])
def test_decode_step_list_is_decode_step_times_to_the_bit(gpu, tp):
    cm = _roofline(gpu, tensor_parallel_size=tp)
    rng = np.random.default_rng(7)
    rows = rng.integers(0, 600, 300)
    rows[:5] = [0, 1, 2, 3000, 4100]  # empty steps, and row counts beyond the tables (they grow)
    ctx = (rows * rng.integers(1, 4000, 300)).astype(np.int64)
    got = cm.decode_step_list(rows.tolist(), ctx.tolist())  # first: the list path grows the tables itself
    want = cm.decode_step_times(rows, ctx.astype(np.float64))
    assert got == want.tolist()
    for n, c, t in zip(rows.tolist()[5:40], ctx.tolist()[5:40], got[5:40], strict=True):
        assert t == float(cm.decode_step_times(n, np.array([float(c)]))[0])  # the scalar path too


def test_list_pricing_of_the_other_cost_models_and_plug_ins():
    const = ConstantCostModel(0.5, 0.01)
    assert const.decode_step_list([3, 0, 1], [0, 0, 0]) == const.decode_step_times(np.array([3, 0, 1]),
                                                                                   np.zeros(3)).tolist()
    group = DeviceGroup("card0", overlap=0.3)
    group.members = [0, 1]
    group.busy = {0: True, 1: True}
    shared = SharedDeviceCost(_roofline("H100"), group, 0)
    rows, ctx = [4, 4, 3], [400, 404, 303]
    want = shared.decode_step_times(np.array(rows), np.array(ctx, dtype=np.float64)).tolist()
    assert shared.decode_step_list(rows, ctx) == want and want[0] > shared.base.decode_step_list(rows, ctx)[0]

    class PlugIn:  # a plug-in cost model with only the protocol's array method
        def decode_step_times(self, num_decode, ctx_sums, num_logits=None):
            return 0.01 * np.asarray(num_decode) + 1e-6 * np.asarray(ctx_sums)

    assert price_decode_steps(PlugIn(), rows, ctx) == (0.01 * np.array(rows) + 1e-6 * np.array(ctx)).tolist()


N = len(COUNT_COLUMNS)


def test_extend_from_lists_widens_a_column_and_refuses_a_bad_one_before_it_moves():
    s = StepStore(10)
    counts: list = [0] * N
    counts[COUNT_COLUMNS.index("num_decode_tokens")] = [5, 300, 70_000]  # int8 -> int32 mid-list
    counts[COUNT_COLUMNS.index("num_free_blocks")] = [9, 8, 7]
    counts[COUNT_COLUMNS.index("num_waiting")] = np.int64(2)
    s.extend([0.0, 0.1, 0.2], [0.1, 0.1, 0.1], counts, usable_blocks=10)
    cols = s.columns()
    assert s.counts[COUNT_COLUMNS.index("num_decode_tokens")].typecode == "i"
    assert cols["num_decode_tokens"].tolist() == [5, 300, 70_000] and cols["num_waiting"].tolist() == [2, 2, 2]
    assert cols["start"].tolist() == [0.0, 0.1, 0.2] and cols["num_running"].tolist() == [0, 0, 0]
    bad = list(counts)
    bad[COUNT_COLUMNS.index("num_running")] = [1, 2.5, 3]
    s.extend([0.3, 0.4, 0.5], [0.1, 0.1, 0.1], bad, usable_blocks=10)
    with pytest.raises(TypeError, match=r"num_running: integer values expected, got 2\.5"):
        s.flush()
    # Refused before anything moved: the typed columns hold the first three steps only.
    assert s.stored == 3 and len(s.duration) == 3 and all(a is None or len(a) == 3 for a in s.counts)
    assert s.counts[COUNT_COLUMNS.index("num_decode_tokens")].tolist() == [5, 300, 70_000]


def test_a_run_priced_in_one_pass_equals_its_rows_priced_in_windows() -> None:
    """The pricer's one pass (``decode_run_times`` on ``finish_counts``) gives ``run_rows``' rows and the
    durations of every step priced at once cut after the first window end past the limit, bit for bit;
    and an engine's fast-forward prices a run alike through the pricer and through the lists it falls
    back to (a plug-in cost model, tables too small), each with its own window rule."""
    import simpy

    from policies.base import make_policy
    from sim.cost.decode_price import decode_run_times, decode_times
    from sim.engine.loop import Engine
    from sim.engine.recorder import Recorder
    from sim.engine.runcalc import finish_counts
    from sim.engine.sources import OpenSource
    from tests.helpers import limits

    tok = [0.0] + [1e-3 + 1e-5 * i for i in range(1, 80)]
    head = [0.0] + [2e-4 + 3e-7 * i for i in range(1, 80)]
    pad = [0, 1, 2, 4, 4, 8, 8, 8, 8] + [16] * 8 + [24] * 8 + [32] * 8
    params = (tok, head, pad, 4e-4, 1.5e-6, 32.0, 2e-5, 3.1e-9, 7e-8)

    def windows(rows: list[int], sums: list[int], start: float, limit: float) -> list[float]:
        """Every step priced at once, cut after the first window end (32, 96, 224, ... steps) whose clock
        has reached the limit."""
        every = decode_times(*params, rows, sums)
        ends = [advance_clock(start, every[:m]) for m in range(len(every) + 1)]
        size, end = 32, min(32, len(every))
        while end < len(every) and ends[end] < limit:
            size *= 2
            end = min(len(every), end + size)
        return every[:end]

    cost = _roofline("H100")
    eng = Engine(simpy.Environment(), make_policy("vllm", limits()), cost, OpenSource([]), Recorder(), None, True)
    ff = eng.ff
    assert ff.pricer is not None

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 9000)), min_size=1, max_size=60),
           st.integers(1, 200), st.floats(0.0, 50.0), st.floats(0.0, 100.0) | st.just(float("inf")))  # fmt: skip
    def check(rows_in: list[tuple[int, int]], k: int, start: float, span: float) -> None:
        last, computed = [f for f, _ in rows_in], [c for _, c in rows_in]
        rows, sums = run_rows(last, computed, k)
        got_rows, got = decode_run_times(*params, *finish_counts(last, computed, k), start, start + span)
        assert got_rows == rows
        assert got == windows(rows, sums, start, start + span)
        # the engine's two paths: the pricer's pass, and the lists priced by the cost model in windows
        one_pass = ff._run_prices(last, computed, k, start, start + span)
        assert one_pass == (rows, ff._price_until(rows, sums, start, start + span))

    check()
