"""Parquet written a row group at a time (sim/app/parquet_out.py) reads back as what pandas' to_parquet
writes in one go: same schema, pandas metadata and values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from sim.app.parquet_out import write_parquet
from sim.app.results import request_metrics, steps_table
from tests.test_outputs_unchanged import CASES


def _same_file(a, b) -> None:
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.equals(tb, check_metadata=True) and ta.schema.metadata == tb.schema.metadata
    pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b))


def test_row_groups_read_back_as_one_write(tmp_path):
    res = CASES["cluster_pools"]()  # replica names and pools: string columns beside the numbers
    req, steps = res.requests, steps_table(res.steps)
    assert len(req) > 200 and len(steps) > 200
    request_metrics(req).to_parquet(tmp_path / "r1.parquet", index=False)
    write_parquet(req, tmp_path / "r2.parquet", request_metrics, rows_per_group=64)
    steps.to_parquet(tmp_path / "s1.parquet", index=False)
    write_parquet(steps, tmp_path / "s2.parquet", rows_per_group=100)
    assert pq.ParquetFile(tmp_path / "s2.parquet").num_row_groups == -(-len(steps) // 100)
    _same_file(tmp_path / "r1.parquet", tmp_path / "r2.parquet")
    _same_file(tmp_path / "s1.parquet", tmp_path / "s2.parquet")


def test_an_object_column_is_written_in_one_go(tmp_path):
    df = pd.DataFrame({"a": [None] * 5 + ["x"] * 5, "b": range(10)}).astype({"a": object})
    write_parquet(df, tmp_path / "o.parquet", rows_per_group=5)  # the first slice alone: a null column
    assert pq.ParquetFile(tmp_path / "o.parquet").num_row_groups == 1
    df.to_parquet(tmp_path / "p.parquet", index=False)
    _same_file(tmp_path / "p.parquet", tmp_path / "o.parquet")


def test_steps_are_written_from_the_stores_without_the_frame(tmp_path, monkeypatch):
    """A result's summary, steps.parquet, steps.jsonl and time series are made from the step stores'
    narrow columns (the frame is never built), and are byte for byte what the built frame gives."""
    import sim.app.outputs as outputs
    from sim.app.outputs import write_outputs
    from sim.app.results import summarize
    from sim.engine.recorder import StepTable

    monkeypatch.setattr(outputs, "ROWS_PER_GROUP", 100)  # several row groups
    lazy, built = CASES["quickstart"](), CASES["quickstart"]()  # one engine (a cluster report builds the frame)
    frame = built.steps  # builds it: every reader below then takes the frame
    assert isinstance(lazy.__dict__["_steps"], StepTable) and lazy.num_steps == len(frame) > 300
    s_lazy, s_built = summarize(lazy), summarize(built)
    for s in (s_lazy, s_built):
        s["meta"].pop("wall_time_s")
    assert s_lazy == s_built
    a = write_outputs(lazy, tmp_path / "a", summary=s_lazy, step_trace=True)
    b = write_outputs(built, tmp_path / "b", summary=s_built, step_trace=True)
    assert isinstance(lazy.__dict__["_steps"], StepTable)  # still not built
    for key in ("steps", "step_trace", "timeseries"):
        assert a[key].read_bytes() == b[key].read_bytes(), key
    assert pq.ParquetFile(a["steps"]).num_row_groups == -(-len(frame) // 100)
    # the slices after the first go to Arrow as arrays: the file is still what pandas writes in one go
    steps_table(frame).to_parquet(tmp_path / "one.parquet", index=False)
    _same_file(tmp_path / "one.parquet", a["steps"])
    pd.testing.assert_frame_equal(lazy.steps, frame)


def test_only_columns_with_few_values_are_dictionary_encoded(tmp_path):
    """A column of distinct values (a step number, a start time, a request id) is written plain, one that
    repeats (a count, a replica, a status) with a dictionary, sliced or in one go; the file reads back
    the same either way."""
    import numpy as np

    n = 4000
    frame = pd.DataFrame({"step": np.arange(n), "start": np.arange(n) * 0.013, "num_running": np.arange(n) % 7,
                          "replica": np.zeros(n, dtype=np.int64)})  # fmt: skip
    write_parquet(frame, tmp_path / "s.parquet", rows_per_group=1000)
    meta = pq.ParquetFile(tmp_path / "s.parquet").metadata.row_group(0)
    dictionary = {meta.column(i).path_in_schema: meta.column(i).has_dictionary_page for i in range(meta.num_columns)}
    assert dictionary == {"step": False, "start": False, "num_running": True, "replica": True}
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "s.parquet"), frame)
    # a frame with string columns is written in one go, by the same rule
    frame["request_id"] = [f"r{i}" for i in range(n)]
    frame["status"] = np.where(np.arange(n) % 3 == 0, "finished", "timed_out")
    write_parquet(frame, tmp_path / "r.parquet")
    meta = pq.ParquetFile(tmp_path / "r.parquet").metadata.row_group(0)
    dictionary = {meta.column(i).path_in_schema: meta.column(i).has_dictionary_page for i in range(meta.num_columns)}
    assert dictionary == {"step": False, "start": False, "num_running": True, "replica": True,
                          "request_id": False, "status": True}  # fmt: skip
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "r.parquet"), frame)


def test_the_step_table_written_beside_the_rest_reports_its_error(tmp_path, monkeypatch):
    """A big run's steps.parquet is written on a second thread while the report and time series are made;
    a failure there is raised by write_outputs (after the other files), not lost with the thread; a small
    run's is written first, on the calling thread, and fails there."""
    import pytest

    import sim.app.outputs as outputs
    from sim.app.outputs import write_outputs

    def broken(*args, **kwargs):
        raise OSError("disk full")

    for rows in (1 << 30, 100):  # the frame in one go / row groups from the stores
        monkeypatch.setattr(outputs, "ROWS_PER_GROUP", rows)
        monkeypatch.setattr(outputs, "write_parquet_slices", broken)
        monkeypatch.setattr(outputs, "write_parquet", lambda frame, path, *a, **k: broken()
                            if path.name == "steps.parquet" else frame.to_parquet(path))  # fmt: skip
        with pytest.raises(OSError, match="disk full"):
            write_outputs(CASES["quickstart"](), tmp_path / str(rows), step_trace=False)
        # on the second thread the rest was written meanwhile; on the calling thread nothing after it
        assert (tmp_path / str(rows) / "report.html").exists() == (rows == 100)


