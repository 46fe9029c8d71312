"""A run's files: requests.parquet, steps.parquet, steps.jsonl, summary.json, timeseries.csv and
report.html, written from a SimResult (sim/app/results.py) a slice at a time where the run is big."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sim.app.parquet_out import ROWS_PER_GROUP, write_parquet, write_parquet_slices
from sim.app.plotlyjs import as_plotlyjs
from sim.app.report import write_report
from sim.app.results import SimResult, request_metrics, steps_arrays, steps_table, summarize, to_jsonable
from sim.app.step_trace import write_step_trace
from sim.app.timeseries import time_series
from sim.engine.recorder import StepTable


def write_outputs(result: SimResult, out_dir: str | Path, slo: Mapping[str, float] | None = None, *,
                  summary: dict | None = None, title: str = "servesim run", plotlyjs: Any = None,
                  step_trace: bool = True) -> dict[str, Path]:  # fmt: skip
    """Write requests.parquet, steps.parquet, steps.jsonl, summary.json, timeseries.csv, report.html.

    ``plotlyjs`` (sim.app.plotlyjs.PlotlyJS or its mode): how report.html loads plotly.js; by default one
    plotly.min.js in ``out_dir``. ``step_trace=False`` leaves out steps.jsonl (the demo: steps.parquet
    holds the same counts)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if summary is None:
        summary = summarize(result, slo)
    paths = {
        "requests": out / "requests.parquet",
        "steps": out / "steps.parquet",
        "step_trace": out / "steps.jsonl",
        "summary": out / "summary.json",
        "timeseries": out / "timeseries.csv",
        "report": out / "report.html",
    }
    # every pass below reads the steps' starts. A big run's step table is written on a second thread,
    # beside the rest, from its stores (only read from now on: the frame is never built): Arrow encodes
    # and compresses it without the GIL (a million-request run: ~22M rows, ~5 s). A small one, or one
    # whose frame is built already, is written here first: no pandas object is read by two threads.
    with starts_held(result), ThreadPoolExecutor(1, thread_name_prefix="servesim-steps") as pool:
        steps = None
        slices = (steps_arrays(p) for p in result.step_array_slices(ROWS_PER_GROUP))  # a row group at a time
        if result.num_steps <= ROWS_PER_GROUP:
            write_parquet(steps_table(result.steps), paths["steps"])  # builds the frame, empties the stores
        elif isinstance(result.__dict__["_steps"], StepTable):
            steps = pool.submit(write_parquet_slices, slices, paths["steps"])
        else:
            write_parquet_slices(slices, paths["steps"])
        write_parquet(result.requests, paths["requests"], request_metrics)  # a row group at a time
        if step_trace:
            write_step_trace(result, paths["step_trace"])
        else:
            del paths["step_trace"]
        paths["summary"].write_text(
            json.dumps(to_jsonable(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8"
        )
        series = time_series(result)
        series.to_csv(paths["timeseries"], index=False)
        write_report(result, paths["report"], summary, title=title, plotlyjs=as_plotlyjs(plotlyjs).rooted(out),
                     series=series)  # fmt: skip
        if steps is not None:
            steps.result()  # its error, if any, raised here
    return paths


@contextmanager
def starts_held(result: SimResult) -> Iterator[None]:
    """The step stores keep every step's start while the writers read them (sim/engine/step_store.py
    ``hold_starts``): 8 bytes a step for the writers' time, each rebuilt once instead of once a pass. Their
    buffered steps are moved in first, so that reading them changes nothing (a big step table is written
    on a second thread: a reader's own ``flush`` would change a store under the other)."""
    s = result.__dict__["_steps"]
    stores = [store for _, store in s.parts] if isinstance(s, StepTable) else []
    try:
        for store in stores:
            store.flush()
            store.hold_starts()
        yield
    finally:
        for store in stores:
            store.drop_starts()
