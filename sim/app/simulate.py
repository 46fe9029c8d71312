"""Wiring: a RunConfig becomes model + GPU + memory plan + cost model + policy + workload + engine,
and the run becomes a SimResult. The only place that knows every part."""

from __future__ import annotations

import dataclasses
import math
import time
import typing
from dataclasses import dataclass
from typing import Any

import simpy

from policies.admission import with_admission
from policies.base import (
    Policy,
    PolicyLimits,
    PolicyOptions,
    make_policy,
    options_class,
    parse_engine_options,
    policy_names,
)
from policies.options import LIMIT_KNOBS, MemoryRule
from sim.app.collect import assemble, engine_counters, engine_rows, spec_rows
from sim.app.config import EngineConfig, RunConfig, shared_engine_keys
from sim.app.engine_memory import engine_overheads, fraction_of
from sim.app.frontend import apply_frontend, with_frontend
from sim.app.heap import paused
from sim.app.memory import plan_memory
from sim.app.progress import run_bar, run_env
from sim.app.results import SimResult
from sim.app.streams import check_listable, source_for, unsent
from sim.core.errors import ConfigError, MemoryPlanError
from sim.core.typed import check_value
from sim.cost.costmodel import make_cost_model
from sim.cost.hardware import get_gpu
from sim.cost.models import get_model, normalize_dtype
from sim.cost.profiles import get_profile
from sim.cost.quantconfig import weight_dtype
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from workloads.gen.lengths import read_float
from workloads.synthetic import MAX_LISTED, build_workload

GIB = 1024**3


@dataclass(frozen=True)
class Setup:
    """Everything resolved before the clock starts (also what `servesim plan` shows)."""

    limits: PolicyLimits
    memory: Any  # sim.app.memory.MemoryPlan
    cost_model: Any
    meta: dict[str, Any]
    policy: str = "vllm"
    options: PolicyOptions | None = None  # the preset's own knobs (None: its defaults)
    max_waiting: int | None = None  # admission control (policies/admission.py)
    queue_timeout_s: float | None = None

    def make_policy(self) -> Policy:
        """A fresh policy for one replica: the preset with its options, behind admission control."""
        pol = make_policy(self.policy, self.limits, self.options)
        return with_admission(pol, self.max_waiting, self.queue_timeout_s)


def _plan(cfg: RunConfig, model: Any, gpu: Any, block_size: int, max_num_seqs: int, rule: MemoryRule) -> Any:
    """The memory plan under the preset's start-up rule (policies/options.py MemoryRule)."""
    e = cfg.engine
    tp = cfg.hardware.tensor_parallel_size
    # a slot engine's per-request context (llama.cpp accepts n_ctx beyond training with a warning)
    max_model_len = e.max_model_len or (rule.max_model_len and min(rule.max_model_len, model.max_position_embeddings))
    over = engine_overheads(rule, model, tokens=rule.profile_tokens, max_num_seqs=max_num_seqs,
                            max_model_len=max_model_len or model.max_position_embeddings, tensor_parallel_size=tp,
                            dtype=normalize_dtype(weight_dtype(cfg.model.dtype, model.quantization)))
    if e.overhead_gib is not None:  # everything but weights and KV, as the user measured it
        overheads: dict[str, Any] = {"activation_bytes": int(e.overhead_gib * GIB), "non_torch_bytes": 0}
    else:
        overheads = {"activation_bytes": over.activation_bytes, "non_torch_bytes": over.non_torch_bytes,
                     "context_bytes": over.context_bytes, "overhead_source": over.source}
    try:
        plan = plan_memory(
            model,
            gpu,
            dtype=cfg.model.dtype,
            kv_cache_dtype=e.kv_cache_dtype,
            gpu_memory_utilization=e.gpu_memory_utilization,
            block_size=block_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=rule.profile_tokens,
            max_num_seqs=max_num_seqs,
            tensor_parallel_size=tp,
            num_gpu_blocks_override=e.num_gpu_blocks_override,
            fit_max_model_len=rule.cap_max_model_len,
            free_fraction=fraction_of(rule),
            offload_bytes=over.offload_bytes,
            **overheads,
        )
    except MemoryPlanError as exc:
        if not rule.context_knob:
            raise
        raise MemoryPlanError(f"[engine] {rule.context_knob} = {rule.context_tokens} tokens: {exc}") from None
    if rule.context_knob and rule.context_tokens:  # a slot engine: its KV is a fixed pool, not the budget
        pool = rule.context_tokens * plan.kv_bytes_per_token
        note = (f"the engine allocates {rule.context_knob} = {rule.context_tokens:,} tokens of KV "
                f"({pool / GIB:.2f} GiB) of this budget up front, in slots of {rule.max_model_len:,}")
        plan = dataclasses.replace(plan, notes=(*plan.notes, note))
    return plan


