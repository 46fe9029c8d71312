"""Wiring: a resolved RunConfig (sim/app/setup.py) becomes policy + workload + engine, and the run becomes a
SimResult. The only place that knows every part."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import simpy

from sim.app.collect import assemble, engine_counters, engine_rows, spec_rows
from sim.app.config import RunConfig
from sim.app.frontend import apply_frontend, with_frontend
from sim.app.heap import paused
from sim.app.progress import run_bar, run_env
from sim.app.results import SimResult
from sim.app.setup import Setup, resolve
from sim.app.streams import check_listable, source_for, unsent
from sim.core.errors import ConfigError
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from workloads.gen.lengths import read_float
from workloads.synthetic import MAX_LISTED, build_workload

__all__ = ["Setup", "collect", "format_summary", "resolve", "simulate"]  # Setup, resolve: sim/app/setup.py


def simulate(cfg: RunConfig, *, fast_forward: bool = True, progress: bool = False) -> SimResult:
    """Run ``cfg``; ``progress``: a bar of arrived requests on stderr where it is a terminal (sim/app/progress.py)."""
    if not isinstance(cfg, RunConfig):  # a dict or a path from a notebook: say which builder makes one
        raise ConfigError(f"simulate takes a RunConfig (sim.app.config.config_from_dict for a dict, load_config for "
                          f"a TOML path; or servesim.run, which takes either), got {type(cfg).__name__}")
    t0 = time.perf_counter()
    setup = resolve(cfg)
    wl_cfg = dict(cfg.workload)
    if cfg.simulation.num_requests is not None:
        wl_cfg["num_requests"] = cfg.simulation.num_requests
    # The client's total timeout (inference-perf / aiohttp; vllm bench has none): the engine aborts.
    timeout = None
    if "client_timeout_s" in wl_cfg:
        timeout = read_float(wl_cfg, "client_timeout_s", "workload", lo=0.0, lo_open=True, hi=1e9)
        del wl_cfg["client_timeout_s"]
    _check_priorities(cfg, wl_cfg)
    workload = build_workload(wl_cfg, seed=cfg.simulation.seed, max_model_len=setup.limits.max_model_len)
    listed = check_listable(workload, cfg.simulation.horizon)
    source, send_time = with_frontend(source_for(workload), cfg.frontend)  # arrivals after the input path
    env = simpy.Environment(initial_time=0.0)
    with paused():  # the KV pool's blocks live for the run (sim/app/heap.py)
        policy = setup.make_policy()
    recorder = Recorder(trace=cfg.simulation.record_step_trace)
    engine = Engine(env, policy, setup.cost_model, source, recorder, cfg.simulation.horizon, fast_forward,
                    async_scheduling=setup.limits.async_scheduling, client_timeout_s=timeout,
                    keep_requests=False)  # finished requests leave as rows (sim/engine/request_log.py)
    run_env(env, run_bar(workload, "run", progress), lambda: engine.num_submitted)
    res = collect(cfg, setup, engine, source, recorder, time.perf_counter() - t0, listed)
    # requests the workload cut to fit max_model_len (a prompt to max_model_len - 1, then the output)
    res.meta["num_clipped"] = _num_clipped(workload)
    # what a trace's loader did or dropped (skip_bad_rows; re-sorted rows, raised lengths): said, never silent
    # (set only when there is something to say: a run without a trace keeps its meta as it was)
    if skipped := int(getattr(workload, "num_skipped", 0) or 0):
        res.meta["num_skipped"] = skipped
    if notes := [*getattr(workload, "notes", ()), *getattr(workload, "errors", ())]:
        res.meta["trace_notes"] = notes
    return apply_frontend(res, cfg.frontend, send_time)


def _check_priorities(cfg: RunConfig, wl_cfg: dict[str, Any]) -> None:
    """vLLM refuses a request with a nonzero priority unless scheduling_policy is "priority" ("Got priority
    ... but Priority scheduling is not enabled", its add_request): a workload that draws such priorities for
    a vLLM preset under fcfs is refused before the run, not run with its priorities silently ignored."""
    prio = wl_cfg.get("priority")
    if prio is None or cfg.engine.policy not in ("vllm", "vllm-v0") or cfg.engine.scheduling_policy != "fcfs":
        return
    from workloads.gen.draws import PriorityMix

    mix = PriorityMix.from_config(prio, "workload.priority")
    used = [lv for lv, w in zip(mix.levels, mix.weights, strict=True) if lv != 0 and w > 0]
    if used:
        raise ConfigError(f"workload.priority: levels {list(mix.levels)} give requests priority {used[0]}, but [engine] "
                          "scheduling_policy is 'fcfs' and vLLM refuses a nonzero priority then; allowed: "
                          "scheduling_policy = 'priority', or levels = [0]")


def _num_clipped(workload: Any) -> int:
    """How many of the workload's requests were cut to fit max_model_len: counted when the workload can
    say so in a pass over its lengths (at most MAX_LISTED of them; a larger one cut by the horizon is
    not drawn out just for the count, and reports 0)."""
    if not hasattr(workload, "__len__") or len(workload) > MAX_LISTED:
        return 0
    return int(getattr(workload, "num_clipped", 0) or 0)


def collect(
    cfg: RunConfig, setup: Setup, engine: Engine, source, recorder: Recorder, wall: float,
    listed: bool = True,
) -> SimResult:
    """The run's SimResult (sim/app/collect.py, the same assembly as a cluster's)."""
    never, unlisted = unsent(source, listed, engine.env.now)
    rows = [engine_rows(engine, 0), spec_rows(never, 0, "not_arrived")]
    kv = engine.policy.kv
    counters = engine_counters(engine, recorder)
    meta = dict(setup.meta)
    meta.update(
        seed=cfg.simulation.seed,
        wall_time_s=wall,
        num_gpu_blocks=setup.limits.num_gpu_blocks,
        limits=dataclasses.asdict(setup.limits),
        prefix_cache=counters["prefix_cache"],
        num_preemptions=counters["num_preemptions"],
        swap=kv.swap_stats() if hasattr(kv, "swap_stats") else None,
        policy_options=setup.options.to_dict() if setup.options is not None else {},
        # the clock, or the last step's end where a decode run's clock landed an ulp before it (delay_to)
        end_time=max(engine.env.now, recorder.steps.end_time() or 0.0),
        num_unlisted=unlisted,  # requests that never came and are not rows (more than MAX_LISTED)
    )
    return assemble(rows, [recorder], config=cfg.to_dict(), horizon=cfg.simulation.horizon, meta=meta)


def _fmt(v: Any, scale: float = 1.0, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * scale:.{digits}f}"


def format_summary(summary: dict[str, Any], result: SimResult) -> str:
    """A short human-readable digest of the summary (the JSON has everything)."""
    m = result.meta
    lines = [
        f"model {m.get('model')} on {m.get('gpu')}  ({m.get('cost_model')}"
        + (f", profile {m.get('profile')} [{m.get('profile_source')}]" if m.get("profile") else "")
        + f"), {m.get('num_gpu_blocks')} KV blocks",
        f"requests: {summary.get('num_requests')} total, {summary.get('num_finished')} finished, "
        f"{summary.get('num_rejected')} rejected, {summary.get('num_timed_out')} timed out, "
        f"{summary.get('num_in_flight')} in flight, "
        f"{summary.get('num_not_arrived')} not arrived",
        f"throughput: {_fmt(summary.get('request_throughput'), 1, 2)} req/s, "
        f"{_fmt(summary.get('output_throughput'), 1, 0)} output tok/s",
    ]
    if summary.get("num_clipped"):
        lines.append(f"note: {summary['num_clipped']} requests were cut to fit max_model_len "
                     f"{m.get('limits', {}).get('max_model_len')} (num_clipped; the prompt first, then the output)")
    if summary.get("num_skipped"):
        lines.append(f"note: {summary['num_skipped']} trace rows were skipped (skip_bad_rows; num_skipped)")
    wl = (summary.get("config") or {}).get("workload") or {}
    said_by = "trace" if isinstance(wl, dict) and "trace" in wl else "workload"  # a closed loop's notes too
    for note in summary.get("trace_notes", ()):
        lines.append(f"note: {said_by}: {note}")
    if summary.get("latency_basis") == "client":  # [frontend] on: the headline is what a client measures
        lines.append("latencies client-side (send to parsed chunk, [frontend]); engine-side TTFT ms: mean "
                     f"{_fmt(summary.get('mean_ttft_engine_ms'))}  p99 {_fmt(summary.get('p99_ttft_engine_ms'))}")
    for metric in ("ttft", "tpot", "itl", "e2el"):
        lines.append(
            f"{metric.upper():5s} ms: mean {_fmt(summary.get(f'mean_{metric}_ms'))}  "
            f"p50 {_fmt(summary.get(f'median_{metric}_ms'))}  p90 {_fmt(summary.get(f'p90_{metric}_ms'))}  "
            f"p99 {_fmt(summary.get(f'p99_{metric}_ms'))}"
        )
    lines.append(
        f"KV usage mean {_fmt(summary.get('mean_kv_cache_usage'), 100)}% max "
        f"{_fmt(summary.get('max_kv_cache_usage'), 100)}%, preemptions {summary.get('num_preemptions')}"
        + (
            f" (swap-outs {summary.get('num_swap_outs')}, swap-ins {summary.get('num_swap_ins')})"
            if summary.get("num_swap_outs")
            else ""
        )
        + ", "
        + f"prefix hit rate {_fmt(summary.get('prefix_cache_hit_rate'), 100)}%, "
        f"mean waiting {_fmt(summary.get('mean_num_waiting'), 1, 1)}"
    )
    cost = summary.get("cost") or {}
    if summary.get("cost_per_hour") is not None:  # sim/app/cost_metrics.py
        cur = summary.get("cost_currency")
        gpus = ", ".join(f"{g['count']} x {g['gpu']} at {g['per_hour']:.4g}/h ({g['origin']}, {g['date']})"
                         for g in cost.get("gpus", []))  # fmt: skip
        lines.append(f"cost: {_fmt(summary['cost_per_hour'], 1, 2)} {cur}/h ({gpus}); per 1M output tokens "
                     f"{_fmt(summary.get('cost_per_1m_output_tokens'), 1, 3)}, per 1M total "
                     f"{_fmt(summary.get('cost_per_1m_total_tokens'), 1, 3)}, per 1M goodput "
                     f"{_fmt(summary.get('cost_per_1m_goodput_tokens'), 1, 3)} {cur}")  # fmt: skip
    elif cost.get("error"):
        lines.append(f"cost: - ({cost['error']})")
    return "\n".join(lines)
