"""The cluster model: conservation across replicas, fast-forward exactness with replicas, a random split
matching independent engines, the gateway's queue cap / timeout / max_outstanding, shared cards, configs,
per-replica results and the CLI."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from sim.app.cluster import Cluster, simulate_cluster
from sim.app.cluster_config import cluster_from_dict, load_cluster
from sim.app.cluster_metrics import fig_load_balance, replica_rows, summarize_cluster
from sim.app.config import config_from_dict
from sim.app.results import request_metrics, summarize, time_series
from sim.app.simulate import simulate
from sim.cli.cluster import is_cluster_file, main
from sim.core.errors import ConfigError, UnknownNameError
from tests.helpers import assert_same_steps

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "model": {"name": "Llama-3.1-8B", "dtype": "bf16"},
    "hardware": {"gpu": "H100 SXM"},
    "engine": {"policy": "vllm", "max_model_len": 8192},
    "workload": {
        "arrival": "poisson",
        "rate": 20.0,
        "num_requests": 300,
        "prompt": {"dist": "lognormal", "mean": 800, "std": 500, "min": 16, "max": 6000},
        "output": {"dist": "lognormal", "mean": 120, "std": 80, "min": 2, "max": 800},
    },
    "simulation": {"seed": 3},
}


def raw(**sections) -> dict:
    out = copy.deepcopy(BASE)
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


def _timestamps(res) -> pd.DataFrame:
    df = res.requests.set_index("request_id").sort_index()
    return df[["replica", "status", "scheduled_time", "first_token_time", "finish_time", "num_preemptions"]]


def _same_run(a, b) -> None:
    ta, tb = _timestamps(a), _timestamps(b)
    assert list(ta.index) == list(tb.index)
    assert (ta["replica"] == tb["replica"]).all() and (ta["status"] == tb["status"]).all()
    for c in ("scheduled_time", "first_token_time", "finish_time"):
        x, y = ta[c].to_numpy(float), tb[c].to_numpy(float)
        assert np.array_equal(np.isnan(x), np.isnan(y))
        assert np.allclose(x[~np.isnan(x)], y[~np.isnan(y)], rtol=1e-9, atol=1e-9), c
    assert_same_steps(a.steps, b.steps)


# ---- equivalences ------------------------------------------------------------------------------------------
def test_one_replica_cluster_is_the_single_engine():
    """The gateway, inbox and wake-ups add nothing: one replica reproduces simulate() request by request."""
    r = raw()
    single = simulate(config_from_dict(r))
    cluster = simulate_cluster(raw(cluster={"replicas": 1}))
    _same_run(single, cluster)
    # vllm's default [frontend] is the same request path around both: the same client-side times
    assert single.meta["frontend"] == cluster.meta["frontend"]
    a, b = (r.requests.set_index("request_id").sort_index() for r in (single, cluster))
    for c in ("send_time", "arrival_time", "client_first_token_time", "client_finish_time"):
        assert np.allclose(a[c].to_numpy(float), b[c].to_numpy(float), rtol=0, atol=1e-9, equal_nan=True), c
    assert summarize(single)["latency_basis"] == summarize_cluster(cluster)["latency_basis"] == "client"


def test_cluster_frontend_looks_up_each_replicas_own_step():
    """A client chunk waits for the output work of the step that emitted it, on its own replica (two replicas'
    steps can end at the same instant with the constant cost model), and a P/D request's first token is
    found on its prefill replica."""
    fe = {"output_s_per_request": 1e-3, "request_overhead_s": 0.0, "tokenize_s_per_token": 0.0,
          "engine_hop_s": 0.0, "stream_chunk_s": 0.0, "network_rtt_s": 0.0}  # fmt: skip
    r = raw(engine={"cost_model": "constant", "constant_step_s": 0.01}, cluster={"replicas": 2, "router": "round-robin"},
            workload={"arrival": "constant", "rate": 50.0, "num_requests": 60,
                      "output": {"dist": "uniform", "low": 2, "high": 80}}, frontend=fe)  # fmt: skip
    res = simulate_cluster(r)
    rq, st_ = res.requests, res.steps
    ends = st_.assign(end=st_["start"] + st_["duration"])
    tied = ends.groupby(ends["end"].round(9))["replica"].nunique()
    assert (tied > 1).sum() > 20  # the case this is about: both replicas end a step at one instant
    for row in rq[rq["status"] == "finished"].itertuples():
        mine = ends[(ends["replica"] == row.replica) & ((ends["end"] - row.first_token_time).abs() < 1e-9)]
        assert len(mine) == 1
        want = row.first_token_time + 1e-3 * (max(int(mine["num_running"].iloc[0]), 1) + 1) / 2
        assert row.client_first_token_time == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(
    "cluster",
    [
        {"replicas": 3, "router": "round-robin"},
        {
            "replicas": 3,
            "router": "least-outstanding",
            "gateway": {"max_outstanding": 6, "queue_timeout_s": 2.0},
        },
        {"replicas": 3, "router": "least-kv"},
        {"replicas": 3, "router": "least-kv", "gateway": {"poll_interval_s": 0.25}},
        {"replicas": 2, "router": "prefix-aware"},
    ],
)
def test_fast_forward_is_exact_with_replicas(cluster):
    """Jumping over quiet decode stretches changes no timestamp, routing decision or step count, also when
    requests are pushed into a replica in the middle of a jump and routers read KV usage mid-jump."""
    r = raw(cluster=cluster, workload={"rate": 30.0, "shared_prefix": {"num_groups": 4, "prefix_len": 256}})
    _same_run(simulate_cluster(r, fast_forward=True), simulate_cluster(r, fast_forward=False))


def test_fast_forward_is_exact_on_a_shared_card_with_constant_steps():
    """Two instances on one card (their step times depend on each other) and identical step lengths
    (boundaries of different replicas coincide): still exact."""
    r = raw(
        engine={"cost_model": "constant", "constant_step_s": 0.01, "gpu_memory_utilization": 0.45},
        replica=[{"name": "a", "device": "g"}, {"name": "b", "device": "g"}],
        cluster={"router": "least-outstanding"},
    )
    _same_run(simulate_cluster(r, fast_forward=True), simulate_cluster(r, fast_forward=False))


def _pcts(df: pd.DataFrame) -> dict[str, np.ndarray]:
    m = request_metrics(df)
    fin = m[m["status"] == "finished"]
    return {k: fin[f"{k}_s"].to_numpy(float) for k in ("ttft", "tpot", "e2el")}


def test_random_split_matches_independent_engines_at_rate_over_n():
    """A random router splits a Poisson stream into N independent Poisson streams at rate/N, so on
    identical replicas the cluster's latencies are those of N independent engines (sampling error only)."""
    n, rate, per = 4, 24.0, 600
    wl = {"rate": rate, "num_requests": n * per}
    cl = simulate_cluster(raw(workload=wl, cluster={"replicas": n, "router": "random"}))
    singles = [
        simulate(
            config_from_dict(
                raw(workload={"rate": rate / n, "num_requests": per}, simulation={"seed": 100 + k})
            )
        )
        for k in range(n)
    ]
    a = _pcts(cl.requests)
    b = _pcts(pd.concat([s.requests for s in singles], ignore_index=True))
    served = cl.requests["replica"].value_counts()
    assert served.min() > 0.85 * per and served.max() < 1.15 * per
    for k in ("ttft", "tpot", "e2el"):
        for q in (50, 90):
            x, y = np.percentile(a[k], q), np.percentile(b[k], q)
            assert abs(x - y) < 0.12 * y, (k, q, x, y)
        assert stats.ks_2samp(a[k], b[k]).pvalue > 0.001, k


