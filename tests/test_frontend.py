"""[frontend]: the request path around the engine (sim/app/frontend.py) shifts client-side TTFT and E2E as
documented, leaves the engine-side columns alone, and is validated like every other section."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.app.config import config_from_dict
from sim.app.frontend import PRIORS, FrontendConfig
from sim.app.results import request_metrics, summarize
from sim.app.simulate import format_summary, simulate
from sim.core.errors import ConfigError

STEP = 0.02
FE = {"request_overhead_s": 1e-3, "tokenize_s_per_token": 2e-6, "engine_hop_s": 1e-4,
      "output_s_per_request": 5e-5, "stream_chunk_s": 3e-4, "network_rtt_s": 4e-4}


def _cfg(frontend=None, n=1, rate=1.0, async_scheduling=False, prompt=100, output=20, workload=None):
    raw = {
        "engine": {"policy": "vllm", "cost_model": "constant", "constant_step_s": STEP, "max_model_len": 2048,
                   "async_scheduling": async_scheduling},
        "workload": workload or {"num_requests": n, "rate": rate, "prompt": {"dist": "fixed", "value": prompt},
                                 "output": {"dist": "fixed", "value": output}},
    }
    raw["frontend"] = frontend  # None: none (an absent table would be vllm's default, the priors)
    return config_from_dict(raw)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_idle_engine_client_ttft_is_engine_ttft_plus_both_paths(async_scheduling):
    fe = FrontendConfig(**FE)
    base = request_metrics(simulate(_cfg(None, async_scheduling=async_scheduling)).requests).iloc[0]
    res = simulate(_cfg(FE, async_scheduling=async_scheduling))
    r = request_metrics(res.requests).iloc[0]
    inp = 4e-4 / 2 + 1e-3 + 2e-6 * 100 + 1e-4  # rtt/2 + overhead + tokenize + hop
    out = 1e-4 + 5e-5 * (1 + 1) / 2 + 3e-4 + 4e-4 / 2  # hop + own output work (B = 1) + chunk + rtt/2
    assert fe.input_latency(100) == pytest.approx(inp) and fe.output_latency(1) == pytest.approx(out)
    # the engine sees it input-path later; its own TTFT (an idle engine: one step) does not change
    assert r.send_time == pytest.approx(base.arrival_time)
    assert r.arrival_time == pytest.approx(base.arrival_time + inp) and r.input_path_time_s == pytest.approx(inp)
    assert r.ttft_engine_s == pytest.approx(base.ttft_engine_s) == pytest.approx(STEP)
    assert r.ttft_s == r.ttft_client_s == pytest.approx(STEP + inp + out)
    assert r.e2el_client_s == pytest.approx(base.e2el_s + inp + out)
    assert r.e2el_engine_s == pytest.approx(base.e2el_s)
    assert r.tpot_s == pytest.approx(base.tpot_s)  # the same delay on the first and the last token


def test_summary_headline_is_client_side_only_with_a_frontend():
    cfg = {"num_requests": 40, "rate": 20.0, "prompt": {"dist": "fixed", "value": 300},
           "output": {"dist": "fixed", "value": 30}}
    plain = summarize(simulate(_cfg(None, workload=cfg)))
    res = simulate(_cfg({}, workload=cfg))  # an empty table: the priors
    s = summarize(res)
    assert plain["latency_basis"] == "engine" and "mean_ttft_engine_ms" not in plain
    assert s["latency_basis"] == "client"
    assert s["mean_ttft_ms"] > s["mean_ttft_engine_ms"] > 0
    assert s["mean_e2el_ms"] > s["mean_e2el_engine_ms"]
    # requests are never lost: every one finished, counts add up
    assert s["completed"] == s["num_requests"] == 40 and s["num_in_flight"] == s["num_not_arrived"] == 0
    assert res.meta["frontend"]["request_overhead_s"] == PRIORS["request_overhead_s"][0]
    assert 0 <= res.meta["frontend"]["saturated_step_fraction"] <= 1
    text = format_summary(s, res)
    assert "client-side" in text and "engine-side TTFT" in text
    # queue time stays engine-side (from the engine's arrival)
    rq = request_metrics(res.requests)
    assert (rq["queue_time_s"] >= -1e-12).all()
    assert (rq["scheduled_time"] - rq["arrival_time"]).to_numpy() == pytest.approx(rq["queue_time_s"].to_numpy())


def test_output_work_grows_with_the_batch():
    fe = FrontendConfig(**FE)
    assert fe.output_latency(41) - fe.output_latency(1) == pytest.approx(5e-5 * 20)


def test_closed_loop_clients_see_the_frontend():
    wl = {"num_requests": 6, "num_clients": 2, "think_time": 0.0, "prompt": {"dist": "fixed", "value": 50},
          "output": {"dist": "fixed", "value": 5}}
    res = simulate(_cfg(FE, workload={**wl, "kind": "closed"}))
    rq = request_metrics(res.requests)
    assert len(rq) == 6 and (rq["status"] == "finished").all()
    assert (rq["arrival_time"] > rq["send_time"]).all()
    assert (rq["ttft_client_s"] > rq["ttft_engine_s"]).all()
    # a client sends its next request only after the previous one's last chunk came back (the wake-up
    # uses the output path of a lone request, B = 1: the source does not see the batch)
    by_send = rq.sort_values("send_time")
    first_done = (by_send["finish_time"].iloc[:2] + FrontendConfig(**FE).output_latency(1)).min()
    assert by_send["send_time"].iloc[2] == pytest.approx(first_done)


@pytest.mark.parametrize("key,value,allowed", [
    ("request_overhead_s", -0.001, "0 <= value <= 10 seconds"),
    ("stream_chunk_s", 1e300, "0 <= value <= 10 seconds"),  # past the clock's range in one chunk
    ("engine_hop_s", float("inf"), "finite"),
    ("tokenize_s_per_token", "fast", "expected float"),
    ("stream_chunk_s", True, "expected float"),
])
def test_bad_frontend_value_is_one_config_error(key, value, allowed):
    with pytest.raises(ConfigError) as exc:
        _cfg({key: value})
    msg = str(exc.value)
    assert "[frontend]" in msg and key in msg and repr(value) in msg and allowed in msg


def test_unknown_frontend_key_and_non_table():
    with pytest.raises(ConfigError, match=r"\[frontend\] unknown key 'latency'.*known keys: enabled"):
        _cfg({"latency": 1.0})
    with pytest.raises(ConfigError, match=r"\[frontend\] must be a table"):
        _cfg(3)


def test_frontend_round_trips_and_can_be_turned_off():
    cfg = _cfg(FE)
    assert config_from_dict(cfg.to_dict()) == cfg
    assert cfg.frontend == FrontendConfig(**FE)
    assert _cfg({"enabled": False}).frontend is None
    assert config_from_dict(_cfg(None).to_dict()).frontend is None


def _absent(policy: str) -> dict:
    return {"engine": {"policy": policy, "cost_model": "constant", "constant_step_s": STEP, "max_model_len": 2048},
            "workload": {"num_requests": 30, "rate": 5.0, "prompt": {"dist": "fixed", "value": 100},
                         "output": {"dist": "fixed", "value": 10}}}  # fmt: skip


@pytest.mark.parametrize("policy,on", [("vllm", True), ("vllm-v0", False), ("tgi", False), ("llamacpp", False)])
def test_an_absent_table_is_the_presets_default(policy, on):
    """vLLM's OpenAI server is what the priors describe: an absent [frontend] is them for preset vllm (the
    headline is then what `vllm bench serve` measures), no front end for other presets."""
    cfg = config_from_dict(_absent(policy))
    assert (cfg.frontend == FrontendConfig()) if on else cfg.frontend is None
    assert config_from_dict(cfg.to_dict()) == cfg  # None (off) and a table both round-trip
    s = summarize(simulate(cfg))
    assert s["latency_basis"] == ("client" if on else "engine")
    off = config_from_dict({**_absent(policy), "frontend": {"enabled": False}})
    assert off.frontend is None


def test_closed_loop_with_a_horizon_and_the_default_frontend_loses_no_request():
    """Clients cut off by the horizon: requests on the input path, waiting, and never sent all have rows."""
    raw = _absent("vllm")
    raw["workload"] = {"kind": "closed", "num_requests": 200, "num_clients": 4, "think_time": 0.05,
                       "prompt": {"dist": "fixed", "value": 100}, "output": {"dist": "fixed", "value": 10}}
    raw["simulation"] = {"horizon": 2.0}
    res = simulate(config_from_dict(raw))
    s = summarize(res)
    assert len(res.requests) == 200 and s["num_not_arrived"] > 100
    assert (s["num_finished"] + s["num_rejected"] + s["num_timed_out"] + s["num_in_flight"]
            + s["num_not_arrived"]) == 200  # fmt: skip


def _run_behind_frontend(cfg, source, horizon=None):
    """(result, decode runs) of one engine reading ``source`` through ``cfg``'s front end; also the
    source the engine read."""
    import simpy

    from sim.app.frontend import apply_frontend, with_frontend
    from sim.app.simulate import collect, resolve
    from sim.engine.loop import Engine
    from sim.engine.recorder import Recorder

    setup = resolve(cfg)
    src, send = with_frontend(source, cfg.frontend)
    env, rec = simpy.Environment(), Recorder()
    eng = Engine(env, setup.make_policy(), setup.cost_model, src, rec, horizon,
                 async_scheduling=setup.limits.async_scheduling)
    env.run()
    return apply_frontend(collect(cfg, setup, eng, src, rec, 0.0), cfg.frontend, send), eng.ff.runs, src


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_lazy_open_source_behind_the_frontend_is_the_listed_one(async_scheduling):
    """A workload generated as the clock goes (chunks) reaches the engine through FrontendSource, a listed
    one as shifted specs: the same run, and the same decode runs (the wrapper announces the next
    arrival, not the next send, so it does not end runs early)."""
    from sim.engine.sources import OpenSource
    from workloads.synthetic import build_workload

    cfg = _cfg({}, async_scheduling=async_scheduling, workload={
        "num_requests": 400, "rate": 8.0, "prompt": {"dist": "uniform", "low": 20, "high": 1500},
        "output": {"dist": "uniform", "low": 5, "high": 120}})  # fmt: skip
    specs = build_workload(dict(cfg.workload), seed=0, max_model_len=2048).specs
    out = []
    for source in (OpenSource(specs), OpenSource(chunks=(specs[i:i + 37] for i in range(0, 400, 37)), total=400)):
        listed = not source.lazy
        res, runs, src = _run_behind_frontend(cfg, source)
        assert (type(src) is OpenSource) == listed
        out.append((res, runs))
    (a, runs_a), (b, runs_b) = out
    assert runs_a == runs_b > 10
    cols = ["request_id", "send_time", "arrival_time", "first_token_time", "finish_time", "client_finish_time"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols])
    pd.testing.assert_frame_equal(a.steps, b.steps)


@pytest.mark.parametrize("horizon", [None, 12.0])
def test_a_generated_workload_made_at_its_delayed_times_is_the_wrapped_one(horizon):
    """A generated workload's requests built at their engine-side times (``delayed_chunks`` ordered by
    ``in_arrival_order``) are the run FrontendSource gives the same requests shifted one by one: same
    requests, steps, decode runs and not-arrived rows, with a tokenize cost that reorders many arrivals."""
    from sim.engine.sources import OpenSource
    from workloads.synthetic import SyntheticOpenWorkload, build_workload

    fe = {**FE, "tokenize_s_per_token": 2e-4}  # 1,500 tokens: 0.3 s on the way in, several arrivals apart
    cfg = _cfg(fe, async_scheduling=True, workload={
        "num_requests": 600, "rate": 30.0, "prompt": {"dist": "uniform", "low": 20, "high": 1500},
        "output": {"dist": "uniform", "low": 5, "high": 120}})  # fmt: skip
    out = []
    for delayed in (True, False):
        w = build_workload(dict(cfg.workload), seed=3, max_model_len=2048)
        assert isinstance(w, SyntheticOpenWorkload)
        source = w.make_source() if delayed else OpenSource(chunks=w.chunks(50), total=len(w))
        res, runs, src = _run_behind_frontend(cfg, source, horizon)
        assert (type(src) is OpenSource) == delayed
        out.append((res, runs))
    (a, runs_a), (b, runs_b) = out
    assert runs_a == runs_b > 10
    sends = a.requests.sort_values("send_time")["request_id"].tolist()
    assert a.requests["request_id"].tolist() != sends  # arrivals did change order on the way in
    if horizon is not None:  # not-arrived rows in engine-side arrival order, then send order, as the others
        late = a.requests[a.requests["status"] == "not_arrived"]
        assert len(late) > 10
        assert list(late.index) == list(late.sort_values(["arrival_time", "send_time"], kind="stable").index)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.floats(0, 3), st.integers(1, 6)), max_size=60), st.floats(0, 1))
def test_in_arrival_order_is_arrival_then_send_order(rows, least):
    """Chunks of requests sent in order, each delayed by ``least`` or more: handed out as one list sorted
    by (arrival, send), whatever the chunking, with every send time noted."""
    from sim.app.frontend import in_arrival_order
    from sim.core.request import RequestSpec

    t, specs, sends, chunks = 0.0, [], [], []
    for gap, extra, _ in rows:
        t += gap
        specs.append(RequestSpec(f"r{len(specs)}", t + (least + extra), 10, 5))
        sends.append(t)
    i = 0
    for _, _, size in rows:  # chunk sizes from the same draws
        if i < len(specs):
            chunks.append((specs[i:i + size], sends[i:i + size]))
            i += size
    noted: dict[str, float] = {}
    got = [s for chunk in in_arrival_order(iter(chunks), least, noted) for s in chunk]
    want = sorted(specs, key=lambda s: (s.arrival_time, int(s.request_id[1:])))
    assert [s.request_id for s in got] == [s.request_id for s in want]
    assert noted == {s.request_id: sends[k] for k, s in enumerate(specs)}
