"""Fuzzing the edges: random configs (a valid one with keys replaced, added or removed, values of any
JSON/TOML type, NaN, inf, huge and negative numbers) and random trace rows must end in a ServesimError or
a valid result, never another exception. ``SERVESIM_FUZZ_EXAMPLES`` scales the example counts (the
defaults add up to 10,000 examples; the note of issue 13 quotes a run)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.app.config import config_from_dict
from sim.app.simulate import resolve, simulate
from sim.app.streams import check_listable
from sim.core.errors import ServesimError
from workloads.synthetic import build_workload
from workloads.tracefmt import load_trace

SCALE = float(os.environ.get("SERVESIM_FUZZ_EXAMPLES", "1"))


def _n(k: int) -> int:
    return max(1, int(k * SCALE))


NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, 2**31, 2**63, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, 1e300, math.nan, math.inf]),
)  # fmt: skip
SCALARS = st.one_of(NUMBERS, st.booleans(), st.text(max_size=12), st.none())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=8)

BASE = {
    "model": {"name": "Llama-3.1-8B", "dtype": "bf16"},
    "hardware": {"gpu": "A100 80GB", "tensor_parallel_size": 1},
    "engine": {"policy": "vllm", "max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": 4096,
               "gpu_memory_utilization": 0.9, "block_size": 16, "enable_prefix_caching": True},
    "workload": {"arrival": "poisson", "rate": 4.0, "num_requests": 20,
                 "prompt": {"dist": "lognormal", "mean": 300, "std": 200, "max": 2000},
                 "output": {"dist": "uniform", "low": 4, "high": 60},
                 "shared_prefix": {"num_groups": 2, "prefix_len": 64}},
    "simulation": {"seed": 0, "horizon": 30.0},
    "slo": {"ttft_ms": 500},
}  # fmt: skip
KEYS = {sec: list(tab) for sec, tab in BASE.items()}
EXTRA_KEYS = {
    "engine": ["policy", "preset", "scheduling_policy", "kv_cache_dtype", "num_gpu_blocks_override", "max_waiting",
               "queue_timeout_s", "async_scheduling", "watermark", "cost_model", "constant_step_s", "overhead_gib",
               "enable_chunked_prefill", "n_parallel", "chunk_size", "max_batch_size", "preemption_mode"],
    "workload": ["kind", "burstiness", "rescale", "num_clients", "think_time", "think_dist", "priority",
                 "client_timeout_s", "num_sessions", "turns", "message", "trace", "too_long"],
    "hardware": ["profile"],
    "simulation": ["num_requests", "record_step_trace"],
    "slo": ["tpot_ms", "p99_ttft_ms", "p50_e2el_ms", "itl_ms", "p90_queue_time_ms", "ttft_p99"],
}  # fmt: skip
ENUMS = {
    "policy": ["vllm", "vllm-v0", "trtllm", "tgi", "orca", "sarathi", "static", "hf-static", "llamacpp", "ollama",
               "nope"],
    "kind": ["open", "closed", "sessions", "trace", "weird"], "arrival": ["poisson", "gamma", "constant", "x"],
    "dist": ["fixed", "uniform", "normal", "lognormal", "empirical", "zipf"],
    "name": ["Llama-3.1-8B", "Mixtral-8x7B", "Llama-3.1-70B", "nope"], "gpu": ["A100 80GB", "RTX 4090", "T4", "x"],
}  # fmt: skip


@st.composite
def mutated_configs(draw):
    """BASE with 1-4 edits: a value replaced (by anything, or by another enum choice), a key added
    from the section's vocabulary, a key or a section removed, or a section replaced by a scalar."""
    raw = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(1, 3))):
        sec = draw(st.sampled_from(sorted(raw) * 6 + ["frontend", "bogus"]))  # mostly the known sections
        op = draw(st.sampled_from(["replace"] * 4 + ["add"] * 3 + ["remove", "section"]))
        table = raw.setdefault(sec, {}) if sec not in ("bogus",) or op != "remove" else {}
        if op == "section":
            raw[sec] = draw(SCALARS)
            continue
        if not isinstance(table, dict):
            continue
        if op == "remove" and table:
            table.pop(draw(st.sampled_from(sorted(table))))
            continue
        keys = (KEYS.get(sec, []) + EXTRA_KEYS.get(sec, [])) * 4 + ["zzz"]
        key = draw(st.sampled_from(keys))
        if key in ENUMS and draw(st.integers(0, 3)):
            table[key] = draw(st.sampled_from(ENUMS[key]))
        elif key in ("prompt", "output", "message", "turns") and draw(st.booleans()):
            table[key] = {"dist": draw(st.sampled_from(ENUMS["dist"])),
                          draw(st.sampled_from(["value", "low", "high", "mean", "std", "min", "max"])): draw(NUMBERS)}
        elif draw(st.booleans()):
            table[key] = draw(NUMBERS)  # the numbers that reach int() and numpy
        else:
            table[key] = draw(VALUES)
    return raw