def test_round_robin_balances_exactly():
    res = simulate_cluster(raw(cluster={"replicas": 3, "router": "round-robin"}))
    counts = res.requests["replica"].value_counts()
    assert counts.max() - counts.min() <= 1
    # least-outstanding looks at the load, a random choice does not: its replicas are more even
    lo = summarize_cluster(simulate_cluster(raw(cluster={"replicas": 3, "router": "least-outstanding"})))
    rnd = summarize_cluster(simulate_cluster(raw(cluster={"replicas": 3, "router": "random"})))
    assert lo["load_imbalance"] < 0.8 * rnd["load_imbalance"]


# ---- conservation ------------------------------------------------------------------------------------------
rows = st.lists(st.tuples(st.floats(0, 20), st.integers(1, 200), st.integers(1, 60)), min_size=1, max_size=30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows,
    router=st.sampled_from(["round-robin", "least-outstanding", "least-kv", "prefix-aware", "random"]),
    n=st.integers(1, 3),
    cap=st.one_of(st.none(), st.integers(1, 3)),
    max_queue=st.one_of(st.none(), st.integers(0, 5)),
    timeout=st.one_of(st.none(), st.floats(0.05, 3)),
    horizon=st.one_of(st.none(), st.floats(1, 25)),
)
def test_conservation_across_replicas(tmp_path_factory, rows, router, n, cap, max_queue, timeout, horizon):
    """Every request is served by exactly one replica, or rejected at the gateway with a reason, or in
    flight / not arrived at the horizon; no replica ever holds more than max_outstanding."""
    d = tmp_path_factory.mktemp("wl")
    trace = d / "t.jsonl"
    lines = [f'{{"arrival_time": {t}, "prompt_len": {p}, "output_len": {o}}}' for t, p, o in rows]
    trace.write_text("\n".join(lines) + "\n")
    gw = {
        k: v
        for k, v in (("max_outstanding", cap), ("max_queue", max_queue), ("queue_timeout_s", timeout))
        # a queue limit needs max_outstanding (without it the gateway queues nothing, and the config says so)
        if v is not None and (cap is not None or k == "max_outstanding")
    }
    r = raw(
        engine={
            "cost_model": "constant",
            "constant_step_s": 0.05,
            "max_model_len": 160,
            "num_gpu_blocks_override": 24,
            "block_size": 8,
        },
        cluster={"replicas": n, "router": router, "gateway": gw},
        simulation={"seed": 1, "horizon": horizon},
    )
    r["workload"] = {"trace": str(trace), "too_long": "reject"}
    c = Cluster(cluster_from_dict(r))
    res = c.run()
    df = res.requests
    assert df["request_id"].is_unique and len(df) == len(rows)
    # one row per request a replica took in (or holds in its inbox): none reached two replicas
    taken = sum(rep.engine.num_submitted + len(rep.inbox.items) for rep in c.replicas)
    assert taken == int((df["replica"] >= 0).sum()), "a request reached two replicas"
    for _, row in df.iterrows():
        if row["status"] == "finished":
            assert row["replica"] >= 0 and row["num_output_tokens"] >= 1
        elif row["status"] == "rejected":
            assert isinstance(row["finish_reason"], str) and row["finish_reason"]
            if row["replica"] == -1:
                assert "gateway" in row["finish_reason"] or "no replica" in row["finish_reason"]
        else:
            assert horizon is not None, row.to_dict()
    if horizon is None:
        assert set(df["status"]) <= {"finished", "rejected"}
    if cap is not None:  # max outstanding per replica: never more requests inside it at once
        for i in range(n):
            mine = df[(df["replica"] == i) & df["queued_time"].notna()]
            ev = sorted(
                [(t, 1) for t in mine["queued_time"]] + [(t, -1) for t in mine["finish_time"].dropna()],
                key=lambda e: (e[0], e[1]),
            )
            level = np.cumsum([e[1] for e in ev]) if ev else np.array([0])
            assert level.max() <= cap
    summarize(res)  # the integrity checks of the results layer pass


