"""Result assembly shared by one engine (sim/app/simulate.py) and a cluster (sim/app/cluster_results.py):
requests as row logs (sim/engine/request_log.py), the recorders' steps, inter-token gaps and step traces, and
the per-engine counters, made into one SimResult."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pandas as pd

from sim.app.results import SimResult
from sim.core.request import Request, RequestSpec, Status
from sim.engine.gaps import GapTable
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder, StepTable
from sim.engine.request_log import RequestLog, requests_frame

_STATUS = {Status.FINISHED: "finished", Status.REJECTED: "rejected", Status.TIMED_OUT: "timed_out"}


def request_status(req: Request) -> str:
    """finished, rejected, timed_out, or in_flight (anything an engine still holds)."""
    return _STATUS.get(req.status, "in_flight")


def engine_rows(engine: Engine, replica: int) -> RequestLog:
    """A row for every request that reached ``engine``, in arrival order (the engine is emptied of
    them unless it keeps its requests)."""
    return engine.drain_rows(replica, request_status)


def spec_rows(specs: Iterable[RequestSpec], replica: int, status: str) -> RequestLog:
    """Rows for requests that never reached an engine (not arrived yet, or still in an inbox)."""
    return RequestLog.of((Request(s), replica, status) for s in specs)


def engine_counters(engine: Engine, recorder: Recorder) -> dict[str, Any]:
    """The counters every result's meta carries per engine: prefix-cache stats and preemptions."""
    return {
        "prefix_cache": engine.policy.kv.prefix_cache_stats(),
        "num_preemptions": recorder.num_preemptions,
    }


def assemble(
    rows: Sequence[RequestLog],
    recorders: Sequence[Recorder],
    *,
    config: dict[str, Any],
    horizon: float | None,
    meta: dict[str, Any],
    merge_traces: bool = False,
    annotate: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
) -> SimResult:
    """The SimResult of ``rows`` (parts, in turn) and the ``recorders``' steps and gaps. One recorder's
    step trace is taken as it is; with ``merge_traces`` (a cluster) every recorder's records are tagged with its
    replica and merged by time (None when no recorder keeps one). ``annotate`` adds request columns."""
    requests = requests_frame(rows)
    if annotate is not None:
        requests = annotate(requests)
    # The steps stay in the stores' narrow columns: the frame is built only if a reader asks for it
    steps = StepTable(list(recorders))
    if not merge_traces:
        (trace,) = [r.trace for r in recorders]
    elif any(r.trace is not None for r in recorders):
        trace = [{**rec, "replica": r.replica} for r in recorders for rec in r.trace or []]
        trace.sort(key=lambda rec: rec["time"])
    else:
        trace = None
    return SimResult(
        requests=requests,
        steps=steps,
        # the gaps too: rebuilt from the recorders' stores when read (sim/engine/gaps.py)
        itl_values=GapTable([(r.gaps, r.steps) for r in recorders]),
        itl_weights=None,
        step_trace=trace,
        config=config,
        horizon=horizon,
        meta=meta,
    )


def recorded_end(recorders: Sequence[Recorder]) -> float:
    """When the last step any recorder holds ended (0 with no steps)."""
    ends = [e for r in recorders if (e := r.steps.end_time()) is not None]
    return max(ends, default=0.0)
