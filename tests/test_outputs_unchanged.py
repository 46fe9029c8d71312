"""A run's tables are what they were before the memory work (compact step store, finished requests
leaving the engine, requests.parquet streamed): digests of the requests and steps frames (values, dtypes,
columns, row order), the inter-token gaps and the summary, pinned from main before the merge (065b59d)
on configs that reach every path: one engine, a cluster with pools, a P/D cluster, swap preemption (vLLM V0), client
timeouts under static batching, async scheduling and llama.cpp's slots, shared prefixes. Engine-side tables:
vLLM's default [frontend] (which adds client-side columns, tests/test_frontend.py) is off here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
TIMEOUTS = {"num_requests": 60, "rate": 40.0, "prompt": {"dist": "uniform", "low": 50, "high": 400},
            "output": {"dist": "uniform", "low": 50, "high": 300}, "client_timeout_s": 2.0}  # fmt: skip
SMALL = {"max_model_len": 1024, "cost_model": "constant", "constant_step_s": 0.02}


def _single(raw: dict[str, Any]) -> Any:
    from sim.app.config import config_from_dict
    from sim.app.simulate import simulate

    return simulate(config_from_dict({"frontend": None, **raw}))  # engine-side tables, as pinned


def _quickstart() -> Any:
    from sim.app.config import load_config
    from sim.app.simulate import simulate

    return simulate(load_config(EX / "quickstart.toml", ["workload.num_requests=300", "frontend.enabled=false"]))


def _cluster(name: str, variant: str, n: int) -> Any:
    from sim.app.cluster import simulate_cluster

    # the H100 examples at the batch limits they were pinned with (vLLM's H100 defaults, 8192 / 1024 since
    # 2026-12-06, change the runs by design: tests/test_bad_inputs_round9.py)
    return simulate_cluster(EX / name, variant=variant,
                            overrides=[f"workload.num_requests={n}", "frontend.enabled=false",
                                       "engine.max_num_seqs=256", "engine.max_num_batched_tokens=2048"])


CASES = {
    "quickstart": _quickstart,
    "cluster_pools": lambda: _cluster("cluster_pools.toml", "long-short", 300),
    "cluster_disagg": lambda: _cluster("cluster_disagg.toml", "1p3d", 150),
    "vllm_v0_swap": lambda: _single({
        "engine": {"preset": "vllm-v0", "preemption_mode": "swap", "num_gpu_blocks_override": 120,
                   "max_model_len": 1024, "cost_model": "constant"},
        "workload": {"num_requests": 30, "rate": 50.0, "prompt": {"dist": "fixed", "value": 200},
                     "output": {"dist": "fixed", "value": 200}}}),  # fmt: skip
    "static_timeout": lambda: _single({"engine": {"preset": "static", **SMALL, "num_gpu_blocks_override": 120,
                                                  "max_num_seqs": 8}, "workload": dict(TIMEOUTS)}),  # fmt: skip
    "async_timeout": lambda: _single({"engine": {"preset": "vllm", "async_scheduling": True, **SMALL,
                                                 "num_gpu_blocks_override": 120, "max_num_seqs": 8},
                                      "workload": dict(TIMEOUTS)}),  # fmt: skip
    "llamacpp_timeout": lambda: _single({"engine": {"preset": "llamacpp", **SMALL, "n_parallel": 4, "n_ctx": 4096},
                                         "workload": dict(TIMEOUTS)}),  # fmt: skip
    "shared_prefix": lambda: _single({
        "model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
        "engine": {"policy": "vllm", "max_num_seqs": 32, "num_gpu_blocks_override": 400, "max_model_len": 4096},
        "workload": {"num_requests": 150, "rate": 6.0, "shared_prefix": {"num_groups": 3, "prefix_len": 100},
                     "prompt": {"dist": "uniform", "low": 20, "high": 900},
                     "output": {"dist": "uniform", "low": 4, "high": 200}}}),  # fmt: skip
}


def frame_digest(frame: pd.DataFrame) -> str:
    """Values (row order included), column names and dtypes."""
    h = hashlib.sha256(pd.util.hash_pandas_object(frame, index=True).values.tobytes())
    h.update(repr([(c, str(t)) for c, t in frame.dtypes.items()]).encode())
    return h.hexdigest()[:16]


def itl_digest(res: Any) -> str:
    """The inter-token gaps as a weighted sample: each distinct gap with its total weight. The sample's
    order, and which equal gaps share one weight, follow where decode runs start and end (a cluster
    replica's runs going on past finishes changes both, not one gap)."""
    values, inverse = np.unique(np.asarray(res.itl_values, dtype=np.float64), return_inverse=True)
    weights = np.zeros(len(values), dtype=np.int64)
    np.add.at(weights, inverse.ravel(), np.asarray(res.itl_weights, dtype=np.int64))
    return hashlib.sha256(values.tobytes() + weights.tobytes()).hexdigest()[:16]


def result_digests(res: Any) -> dict[str, str]:
    from sim.app.results import summarize

    s = summarize(res)
    s["meta"].pop("wall_time_s", None)
    s["meta"].pop("num_clipped", None)  # reported since 2026-12-02 (the pins predate it)
    s.pop("num_clipped", None)
    if s.get("config", {}).get("frontend") == {"enabled": False}:  # a cluster echoes the override (pins predate it)
        del s["config"]["frontend"]
    return {"requests": frame_digest(res.requests), "steps": frame_digest(res.steps), "itl": itl_digest(res),
            "summary": hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:16]}  # fmt: skip