def test_gateway_queue_cap_and_timeout_reject_with_reasons():
    """30 requests at once, 2 replicas x 2 outstanding, a queue of 10 and a 0.5 s timeout: 4 are served,
    16 find the queue full, the 10 queued time out before the first answer (~1.4 s)."""
    r = raw(
        cluster={
            "replicas": 2,
            "router": "least-outstanding",
            "gateway": {"max_outstanding": 2, "max_queue": 10, "queue_timeout_s": 0.5},
        }
    )
    r["workload"] = {
        "arrival": "constant",
        "rate": 1e6,
        "num_requests": 30,
        "prompt": {"dist": "fixed", "value": 2000},
        "output": {"dist": "fixed", "value": 200},
    }
    res = simulate_cluster(r)
    s = summarize_cluster(res)
    assert s["gateway"]["rejection_reasons"] == {
        "gateway queue full (max_queue 10)": 16,
        "gateway queue timeout (0.5 s)": 10,
    }
    assert s["completed"] == 4 and s["gateway"]["max_queue_len"] == 10
    gw = res.requests[res.requests["replica"] == -1]
    assert (gw["status"] == "rejected").all() and len(gw) == 26
    late = gw[gw["finish_reason"].str.contains("timeout")]
    assert np.allclose(late["finish_time"] - late["arrival_time"], 0.5, atol=1e-5)


