"""Lazy workloads: open and closed loops generated a chunk at a time are the same requests, bit for bit,
as drawing them all at once; a horizon bounds the work however many requests the workload names; the
requests that never came are counted when they are too many to list."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.app.config import config_from_dict
from sim.app.results import summarize
from sim.app.simulate import simulate
from sim.core.errors import ConfigError
from workloads.gen.arrivals import ArrivalConfig, ArrivalStream
from workloads.gen.draws import Drawer
from workloads.synthetic import build_workload, spawn_streams

ARRIVALS = [
    ArrivalConfig("poisson", 2.0),
    ArrivalConfig("poisson", 2.0, 1.0, False),
    ArrivalConfig("gamma", 3.0, 0.3),
    ArrivalConfig("gamma", 1.5, 4.0),
    ArrivalConfig("gamma", 3.0, float("inf")),
    ArrivalConfig("constant", 4.0),
    ArrivalConfig("poisson", float("inf")),
]
TABLE = {
    "num_requests": 2500,
    "prompt": {"dist": "uniform", "low": 10, "high": 900},
    "output": {"dist": "lognormal", "mean": 100, "std": 80},
    "shared_prefix": {"num_groups": 3, "prefix_len": 64},
    "priority": {"levels": [0, 1], "weights": [0.7, 0.3]},
}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ARRIVALS), st.integers(1, 3000), st.lists(st.integers(1, 700), min_size=1, max_size=20),
       st.integers(0, 2**32 - 1))  # fmt: skip
def test_arrival_chunks_equal_one_draw(arrivals, n, sizes, seed):
    whole = arrivals.sample(n, np.random.default_rng(seed))
    stream, parts, i = ArrivalStream(arrivals, n, np.random.default_rng(seed)), [], 0
    while stream.done < n:
        parts.append(stream.take(sizes[i % len(sizes)]))
        i += 1
    assert np.array_equal(np.concatenate(parts), whole)


def _eager(table, seed, max_model_len):
    """The requests drawn all at once, as servesim did before workloads became lazy."""
    streams = spawn_streams(seed)
    arrivals = ArrivalConfig(table.get("arrival", "poisson"), table.get("rate", 2.0))
    times = arrivals.sample(table["num_requests"], streams["arrivals"])
    d = Drawer(table, "workload", max_model_len, None).draw(table["num_requests"], streams)
    return d.specs(0, times.tolist()), d.num_clipped


@pytest.mark.parametrize("max_model_len", [None, 512])
def test_open_workload_chunks_equal_one_draw(max_model_len):
    table = dict(TABLE, rate=2.0)
    want, clipped = _eager(table, 7, max_model_len)
    w = build_workload(table, seed=7, max_model_len=max_model_len)
    for size in (1, 333, 4096, 10**6):
        assert [s for c in w.chunks(size) for s in c] == want
    assert w.specs == want
    assert w.num_clipped == clipped and (clipped > 0) == (max_model_len is not None)


def test_closed_workload_is_the_same_in_any_order():
    table = dict(TABLE, kind="closed", num_clients=4, think_time=0.5, think_dist="exponential")
    table["num_requests"] = 9000  # three chunks
    a, b = build_workload(table, seed=3), build_workload(table, seed=3)
    forward = [(a.spec(i, 0, 0.0), a.think_time(i)) for i in range(9000)]
    order = list(range(8999, -1, -97)) + [0, 8999, 4096, 4095]  # backwards: every step rewinds
    assert all((b.spec(i, 0, 0.0), b.think_time(i)) == forward[i] for i in order)
    assert a.prompt_lens.tolist() == [s.prompt_len for s, _ in forward]
    assert len({t for _, t in forward}) > 1000  # exponential think times, drawn per request


def _cfg(**workload):
    return config_from_dict({
        "model": {"name": "Llama-3.1-8B"},
        "hardware": {"gpu": "A100 80GB"},
        "engine": {"max_num_seqs": 64},
        "workload": {"prompt": {"dist": "uniform", "low": 100, "high": 900}, "output": 64, **workload},
        "simulation": {"horizon": 20.0},
    })


@pytest.mark.parametrize("workload", [
    {"rate": 4.0, "num_requests": 5_000_000},
    {"arrival": "gamma", "burstiness": 0.5, "rate": 4.0, "num_requests": 3_000_000},
    {"kind": "closed", "num_clients": 8, "num_requests": 50_000_000},
])  # fmt: skip
def test_a_horizon_bounds_a_huge_workload_and_the_counts_add_up(workload):
    res = simulate(_cfg(**workload))
    s = summarize(res)
    n = workload["num_requests"]
    assert len(res.requests) < 1000  # only what arrived is a row
    assert s["num_requests"] == s["num_prompts"] == n
    parts = ("num_finished", "num_rejected", "num_timed_out", "num_in_flight", "num_not_arrived")
    assert sum(s[k] for k in parts) == n
    assert s["num_finished"] > 20 and res.meta["num_unlisted"] == s["num_not_arrived"]


def test_a_huge_workload_needs_a_horizon():
    cfg = _cfg(rate=4.0, num_requests=2_000_000)
    from dataclasses import replace

    with pytest.raises(ConfigError, match="num_requests: 2000000 requests need simulation.horizon"):
        simulate(replace(cfg, simulation=replace(cfg.simulation, horizon=None)))


def test_a_listed_run_with_a_horizon_is_unchanged_by_laziness():
    """Below MAX_LISTED the requests that never came are still rows, with their would-be arrival times,
    and they are the workload's own requests."""
    cfg = _cfg(rate=4.0, num_requests=400)
    res = simulate(cfg)
    late = res.requests[res.requests["status"] == "not_arrived"]
    assert len(res.requests) == 400 and len(late) > 200
    assert (late["arrival_time"] > 20.0).all() and res.meta["num_unlisted"] == 0
    specs = build_workload(dict(cfg.workload), seed=cfg.simulation.seed,
                           max_model_len=int(res.meta["limits"]["max_model_len"])).specs  # fmt: skip
    got = res.requests.set_index("request_id")["send_time"]  # vllm's [frontend]: the client's send
    assert all(got[s.request_id] == s.arrival_time for s in specs)


def test_a_run_reports_the_requests_its_workload_cut_to_fit():
    """Lengths drawn past max_model_len are cut (the prompt first): the run says how many, in the summary
    (``num_clipped``) and its printed digest, instead of silently simulating 1-token outputs."""
    from sim.app.config import config_from_dict
    from sim.app.results import summarize
    from sim.app.simulate import format_summary, simulate

    raw = {"model": {"name": "Mistral-7B"}, "hardware": {"gpu": "RTX 4090"},
           "engine": {"policy": "vllm", "max_model_len": 2048},
           "workload": {"rate": 2.0, "num_requests": 12, "prompt": {"dist": "uniform", "low": 100, "high": 4000},
                        "output": 20}}  # fmt: skip
    res = simulate(config_from_dict(raw))
    s = summarize(res)
    cut = res.requests["output_len"] < 20  # every cut request loses output tokens (a prompt keeps 2047)
    assert s["num_clipped"] == int(cut.sum()) > 0 and res.requests.loc[cut, "prompt_len"].max() == 2047
    assert "cut to fit max_model_len 2048" in format_summary(s, res)
    raw["workload"]["prompt"] = {"dist": "uniform", "low": 100, "high": 1000}
    assert "num_clipped" not in summarize(simulate(config_from_dict(raw)))
