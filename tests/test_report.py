"""HTML reports and plotly figures: self-contained, titled, one trace per thing they claim to show."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from sim.app.report import (
    fig_compare,
    fig_latency_cdf,
    fig_timeline,
    write_comparison_report,
    write_report,
)
from sim.app.results import SimResult, summarize

PLOTLY_BUNDLE = "* plotly.js v"  # header comment of the inlined bundle


def synthetic(n: int = 40, seed: int = 0, itl: float = 0.02) -> SimResult:
    """n finished requests with random latencies, and steps covering the run."""
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 10, n))
    first = arrival + rng.uniform(0.05, 0.5, n)
    n_out = rng.integers(1, 60, n)
    finish = first + (n_out - 1) * itl
    requests = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(n)], "replica": 0, "arrival_time": arrival,
        "queued_time": arrival, "scheduled_time": arrival + 0.01, "first_token_time": first,
        "finish_time": finish, "prompt_len": rng.integers(10, 500, n), "output_len": n_out,
        "num_output_tokens": n_out, "num_cached_tokens": 0, "num_preemptions": 0, "priority": 0,
        "status": "finished", "finish_reason": "length",
    })  # fmt: skip
    m = int(np.ceil(finish.max() / itl))
    start = np.arange(m) * itl
    steps = pd.DataFrame({
        "step": np.arange(m), "replica": 0, "start": start, "duration": itl,
        "num_prefill_tokens": rng.integers(0, 100, m), "num_decode_tokens": rng.integers(0, 30, m),
        "num_scheduled_tokens": 0, "num_running": rng.integers(0, 30, m), "num_waiting": rng.integers(0, 5, m),
        "num_preempted": 0, "num_finished": 0, "kv_usage": rng.uniform(0, 1, m), "num_free_blocks": 10,
    })  # fmt: skip
    return SimResult(requests, steps, np.array([itl]), np.array([int((n_out - 1).sum())]),
                     config={"policy": "vllm", "note": "<b>x</b>"})  # fmt: skip


def test_write_report_is_self_contained_and_titled(tmp_path):
    res = synthetic()
    s = summarize(res, slo={"ttft_p99": 0.3})
    path = write_report(res, tmp_path / "report.html", s, title="Llama <8B> on 4090")
    text = path.read_text()
    assert "Llama &lt;8B&gt; on 4090" in text and "<8B>" not in text
    assert text.count(PLOTLY_BUNDLE) == 1  # plotly.js inlined once, offline-safe
    assert not re.search(r"<script[^>]*\bsrc=", text)  # nothing fetched at view time
    assert text.count("Plotly.newPlot") >= 2  # timeline + CDFs
    assert "mean_ttft_ms" in text and "ttft_p99" in text
    assert "&lt;b&gt;x&lt;/b&gt;" in text  # config is escaped, not rendered


def test_timeline_figure_shares_x_axis():
    fig = fig_timeline(synthetic())
    names = [t.name for t in fig.data]
    assert names == ["KV usage", "running", "waiting", "prompt tok/s", "generation tok/s"]
    assert fig.data[1].xaxis == fig.data[2].xaxis == "x2"
    assert fig.layout.xaxis.matches == fig.layout.xaxis2.matches == "x3"  # one zoom for all three panels
    assert max(fig.data[0].y) <= 100


def test_latency_cdf_traces_end_at_one():
    res = synthetic(n=50)
    fig = fig_latency_cdf(res)
    assert len(fig.data) == 3
    for tr in fig.data:
        assert tr.y[-1] == pytest.approx(1.0) and np.all(np.diff(tr.x) >= 0)
    # TTFT panel: 50 finished requests, values in ms
    fin = res.requests
    assert len(fig.data[0].x) == 50
    assert fig.data[0].x[-1] == pytest.approx((fin.first_token_time - fin.arrival_time).max() * 1000)
    # TPOT skips one-token requests
    assert len(fig.data[1].x) == int((fin.num_output_tokens > 1).sum())
    assert len(fig_latency_cdf({"a": res, "b": synthetic(seed=1)}).data) == 6


def test_compare_figure_has_a_panel_per_metric():
    sums = {"fast": {"p99_ttft_ms": 10.0, "output_throughput": 900.0},
            "slow": {"p99_ttft_ms": 30.0, "output_throughput": None}}  # fmt: skip
    fig = fig_compare(sums, metrics=["p99_ttft_ms", "output_throughput"])
    assert len(fig.data) == 2
    assert list(fig.data[0].x) == ["fast", "slow"] and list(fig.data[0].y) == [10.0, 30.0]
    assert list(fig.data[1].y) == [900.0, None]


def test_comparison_report(tmp_path):
    a, b = synthetic(seed=2), synthetic(seed=3, itl=0.05)
    runs = {"continuous": (a, summarize(a)), "static & slow": (b, summarize(b))}
    path = write_comparison_report(runs, tmp_path / "cmp" / "index.html", "Policies compared",
                                   intro_html="<p id='intro'>Why this matters.</p>")  # fmt: skip
    text = path.read_text()
    assert "<p id='intro'>Why this matters.</p>" in text and "Policies compared" in text
    assert "static &amp; slow" in text and "continuous" in text
    assert text.count(PLOTLY_BUNDLE) == 1
    assert text.count("Plotly.newPlot") >= 4  # bars, CDFs, one timeline per run


def test_timeline_shows_cached_and_swapped_kv():
    """Swap vs recompute and prefix caching are visible in the KV panel, not only in the summary."""
    from sim.app.config import config_from_dict
    from sim.app.simulate import simulate

    raw = {
        "model": {"name": "seed-7b", "dtype": "fp16"},
        "hardware": {"gpu": "24GB"},
        "engine": {"policy": "vllm-v0", "preemption_mode": "swap", "max_model_len": 2048,
                   "num_gpu_blocks_override": 200, "enable_prefix_caching": True},
        "workload": {"arrival": "poisson", "rate": 20.0, "num_requests": 60,
                     "prompt": {"dist": "uniform", "low": 200, "high": 600},
                     "output": {"dist": "uniform", "low": 100, "high": 400},
                     "shared_prefix": {"num_groups": 2, "prefix_len": 128}},
    }
    res = simulate(config_from_dict(raw))
    names = [t.name for t in fig_timeline(res).data]
    assert "cached, reusable (% of pool)" in names
    assert "swapped to CPU (% of pool)" in names