def test_gateway_routes_only_to_replicas_whose_policy_accepts_the_request():
    """A TGI replica without prefill chunking rejects prompts over max_batch_prefill_tokens, a rule the
    gateway's old copy of the fit check (max_model_len and pool size only) did not know: round-robin
    sent every other 2000-token prompt there to be rejected. The gateway asks each replica's policy
    (``rejection_reason``), so all go to the vLLM replica; with only the TGI replica, the gateway itself
    rejects them with the policy's reason."""
    tgi = {"policy": "tgi", "enable_chunked_prefill": False, "max_num_batched_tokens": 1024}
    r = raw(
        replica=[{"name": "tgi", "engine": tgi}, {"name": "vllm"}],
        cluster={"router": "round-robin"},
    )
    r["workload"] = {
        "arrival": "constant",
        "rate": 4.0,
        "num_requests": 20,
        "prompt": {"dist": "fixed", "value": 2000},
        "output": {"dist": "fixed", "value": 20},
    }
    c = Cluster(cluster_from_dict(r))
    spec = next(iter(c.source.remaining()))
    assert c.replicas[0].rejection_reason(spec) is not None and c.replicas[1].rejection_reason(spec) is None
    df = c.run().requests
    assert (df["status"] == "finished").all() and (df["replica_name"] == "vllm").all()
    assert c.replicas[0].engine.num_submitted == 0  # nothing ever reached the replica that would reject it
    alone = simulate_cluster({**r, "replica": [{"name": "tgi", "engine": tgi}]}).requests
    assert (alone["status"] == "rejected").all() and (alone["replica"] == -1).all()
    assert alone["finish_reason"].str.startswith("no replica can hold it: input (2000 tokens) exceeds").all()
    # Replicas of equal configs share one fit check; the TGI ones and the vLLM ones are asked apart.
    four = {**r, "replica": [{"name": "tgi", "engine": tgi}, {"name": "vllm"},
                             {"name": "tgi2", "engine": tgi}, {"name": "vllm2"}]}  # fmt: skip
    c4 = Cluster(cluster_from_dict(four))
    assert c4.gateway._fit_group == [0, 1, 0, 1]
    # ... and are resolved once: one Setup (memory plan, cost model) per distinct config, a policy each
    setups = [r.setup for r in c4.replicas]
    assert setups[0] is setups[2] and setups[1] is setups[3] and setups[0] is not setups[1]
    assert len({id(r.policy) for r in c4.replicas}) == 4
    df4 = c4.run().requests
    assert (df4["status"] == "finished").all() and set(df4["replica_name"]) == {"vllm", "vllm2"}


