"""What a run's deployment costs: its GPUs × their hourly price (sim/app/prices.py), over the tokens it
served, as flat summary keys beside vLLM's.

* ``cost_per_hour``: every GPU the deployment holds (TP ranks; a card shared by instances counts once),
  whole cards whatever their ``gpu_memory_utilization``.
* ``cost_per_1m_output_tokens`` / ``cost_per_1m_total_tokens``: ``cost_per_hour`` over the achieved
  ``output_throughput`` / ``total_token_throughput`` (tokens/s × 3600), × 10⁶: the price of a million tokens
  if the deployment ran all hour as it ran here.
* ``cost_per_1m_goodput_tokens``: the same over the output tokens of requests that met the SLOs: with
  per-request SLOs (``ttft_ms`` ...) the good requests' tokens; with percentile SLOs only, all tokens when
  every percentile target is met and none otherwise (then None: no goodput). None without SLOs.
* ``cost``: currency, GPUs and each price with its source and date, the run's own cost, the monthly figure.

A card without a price (and no ``[cost]`` entry for it) leaves these None with the reason in ``cost``:
a run is never refused for a missing price.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sim.app.prices import CostConfig, GpuPrice, cost_from_dict, gpu_hour_price
from sim.core.errors import ConfigError

COST_KEYS = ("cost_per_hour", "cost_per_1m_output_tokens", "cost_per_1m_total_tokens", "cost_per_1m_goodput_tokens")


def deployment_gpus(meta: Mapping[str, Any]) -> dict[str, int]:
    """GPU name -> how many the run held: per replica its TP ranks, a shared ``device`` once."""
    if not meta.get("cluster"):
        plan = meta.get("memory_plan") or {}
        return {str(meta.get("gpu")): int(plan.get("tensor_parallel_size", 1))} if meta.get("gpu") else {}
    counts: dict[str, int] = {}
    seen: set[str] = set()
    for r in meta.get("replicas") or []:
        dev = r.get("device")
        if dev is not None:
            if dev in seen:
                continue
            seen.add(dev)
        counts[r["gpu"]] = counts.get(r["gpu"], 0) + int(r.get("tensor_parallel_size", 1))
    return counts


def per_million(cost_per_hour: float | None, tokens_per_s: float | None) -> float | None:
    """Cost of 10⁶ tokens at ``tokens_per_s`` for a deployment costing ``cost_per_hour``."""
    if cost_per_hour is None or not tokens_per_s or tokens_per_s <= 0:
        return None
    return cost_per_hour / (tokens_per_s * 3600.0) * 1e6


def cost_summary(
    config: Mapping[str, Any], meta: Mapping[str, Any], summary: Mapping[str, Any], good_output_tokens: int | None
) -> dict[str, Any]:
    """The cost keys of a summary (module doc); ``good_output_tokens``: output tokens of the requests
    that met the per-request SLOs (None when there are none)."""
    out: dict[str, Any] = dict.fromkeys(COST_KEYS)
    try:
        cfg: CostConfig = cost_from_dict(config.get("cost")) or CostConfig()
        gpus = deployment_gpus(meta)
        prices: dict[str, GpuPrice] = {g: gpu_hour_price(cfg, g) for g in gpus}
    except ConfigError as e:
        out["cost_currency"] = None
        out["cost"] = {"error": str(e)}
        return out
    if not gpus:
        out["cost_currency"], out["cost"] = cfg.unit, {"error": "no GPU recorded for this run"}
        return out
    per_hour = sum(n * prices[g].per_hour for g, n in gpus.items())
    duration = float(summary.get("duration") or 0.0)
    goodput_tps, basis = _goodput(summary, good_output_tokens, duration)
    out.update(
        cost_per_hour=per_hour,
        cost_per_1m_output_tokens=per_million(per_hour, summary.get("output_throughput")),
        cost_per_1m_total_tokens=per_million(per_hour, summary.get("total_token_throughput")),
        cost_per_1m_goodput_tokens=per_million(per_hour, goodput_tps),
    )
    out["cost_currency"] = cfg.unit
    out["cost"] = {
        "currency": cfg.unit,
        "num_gpus": sum(gpus.values()),
        "gpus": [{**prices[g].to_dict(), "count": n} for g, n in gpus.items()],
        "per_month": per_hour * cfg.hours_per_month,
        "hours_per_month": cfg.hours_per_month,
        "run_cost": per_hour * duration / 3600.0,
        "goodput_basis": basis,
    }
    return out


def _goodput(summary: Mapping[str, Any], good_tokens: int | None, duration: float) -> tuple[float | None, str]:
    if good_tokens is not None:
        return (good_tokens / duration if duration > 0 else None), "output tokens of requests meeting the SLOs"
    checks = summary.get("slo_checks")
    if checks:
        if all(c.get("met") for c in checks.values()):
            return summary.get("output_throughput"), "all output tokens (every percentile SLO met)"
        return None, "none (a percentile SLO missed)"
    return None, "no SLO given"