def _explicit_limits(e: Any, aliases: dict[str, str], given: dict[str, Any]) -> dict[str, Any]:
    """The shared limits the user set (None: not set), engine-native names folded in."""
    explicit = {key: getattr(e, key) for key in LIMIT_KNOBS}
    hints = typing.get_type_hints(EngineConfig, include_extras=True)
    for alias, v in given.items():
        target = aliases[alias]
        if isinstance(v, int) and not isinstance(v, bool) and v < 1:  # a count of sequences/tokens/blocks
            raise ConfigError(f"[engine] {alias}: must be >= 1, got {v}; allowed integers >= 1 "
                              f"({target} of preset {e.policy!r})")
        check_value("[engine]", alias, v, hints[target])  # the shared knob's range (block_size: its choices)
        if explicit[target] is not None and explicit[target] != v:
            raise ConfigError(
                f"[engine] {alias} = {v!r} and {target} = {explicit[target]!r} are the same knob for "
                f"preset {e.policy!r}; give one of them"
            )
        explicit[target] = v
    return explicit


def resolve(cfg: RunConfig) -> Setup:
    e = cfg.engine
    parsed = parse_engine_options(e.policy, e.options, shared_engine_keys())
    cls = type(parsed.options)
    if e.scheduling_policy not in cls.SCHEDULING_POLICIES:
        users = [n for n in policy_names() if e.scheduling_policy in options_class(n).SCHEDULING_POLICIES]
        raise ConfigError(
            f"[engine] scheduling_policy = {e.scheduling_policy!r} is not modelled for preset {e.policy!r} "
            f"(only: {', '.join(users)})"
        )
    if e.async_scheduling and e.policy != "vllm":
        raise ConfigError(f"[engine] async_scheduling = true is modelled for preset 'vllm' only, not {e.policy!r}")
    async_scheduling = e.policy == "vllm" if e.async_scheduling is None else e.async_scheduling
    explicit = _explicit_limits(e, cls.ALIASES, parsed.aliases)

    def pick(key: str, fallback: Any) -> Any:
        v = explicit[key]
        return v if v is not None else cls.LIMITS.get(key, fallback)

    block_size = pick("block_size", 16)
    model = get_model(cfg.model.name)
    gpu = get_gpu(cfg.hardware.gpu)
    max_num_seqs = pick("max_num_seqs", 256)
    mnbt_explicit = explicit["max_num_batched_tokens"]
    mnbt = mnbt_explicit or cls.LIMITS.get("max_num_batched_tokens", 2048)
    picked = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": mnbt, "block_size": block_size,
              "enable_prefix_caching": pick("enable_prefix_caching", True),
              "enable_chunked_prefill": pick("enable_chunked_prefill", True)}
    rule = parsed.options.memory_rule(picked, explicit, e.max_model_len or model.max_position_embeddings)
    plan = _plan(cfg, model, gpu, block_size, max_num_seqs, rule)
    limit_kw: dict[str, Any] = dict(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=mnbt,
        max_model_len=plan.max_model_len,
        block_size=block_size,
        num_gpu_blocks=plan.num_gpu_blocks,
        enable_prefix_caching=picked["enable_prefix_caching"],
        enable_chunked_prefill=picked["enable_chunked_prefill"],
        scheduling_policy=e.scheduling_policy,
        async_scheduling=async_scheduling,
        **parsed.options.limit_values(),
    )
    # The preset's own resolution: what it derives from the memory plan (policies/options.py).
    options = parsed.options.from_memory(plan, limit_kw, explicit)
    if cls.VLLM_BUDGET_RULE:
        chunked, max_model_len = limit_kw["enable_chunked_prefill"], limit_kw["max_model_len"]
        if not chunked and mnbt_explicit is None:
            limit_kw["max_num_batched_tokens"] = max(max_model_len, 2048)  # engines.md §1.1
        if not chunked and limit_kw["max_num_batched_tokens"] < max_model_len:
            raise ConfigError(
                f"[engine] max_num_batched_tokens ({limit_kw['max_num_batched_tokens']}) < max_model_len "
                f"({max_model_len}) without chunked prefill: long prompts could never be scheduled (vLLM "
                "refuses this too)"
            )
        if e.policy in ("vllm", "vllm-v0") and limit_kw["max_num_batched_tokens"] < limit_kw["max_num_seqs"]:
            # vLLM SchedulerConfig._verify_args
            raise ConfigError(
                f"[engine] max_num_batched_tokens ({limit_kw['max_num_batched_tokens']}) must be >= max_num_seqs "
                f"({limit_kw['max_num_seqs']}), as vLLM requires (a step must fit a token per running sequence)"
            )
    limits = PolicyLimits(**limit_kw)
    step_default = EngineConfig.__dataclass_fields__["constant_step_s"].default
    if e.cost_model != "constant" and e.constant_step_s != step_default:  # it would do nothing
        raise ConfigError(f"[engine] constant_step_s = {e.constant_step_s:g} applies to cost_model = \"constant\" "
                          f"only (this run's is {e.cost_model!r}); allowed: leave it out, or set cost_model = "
                          '"constant"')
    if e.cost_model == "constant":
        cost = make_cost_model("constant", step_s=e.constant_step_s)
        profile_meta = {"cost_model": "constant", "step_s": e.constant_step_s}
    else:
        profile = get_profile(gpu, None if cfg.hardware.profile == "auto" else cfg.hardware.profile)
        cost = make_cost_model(
            e.cost_model,
            model=model,
            gpu=gpu,
            dtype=weight_dtype(cfg.model.dtype, model.quantization),
            kv_cache_dtype=e.kv_cache_dtype,
            tensor_parallel_size=cfg.hardware.tensor_parallel_size,
            profile=profile,
            block_size=limits.block_size,  # swap copies are priced per block
        )
        profile_meta = {"cost_model": e.cost_model, "profile": profile.gpu, "profile_source": profile.source}
    meta = {"model": model.name, "gpu": gpu.name, "memory_plan": plan.to_dict(), **profile_meta}
    return Setup(
        limits=limits,
        memory=plan,
        cost_model=cost,
        meta=meta,
        policy=e.policy,
        options=options,
        max_waiting=e.max_waiting,
        queue_timeout_s=e.queue_timeout_s,
    )


def simulate(cfg: RunConfig, *, fast_forward: bool = True, progress: bool = False) -> SimResult:
    """Run ``cfg``; ``progress``: a bar of arrived requests on stderr where it is a terminal (sim/app/progress.py)."""
    t0 = time.perf_counter()
    setup = resolve(cfg)
    wl_cfg = dict(cfg.workload)
    if cfg.simulation.num_requests is not None:
        wl_cfg["num_requests"] = cfg.simulation.num_requests
    # The client's total timeout (inference-perf / aiohttp; vllm bench has none): the engine aborts.
    timeout = None
    if "client_timeout_s" in wl_cfg:
        timeout = read_float(wl_cfg, "client_timeout_s", "workload", lo=0.0, lo_open=True)
        del wl_cfg["client_timeout_s"]
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
    return apply_frontend(res, cfg.frontend, send_time)


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
        end_time=engine.env.now,
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
