"""Real runs as users have them on disk → RealRun (the workload sent + what was measured, with its meaning).

Formats (one module each): ``vllm-bench`` (``vllm bench serve --save-result --save-detailed`` JSON),
``inference-perf`` (a results directory, with the server's ``exp-config.yaml`` when beside it),
``engine-jsonl`` (per-request JSONL with engine timestamps, e.g. LLMServingSim's vLLM harness) and
``prometheus`` (scrapes of vLLM's ``/metrics`` before and after a run). ``load_run(path)`` sniffs which.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.core.errors import TraceFormatError, UnknownNameError
from workloads.runs.engine_jsonl import is_engine_jsonl, load_engine_jsonl
from workloads.runs.inference_perf import is_results_dir, load_inference_perf
from workloads.runs.model import LATENCIES, STATS, RealRun, Stage, latency_stats, metric_name
from workloads.runs.prometheus import is_scrape, load_prometheus
from workloads.runs.vllm_bench import load_vllm_bench_run

__all__ = ["LATENCIES", "RUN_FORMATS", "STATS", "RealRun", "Stage", "latency_stats", "load_run", "metric_name",
           "sniff_run"]  # fmt: skip

RUN_FORMATS: dict[str, Callable[..., RealRun]] = {
    "vllm-bench": load_vllm_bench_run,
    "inference-perf": load_inference_perf,
    "engine-jsonl": load_engine_jsonl,
    "prometheus": load_prometheus,
}


def _is_bench_json(path: Path) -> bool:
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(65536)
    return head.lstrip().startswith("{") and '"duration"' in head and '"completed"' in head


def _is_blank(f: Path) -> bool:
    """A file with nothing but white space (read up to its first other byte), so the error can say it is
    empty rather than of no known format."""
    try:
        with open(f, "rb") as fh:
            return f.is_file() and not any(ln.strip() for ln in fh)
    except OSError:
        return False


def sniff_run(path: str | Path) -> str:
    """The run format of a file or directory (see the module doc); a clear error says what was looked for."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"run not found: {path}")
    if path.is_dir():
        if is_results_dir(path):
            return "inference-perf"
        if is_engine_jsonl(path):
            return "engine-jsonl"
        if is_scrape(path):
            return "prometheus"
        if _is_blank(path / "requests.jsonl"):
            raise TraceFormatError(f"{path / 'requests.jsonl'}: empty (no requests); expected one JSON object per "
                                   "request with input_toks, output_toks, arrival_time and the engine's queued_ts, "
                                   "scheduled_ts, first_token_ts, last_token_ts")
        raise TraceFormatError(f"{path}: not a run directory servesim knows: expected an inference-perf results "
                               "directory (config.yaml + stage_<k>_lifecycle_metrics.json), requests.jsonl with "
                               "engine timestamps, or Prometheus scrapes (*.prom)")
    if _is_bench_json(path):
        return "vllm-bench"
    if is_engine_jsonl(path):
        return "engine-jsonl"
    if is_scrape(path):
        return "prometheus"
    if _is_blank(path):
        raise TraceFormatError(f"{path}: empty (nothing but white space); expected a vllm bench serve result JSON "
                               "(--save-result --save-detailed), per-request JSONL with queued_ts/first_token_ts/"
                               "last_token_ts, or a Prometheus scrape of vLLM's /metrics")
    raise TraceFormatError(f"{path}: not a run file servesim knows: expected a vllm bench serve result JSON "
                           "(--save-result --save-detailed), per-request JSONL with queued_ts/first_token_ts/"
                           "last_token_ts, or a Prometheus scrape of vLLM's /metrics")


def load_run(path: str | Path, format: str = "auto", seed: int = 0) -> RealRun:
    """``seed``: for what the format leaves to be drawn (RealRun.seed says whether anything was)."""
    fmt = sniff_run(path) if format == "auto" else format
    if fmt not in RUN_FORMATS:
        raise UnknownNameError(f"unknown run format {format!r}; known: auto, {', '.join(RUN_FORMATS)}")
    return RUN_FORMATS[fmt](path, seed)
