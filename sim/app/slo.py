"""Latency SLOs: the ``[slo]`` keys and vLLM's ``NAME:MS`` command-line pairs, all in milliseconds.

``<metric>_ms`` is a per-request limit (``vllm bench serve --goodput ttft:1000``: a request is good when
every given metric is within it); ``p<q>_<metric>_ms`` (vLLM's summary key, e.g. ``p99_ttft_ms``) is
"the run's q-th percentile of the metric <= target". Seconds appear only where a name says ``_s``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from numbers import Real

from sim.core.errors import ConfigError
from sim.core.fields import int_digits

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")

# ---- SLOs -----------------------------------------------------------------------------------------------
# Every latency SLO is in milliseconds, as ``vllm bench serve --goodput ttft:1000`` takes it:
# ``<metric>_ms`` per request, ``p<q>_<metric>_ms`` for "the q-th percentile <= target" (vLLM's summary
# key, e.g. p99_ttft_ms). The seconds spelling ``<metric>_p<q>`` of earlier versions is refused, naming the
# new key and the converted value.
_PCT_METRICS = (*LATENCY_METRICS, "queue_time")
_PCT_SLO = re.compile(rf"^p(\d+(?:\.\d+)?)_({'|'.join(_PCT_METRICS)})_ms$")
_OLD_PCT_SLO = re.compile(rf"^({'|'.join(_PCT_METRICS)})_p(\d+(?:\.\d+)?)$")
_SLO_HELP = ("ttft_ms, tpot_ms, itl_ms, e2el_ms (per request) or p<q>_<ttft|tpot|itl|e2el|queue_time>_ms "
             "(percentile), e.g. p99_ttft_ms; all in milliseconds")


def _ms_text(seconds: float) -> str:
    return f"{seconds * 1000.0:.6g}"


def parse_slo(
    slo: Mapping[str, float] | None,
) -> tuple[dict[str, float], dict[str, tuple[str, float, float]]]:
    """Split an SLO dict into per-request limits (converted to seconds, the unit of the request columns)
    and percentile targets ``key -> (metric, q, target_ms)``.

    ``ttft_ms``/``tpot_ms``/``e2el_ms``/``itl_ms``: per request, as ``vllm bench --goodput ttft:1000``.
    ``p<q>_<metric>_ms`` (e.g. ``p99_ttft_ms = 1000``): "the q-th percentile of the metric <= value ms",
    met or not over the whole run. A request's ITL limit applies to its mean gap, which is its TPOT.
    """
    if slo is not None and not isinstance(slo, Mapping):
        raise ConfigError(f"SLOs: expected a dict of [slo] keys (e.g. {{'p99_ttft_ms': 1000}}), got "
                          f"{type(slo).__name__}")
    per_request: dict[str, float] = {}
    pct: dict[str, tuple[str, float, float]] = {}
    for key, raw in (slo or {}).items():
        if not isinstance(key, str):
            raise ConfigError(f"[slo] key {key!r}: expected a name, {_SLO_HELP}")
        old = _OLD_PCT_SLO.match(key)
        # a number, as TOML gives it (numpy's too); not a bool (True would be a 1 ms SLO) or a string
        if isinstance(raw, bool) or not isinstance(raw, Real):
            raise ConfigError(f"[slo] {key}: expected a number of milliseconds, got {raw!r}")
        try:
            value = float(raw)
        except OverflowError:  # an integer past any float
            raise ConfigError(f"[slo] {key}: expected a finite number of milliseconds, got an integer of "
                              f"{int_digits(int(raw))} digits") from None
        if old:
            raise ConfigError(
                f"[slo] {key} = {raw} (seconds) is now p{old.group(2)}_{old.group(1)}_ms = {_ms_text(value)}: "
                "every latency SLO is in milliseconds"
            )
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"[slo] {key}: must be a finite number of milliseconds >= 0, got {raw!r}")
        m = _PCT_SLO.match(key)
        if key.endswith("_ms") and key[:-3] in LATENCY_METRICS:
            per_request[key[:-3]] = value / 1000.0
        elif m and 0 <= float(m.group(1)) <= 100:
            metric, q = m.group(2), float(m.group(1))
            same = next((k for k, (mm, qq, _) in pct.items() if mm == metric and qq == q), None)
            if same is not None:  # p99 / p99.0 / p099: one percentile, two targets
                raise ConfigError(f"[slo] {key} and {same}: both name the {q:g}th percentile of {metric}; "
                                  "allowed: one key per percentile")
            pct[key] = (metric, q, value)
        elif key.endswith("_s") and key[:-2] in LATENCY_METRICS:
            raise ConfigError(f"[slo] {key} = {raw!r}: SLOs are in milliseconds, use {key[:-2]}_ms = "
                              f"{_ms_text(value)}")  # fmt: skip
        else:
            raise ConfigError(f"[slo] unknown SLO key {key!r}: use {_SLO_HELP}")
    return per_request, pct


def slo_from_args(pairs: Sequence[str], flag: str = "--slo", percentiles: bool = True) -> dict[str, float]:
    """vLLM's ``NAME:MS`` pairs (``vllm bench serve --goodput ttft:1000 tpot:50``) -> ``[slo]`` keys:
    ``ttft:1000`` -> ``ttft_ms = 1000``, ``p99_ttft:1000`` -> ``p99_ttft_ms = 1000`` (with ``percentiles``).
    The old ``KEY=VALUE`` spelling is refused with the new one (seconds converted to ms)."""
    out: dict[str, float] = {}
    allowed = "ttft, tpot, itl, e2el" + (" or p<q>_<metric> (e.g. p99_ttft, p90_queue_time)" if percentiles else "")
    for pair in pairs:
        name, sep, text = pair.partition(":")
        name = name.strip()
        if not sep and "=" in pair:
            key, _, val = pair.partition("=")
            raise ConfigError(f"{flag} {pair!r}: {_new_spelling(key.strip(), val.strip(), flag, percentiles)}")
        if not sep or not name or not text.strip():
            raise ConfigError(f"{flag} {pair!r}: expected NAME:MS, e.g. ttft:1000 (NAME is {allowed})")
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{flag} {pair!r}: {text.strip()!r} is not a number of milliseconds") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} {pair!r}: the target must be a positive number of ms, got {text.strip()}")
        m = _PCT_SLO.match(f"{name}_ms")
        if name in LATENCY_METRICS or (percentiles and m and 0 <= float(m.group(1)) <= 100):
            if f"{name}_ms" in out and out[f"{name}_ms"] != value:  # the later one would silently win
                raise ConfigError(f"{flag} {pair!r}: {name} is already {out[f'{name}_ms']:g} ms; allowed: one "
                                  "target per name")
            out[f"{name}_ms"] = value
        else:
            raise ConfigError(f"{flag} {pair!r}: unknown SLO name {name!r}; expected {allowed}, as NAME:MS")
    parse_slo(out)
    return out


def _new_spelling(key: str, val: str, flag: str, percentiles: bool = True) -> str:
    """What an old ``KEY=VALUE`` SLO is now written as (percentiles were seconds, now ms)."""
    old = _OLD_PCT_SLO.match(key)
    try:
        num = float(val)
    except ValueError:
        num = None
    if old and num is not None and not percentiles:
        return (f"{flag} takes per-request targets as NAME:MS (ttft, tpot, itl, e2el), e.g. {flag} ttft:1000; a "
                f"percentile target goes in [slo] (p{old.group(2)}_{old.group(1)}_ms)")
    if old and num is not None:
        return f"{key}={val} (seconds) is now {flag} p{old.group(2)}_{old.group(1)}:{_ms_text(num)} (milliseconds)"
    if key.endswith("_ms"):
        return f"SLOs are now NAME:MS as in vllm bench --goodput: {flag} {key[:-3]}:{val}"
    if not percentiles:  # --goodput takes per-request targets only
        return f"SLOs are NAME:MS as in vllm bench --goodput, e.g. {flag} ttft:1000 tpot:50"
    return f"SLOs are now NAME:MS as in vllm bench --goodput, e.g. {flag} ttft:1000 or {flag} p99_ttft:1000"


def slo_from_goodput_args(pairs: Sequence[str]) -> dict[str, float]:
    """``["ttft:1000", "tpot:50"]`` (vllm bench ``--goodput``, per request, ms) -> ``{"ttft_ms": 1000.0, ...}``."""
    return slo_from_args(pairs, flag="--goodput", percentiles=False)
