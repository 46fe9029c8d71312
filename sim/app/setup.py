"""Resolution: a RunConfig becomes the model, GPU, memory plan, cost model and policy limits a run needs,
before the clock starts (what `servesim plan` shows). Apart from sim/app/simulate.py, which runs it, so
that a caller that only resolves (bench/speed.py, the planner) loads no result tables (pandas)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

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
from sim.app.config import EngineConfig, RunConfig, shared_engine_keys
from sim.app.engine_memory import engine_overheads, fraction_of
from sim.app.memory import plan_memory
from sim.core.errors import ConfigError, MemoryPlanError
from sim.core.typed import check_value
from sim.cost.costmodel import make_cost_model
from sim.cost.hardware import get_gpu
from sim.cost.models import get_model, normalize_dtype
from sim.cost.profiles import get_profile
from sim.cost.quantconfig import weight_dtype

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
        # -1 (the longest that fits) is not for a slot engine: the plan's hint is left out
        raise MemoryPlanError(f"[engine] {rule.context_knob} = {rule.context_tokens} tokens: "
                              f"{str(exc).replace(' (-1 picks it)', '')}") from None
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
    # max_model_len -1 (vLLM's "auto", v1/core/kv_cache_planning _auto_fit_max_model_len): the model's
    # length, cut to the longest one request can hold; from here on it is an unset length that is fitted
    fit_len = cfg.engine.max_model_len == -1
    if fit_len:
        cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, max_model_len=None))
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
    try:  # a miss names the config field it came from (a --set, a --vllm-args MODEL, the file)
        model = get_model(cfg.model.name)
    except ConfigError as e:
        raise type(e)(f"[model] name: {e}") from None
    try:
        gpu = get_gpu(cfg.hardware.gpu)
    except ConfigError as e:
        raise type(e)(f"[hardware] gpu: {e}") from None
    mnbt_explicit = explicit["max_num_batched_tokens"]
    chunked = pick("enable_chunked_prefill", True)
    if not gpu.supports_bf16:  # vLLM (platforms/cuda.py): bfloat16 needs compute capability 8.0; auto falls back
        for where, key, v in (("[model]", "dtype", cfg.model.dtype), ("[engine]", "kv_cache_dtype", e.kv_cache_dtype)):
            if str(v).strip().lower() in ("bf16", "bfloat16"):
                raise ConfigError(f"{where} {key} = {v!r}: {gpu.name} has no bfloat16 (compute capability below "
                                  "8.0; vLLM refuses it); allowed: auto (float16 there), fp16 / float16")
    max_num_seqs, mnbt = cls.batch_limits(gpu, explicit, chunked, e.max_model_len or model.max_position_embeddings)
    picked = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": mnbt, "block_size": block_size,
              "enable_prefix_caching": pick("enable_prefix_caching", True), "enable_chunked_prefill": chunked}
    rule = parsed.options.memory_rule(picked, explicit, e.max_model_len or model.max_position_embeddings)
    if fit_len:
        if rule.context_knob:  # a slot engine's context is its knob's, not sized from memory
            raise ConfigError(f"[engine] max_model_len = -1 (the longest that fits, vLLM's auto): preset "
                              f"{e.policy!r} sizes its context by {rule.context_knob}, not from memory; allowed: a "
                              f"max_model_len, or leave it out ({rule.context_knob} decides)")
        rule = dataclasses.replace(rule, cap_max_model_len=True)
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
    options = parsed.options.from_memory(plan, limit_kw, {**explicit, "max_model_len": e.max_model_len})
    if cls.VLLM_BUDGET_RULE:
        chunked, max_model_len = limit_kw["enable_chunked_prefill"], limit_kw["max_model_len"]
        if not chunked and mnbt_explicit is None and cls.NO_CHUNK_BUDGET is not None:
            limit_kw["max_num_batched_tokens"] = max(max_model_len, cls.NO_CHUNK_BUDGET)  # engines.md §1.1
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
        if cfg.hardware.profile != "auto":  # a profile calibrates the roofline; a constant step reads none
            raise ConfigError(f"[hardware] profile = {cfg.hardware.profile!r} applies to the roofline cost model "
                              "only (this run's is \"constant\"); allowed: leave it out, or a roofline cost_model "
                              "(a sweep over engine.cost_model keeps a shared profile for its roofline points)")
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


def profile_notes(cfgs: typing.Iterable[RunConfig]) -> list[str]:
    """One line for each [hardware] profile that was measured on another card than the run's: allowed (a
    stand-in for a card with no fit of its own), but said, as its efficiencies and fixed costs are that
    card's. ``cfgs``: the runs' configs (a cluster's replicas), each pair of profile and card said once."""
    from sim.cost.hardware import device_gpu

    out: list[str] = []
    for cfg in cfgs:
        hw = cfg.hardware
        if hw.profile in ("auto", "prior") or cfg.engine.cost_model == "constant":
            continue  # the card's own profile, or none read
        gpu = get_gpu(hw.gpu)
        measured = get_profile(gpu, hw.profile).gpu
        if measured in (gpu.name, "generic") or device_gpu(measured) == gpu.name:
            continue
        note = (f"[hardware] profile = {hw.profile!r} was measured on the {measured}, not on this run's {gpu.name}: "
                f"its efficiencies and fixed costs stand in for the {gpu.name}'s")
        if note not in out:
            out.append(note)
    return out
