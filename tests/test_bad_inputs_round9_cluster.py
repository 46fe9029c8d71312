"""The hostile corpus, cluster side, ninth round (fuzz report, cluster helper): a metrics poll interval so
short that the poll rescheduled itself at the same instant for ever, ``count`` copies with a ``device`` put
on a card each while the docs (and the same layout written out) share one, and settings that changed
nothing: the gateway's queue limits without ``max_outstanding``, ``poll_interval_s`` with a router that
reads no engine metrics, ``device_overlap`` with no shared device, ``[cluster.disagg]`` without
prefill/decode replicas (the prefix-aware router over replicas without a prefix cache runs: an ablation). Each bad input ends in exit
code 2 (or a ConfigError) and one line naming the field and the value, before any replica is built;
beside each, the nearest valid input still runs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from routers.base import BaseRouter
from sim.core.errors import ConfigError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401
from tests.test_bad_inputs_cluster4 import _write, no_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

# One small deployment: constant 10 ms steps, 40 requests over ~2 s, a card with room for two instances
BASE = """[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "A100 80GB"
[engine]
cost_model = "constant"
constant_step_s = 0.01
max_model_len = 4096
{engine}
[workload]
rate = 20.0
num_requests = 40
prompt = {{ dist = "fixed", value = 64 }}
output = {{ dist = "fixed", value = 8 }}
"""


def _cfg(extra: str, engine: str = "") -> str:
    return BASE.format(engine=engine) + extra


def _run_json(tmp: Path, text: str, capsys) -> dict:
    from sim.cli.main import main

    rc = main(["run", _write(tmp, text), "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.err.strip() == "", out.err
    return json.loads(out.out)


def _gw(router: str, gateway: str, replicas: int = 2) -> str:
    return f"[cluster]\nreplicas = {replicas}\nrouter = {router}\n[cluster.gateway]\n{gateway}\n"


PD = """[cluster]
router = "round-robin"
{cluster}
[[replica]]
name = "p"
role = "prefill"
[[replica]]
name = "d"
role = "decode"
"""

CASES = [
    # 1: a poll interval so short that now + interval == now: the poll rescheduled itself at one instant
    ("poll-1e-20", _cfg(_gw('"least-kv"', "poll_interval_s = 1e-20")),
     ["[cluster.gateway].poll_interval_s", "got 1e-20", "expected 0 (live", "from 0.0001 to 1e+09 s"]),
    ("poll-1e-7", _cfg(_gw('"least-kv"', "poll_interval_s = 1e-7")), ["poll_interval_s", "1e-07", "0.0001"]),
    ("poll-just-below", _cfg(_gw('"least-kv"', "poll_interval_s = 9.9e-5")), ["poll_interval_s", "9.9e-05"]),
    ("poll-negative", _cfg(_gw('"least-kv"', "poll_interval_s = -1")), ["poll_interval_s", "got -1", "expected 0"]),
    # 2: count copies with one device share the card, as two [[replica]] tables naming it do
    ("count-device-memory", _cfg('[[replica]]\nname = "a"\ncount = 2\ndevice = "g0"\n'),
     ["device 'g0'", "gpu_memory_utilization", "adds up to 1.80 > 1", "a0, a1"]),
    # 3: the gateway queues only while every replica is at max_outstanding (built-in routers)
    ("max-queue-no-cap", _cfg(_gw('"round-robin"', "max_queue = 0")),
     ["[cluster.gateway] max_queue = 0", "max_outstanding is not set", "router 'round-robin'", "allowed:"]),
    ("queue-timeout-no-cap", _cfg(_gw('"least-kv"', "queue_timeout_s = 0")),
     ["[cluster.gateway] queue_timeout_s = 0", "max_outstanding is not set", "router 'least-kv'"]),
    ("max-queue-no-cap-pools", _cfg('[cluster]\nrouter = {name = "length-pools", threshold = 100}\n'
                                    '[cluster.gateway]\nmax_queue = 5\n[[replica]]\nname = "s"\npool = "short"\n'
                                    '[[replica]]\nname = "l"\npool = "long"\n'),
     ["max_queue = 5", "router 'length-pools'"]),
    ("poll-round-robin", _cfg(_gw('"round-robin"', "poll_interval_s = 0.5")),
     ["[cluster.gateway] poll_interval_s = 0.5", "router 'round-robin' reads no engine metrics", "allowed:"]),
    ("poll-random", _cfg(_gw('"random"', "poll_interval_s = 0.5")), ["poll_interval_s = 0.5", "router 'random'"]),
    ("poll-least-outstanding", _cfg(_gw('"least-outstanding"', "poll_interval_s = 1")),
     ["poll_interval_s = 1", "router 'least-outstanding'"]),
    ("poll-prefix-aware", _cfg(_gw('"prefix-aware"', "poll_interval_s = 0.5")), ["router 'prefix-aware'"]),
    ("poll-session-affinity", _cfg(_gw('"session-affinity"', "poll_interval_s = 0.5")),
     ["router 'session-affinity' reads no engine metrics"]),
    # 4: nothing to overlap without a shared device
    ("overlap-no-shared", _cfg("[cluster]\nreplicas = 2\ndevice_overlap = 0.7\n"),
     ["[cluster] device_overlap = 0.7", "only when replicas share a device", "allowed:"]),
    ("overlap-own-devices", _cfg('[cluster]\ndevice_overlap = 0.5\n[[replica]]\nname = "a"\ndevice = "g0"\n'
                                 '[[replica]]\nname = "b"\ndevice = "g1"\n'), ["device_overlap = 0.5", "share a device"]),
    # 6: the KV link of P/D disaggregation, without prefill/decode replicas
    ("disagg-no-pd", _cfg("[cluster]\nreplicas = 2\n[cluster.disagg]\nlink_bandwidth_gb_s = 0.5\n"),
     ["[cluster.disagg] link_bandwidth_gb_s = 0.5", 'role = "prefill"', "allowed:"]),
    ("disagg-decode-router-no-pd", _cfg('[cluster]\nreplicas = 2\n[cluster.disagg]\ndecode_router = "random"\n'),
     ["[cluster.disagg] decode_router = 'random'", "every replica here is mixed"]),
    # a comparison: the shared part's setting is used by no variant / a variant's own setting does nothing
    ("disagg-no-variant-pd", _cfg("[cluster]\nreplicas = 2\n[cluster.disagg]\nlink_latency_ms = 1\n"
                                  "[variants.a]\n[variants.b]\ncluster = {replicas = 3}\n"),
     ["in every variant (a, b)", "[cluster.disagg] link_latency_ms = 1"]),
    ("overlap-variant-own", _cfg('[[replica]]\nname = "a"\ndevice = "g"\nengine = {gpu_memory_utilization = 0.45}\n'
                                 '[[replica]]\nname = "b"\ndevice = "g"\nengine = {gpu_memory_utilization = 0.45}\n'
                                 "[variants.split]\n[variants.one]\n"
                                 'replica = [{name = "a"}]\ncluster = {device_overlap = 0.5}\n'),
     ["[variants.one]", "device_overlap = 0.5", "share a device"]),
]
BY_NAME = {c[0]: c for c in CASES}


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize("name,text,fragments", CASES, ids=[c[0] for c in CASES])
def test_round9_cluster_one_line_exit_2(name, text, fragments, tmp_path, capsys):
    out = tmp_path / "out"
    run_bad_case(["cluster", _write(tmp_path, text), "--out", str(out)], fragments, capsys)
    assert not out.exists()


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize("name", ["poll-1e-20", "count-device-memory", "max-queue-no-cap", "poll-round-robin",
                                  "overlap-no-shared", "disagg-no-pd"])
def test_round9_cluster_through_run_too(name, tmp_path, capsys):
    """``servesim run`` hands these configs to the cluster path: the same one line."""
    _, text, fragments = BY_NAME[name]
    run_bad_case(["run", _write(tmp_path, text)], fragments, capsys)


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_round9_cluster_api_config_error(name):
    """The API's load (``simulate_cluster`` on a raw dict): a ConfigError, one line, the same fragments."""
    from sim.app.cluster import simulate_cluster

    _, text, fragments = BY_NAME[name]
    raw = tomllib.loads(text)
    with pytest.raises(ConfigError) as exc:
        simulate_cluster(raw, variant=next(iter(raw["variants"])) if "variants" in raw else None)
    msg = str(exc.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, (name, f, msg)


@pytest.mark.usefixtures("no_cluster")
def test_set_poll_interval_refused_too(tmp_path, capsys):
    text = _cfg('[cluster]\nreplicas = 2\nrouter = "least-kv"\n')
    run_bad_case(["cluster", _write(tmp_path, text), "--set", "cluster.gateway.poll_interval_s=1e-20"],
                 ["poll_interval_s", "1e-20", "0.0001"], capsys)


# ---- the nearest valid inputs still run --------------------------------------------------------------------
@pytest.mark.parametrize("poll", ["0", "1e-4", "0.25"])
def test_poll_interval_live_or_at_least_the_minimum_runs(poll, tmp_path, capsys):
    """0 = live metrics; 1e-4 s (the shortest allowed) ends in well under a second for this run."""
    s = _run_json(tmp_path, _cfg(_gw('"least-kv"', f"poll_interval_s = {poll}")), capsys)
    assert s["completed"] == 40


def test_count_copies_with_a_device_share_it(tmp_path, capsys):
    """Two copies at 0.45 on device g0: one GPU, the same run as the layout written as two [[replica]]."""
    from sim.app.cluster import simulate_cluster
    from sim.app.cluster_config import cluster_from_dict

    rep = 'device = "g0"\nengine = { gpu_memory_utilization = 0.45 }\n'
    counted = _cfg('[cluster]\nrouter = "round-robin"\n[[replica]]\nname = "a"\ncount = 2\n' + rep)
    cfg = cluster_from_dict(tomllib.loads(counted))
    assert [r.device for r in cfg.replicas] == ["g0", "g0"] and cfg.num_gpus == 1
    s = _run_json(tmp_path, counted, capsys)
    assert s["completed"] == 40 and s["num_gpus"] == 1
    written = _cfg('[cluster]\nrouter = "round-robin"\n' + "".join(f'[[replica]]\nname = "a{k}"\n' + rep
                                                                   for k in range(2)))
    a, b = simulate_cluster(tomllib.loads(counted)), simulate_cluster(tomllib.loads(written))
    cols = ["request_id", "replica", "first_token_time", "finish_time"]
    assert a.requests[cols].equals(b.requests[cols])


def test_count_copies_without_a_device_have_a_card_each(tmp_path, capsys):
    s = _run_json(tmp_path, _cfg('[[replica]]\nname = "a"\ncount = 2\n'), capsys)
    assert s["completed"] == 40 and s["num_gpus"] == 2


@pytest.mark.parametrize("gateway", ["max_outstanding = 1\nmax_queue = 0", "max_outstanding = 1\nqueue_timeout_s = 0",
                                     "max_outstanding = 2\nmax_queue = 5\nqueue_timeout_s = 1"])
def test_queue_limits_with_max_outstanding_run(gateway, tmp_path, capsys):
    s = _run_json(tmp_path, _cfg(_gw('"round-robin"', gateway)), capsys)
    assert s["completed"] + s["num_rejected"] == 40


class HoldFirst(BaseRouter):
    """A plug-in router that holds requests itself (here: every request until 0.5 s): the gateway's queue
    limits apply without max_outstanding."""

    name = "hold-first"
    reads_engine_metrics = False

    def __init__(self, options: dict, ctx: object) -> None:
        pass

    def route(self, spec, candidates, now):
        return None if now < 0.5 else candidates[0]


def test_queue_limits_with_a_plugin_router_run(tmp_path, capsys):
    """A plug-in router may hold requests: max_queue applies without max_outstanding (3 kept, the rest
    that arrive before 0.5 s refused)."""
    router = '"tests.test_bad_inputs_round9_cluster:HoldFirst"'
    s = _run_json(tmp_path, _cfg(_gw(router, "max_queue = 3")), capsys)
    assert s["num_rejected"] > 0 and s["completed"] + s["num_rejected"] == 40


@pytest.mark.parametrize("router", ['"least-kv"', '{name = "session-affinity", fallback = "least-kv"}',
                                    '"tests.test_cluster_lazy_finishes:QuietFirst"'])
def test_poll_interval_with_a_router_that_reads_metrics_runs(router, tmp_path, capsys):
    s = _run_json(tmp_path, _cfg(_gw(router, "poll_interval_s = 0.5")), capsys)
    assert s["completed"] == 40


def test_poll_interval_under_pd_runs(tmp_path, capsys):
    """Under P/D the gateway polls the replicas whatever the router: the interval is kept."""
    s = _run_json(tmp_path, _cfg(PD.format(cluster="[cluster.gateway]\npoll_interval_s = 0.5")), capsys)
    assert s["completed"] == 40


@pytest.mark.parametrize("overlap", ["0.7", "0"])
def test_device_overlap_with_a_shared_device_runs(overlap, tmp_path, capsys):
    text = _cfg(f"[cluster]\ndevice_overlap = {overlap}\n" + "".join(
        f'[[replica]]\nname = "{n}"\ndevice = "g"\nengine = {{ gpu_memory_utilization = 0.45 }}\n' for n in "ab"))
    assert _run_json(tmp_path, text, capsys)["completed"] == 40


def test_device_overlap_zero_without_a_shared_device_runs(tmp_path, capsys):
    """0 is the default (nothing overlaps): written out, it changes nothing and says nothing wrong."""
    assert _run_json(tmp_path, _cfg("[cluster]\nreplicas = 2\ndevice_overlap = 0\n"), capsys)["completed"] == 40


def test_device_overlap_of_a_comparison_used_by_one_variant_loads():
    """The shared part's device_overlap is for the variant that shares a card (as in cluster_split_card)."""
    from sim.app.cluster_config import cluster_variants

    text = _cfg("[cluster]\ndevice_overlap = 0.5\n[variants.one]\ncluster = {replicas = 1}\n[variants.split]\n"
                'replica = [{name = "a", device = "g", engine = {gpu_memory_utilization = 0.45}},'
                ' {name = "b", device = "g", engine = {gpu_memory_utilization = 0.45}}]\n')
    cfgs = cluster_variants(tomllib.loads(text))
    assert cfgs["one"].device_overlap == cfgs["split"].device_overlap == 0.5


@pytest.mark.parametrize(("engine", "replicas"), [
    ("", "[cluster]\nreplicas = 2\n"),  # the preset's default: a prefix cache
    ("enable_prefix_caching = false",  # one replica with a cache is enough to route to
     '[[replica]]\nname = "a"\n[[replica]]\nname = "b"\nengine = { enable_prefix_caching = true }\n'),
])
def test_prefix_aware_with_a_prefix_cache_runs(engine, replicas):
    from sim.app.cluster import simulate_cluster

    text = _cfg(replicas, engine).replace("[workload]", "[workload]\nshared_prefix = { num_groups = 2, prefix_len = 32 }")
    raw = tomllib.loads(text)
    raw.setdefault("cluster", {})["router"] = "prefix-aware"
    res = simulate_cluster(raw)
    assert (res.requests["status"] == "finished").sum() == 40


def test_prefix_aware_without_a_prefix_cache_runs(tmp_path, capsys):
    """Not refused (the review of the first version): the router still groups requests by its own index of
    prompts, so caching off beside it is an ablation (how much of its gain is the cache's), not a no-op."""
    text = _cfg('[cluster]\nreplicas = 2\nrouter = "prefix-aware"\n', "enable_prefix_caching = false")
    assert _run_json(tmp_path, text, capsys)["completed"] == 40


def test_other_routers_without_a_prefix_cache_run(tmp_path, capsys):
    text = _cfg('[cluster]\nreplicas = 2\nrouter = "least-outstanding"\n', "enable_prefix_caching = false")
    assert _run_json(tmp_path, text, capsys)["completed"] == 40


def test_session_affinity_without_sessions_is_its_fallback_by_design(tmp_path, capsys):
    """Not refused: the router's documented rule (routers/session_affinity.py) sends a request without a
    session by its ``fallback``, so over an open loop it is that router, by design."""
    a = _run_json(tmp_path, _cfg('[cluster]\nreplicas = 2\nrouter = "session-affinity"\n'), capsys)
    b = _run_json(tmp_path, _cfg('[cluster]\nreplicas = 2\nrouter = "least-outstanding"\n'), capsys)
    assert a["completed"] == b["completed"] == 40 and a["median_ttft_ms"] == b["median_ttft_ms"]


def test_disagg_with_pd_replicas_runs(tmp_path, capsys):
    s = _run_json(tmp_path, _cfg(PD.format(cluster="[cluster.disagg]\nlink_bandwidth_gb_s = 0.5")), capsys)
    assert s["completed"] == 40


def test_disagg_of_a_comparison_with_pd_variants_loads():
    """examples/cluster_disagg.toml: the link of its P/D variants beside a colocated one."""
    from sim.app.cluster_config import load_cluster

    cfgs = load_cluster(ROOT / "examples" / "cluster_disagg.toml")
    assert cfgs["colocated"].disagg is None and cfgs["1p3d"].disagg is not None


def test_empty_disagg_table_without_pd_runs(tmp_path, capsys):
    """An empty [cluster.disagg] sets nothing: nothing to refuse."""
    assert _run_json(tmp_path, _cfg("[cluster]\nreplicas = 2\n[cluster.disagg]\n"), capsys)["completed"] == 40