def test_the_report_draws_throughput_from_the_series_it_is_handed():
    """write_outputs hands the report timeseries.csv's 1 s series (computed once): the timeline is the one
    the report draws computing it itself, and the series handed is the one drawn."""
    from sim.app.report import fig_timeline
    from sim.app.timeseries import time_series

    res = CASES["quickstart"]()
    series = time_series(res)
    assert fig_timeline(res).to_json() == fig_timeline(res, series=series).to_json()
    doctored = series.assign(gen_throughput=series["gen_throughput"] + 1.0)
    drawn = {t.name: t for t in fig_timeline(res, series=doctored).data}
    assert drawn["generation tok/s"].y[0] == np.float32(doctored["gen_throughput"].iloc[0])


def test_the_step_stores_are_only_read_while_the_writers_run():
    """Before steps.parquet's thread starts, every store's buffered steps are in its columns (a reader's
    flush would otherwise change a store under the other thread): a store that keeps every start (an
    often idle engine's) holds none of them, so holding its starts does not flush it."""
    from types import SimpleNamespace

    from sim.app.outputs import starts_held
    from sim.engine.recorder import Recorder, StepTable
    from sim.engine.step_store import COUNT_COLUMNS

    rec = Recorder()
    store = rec.steps
    for i in range(1200):  # idle between every two steps: each start stored, then every start (dense)
        store.append(2.0 * i, 1.0, [0] * len(COUNT_COLUMNS), 0.5)
    assert store.start is not None and len(store._dur) > 0
    with starts_held(SimpleNamespace(_steps=StepTable([rec]))):
        assert not len(store._dur)
