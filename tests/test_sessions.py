"""Multi-turn sessions: prompt structure, shared system prompts, think time, closed/open loop, prefix hits."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import simpy

from policies.base import make_policy
from sim.app.config import config_from_dict
from sim.app.simulate import collect, resolve
from sim.core.errors import ConfigError
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from workloads.gen.sessions import SessionSource, build_session_workload, expected_cached_tokens

WL = {
    "kind": "sessions",
    "num_sessions": 12,
    "turns": {"dist": "uniform", "low": 2, "high": 5},
    "message": {"dist": "uniform", "low": 40, "high": 200},
    "output": {"dist": "uniform", "low": 20, "high": 120},
    "system_prompt": {"num_prompts": 2, "len": 300},
    "think_time": 1.5,
    "num_clients": 3,
}
BASE = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "24GB"},
    "engine": {"max_model_len": 4096, "overhead_gib": 1.5, "cost_model": "constant", "constant_step_s": 0.01},
}


def wl(**kw):
    w = copy.deepcopy(WL)
    w.update(kw)
    return w


def run(workload: dict, **engine):
    """simulate() with the session source (the hook in sim.app.simulate may not be there yet)."""
    raw = copy.deepcopy(BASE)
    raw["engine"].update(engine)
    raw["workload"] = workload
    cfg = config_from_dict(raw)
    setup = resolve(cfg)
    w = build_session_workload(cfg.workload, cfg.simulation.seed, setup.limits.max_model_len)
    src = w.make_source()
    env = simpy.Environment()
    rec = Recorder()
    policy = (
        setup.make_policy() if hasattr(setup, "make_policy") else make_policy(cfg.engine.policy, setup.limits)
    )
    eng = Engine(env, policy, setup.cost_model, src, rec, None, True)
    env.run()
    res = collect(cfg, setup, eng, src, rec, 0.0)
    df = res.requests.copy()
    df["session"] = df["request_id"].str.extract(r"^s(\d+)t")[0].astype(int)
    df["turn"] = df["request_id"].str.extract(r"t(\d+)$")[0].astype(int)
    return w, res, df


def test_turn_k_repeats_history_then_output_then_message():
    w = build_session_workload(wl(), seed=3)
    for c in w.conversations:
        for k in range(c.num_turns):
            spec = c.spec(k, 0.0)
            assert spec.prompt_len == sum(n for _, n in spec.segments)
            if k == 0:
                assert [key[0] for key, _ in spec.segments] == ["sys", "sess-msg"]
                continue
            prev = c.spec(k - 1, 0.0)
            assert spec.segments[: len(prev.segments)] == prev.segments
            assert spec.segments[len(prev.segments)] == (prev.output_key, prev.output_len)
            assert spec.prompt_len == prev.prompt_len + prev.output_len + c.messages[k]
    systems = {c.system for c in w.conversations}
    assert systems <= {0, 1} and len(systems) == 2  # 12 users share 2 system prompts


def test_draws_are_common_random_numbers_and_seeded():
    a = build_session_workload(wl(num_sessions=5), seed=1).conversations
    b = build_session_workload(wl(num_sessions=10), seed=1).conversations
    assert [(c.messages, c.outputs, c.thinks, c.system) for c in a] == [
        (c.messages, c.outputs, c.thinks, c.system) for c in b[:5]
    ]
    c = build_session_workload(wl(num_sessions=5), seed=2).conversations
    assert [x.messages for x in a] != [x.messages for x in c]


def test_context_limit_ends_conversations_and_counts_dropped_turns():
    w = build_session_workload(wl(turns={"dist": "fixed", "value": 30}), seed=0, max_model_len=1024)
    assert w.num_truncated > 0
    assert w.num_requests == 12 * 30 - w.num_truncated
    for c in w.conversations:
        assert c.prompt_len(c.num_turns - 1) + c.outputs[-1] <= 1024
    assert min(c.num_turns for c in w.conversations) < 30


def test_num_requests_caps_total_turns():
    w = build_session_workload(wl(num_requests=7), seed=0)
    assert w.num_requests == 7


@pytest.mark.parametrize(
    "change, match",
    [
        ({"rate": 1.0}, "exactly one of num_clients"),
        ({"num_clients": None, "rate": -1.0}, "rate"),
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"think_dist": "weibull"}, "think_dist"),
        ({"message": None}, "message"),
        ({"system_prompt": {"num_prompts": 2, "len": 5000}}, "system_prompt.len"),
    ],
)
def test_bad_config_is_a_clear_config_error(change, match):
    cfg = wl()
    for k, v in change.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    with pytest.raises(ConfigError, match=match):
        build_session_workload(cfg, seed=0, max_model_len=4096)


def test_closed_loop_clients_wait_for_the_answer_plus_think_time():
    w, res, df = run(wl(think_dist="fixed"))
    assert (df["status"] == "finished").all() and len(df) == w.num_requests
    by = df.set_index("request_id")
    for c in w.conversations:
        for k in range(1, c.num_turns):
            prev, cur = by.loc[f"s{c.index}t{k - 1}"], by.loc[f"s{c.index}t{k}"]
            assert cur["arrival_time"] == pytest.approx(prev["finish_time"] + 1.5)
    # never more than num_clients conversations in progress
    spans = df.groupby("session").agg(start=("arrival_time", "min"), end=("finish_time", "max"))
    events = sorted(
        [(t, 1) for t in spans["start"]] + [(t, -1) for t in spans["end"]], key=lambda e: (e[0], e[1])
    )
    assert max(np.cumsum([d for _, d in events])) <= 3
    # a client starts its next conversation only after finishing one: 3 start at t=0, the rest later
    assert (spans["start"] == 0).sum() == 3


def test_open_loop_conversations_start_at_the_rate_and_turns_still_wait():
    cfg = wl(rate=2.0, num_sessions=40)
    del cfg["num_clients"]
    w, _, df = run(cfg)
    starts = sorted(c.start for c in w.conversations)
    assert starts[-1] == pytest.approx(40 / 2.0)  # vLLM-style rescale: the last start at n/rate
    first = df[df["turn"] == 0].set_index("session")["arrival_time"]
    assert np.allclose(sorted(first), starts)
    by = df.set_index("request_id")
    for c in w.conversations:
        for k in range(1, c.num_turns):
            assert by.loc[f"s{c.index}t{k}", "arrival_time"] >= by.loc[f"s{c.index}t{k - 1}", "finish_time"]


def test_prefix_cache_hits_earlier_turns_output():
    w, res, df = run(wl(think_time=0.5))
    later = df[df["turn"] >= 1]
    assert (later["num_cached_tokens"] > 0).all()
    convs = {c.index: c for c in w.conversations}
    bs = res.meta["limits"]["block_size"]
    # with KV to spare every block of the history is still cached: the hit is the whole history
    expected = [
        expected_cached_tokens(convs[s], k, bs) for s, k in zip(later["session"], later["turn"], strict=True)
    ]
    assert later["num_cached_tokens"].tolist() == expected
    # ... and it reaches into the previous turn's output, not only the system prompt
    assert (later["num_cached_tokens"] > later["session"].map(lambda s: convs[s].system_len)).all()


def test_no_prefix_hits_without_prefix_caching():
    _, res, df = run(wl(), enable_prefix_caching=False)
    assert (df["num_cached_tokens"] == 0).all()


def test_remaining_lists_every_unsent_turn():
    w = build_session_workload(wl(), seed=0)
    src = SessionSource(w)
    assert len(src.remaining()) == w.num_requests
    sent = src.pop_due(0.0)
    assert len(sent) == 3 and len(src.remaining()) == w.num_requests - 3
    src.on_done(sent[0], 2.0)
    assert src.peek_time() is not None and src.peek_time() > 2.0


def test_through_simulate_when_hooked():
    from workloads.synthetic import build_workload

    try:
        build_workload(wl(), seed=0)
    except ConfigError:
        pytest.skip("workload kind 'sessions' not wired into build_workload yet")
    from sim.app.results import summarize
    from sim.app.simulate import simulate

    raw = copy.deepcopy(BASE)
    raw["workload"] = wl()
    res = simulate(config_from_dict(raw))
    s = summarize(res)
    assert s["num_finished"] == s["num_requests"] > 12
    assert s["prefix_cache_hit_rate"] > 0.3
    assert isinstance(res.requests, pd.DataFrame)


def test_sizing_open_sessions_in_conversations_per_second_when_hooked():
    from sim.app.sizing import detect_knob
    from workloads.synthetic import build_workload

    try:
        build_workload(wl(), seed=0)
    except ConfigError:
        pytest.skip("workload kind 'sessions' not wired into build_workload yet")
    cfg = wl(rate=0.5)
    del cfg["num_clients"]
    raw = copy.deepcopy(BASE)
    raw["workload"] = cfg
    knob = detect_knob(config_from_dict(raw))
    w = build_session_workload(cfg, seed=0, max_model_len=4096)
    assert knob.unit == "sessions/s" and knob.per_unit == pytest.approx(w.mean_turns)
    raw["workload"] = wl()
    assert detect_knob(config_from_dict(raw)).key == "num_clients"


@pytest.mark.parametrize("clients", [None, 2])
def test_response_delay_is_the_think_time_its_end_starts(clients):
    """What the fast-forward reads to run past a finish (SessionSource.response_delay): a turn's end brings
    the next turn after its think time; a conversation's last turn brings nothing in an open loop and the
    next conversation after the think time in a closed loop; a turn not in flight is unknown. Through
    [frontend] the delay grows by the way back and the next request's way in."""
    from sim.app.frontend import FrontendConfig, with_frontend

    cfg = wl(think_dist="fixed", num_sessions=3)
    if clients is None:
        del cfg["num_clients"]
        cfg["rate"] = 2.0
    else:
        cfg["num_clients"] = clients
    w = build_session_workload(cfg, 0, 4096)
    src = w.make_source()
    seen = {"next turn": 0, "next conversation": 0, "nothing": 0}
    while (t := src.peek_time()) is not None:  # every turn, each answered at once
        for spec in src.pop_due(t):
            j, k = src.sent[spec.request_id]
            conv = w.conversations[j]
            if k + 1 < conv.num_turns:
                kind, want = "next turn", 1.5
            elif clients and src.next_conv < len(w.conversations):
                kind, want = "next conversation", 1.5
            else:
                kind, want = "nothing", None
            assert src.response_delay(spec) == want, (spec.request_id, kind)
            seen[kind] += 1
            src.on_done(spec, t)
            assert src.response_delay(spec) is None  # no longer in flight
    assert seen["next turn"] and seen["nothing"] and (seen["next conversation"] > 0) == (clients is not None)
    fe = FrontendConfig()
    own, _ = with_frontend(w.make_source(), fe)  # the source times its own arrivals (no wrapper)
    bare = w.make_source()
    got, ref = own.pop_due(1e9), bare.pop_due(1e9)
    assert got and [s.request_id for s in got] == [s.request_id for s in ref]
    base = bare.response_delay(ref[0])
    assert base is not None
    assert own.response_delay(got[0]) == base + float(fe.output_latency(1)) + float(fe.input_latency(0))
