"""The hostile corpus, cluster side, fourth round (fuzz report 2026-12, helper A): variant names that left
``--out``, a P/D hand-off checked only where both sides named a value, router options past int32 or
parsed loosely, a blank device, ranges that said "0 to inf" and then refused inf, an unknown inner router
that did not name its option. Each bad input ends in exit code 2 (or a ConfigError) and one line naming
the field and the value, before any replica is built; beside each, the nearest valid input still runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.errors import ConfigError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401
from tests.test_bad_inputs_part3 import BASE  # one small A100 config (10 requests), its [workload] last


@pytest.fixture
def no_cluster(monkeypatch, no_simulation):  # noqa: F811
    """Fail if a cluster (its replicas' engines) is built: bad input is refused when the config loads."""
    import sim.app.cluster as cluster_mod

    def boom(*a, **k):
        raise AssertionError("a cluster was built before the input was checked")

    monkeypatch.setattr(cluster_mod, "Cluster", boom)


def _write(tmp: Path, text: str, name: str = "c.toml") -> str:
    p = tmp / name
    p.write_text(text)
    return str(p)


def _cli(argv: list[str], capsys) -> str:
    from sim.cli.main import main

    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.err.strip() == "", out.err
    return out.out


POOLS = """[cluster]
router = {router}
[[replica]]
name = "s"
pool = "short"
[[replica]]
name = "l"
pool = "long"
"""
TWO = '[cluster]\nreplicas = 2\nrouter = {router}\n'
PD = """[cluster]
router = "round-robin"
[cluster.disagg]
{link}
[[replica]]
name = "p"
role = "prefill"
{p}
[[replica]]
name = "d"
role = "decode"
{d}
"""


def _pd(link: str = "", p: str = "", d: str = "") -> str:
    return BASE + PD.format(link=link, p=p, d=d)


BIG = "9223372036854775808"  # 2^63

CASES = [
    # S1: a variant's name is its output folder: a path out of --out, or --out's root itself
    ("variant-traversal", BASE + '[variants."../../x"]\ncluster = {replicas = 1}\n[variants.b]\n',
     ['[variants."../../x"]', "'../../x'", "output folder"]),
    ("variant-absolute", BASE + '[variants."/tmp/abs_variant"]\n[variants.b]\n',
     ['[variants."/tmp/abs_variant"]', "no leading '/'"]),
    ("variant-empty", BASE + '[variants.""]\n[variants.b]\n', ['[variants.""]', "non-empty"]),
    ("variant-blank", BASE + '[variants." "]\n[variants.b]\n', ['[variants." "]', "non-empty"]),
    ("variant-dot", BASE + '[variants."."]\n[variants.b]\n', ['[variants."."]', "none empty, '.' or '..'"]),
    ("variant-dotdot", BASE + '[variants.".."]\n[variants.b]\n', ['[variants.".."]', "none empty, '.' or '..'"]),
    ("variant-backslash", BASE + '[variants."a\\\\b"]\n', ['[variants."a\\\\b"]', "'\\'"]),
    ("variant-nul", BASE + '[variants."a\\u0000b"]\n', ['[variants."a\\u0000b"]', "NUL"]),
    # S2: compared as resolved (block size: the preset's default; "auto": the model's dtype)
    ("pd-dtype-auto-fp16-vs-bf16", _pd(p='model = { dtype = "fp16" }'),
     ["'p' and 'd'", "kv_cache_dtype 'auto' (= 'fp16') vs 'auto' (= 'bf16')"]),
    ("pd-fp8-vs-auto-decode-side", _pd(d='engine = { kv_cache_dtype = "fp8" }'),
     ["kv_cache_dtype 'auto' (= 'bf16') vs 'fp8'"]),
    ("pd-fp8-e4m3-vs-e5m2", _pd(p='engine = { kv_cache_dtype = "fp8" }', d='engine = { kv_cache_dtype = "fp8_e5m2" }'),
     ["kv_cache_dtype 'fp8' vs 'fp8_e5m2'"]),
    ("pd-block-default-vs-32", _pd(d="engine = { block_size = 32 }"),
     ["block_size 16 (the vllm preset's default) vs 32"]),
    # S3: one pool for both lengths: the split would do nothing
    ("lp-same-pool", BASE + POOLS.format(router='{name = "length-pools", long_pool = "short", short_pool = "short"}'),
     ["length-pools", "long_pool and short_pool", "'short'", "two different pools"]),
    # S5: router counts within int32, as the engine's
    ("lp-threshold-2p63", BASE + POOLS.format(router=f'{{name = "length-pools", threshold = {BIG}}}'),
     ["option threshold", BIG, "2147483647"]),
    ("lp-threshold-2p31", BASE + POOLS.format(router='{name = "length-pools", threshold = 2147483648}'),
     ["option threshold", "2147483648", "from 1 to 2147483647"]),
    ("pa-load-guard-2p63", BASE + TWO.format(router=f'{{name = "prefix-aware", load_guard = {BIG}}}'),
     ["option load_guard", BIG, "from 0 to 2147483647"]),
    ("pa-capacity-2p63", BASE + TWO.format(router=f'{{name = "prefix-aware", capacity_blocks = {BIG}}}'),
     ["option capacity_blocks", BIG, "2147483647"]),
    ("sa-load-guard-2p63", BASE + TWO.format(router=f'{{name = "session-affinity", load_guard = {BIG}}}'),
     ["option load_guard", BIG, "2147483647"]),
    ("decode-router-load-guard-2p63", _pd(link=f'decode_router = {{name = "prefix-aware", load_guard = {BIG}}}'),
     ["option load_guard", BIG]),
    # S6: priority-pools keys: plain integers within the priorities' range
    ("pp-key-underscore", BASE + POOLS.format(router='{name = "priority-pools", pools = {"1_0" = "short"}}'),
     ["pools key '1_0'", "plain integer"]),
    ("pp-key-spaces", BASE + POOLS.format(router='{name = "priority-pools", pools = {" 1 " = "short"}}'),
     ["pools key ' 1 '"]),
    ("pp-key-huge", BASE + POOLS.format(router='{name = "priority-pools", pools = {"99999999999999999999" = "short"}}'),
     ["pools key '99999999999999999999'", "2147483647"]),
    ("pp-key-2p31", BASE + POOLS.format(router='{name = "priority-pools", pools = {"-2147483648" = "short"}}'),
     ["pools key '-2147483648'", "from -2147483647 to 2147483647"]),
    ("pp-key-float", BASE + POOLS.format(router='{name = "priority-pools", pools = {"1.0" = "short"}}'),
     ["pools key '1.0'"]),
    ("pp-key-very-long", BASE + POOLS.format(router='{name = "priority-pools", pools = {"%s" = "short"}}' % ("9" * 5000)),
     ["pools key '999", "plain integer"]),
    ("pp-key-same-priority", BASE + POOLS.format(router='{name = "priority-pools", pools = {"1" = "short", "+1" = "long"}}'),
     ["pools keys '1' and '+1'", "priority 1"]),
    # S7: a blank device name is refused, as a blank name or pool is
    ("device-empty", BASE + '[[replica]]\nname = "a"\ndevice = ""\nengine = { gpu_memory_utilization = 0.45 }\n',
     ["[[replica]] #1.device", "non-empty string", "''"]),
    ("device-blank", BASE + '[[replica]]\nname = "a"\ndevice = "  "\n', ["[[replica]] #1.device", "'  '"]),
    ("pool-blank", BASE + '[[replica]]\nname = "a"\npool = " "\n', ["[[replica]] #1.pool", "' '"]),
    # M2: the real ranges, for every bad value
    ("link-bandwidth-inf", _pd(link="link_bandwidth_gb_s = inf"),
     ["[cluster.disagg].link_bandwidth_gb_s", "from 0.01 to 100000 GB/s", "got inf"]),
    ("link-bandwidth-nan", _pd(link="link_bandwidth_gb_s = nan"), ["link_bandwidth_gb_s", "0.01 to 100000", "nan"]),
    ("link-bandwidth-neg", _pd(link="link_bandwidth_gb_s = -1"), ["link_bandwidth_gb_s", "0.01 to 100000", "-1"]),
    ("link-bandwidth-zero", _pd(link="link_bandwidth_gb_s = 0"), ["link_bandwidth_gb_s", "0.01 to 100000", "got 0"]),
    ("link-latency-inf", _pd(link="link_latency_ms = inf"),
     ["[cluster.disagg].link_latency_ms", "from 0 to 60000 ms", "got inf"]),
    ("link-latency-nan", _pd(link="link_latency_ms = nan"), ["link_latency_ms", "0 to 60000 ms", "nan"]),
    ("link-latency-neg", _pd(link="link_latency_ms = -1"), ["link_latency_ms", "0 to 60000 ms", "-1"]),
    # M5: an unknown inner router names its option
    ("lp-within-unknown", BASE + POOLS.format(router='{name = "length-pools", within = "nosuch"}'),
     ["router 'length-pools': option within", "unknown router 'nosuch'"]),
    ("pp-within-unknown", BASE + POOLS.format(router='{name = "priority-pools", pools = {"0" = "short"}, '
                                                    'within = "nosuch"}'),
     ["router 'priority-pools': option within", "'nosuch'"]),
    ("sa-fallback-unknown", BASE + TWO.format(router='{name = "session-affinity", fallback = "nosuch"}'),
     ["router 'session-affinity': option fallback", "unknown router 'nosuch'"]),
    # a router checked when the config loads: a later variant's bad option, before the first variant runs
    ("variant-router-bad", BASE + TWO.format(router='"round-robin"') + '[variants.a]\n[variants.b]\n'
     'cluster = {router = {name = "length-pools", threshold = 0}}\n', ["[variants.b]", "option threshold"]),
]


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize("name,text,fragments", CASES, ids=[c[0] for c in CASES])
def test_cluster4_one_line_exit_2(name, text, fragments, tmp_path, capsys):
    out = tmp_path / "out" / "sub"
    run_bad_case(["cluster", _write(tmp_path, text), "--out", str(out)], fragments, capsys)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # nothing written beside --out either


BY_NAME = {c[0]: c for c in CASES}


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize("name", ["variant-traversal", "pd-fp8-vs-auto-decode-side", "lp-same-pool",
                                  "pp-key-underscore", "device-empty", "link-latency-inf", "lp-within-unknown"])
def test_cluster4_through_run_too(name, tmp_path, capsys):
    """``servesim run`` hands these configs to the cluster path: the same one line."""
    _, text, fragments = BY_NAME[name]
    run_bad_case(["run", _write(tmp_path, text)], fragments, capsys)


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize("name", ["variant-traversal", "variant-empty", "pd-dtype-auto-fp16-vs-bf16", "lp-same-pool",
                                  "lp-threshold-2p63", "decode-router-load-guard-2p63", "pp-key-same-priority",
                                  "pool-blank", "link-bandwidth-nan", "sa-fallback-unknown", "variant-router-bad"])
def test_cluster4_api_config_error(name):
    """The API's load (``simulate_cluster`` on a raw dict): a ConfigError, one line, the same fragments."""
    import tomllib

    from sim.app.cluster import simulate_cluster

    _, text, fragments = BY_NAME[name]
    with pytest.raises(ConfigError) as exc:
        simulate_cluster(tomllib.loads(text), variant="b" if "variants" in text else None)
    msg = str(exc.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, (name, f, msg)


# ---- the nearest valid inputs still run --------------------------------------------------------------------
def test_variant_names_that_are_one_folder_run(tmp_path, capsys):
    """Spaces, dots inside, unicode, a leading dash: each is one folder under --out."""
    names = ["tp 2", "a.b", "größe", "-x", "...", "vllm/split"]  # a '/' nests a folder inside --out
    body = "".join(f'[variants."{n}"]\n' for n in names)
    out = tmp_path / "out"
    _cli(["cluster", _write(tmp_path, BASE + TWO.format(router='"round-robin"') + body), "--out", str(out),
          "--json"], capsys)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted([*names[:-1], "vllm"])
    assert (out / "vllm" / "split" / "summary.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "out"]


@pytest.mark.usefixtures("no_cluster")
@pytest.mark.parametrize(("name", "fragments"), [("a//b", ["'a//b'"]), ("x/..", ["'x/..'"]), ("/abs", ["'/abs'"])])
def test_variant_names_with_empty_or_parent_parts_refused(name, fragments, tmp_path, capsys):
    text = BASE + TWO.format(router='"round-robin"') + f'[variants."{name}"]\n'
    run_bad_case(["cluster", _write(tmp_path, text)], ["[variants.", "output folder", *fragments], capsys)


@pytest.mark.usefixtures("no_cluster")
def test_variant_description_is_text(tmp_path, capsys):
    text = BASE + TWO.format(router='"round-robin"') + "[variants.a]\ndescription = 5\n"
    run_bad_case(["cluster", _write(tmp_path, text)], ["[variants.a] description", "expected a string", "5"], capsys)


def test_priority_pools_numpy_keys_run():
    """A pools table built from a pandas column (numpy integer keys) is the table it says."""
    import tomllib

    import numpy as np

    from sim.app.cluster import simulate_cluster

    raw = tomllib.loads(BASE + POOLS.format(router='"priority-pools"'))
    raw["cluster"]["router"] = {"name": "priority-pools", "pools": {np.int64(0): "short", np.int64(1): "long"}}
    res = simulate_cluster(raw)
    assert (res.requests["status"] == "finished").sum() > 0


@pytest.mark.parametrize("p,d", [
    ("engine = { block_size = 16 }", ""),  # the preset's default, named on one side
    ('engine = { kv_cache_dtype = "bf16" }', ""),  # "auto" on the other side is the model's bf16
    ('engine = { kv_cache_dtype = "fp8" }', 'engine = { kv_cache_dtype = "fp8_e4m3" }'),  # vLLM's fp8 is e4m3
    ('model = { dtype = "fp16" }', 'model = { dtype = "fp16" }'),  # both sides' auto: fp16
])
def test_pd_replicas_that_agree_once_resolved(p, d, tmp_path, capsys):
    out = _cli(["run", _write(tmp_path, _pd(p=p, d=d)), "--json"], capsys)
    assert '"completed": 10' in out


@pytest.mark.parametrize(("replicas", "router"), [
    (POOLS, '{name = "length-pools", long_pool = "long", short_pool = "short", threshold = 2147483647}'),
    (POOLS, '{name = "length-pools", within = "round-robin", threshold = 150}'),
    (POOLS, '{name = "priority-pools", pools = {"-1" = "short", "+2" = "long", "0" = "short", "2147483647" = "long"}}'),
    (POOLS, '{name = "priority-pools", pools = {"-2147483647" = "long"}, default_pool = "short", within = "random"}'),
    (TWO, '{name = "prefix-aware", load_guard = 2147483647, capacity_blocks = 2147483647}'),
    (TWO, '{name = "prefix-aware", load_guard = 0, capacity_blocks = 1}'),
    (TWO, '{name = "session-affinity", load_guard = 2147483647, fallback = "round-robin"}'),
])
def test_routers_at_their_bounds_run(replicas, router, tmp_path, capsys):
    """Pool routers over two named pools, load routers over two replicas: every option at its bound runs."""
    out = _cli(["run", _write(tmp_path, BASE + replicas.format(router=router)), "--json"], capsys)
    assert '"completed": 10' in out


def test_shared_device_named_runs(tmp_path, capsys):
    text = BASE + "".join(f'[[replica]]\nname = "{n}"\ndevice = "gpu0"\nengine = {{ gpu_memory_utilization = 0.45 }}\n'
                          for n in "ab")
    out = _cli(["run", _write(tmp_path, text), "--json"], capsys)
    assert '"completed": 10' in out


@pytest.mark.parametrize("link", ["link_bandwidth_gb_s = 0.01\nlink_latency_ms = 60000",
                                  "link_bandwidth_gb_s = 100000\nlink_latency_ms = 0"])
def test_disagg_link_at_its_bounds_runs(link, tmp_path, capsys):
    out = _cli(["run", _write(tmp_path, _pd(link=link)), "--json"], capsys)
    assert '"completed": 10' in out


def test_set_cluster_on_a_run_config(tmp_path, capsys):
    """V3: ``--set cluster.replicas=2`` on a config without [cluster] runs as a cluster through ``servesim
    cluster``; ``sets_cluster_tables`` is the test ``servesim run`` needs to do the same."""
    from sim.cli.cluster import sets_cluster_tables

    assert sets_cluster_tables(["cluster.replicas=2"]) and sets_cluster_tables([" cluster . router = 'random'"])
    assert sets_cluster_tables(["engine.max_num_seqs=8", '"stream".x=1'])
    assert not sets_cluster_tables(["engine.max_num_seqs=8", "clusterx.a=1", "bad"]) and not sets_cluster_tables(None)
    out = _cli(["cluster", _write(tmp_path, BASE), "--set", "cluster.replicas=2", "--json"], capsys)
    assert '"num_replicas": 2' in out or '"replicas": [' in out