# ---- shared card, heterogeneous replicas -------------------------------------------------------------------
def test_shared_card_slows_steps_while_both_instances_are_busy():
    """overlap 0: a step takes exactly twice its solo time when the other instance has work; 0.5: 1.5x."""
    for overlap, factor in ((0.0, 2.0), (0.5, 1.5)):
        r = raw(
            engine={"cost_model": "constant", "constant_step_s": 0.01, "gpu_memory_utilization": 0.45},
            replica=[{"name": "a", "device": "g"}, {"name": "b", "device": "g"}],
            cluster={"router": "round-robin", "device_overlap": overlap},
            workload={"rate": 4.0, "num_requests": 80},
        )
        res = simulate_cluster(r)
        d = np.round(res.steps["duration"].to_numpy(float), 9)
        assert set(np.unique(d)) == {0.01, round(0.01 * factor, 9)}
        assert (d > 0.01).mean() > 0.2  # both were busy a fair part of the time
    with pytest.raises(ConfigError, match="adds up to"):
        cluster_from_dict(raw(replica=[{"device": "g", "name": "x"}, {"device": "g", "name": "y"}]))


def test_heterogeneous_replicas_and_least_outstanding_favours_the_fast_one():
    r = raw(
        replica=[
            {"name": "big", "hardware": {"gpu": "H100 SXM", "tensor_parallel_size": 2}},
            {"name": "small", "hardware": {"gpu": "L4"}},
        ],
        cluster={"router": "least-outstanding"},
        workload={"rate": 8.0},
    )
    res = simulate_cluster(r)
    reps = {m["name"]: m for m in res.meta["replicas"]}
    assert reps["big"]["gpu"] == "H100 SXM" and reps["big"]["tensor_parallel_size"] == 2
    assert reps["small"]["gpu"] == "L4" and reps["small"]["num_gpu_blocks"] < reps["big"]["num_gpu_blocks"]
    assert res.meta["num_gpus"] == 3
    rows_ = replica_rows(res).set_index("name")
    assert rows_.loc["big", "requests_served"] > 1.5 * rows_.loc["small", "requests_served"]


# ---- configs -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (dict(cluster={"replicas": 2}, replica=[{"name": "a"}]), ConfigError, "not both"),
        (dict(cluster={"bogus": 1}), ConfigError, "bogus"),
        (dict(replica=[{"name": "a", "role": "boss"}]), ConfigError, "role"),
        (dict(replica=[{"name": "a"}, {"name": "a"}]), ConfigError, "unique"),
        (dict(replica=[{"name": "a", "engine": {"max_num_seqs": 0}}]), ConfigError, "max_num_seqs"),
        (dict(cluster={"gateway": {"max_outstanding": 0}}), ConfigError, "max_outstanding"),
        (dict(replica=[{"name": "a", "role": "prefill"}, {"name": "b"}]), ConfigError, "no mixed"),
    ],
)
def test_config_errors_name_the_field(bad, exc, match):
    with pytest.raises(exc, match=match):
        cluster_from_dict(raw(**bad))


def test_unknown_router_is_reported():
    with pytest.raises(UnknownNameError, match="least-outstanding"):
        Cluster(cluster_from_dict(raw(cluster={"replicas": 2, "router": "fastest"})))


def test_streams_merge_with_their_own_ids_and_content():
    r = raw()
    del r["workload"]
    common = {
        "arrival": "poisson",
        "rate": 5.0,
        "num_requests": 40,
        "prompt": {"dist": "fixed", "value": 300},
        "output": {"dist": "fixed", "value": 20},
        "shared_prefix": {"num_groups": 1, "prefix_len": 128},
    }
    r["stream"] = [{"name": "a", **common}, {"name": "b", **common, "priority": {"levels": [1]}}]
    r["cluster"] = {"replicas": 1}
    res = simulate_cluster(r)
    df = res.requests
    assert len(df) == 80 and df["request_id"].str.startswith(("a-", "b-")).all()
    assert (df.loc[df["request_id"].str.startswith("b-"), "priority"] == 1).all()
    assert df["arrival_time"].is_monotonic_increasing
    # each stream's system prompt is its own: two misses on the prefix, not one
    assert (df["num_cached_tokens"] == 0).sum() >= 2


