"""Result rows as columns (sim/engine/request_log.py): the frame is what pandas makes of the Python values
(the code before the log: a list per column), dtypes included, and an engine that drops its finished
requests gives the rows in arrival order."""

from __future__ import annotations

import pandas as pd

from sim.core.request import Request, RequestSpec, Status
from sim.engine.request_log import REQUEST_COLUMNS, RequestLog, requests_frame


def _reference(rows: list[tuple[Request, int, str]]) -> pd.DataFrame:
    """The frame as it was built before: one Python list per column."""
    nan = float("nan")
    data = {c: [] for c in REQUEST_COLUMNS}
    for req, replica, status in rows:
        for c in REQUEST_COLUMNS:
            v = replica if c == "replica" else status if c == "status" else getattr(req, c)
            data[c].append(nan if v is None and c.endswith("_time") else v)
    df = pd.DataFrame(data)
    for c in ("prompt_len", "output_len", "num_output_tokens", "num_cached_tokens", "num_preemptions"):
        df[c] = df[c].astype("int64")
    return df


def _req(i: int, **fields) -> Request:
    r = Request(RequestSpec(f"r{i}", arrival_time=fields.pop("arrival_time", 0.5 * i), prompt_len=10, output_len=5))
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def test_frame_has_the_dtypes_of_the_python_values():
    cases = [
        [(_req(0, queued_time=0, status=Status.FINISHED, finish_time=1.5, finish_reason="length"), 0, "finished"),
         (_req(1, queued_time=0), 2, "in_flight")],  # every queued_time the int 0: int64 as before
        [(_req(0, arrival_time=0, queued_time=0.25), 0, "in_flight"), (_req(1, priority=2**70), -1, "rejected")],
        [],
    ]  # fmt: skip
    for rows in cases:
        half = len(rows) // 2
        got = requests_frame([RequestLog.of(rows[:half]), RequestLog(), RequestLog.of(rows[half:])])
        pd.testing.assert_frame_equal(got, _reference(rows))
    assert str(requests_frame([RequestLog.of(cases[0])])["queued_time"].dtype) == "int64"
    assert str(requests_frame([RequestLog.of(cases[1])])["priority"].dtype) == "object"  # beyond int64


def test_rows_buffered_across_flushes_give_the_frame_of_the_python_values(monkeypatch):
    """Rows go into the columns FLUSH at a time: a column that turns into a list (beyond int64, a numpy
    integer), a float time after int ones and a missing time, each in a later batch, read as before."""
    import numpy as np

    from sim.engine import request_log

    monkeypatch.setattr(request_log, "FLUSH", 3)
    rows = [(_req(i, queued_time=0, finish_time=None if i == 4 else 2.0 + i), i % 2, "finished") for i in range(5)]
    rows += [(_req(5, queued_time=0.5, priority=2**70), 1, "finished"),
             (_req(6, num_cached_tokens=7), np.int64(0), "in_flight"),
             (_req(7), 0, "in_flight")]  # fmt: skip
    log = RequestLog.of(rows)
    assert len(log) == len(rows) and 0 < len(log._rows) < 3  # the last rows still buffered
    got = requests_frame([log])
    pd.testing.assert_frame_equal(got, _reference(rows))
    assert [str(got[c].dtype) for c in ("queued_time", "priority", "replica")] == ["float64", "object", "int64"]
    only_ints = RequestLog.of(rows[:5])
    assert str(requests_frame([only_ints])["queued_time"].dtype) == "int64"


def test_sorted_restores_key_order_and_empties_the_log():
    log = RequestLog()
    for key in (3, 0, 2, 1):
        log.add(_req(key, queued_time=0.1 * key), 0, "finished", key)
    out = log.sorted()
    assert len(log) == 0 and out.request_id == ["r0", "r1", "r2", "r3"]
    assert requests_frame([out])["queued_time"].tolist() == [0.0, 0.1, 0.2, 0.1 * 3]


def test_an_engine_that_drops_finished_requests_gives_the_same_rows(monkeypatch):
    import simpy

    from policies.base import make_policy
    from sim.app.collect import engine_rows
    from sim.cost.costmodel import ConstantCostModel
    from sim.engine import loop
    from sim.engine.recorder import Recorder
    from sim.engine.sources import OpenSource
    from tests.helpers import limits

    monkeypatch.setattr(loop, "SWEEP_MIN", 4)
    # bursts of arrivals with long gaps between: the bursts before the last have finished by the next
    specs = [RequestSpec(f"q{i}", arrival_time=20.0 * (i // 10) + 0.01 * (9 - i % 10), prompt_len=30 + i,
                         output_len=3 + i % 7) for i in range(60)]  # fmt: skip

    def run(keep: bool) -> tuple[loop.Engine, int]:
        env = simpy.Environment()
        eng = loop.Engine(env, make_policy("vllm", limits(max_num_seqs=4)), ConstantCostModel(step_s=0.1),
                          OpenSource(specs), Recorder(), keep_requests=keep)  # fmt: skip
        env.run()
        return eng, len(eng.requests)

    (kept, n_kept), (dropped, n_held) = run(True), run(False)
    assert n_kept == 60 and n_held < 20 and len(dropped.log) > 40  # the finished ones left as rows
    assert dropped.num_finished() == kept.num_finished() == 60
    pd.testing.assert_frame_equal(requests_frame([engine_rows(dropped, 0)]), requests_frame([engine_rows(kept, 0)]))
    assert not dropped.requests and len(kept.requests) == 60  # drained / kept
