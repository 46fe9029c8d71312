"""HTML reports and plotly figures: titled with the deployment, one plotly.js per output directory, one
trace per thing they claim to show, a colour per series, log axes where latencies span decades."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from sim.app.plotlyjs import JS_NAME, PlotlyJS
from sim.app.report import (
    fig_compare,
    fig_latency_cdf,
    fig_timeline,
    write_comparison_report,
    write_report,
)
from sim.app.report_style import SERIES_COLORS, common_label, run_label, spans_decades
from sim.app.results import SimResult, summarize
from sim.core.errors import ConfigError

PLOTLY_BUNDLE = "* plotly.js v"  # header comment of the inlined bundle


CONFIG = {"model": {"name": "Llama-3.1-8B", "dtype": "bf16"}, "hardware": {"gpu": "H100 SXM"},
          "engine": {"policy": "sarathi"}, "workload": {"rate": 4.0, "num_requests": 40}, "note": "<b>x</b>"}  # fmt: skip


def synthetic(n: int = 40, seed: int = 0, itl: float = 0.02, ttft: tuple[float, float] = (0.05, 0.5)) -> SimResult:
    """n finished requests with random latencies, and steps covering the run."""
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 10, n))
    first = arrival + rng.uniform(*ttft, n)
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
                     config=CONFIG)  # fmt: skip


def test_write_report_loads_one_shared_plotlyjs_and_names_the_deployment(tmp_path):
    res = synthetic()
    s = summarize(res, slo={"p99_ttft_ms": 300})
    path = write_report(res, tmp_path / "report.html", s, title="Llama <8B> on 4090")
    text = path.read_text()
    assert "Llama &lt;8B&gt; on 4090" in text and "<8B>" not in text
    assert "Llama-3.1-8B bf16 · H100 SXM · sarathi · poisson 4 req/s, 40 requests" in text
    assert PLOTLY_BUNDLE not in text and f'<script src="{JS_NAME}"' in text  # loaded, not embedded
    assert PLOTLY_BUNDLE in (tmp_path / JS_NAME).read_text()  # ... from the copy beside it: offline-safe
    assert text.count("Plotly.newPlot") >= 2  # timeline + CDFs
    assert "mean_ttft_ms" in text and "p99_ttft_ms" in text and "target 300 ms" in text
    assert "&lt;b&gt;x&lt;/b&gt;" in text  # config is escaped, not rendered


def test_plotlyjs_once_per_directory_cdn_and_inline(tmp_path):
    res = synthetic()
    s = summarize(res)
    js = PlotlyJS("directory", tmp_path)
    for sub in ("a", "b"):
        text = write_report(res, tmp_path / sub / "report.html", s, plotlyjs=js).read_text()
        assert f'<script src="../{JS_NAME}"' in text and PLOTLY_BUNDLE not in text
    assert sorted(p.name for p in tmp_path.rglob("*.js")) == [JS_NAME]  # one copy for the whole folder
    cdn = write_report(res, tmp_path / "cdn.html", s, plotlyjs="cdn").read_text()
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js"', cdn) and PLOTLY_BUNDLE not in cdn
    inline = write_report(res, tmp_path / "inline.html", s, plotlyjs="inline").read_text()
    assert inline.count(PLOTLY_BUNDLE) == 1 and not re.search(r"<script[^>]*\bsrc=", inline)
    with pytest.raises(ConfigError, match="--plotlyjs 'web'"):
        PlotlyJS("web")


def test_timeline_figure_shares_x_axis_and_gives_each_throughput_its_own_axis():
    fig = fig_timeline(synthetic())
    names = [t.name for t in fig.data]
    assert names == ["KV usage", "running", "waiting", "prompt tok/s", "generation tok/s"]
    assert fig.data[1].xaxis == fig.data[2].xaxis == "x2"
    assert (fig.data[3].yaxis, fig.data[4].yaxis) == ("y3", "y4")  # 10k prompt tok/s vs 300 generated
    assert fig.layout.xaxis.matches == fig.layout.xaxis2.matches == fig.layout.xaxis3.matches == "x4"
    assert max(fig.data[0].y) <= 100
    assert [t.line.color for t in fig.data] == [SERIES_COLORS[n] for n in names]
    assert "Llama-3.1-8B" in fig.layout.title.text and "H100 SXM" in fig.layout.title.text


def test_latency_cdf_traces_end_at_one():
    res = synthetic(n=50)
    fig = fig_latency_cdf(res)
    assert [t.xaxis for t in fig.data] == ["x", "x2", "x3", "x4"]  # TTFT, TPOT, ITL, E2E
    for tr in fig.data:
        assert tr.y[-1] == pytest.approx(1.0) and np.all(np.diff(tr.x) >= 0)
    # TTFT panel: 50 finished requests, values in ms
    fin = res.requests
    assert len(fig.data[0].x) == 50
    assert fig.data[0].x[-1] == pytest.approx((fin.first_token_time - fin.arrival_time).max() * 1000, rel=1e-6)
    # TPOT skips one-token requests
    assert len(fig.data[1].x) == int((fin.num_output_tokens > 1).sum())
    assert list(fig.data[2].x) == pytest.approx([20.0])  # ITL: the one gap value, in ms
    two = fig_latency_cdf({"a": res, "b": synthetic(seed=1)})
    assert len(two.data) == 8
    by_run = {n: {t.line.color for t in two.data if t.name == n} for n in ("a", "b")}
    assert len(by_run["a"]) == len(by_run["b"]) == 1 and by_run["a"] != by_run["b"]  # a colour per run


def test_latency_cdf_log_axis_only_where_values_span_decades_and_slo_marks():
    fast, queued = synthetic(ttft=(0.02, 0.05)), synthetic(seed=1, ttft=(5.0, 20.0))
    fig = fig_latency_cdf({"fast": fast, "queued": queued}, slo={"ttft_ms": 1000, "p99_e2el_ms": 4000})
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type != "log"  # TTFT 20 ms..20 s; TPOT flat
    slo = {t.name: t for t in fig.data if t.legendgroup == "slo"}
    assert list(slo["ttft <= 1000 ms per request"].x) == [1000, 1000] and slo["ttft <= 1000 ms per request"].xaxis == "x"
    mark = slo["p99_e2el_ms <= 4000 (SLO)"]
    assert mark.xaxis == "x4" and list(mark.x) == [4000, 4000] and list(mark.y) == [0, 0.99]
    assert not spans_decades([(np.array([10.0, 20.0, 40.0]), None)])
    assert spans_decades([(np.array([10.0, 20.0]), None), (np.array([5000.0]), None)])
    # a weighted sample: ten thousand 20 ms gaps and one 5 s stall span decades
    assert spans_decades([(np.array([20.0, 5000.0]), np.array([10_000, 1]))])


def test_run_labels_name_model_gpu_preset_and_workload():
    assert run_label(CONFIG) == "Llama-3.1-8B bf16 · H100 SXM · sarathi · poisson 4 req/s, 40 requests"
    closed = {"model": {"name": "m"}, "hardware": {"gpu": "A100 80GB", "tensor_parallel_size": 2},
              "workload": {"kind": "closed", "num_clients": 8}}  # fmt: skip
    assert run_label(closed) == "m · A100 80GB TP=2 · vllm · closed loop, 8 clients"
    capped = {**closed, "simulation": {"num_requests": 12}}
    assert run_label(capped).endswith("closed loop, 8 clients, 12 requests")  # [simulation] caps the count
    assert run_label(closed, gpu=False) == "m · vllm · closed loop, 8 clients"
    assert run_label({"workload": {"trace": "data/conv.csv", "rate_scale": 2}}, {"gpu": "L4"}).endswith(
        "trace conv.csv x2 rate")
    assert common_label(["a · vllm · 4 clients", "a · vllm · 8 clients"]) == "a · vllm"
    assert common_label(["m · H100 TP=2 · vllm · w", "m · H100 · vllm · 2 replicas · w"]) == "m · vllm · w"


def test_compare_figure_has_a_panel_per_metric():
    sums = {"fast": {"p99_ttft_ms": 10.0, "output_throughput": 900.0},
            "slow": {"p99_ttft_ms": 30.0, "output_throughput": None}}  # fmt: skip
    fig = fig_compare(sums, metrics=["p99_ttft_ms", "output_throughput"])
    assert len(fig.data) == 2
    assert list(fig.data[0].x) == ["fast", "slow"] and list(fig.data[0].y) == [10.0, 30.0]
    assert list(fig.data[1].y) == [900.0, None]
    assert list(fig.data[0].marker.color) == list(fig.data[1].marker.color)  # a run keeps its colour
    assert fig.data[0].marker.color[0] != fig.data[0].marker.color[1]


def test_comparison_report(tmp_path):
    a, b = synthetic(seed=2), synthetic(seed=3, itl=0.05)
    runs = {"continuous": (a, summarize(a)), "static & slow": (b, summarize(b))}
    path = write_comparison_report(runs, tmp_path / "cmp" / "index.html", "Policies compared",
                                   intro_html="<p id='intro'>Why this matters.</p>")  # fmt: skip
    text = path.read_text()
    assert "<p id='intro'>Why this matters.</p>" in text and "Policies compared" in text
    assert "static &amp; slow" in text and "continuous" in text
    assert PLOTLY_BUNDLE not in text and (tmp_path / "cmp" / JS_NAME).is_file()
    assert text.count("Plotly.newPlot") >= 4  # bars, CDFs, one timeline per run
    assert "(Llama-3.1-8B bf16 · H100 SXM · sarathi · poisson 4 req/s, 40 requests)" in text


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
