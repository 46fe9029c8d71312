"""Prometheus text scrapes of vLLM's ``/metrics`` taken before and after a run, as a RealRun (engine-side).

Input: a directory of scrape files (``*.prom`` / ``*.txt`` / ``*.metrics``, sorted by name with one named
``*before*`` first and one named ``*after*`` last; the first is the scrape before the run, the last the one after; with more than two, the gauges in between form a time series,
at the seconds a number in each file name gives, e.g. ``metrics_0012.prom``), or one file (a scrape after a
run on a fresh server: the "before" is all zeros). Parsed with ``prometheus_client``'s text parser; series
with several label sets (engines, models) are summed.

What is read (vLLM V1 metric names, older spellings in brackets): histograms ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds`` [``vllm:time_per_output_token_seconds``],
``vllm:request_time_per_output_token_seconds``, ``vllm:e2e_request_latency_seconds``,
``vllm:request_queue_time_seconds``, ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``; the
counter ``vllm:request_success_total``; gauges ``vllm:kv_cache_usage_perc`` [``vllm:gpu_cache_usage_perc``],
``vllm:num_requests_running``, ``vllm:num_requests_waiting``; ``vllm:cache_config_info`` labels (block size,
GPU blocks, memory utilization, prefix caching). Each histogram is the after − before difference: means are
sum / count, percentiles Prometheus' ``histogram_quantile`` (linear inside the bucket holding the rank), so
they are only as fine as vLLM's buckets.

Meaning: vLLM records these in the engine's output processor from the request's arrival at the server: TTFT
and E2E exclude the client and the network, ``queue_time`` is waiting → first scheduled. The scrapes carry no
arrival times: the replay needs the load from the user (``--set workload.rate=R`` [``workload.arrival``,
``workload.burstiness``]); prompt and output lengths are drawn from the token-count histograms.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError
from sim.core.fields import MAX_REQUESTS
from sim.core.request import RequestSpec
from workloads.runs.model import MAX_TOKENS, QUANTILES, RealRun, Stage, show

SUFFIXES = (".prom", ".txt", ".metrics")
HISTOGRAMS = {  # servesim metric -> vLLM histogram names, newest first
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2el": ("vllm:e2e_request_latency_seconds",),
    "queue_time": ("vllm:request_queue_time_seconds",),
}
GAUGES = {"kv_cache_pct": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
          "running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",)}  # fmt: skip
MEANING = {
    "ttft": "engine: server arrival -> first token (vllm:time_to_first_token_seconds, bucketed)",
    "itl": "engine: gap between output tokens (vllm:inter_token_latency_seconds, bucketed)",
    "tpot": "engine: per-request mean gap (vllm:request_time_per_output_token_seconds, bucketed)",
    "e2el": "engine: server arrival -> finish (vllm:e2e_request_latency_seconds, bucketed)",
    "queue_time": "engine: waiting -> first scheduled (vllm:request_queue_time_seconds, bucketed)",
}


@dataclass
class Scrape:
    """One scrape: plain samples summed over label sets, histograms as (le -> cumulative count, sum, count)."""

    values: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str = "(no scrape: a fresh server)"


def _series(name: str, labels: dict[str, str]) -> str:
    """``name{labels}`` for a message: le first (it tells the buckets apart), cut past 200 characters."""
    items = sorted(labels.items(), key=lambda kv: (kv[0] != "le", kv[0]))
    text = repr(name + "{" + ",".join(f'{k}="{v}"' for k, v in items) + "}")
    return text if len(text) <= 200 else text[:197] + "..."


def _check_sample(where: str, name: str, labels: dict[str, str], v: float, seen: set) -> None:
    """vLLM's counters and histograms (``_total``, ``_bucket``, ``_sum``, ``_count``) count up from 0: a
    finite value >= 0; each series (name and labels) once per scrape (a repeated line would be summed)."""
    key = (name, tuple(sorted(labels.items())))
    if key in seen:
        raise TraceFormatError(f"{where}: series {_series(name, labels)} appears twice; expected one sample "
                               "per series (name and labels) in a scrape")
    seen.add(key)
    counts = name.endswith(("_total", "_bucket", "_sum", "_count"))
    if name.startswith("vllm:") and counts and not (math.isfinite(v) and v >= 0):
        raise TraceFormatError(f"{where}: series {_series(name, labels)}: got {v}; expected a finite value "
                               ">= 0 (a counter or histogram sample)")


def _check_buckets(where: str, out: Scrape) -> None:
    """Cumulative buckets never decrease with ``le``, and a histogram has its ``_sum`` and ``_count``."""
    for name, b in out.buckets.items():
        if not name.startswith("vllm:"):
            continue
        les = sorted(b)
        for lo, hi in zip(les, les[1:], strict=False):
            if b[hi] < b[lo]:
                raise TraceFormatError(f"{where}: histogram {name}: bucket le={hi:g} holds {b[hi]:g}, less than "
                                       f"le={lo:g} ({b[lo]:g}); expected cumulative counts that never decrease")
        for part in ("_sum", "_count"):
            if name + part not in out.values:
                raise TraceFormatError(f"{where}: histogram {name} has buckets but no {name}{part}; expected "
                                       "_bucket, _sum and _count series")
        if math.inf in b and abs(out.values[name + "_count"] - b[math.inf]) > 1e-6 * max(b[math.inf], 1.0):
            raise TraceFormatError(f"{where}: histogram {name}: {name}_count {out.values[name + '_count']:g} but the "
                                   f"le=+Inf bucket {b[math.inf]:g}; expected them equal")


def parse_scrape(text: str, where: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    out = Scrape(source=where)
    seen: set = set()
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                _check_sample(where, s.name, s.labels, float(s.value), seen)
                if s.name.endswith("_bucket") and "le" in s.labels:
                    le = math.inf if s.labels["le"] in ("+Inf", "Inf") else float(s.labels["le"])
                    if le != le:  # a NaN bound bounds nothing (and a NaN key is never found again)
                        raise ValueError(f"{s.name}: bucket le={s.labels['le']!r} is not a bound")
                    b = out.buckets.setdefault(s.name.removesuffix("_bucket"), {})
                    b[le] = b.get(le, 0.0) + float(s.value)
                else:
                    out.values[s.name] = out.values.get(s.name, 0.0) + float(s.value)
                    out.labels.setdefault(s.name, dict(s.labels))
    except (ValueError, TypeError, IndexError, OverflowError) as e:
        raise TraceFormatError(f"{where}: not Prometheus text format ({e})") from None
    if not any(k.startswith("vllm:") for k in (*out.values, *out.buckets)):
        raise TraceFormatError(f"{where}: no vllm:* metrics in this scrape (is it vLLM's /metrics?)")
    _check_buckets(where, out)
    return out


def histogram_quantile(q: float, les: np.ndarray, cum: np.ndarray) -> float:
    """Prometheus' histogram_quantile: the bucket holding rank q·count, linear inside it (the +Inf bucket
    answers its lower bound, the largest finite le)."""
    total = cum[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    i = int(np.searchsorted(cum, rank, side="left"))
    i = min(i, len(les) - 1)
    if math.isinf(les[i]):
        return float(les[i - 1]) if i > 0 else math.nan
    lo, c_lo = (0.0, 0.0) if i == 0 else (float(les[i - 1]), float(cum[i - 1]))
    width = cum[i] - c_lo
    return float(les[i]) if width <= 0 else lo + (float(les[i]) - lo) * (rank - c_lo) / width


def _between(after: Scrape, before: Scrape) -> str:
    return f"{after.source} - {before.source}" if before.values or before.buckets else after.source


def _delta(after: Scrape, before: Scrape, names: tuple[str, ...]) -> tuple[str, np.ndarray, np.ndarray, float, float] | None:
    """(name, les, cumulative counts, sum, count) of the first histogram of ``names`` the after-scrape has, as
    after - before: every part grows (a counter that went down is a restarted server) and the mean
    sum / count lies inside the buckets that were filled."""
    for name in names:
        if name in after.buckets:
            a, b = after.buckets[name], before.buckets.get(name, {})
            les = np.array(sorted(a))
            cum = np.array([a[x] - b.get(x, 0.0) for x in les])
            s = after.values[f"{name}_sum"] - before.values.get(f"{name}_sum", 0.0)
            n = after.values[f"{name}_count"] - before.values.get(f"{name}_count", 0.0)
            where = f"{_between(after, before)}: histogram {name}"
            per = np.diff(np.concatenate([[0.0], cum]))
            if s < 0 or n < 0 or (per < -1e-9).any():
                raise TraceFormatError(f"{where}: went down between the scrapes (sum {s:g}, count {n:g}, buckets "
                                       f"{cum.tolist()[:6]}...); expected counts that only grow (was the server "
                                       "restarted?)")
            filled = np.flatnonzero(per > 0)
            if n > 0 and filled.size:
                lo = float(les[filled[0] - 1]) if filled[0] > 0 else 0.0
                hi = float(les[filled[-1]])
                if not lo * (1 - 1e-9) - 1e-9 <= s / n <= hi * (1 + 1e-9) + 1e-9:
                    raise TraceFormatError(f"{where}: {name}_sum / _count = {s / n:g}, outside the filled buckets "
                                           f"({lo:g} .. {hi:g}); expected the mean inside them")
            return name, les, cum, s, n
    return None


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    def order(p: Path) -> tuple[int, str]:  # "before" first and "after" last, whatever the name sorts as
        low = p.stem.lower()
        return (0 if "before" in low else 2 if "after" in low else 1, p.name)

    files = sorted((p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file()), key=order)
    if not files:
        raise TraceFormatError(f"{path}: no Prometheus scrapes ({', '.join(SUFFIXES)} files) in this directory")
    return files


def is_scrape(path: Path) -> bool:
    try:
        files = [path] if path.is_file() else [p for p in path.iterdir() if p.suffix in SUFFIXES]
        head = files[0].read_text(errors="replace")[:4096] if files else ""
    except OSError:
        return False
    return "vllm:" in head and ("# TYPE" in head or "# HELP" in head or re.search(r"^vllm:\S+ ", head, re.M))


def _lengths(after: Scrape, before: Scrape, name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    d = _delta(after, before, (name,))
    if d is None:
        raise TraceFormatError(f"scrape has no {name} histogram: the prompt / output lengths are unknown")
    _, les, cum, s, cnt = d
    counts = np.diff(np.concatenate([[0.0], cum])).round().astype(int)
    if counts.sum() < 1 or cnt <= 0:
        raise TraceFormatError(f"{_between(after, before)}: histogram {name}: no observations between the scrapes "
                               "(every bucket 0 after - before): the prompt / output lengths are unknown")
    if s / cnt > MAX_TOKENS:
        raise TraceFormatError(f"{_between(after, before)}: histogram {name}: mean {s / cnt:g} tokens (_sum / "
                               f"_count); expected at most {MAX_TOKENS}")
    edges = np.concatenate([[0.0], les])
    top = les[np.isfinite(les)].max() if np.isfinite(les).any() else 1.0
    vals = np.concatenate([rng.uniform(lo, min(hi, top), k) for lo, hi, k in zip(edges[:-1], edges[1:], counts,
                                                                                  strict=True) if k > 0])  # fmt: skip
    vals = rng.permutation(vals)[:n] if len(vals) >= n else np.resize(vals, n)
    mean = s / cnt
    vals = vals * (mean / vals.mean()) if vals.mean() > 0 else vals  # keep the measured mean exactly
    return np.clip(np.round(vals), 1, MAX_TOKENS).astype(np.int64), mean


def _cache_config(after: Scrape) -> dict[str, object]:
    """[engine] settings from the ``vllm:cache_config_info`` labels (vLLM writes str() of each value: an
    integer, a float, True / False, or None when unset); any other spelling is refused by name."""
    engine: dict[str, object] = {}
    info = after.labels.get("vllm:cache_config_info", {})
    where = f"{after.source}: vllm:cache_config_info label"
    for src, key, cast, kind in (("block_size", "block_size", int, "an integer >= 1"),
                                 ("num_gpu_blocks", "num_gpu_blocks_override", int, "an integer >= 1"),
                                 ("gpu_memory_utilization", "gpu_memory_utilization", float, "a number in (0, 1]")):
        if info.get(src) in (None, "", "None"):
            continue
        try:
            v = cast(info[src])
        except ValueError:
            v = None
        if v is None or not (0 < v <= 1 if cast is float else v >= 1):
            raise TraceFormatError(f"{where} {src}={show(info[src])}: expected {kind} (or None)")
        engine[key] = v
    pc = info.get("enable_prefix_caching")
    if pc in ("True", "False"):
        engine["enable_prefix_caching"] = pc == "True"
    elif pc not in (None, "", "None"):
        raise TraceFormatError(f"{where} enable_prefix_caching={show(pc)}: expected True, False or None")
    return engine


def load_prometheus(path: str | Path, seed: int = 0) -> RealRun:
    path = Path(path)
    files = _files(path)
    scrapes = [parse_scrape(f.read_text(errors="replace"), str(f)) for f in files]
    after = scrapes[-1]
    before = scrapes[0] if len(scrapes) > 1 else Scrape()
    done = after.values.get("vllm:request_success_total", 0.0) - before.values.get("vllm:request_success_total", 0.0)
    if not (math.isfinite(done) and done <= MAX_REQUESTS):
        raise TraceFormatError(f"{_between(after, before)}: vllm:request_success_total grew by {done:g}; expected "
                               f"a finite count of at most {MAX_REQUESTS} requests (the most a replay lists)")
    n = int(round(done))
    if n < 1:
        raise TraceFormatError(f"{path}: vllm:request_success_total did not grow between the scrapes (no "
                               "request finished): nothing to compare")
    measured: dict[str, float] = {"completed": float(n)}
    meaning, used = {}, []
    for m, names in HISTOGRAMS.items():
        d = _delta(after, before, names)
        if d is None or d[4] <= 0:
            continue
        name, les, cum, s, cnt = d
        used.append(name)
        meaning[m] = MEANING[m]
        measured[f"{m}_mean_ms"] = 1e3 * s / cnt
        for stat, q in QUANTILES.items():
            measured[f"{m}_{stat}_ms"] = 1e3 * histogram_quantile(q / 100, les, cum)
    rng = np.random.default_rng(seed)
    prompt, pmean = _lengths(after, before, "vllm:request_prompt_tokens", n, rng)
    output, omean = _lengths(after, before, "vllm:request_generation_tokens", n, rng)
    specs = [RequestSpec(request_id=str(i), arrival_time=0.0, prompt_len=int(p), output_len=int(o))
             for i, (p, o) in enumerate(zip(prompt, output, strict=True))]  # fmt: skip
    engine = _cache_config(after)
    model = next((lab.get("model_name") for lab in after.labels.values() if lab.get("model_name")), None)
    ts = None
    if len(scrapes) > 2:
        nums = [re.findall(r"\d+(?:\.\d+)?", f.stem) for f in files]
        t = [float(x[-1]) for x in nums] if all(nums) else list(range(len(files)))
        rows = []
        for ti, sc in zip(t, scrapes, strict=True):
            row = {"t": ti - t[0]}
            for col, names in GAUGES.items():
                v = next((sc.values[x] for x in names if x in sc.values), None)
                if v is not None:
                    row[col] = 100 * v if col == "kv_cache_pct" else v
            rows.append(row)
        ts = pd.DataFrame(rows)
    gauges = {col: next((after.values[x] for x in names if x in after.values), None) for col, names in GAUGES.items()}
    notes = [f"{len(files)} scrape(s): {', '.join(f.name for f in files)}" + ("" if len(files) > 1 else
             " (one scrape: counted from a fresh server)"),
             f"lengths drawn from the token histograms (means {pmean:.1f} / {omean:.1f} tokens kept exactly; "
             "prompt and output paired at random, seed %d); prompts unique" % seed,
             f"histograms read: {', '.join(used) or 'none'}",
             "gauges at the last scrape: " + ", ".join(f"{k} {v:g}" for k, v in gauges.items() if v is not None)]
    return RealRun(
        source=path, format="prometheus", basis="engine", specs=specs, stage_of=np.zeros(n),
        stages=[Stage(0, None, None, 0.0, n)], measured=[dict(measured)], overall=dict(measured),
        meaning=meaning, model=model, engine=engine, arrivals="unknown", timeseries=ts, notes=notes,
        settings_file=files[-1], seed=seed,
    )  # fmt: skip