def _check(raw) -> None:
    """Validate ``raw`` as a run does before its clock starts; only a ServesimError may escape."""
    try:
        cfg = config_from_dict(raw)
        setup = resolve(cfg)
        wl = dict(cfg.workload)
        wl.pop("client_timeout_s", None)
        w = build_workload(wl, seed=cfg.simulation.seed, max_model_len=setup.limits.max_model_len)
        check_listable(w, cfg.simulation.horizon)
    except ServesimError:
        return


SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])  # fmt: skip


@settings(max_examples=_n(6000), **SETTINGS)
@given(mutated_configs())
def test_random_configs_validate_or_fail_cleanly(raw):
    _check(raw)


@settings(max_examples=_n(150), **SETTINGS)
@given(mutated_configs())
def test_random_configs_that_validate_also_run(raw):
    """The valid ones run (small: the workload capped at 12 requests, horizon 5 s) and their counts add up."""
    raw.setdefault("simulation", {}) if isinstance(raw.get("simulation"), dict) else raw.update(simulation={})
    raw["simulation"].update(num_requests=12, horizon=5.0)
    try:
        res = simulate(config_from_dict(raw))
    except ServesimError:
        return
    from sim.app.results import summarize

    try:
        s = summarize(res, slo=res.config.get("slo") or None)
    except ServesimError:
        return
    parts = ("num_finished", "num_rejected", "num_timed_out", "num_in_flight", "num_not_arrived")
    assert sum(s[k] for k in parts) == s["num_requests"]


ROW_KEYS = ["request_id", "arrival_time", "prompt_len", "output_len", "segments", "hash_ids", "hash_block_size",
            "token_ids", "session_id", "priority", "timestamp", "input_length", "output_length", "input_toks",
            "output_toks", "arrival_time_ns", "zzz"]  # fmt: skip
GOOD_ROW = {"request_id": "a", "arrival_time": 0.5, "prompt_len": 40, "output_len": 8}
ROWS = st.one_of(
    st.dictionaries(st.sampled_from(ROW_KEYS), VALUES, max_size=6),
    st.builds(lambda k, v: {**GOOD_ROW, k: v}, st.sampled_from(ROW_KEYS), VALUES),
    VALUES,
)
_TMP = tempfile.TemporaryDirectory()
FORMATS = ["auto", "jsonl", "mooncake", "vllm-bench", "azure", "burstgpt", "token-counts", "sharegpt"]


@settings(max_examples=_n(3850), **SETTINGS)
@given(st.lists(ROWS, min_size=1, max_size=4), st.sampled_from(FORMATS), st.booleans(),
       st.sampled_from(["rows.jsonl", "rows.csv", "rows.json"]))  # fmt: skip
def test_random_trace_rows_load_or_fail_cleanly(rows, fmt, skip_bad, name):
    p = Path(_TMP.name) / name  # one folder for every example: the file is rewritten each time
    if name.endswith(".csv"):
        p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     + "".join(",".join(str(x) for x in (r.values() if isinstance(r, dict) else [r])) + "\n"
                               for r in rows))  # fmt: skip
    else:
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    opts = {"skip_bad_rows": True} if skip_bad else {}
    if fmt in ("vllm-bench", "sharegpt"):
        opts["rate"] = 2.0
    try:
        load_trace(p, format=fmt, **opts)
    except ServesimError:
        return
