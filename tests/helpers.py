"""Small builders shared by the policy and engine tests."""

from __future__ import annotations

from policies.base import PolicyLimits, StepPlan
from sim.core.request import Request, RequestSpec


def limits(**kw) -> PolicyLimits:
    base = dict(
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=8192,
        block_size=16,
        num_gpu_blocks=1000,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
    )
    base.update(kw)
    return PolicyLimits(**base)


def req(rid: str, prompt: int, output: int, t: float = 0.0, priority: int = 0, **kw) -> Request:
    return Request(RequestSpec(request_id=rid, arrival_time=t, prompt_len=prompt, output_len=output,
                               priority=priority, **kw))


def step(policy, now: float = 0.0) -> StepPlan:
    """One engine step without the engine: schedule, then apply the outcome at once."""
    plan = policy.schedule(now)
    for r in plan.sampled:
        if r.first_token_time is None:
            r.first_token_time = now
        r.last_token_time = now
    policy.update(plan, now)
    return plan


def sched(plan: StepPlan) -> list[tuple[str, int]]:
    return [(r.request_id, n) for r, n in plan.scheduled]


def add(policy, *reqs: Request, t: float = 0.0) -> None:
    """Queue requests that must be accepted."""
    for r in reqs:
        reason = policy.add_request(r, t)
        assert reason is None, reason


def ids(reqs) -> list[str]:
    return [r.request_id for r in reqs]


def assert_same_steps(a, b) -> None:
    """Two step frames (fast-forwarded vs step by step) agree in every column: counts exactly,
    times and fractions to 1e-9."""
    import numpy as np

    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":
            assert np.allclose(x, y, rtol=1e-9, atol=1e-12), col
        else:
            assert (x == y).all(), col


def small_toml(num_requests: int = 40, max_output: int = 120) -> str:
    """A small run config (Mistral-7B on an RTX 4090, Poisson at 4 req/s) for the CLI tests."""
    return f"""
[model]
name = "Mistral-7B"
[hardware]
gpu = "RTX 4090"
[engine]
max_model_len = 4096
[workload]
arrival = "poisson"
rate = 4.0
num_requests = {num_requests}
prompt = {{ dist = "uniform", low = 100, high = 900 }}
output = {{ dist = "uniform", low = 10, high = {max_output} }}
[slo]
ttft_ms = 500
"""
