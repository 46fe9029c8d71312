"""steps.jsonl: one JSON line per engine step, the engine's own records when it kept them (a step
trace) or else the rows of the step table, written a slice at a time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sim.app.results import SimResult, to_jsonable

_TRACE_FIELDS = {  # steps column -> steps.jsonl field
    "step": "step", "replica": "replica", "start": "time", "duration": "duration",
    "num_scheduled_tokens": "scheduled", "num_preempted": "preempted", "num_finished": "finished",
    "num_running": "num_running", "num_waiting": "num_waiting", "num_free_blocks": "num_free_blocks",
    "kv_usage": "kv_usage",
}  # fmt: skip


TRACE_SLICE = 50_000  # steps per to_json call: bounds the text held at once (~1 KB a step)


def write_step_trace(result: SimResult, path: Path) -> None:
    """The engine's own step records when it kept them, else one line per row of the steps frame."""
    if result.step_trace is None:
        ints = {v: np.int64 for k, v in _TRACE_FIELDS.items() if v not in ("time", "duration", "kv_usage")}
        with path.open("w", encoding="utf-8") as fh:  # in slices: one string (and one copy) per slice
            for part in result.step_slices(TRACE_SLICE):
                frame = part[list(_TRACE_FIELDS)].rename(columns=_TRACE_FIELDS)
                text = frame.astype(ints).to_json(orient="records", lines=True, double_precision=15)
                fh.write(text if text.endswith("\n") else text + "\n")
        return
    # The records are plain Python already (the recorder builds them so): the C encoder takes them as
    # they are; only a record it refuses (a numpy value, a NaN) goes through to_jsonable first.
    encode = json.JSONEncoder(allow_nan=False).encode
    with path.open("w", encoding="utf-8") as fh:
        write = fh.write
        for rec in result.step_trace:
            try:
                line = encode(rec)
            except (TypeError, ValueError):
                line = encode(to_jsonable(rec))
            write(line)
            write("\n")