# ---- results and CLI ---------------------------------------------------------------------------------------
def test_per_replica_summary_time_series_and_load_balance_plot():
    res = simulate_cluster(raw(cluster={"replicas": 3, "router": "least-outstanding"}))
    s = summarize_cluster(res)
    reps = s["replicas"]
    assert [r["replica"] for r in reps] == [0, 1, 2]
    assert sum(r["requests_served"] for r in reps) == s["completed"]
    for r in reps:
        assert 0 < r["utilization"] <= 1.0 + 1e-9 and 0 <= r["mean_kv_cache_usage"] <= 1
        assert r["median_ttft_ms"] is not None
    ts = time_series(res, by_replica=True)
    assert sorted(ts["replica"].unique()) == [0, 1, 2]
    fig = fig_load_balance(res)
    assert len([t for t in fig.data if t.xaxis == "x"]) == 3
    assert math.isclose(s["duration"], summarize(res)["duration"])


def test_example_configs_load():
    for name in ("cluster_tp", "cluster_split_card", "cluster_pools", "cluster_disagg"):
        path = ROOT / "examples" / f"{name}.toml"
        assert is_cluster_file(path)
        cfgs = load_cluster(path)
        assert len(cfgs) >= 2 and all(c.num_gpus == next(iter(cfgs.values())).num_gpus for c in cfgs.values())
    assert not is_cluster_file(ROOT / "examples" / "quickstart.toml")


@pytest.mark.parametrize("name", ["cluster_tp", "cluster_split_card", "cluster_pools", "cluster_disagg"])
def test_comparisons_run_from_the_cli(name, tmp_path, capsys):
    path = ROOT / "examples" / f"{name}.toml"
    rc = main([str(path), "--set", "simulation.num_requests=60", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "== comparison" in out
    assert (tmp_path / "comparison.html").is_file() and (tmp_path / "comparison.json").is_file()
    variant = next(p for p in tmp_path.iterdir() if p.is_dir())
    for f in ("summary.json", "replicas.csv", "load_balance.html", "requests.parquet"):
        assert (variant / f).is_file(), f


def test_cli_reports_config_errors(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text(
        '[cluster]\nreplicas = 2\nrouter = "nope"\n[workload]\nrate = 1\nnum_requests = 2\n'
        "prompt = 10\noutput = 5\n"
    )
    assert main([str(p)]) == 2
    assert "unknown router" in capsys.readouterr().err


ROUTER_CFG = """
[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "H100 SXM"
[engine]
max_model_len = 8192
[workload]
rate = 20.0
num_requests = 60
prompt = { dist = "lognormal", mean = 1500, std = 1500, min = 16, max = 7000 }
output = { dist = "fixed", value = 20 }
shared_prefix = { num_groups = 2, prefix_len = 64 }
[cluster.router]
name = "round-robin"
[[replica]]
name = "s"
count = 2
pool = "short"
[[replica]]
name = "l"
pool = "long"
"""


@pytest.mark.parametrize(
    "router, extra",
    [
        ("round-robin", []),
        ("random", []),
        ("least-outstanding", []),
        ("least-kv", ["cluster.gateway.poll_interval_s=0.5"]),
        ("prefix-aware", ["cluster.router.load_guard=2"]),
        ("length-pools", ["cluster.router.threshold=2000"]),
        ("priority-pools", ['cluster.router.pools={"0" = "short"}']),
        ("session-affinity", []),
    ],
)
def test_every_router_runs_from_the_cli(router, extra, tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text(ROUTER_CFG)
    args = [str(p), "--json", "--set", f"cluster.router.name={router}"]
    for e in extra:
        args += ["--set", e]
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["router"] == router and s["completed"] == 60 and len(s["replicas"]) == 3
    served = {r["name"]: r["requests_served"] for r in s["replicas"]}
    if router == "length-pools":  # prompt + output over 2000 tokens: the long replica, and only those
        res = simulate_cluster(tmp_path / "c.toml", overrides=[f"cluster.router.name={router}", *extra])
        df = res.requests
        assert ((df["prompt_len"] + df["output_len"] > 2000) == (df["replica_name"] == "l")).all()
        assert served["l"] > 0
