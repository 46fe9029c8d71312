"""Tables written to Parquet a row group at a time, so a big run's output never holds a second copy of
the whole table (pandas' ``to_parquet`` converts all of it to Arrow first; the per-request metrics
would be a third copy). The file reads back to the same frame as ``to_parquet`` writes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROWS_PER_GROUP = 1 << 17  # ~20 MB of Arrow per group for the step table
PROBE_ROWS = 1 << 14  # rows _few_values counts distinct values in


def write_parquet(frame: pd.DataFrame, path: str | Path,
                  transform: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
                  rows_per_group: int = ROWS_PER_GROUP) -> None:  # fmt: skip
    """``transform(frame)`` (a row-wise function: each slice is transformed alone) to ``path``, without
    the index. A frame with an object column is written in one go: Arrow infers such a column's type
    from its values, so slices could disagree."""
    if len(frame) <= rows_per_group or any(pd.api.types.is_object_dtype(t) for t in frame.dtypes):
        table = pa.Table.from_pandas(frame if transform is None else transform(frame), preserve_index=False)
        pq.write_table(table, path, compression="snappy", use_dictionary=_few_values(table))
        return
    parts = (frame.iloc[i : i + rows_per_group] for i in range(0, len(frame), rows_per_group))
    write_parquet_slices(parts if transform is None else map(transform, parts), path)


def write_parquet_slices(parts: Iterable[pd.DataFrame | Mapping[str, np.ndarray]], path: str | Path) -> None:
    """A table given as consecutive slices of more than one row group in all, made one at a time (a big
    run's step table is never whole), each a row group: the file ``write_parquet`` writes of the whole
    frame. A slice may be a frame or its columns ({name: array}, in order: after the first, which gives
    the schema pandas would write, they go to Arrow as they are, without a frame's consolidation copy).
    No object columns (Arrow would infer their type per slice)."""
    writer: pq.ParquetWriter | None = None
    try:
        for part in parts:
            if writer is not None and not isinstance(part, pd.DataFrame):
                table = pa.Table.from_arrays([part[name] for name in writer.schema.names], schema=writer.schema)
            else:
                frame = part if isinstance(part, pd.DataFrame) else pd.DataFrame(part, copy=False)
                table = pa.Table.from_pandas(frame, preserve_index=False,
                                             schema=None if writer is None else writer.schema)  # fmt: skip
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="snappy",
                                          use_dictionary=_few_values(table))  # fmt: skip
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def _few_values(table: pa.Table) -> list[str]:
    """The columns worth dictionary-encoding: fewer distinct values than a quarter of the rows among the
    first PROBE_ROWS of the (first) row group. Arrow hashes every value of a dictionary column until the dictionary outgrows its
    page and falls back to plain; a step table's step, start and duration columns and a request table's
    ids and times never fit, and leaving them plain halves the step table's write (100k requests, 2.2M
    steps: 0.82-1.29 s -> 0.55-0.68 s, 60.4 -> 54.4 MB)."""
    head = table.slice(0, PROBE_ROWS)  # judged on a head: counting distinct values costs what it saves
    rows = max(head.num_rows, 1)
    return [name for name, col in zip(head.column_names, head.columns, strict=True)
            if pa.types.is_null(col.type)  # an all-null column (an empty table's): one value; no kernel counts it
            or pc.count_distinct(col, mode="all").as_py() * 4 < rows]  # fmt: skip
