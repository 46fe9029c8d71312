"""Parquet written a row group at a time (sim/app/parquet_out.py) reads back as what pandas' to_parquet
writes in one go: same schema, pandas metadata and values."""

from __future__ import annotations

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