PINNED: dict[str, dict[str, str]] = {  # python tests/test_outputs_unchanged.py, PYTHONPATH=a checkout of 065b59d
    # (main before the memory work merged. The helper's first pins, from bb115d8, had the same tables where a
    # config sets its loop; the vllm configs that do not ran synchronously there: async became the default).
    # 'itl' is the weighted sample (itl_digest), pinned from 675aec1, whose other three digests are these.
    'async_timeout': {'requests': '3383b0c518eaabdf', 'steps': '87698ed56eb1a8de', 'itl': '78ec2834fa7faf96', 'summary': '322f6a15142ff87e'},
    'cluster_disagg': {'requests': '72f44406a5a3c2b4', 'steps': 'c9e55b924274c4dc', 'itl': '0b889cf0eb90930d', 'summary': 'b826941af1dbcc59'},
    # the clusters' summaries: re-pinned 2026-12-06, their config echo holds the two batch limits _cluster now
    # sets (the rest of the summary and the three tables are the 065b59d pins)
    # shared_prefix and cluster_pools' summaries: re-pinned 2026-12-06 (issue 12 item 1, async runs that go on
    # through arrivals, sim/engine/chain.py): the same gaps in another order, so mean_itl_ms / std_itl_ms
    # (a pairwise sum in the sample's order) moved in their last bit (12.618925382634828 vs ...83, 10.0387016892568
    # 04 vs ...06; std 6.287687566175627 vs ...28); their tables and gap samples (itl) are the 065b59d pins
    'cluster_pools': {'requests': '78a6b37ea072917a', 'steps': 'b876b4d348204f56', 'itl': '795010c075766a13', 'summary': '0dfe587d24ed83bc'},
    'llamacpp_timeout': {'requests': 'e804ee570a90a609', 'steps': 'e09b0719b02b10c1', 'itl': '244f17959d4636e9', 'summary': '11116ef44308f93a'},
    'quickstart': {'requests': 'bc14be6755ee0fbc', 'steps': 'd226775244300262', 'itl': 'e35d4b80df0e3b05', 'summary': 'c7dbf3e89eb50dac'},
    'shared_prefix': {'requests': 'aeb1d119ca31b922', 'steps': '700f4b7279a02a6e', 'itl': 'ed14b0d96573f4f1', 'summary': '670a5d8547b88eeb'},
    'static_timeout': {'requests': 'dc36f659c7cfb9de', 'steps': '83223ef7dba625dd', 'itl': '4184a6aac62b71c9', 'summary': '63c3517ec1df7809'},
    'vllm_v0_swap': {'requests': 'fb892074ffc508c1', 'steps': 'fc8f4ee042a09c76', 'itl': '107216f3f5a9a0d5', 'summary': '650276ad35ddaa5e'},
}  # fmt: skip


@pytest.mark.parametrize("sweep_min", [None, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_tables_match_main(case: str, sweep_min: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sweep_min``: the engine moves finished requests to its row log every few arrivals (by default
    only past 4096 held requests, more than these runs have)."""
    if sweep_min is not None:
        from sim.engine import loop

        monkeypatch.setattr(loop, "SWEEP_MIN", sweep_min)
    assert result_digests(CASES[case]()) == PINNED[case]


if __name__ == "__main__":  # print the digests of the code on the path (run once on main to pin them)
    print(json.dumps({c: result_digests(f()) for c, f in sorted(CASES.items())}, indent=1))
