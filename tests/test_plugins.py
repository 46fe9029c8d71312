"""Plug-ins (issue 15, item 2): a router, a workload generator and a cost model in the user's own module,
named in a config as ``"module:Name"``, run from the CLI; the same found through entry points; unknown
names stay one line with a "did you mean".

Nothing is installed: each test writes its module into tmp_path and puts that on sys.path; the entry-point
tests replace ``importlib.metadata.entry_points`` with a list of their own."""

from __future__ import annotations

import importlib.metadata
import json
import textwrap

import pytest

from sim.cli.main import main

PLUGIN = '''
import numpy as np

from routers.base import BaseRouter
from sim.core.request import RequestSpec


class LastReplica(BaseRouter):
    """Every request to the last candidate: easy to see in the per-replica counts."""

    name = "last-replica"

    def __init__(self, options, ctx):
        self.options = options

    def route(self, spec, candidates, now):
        return candidates[-1]


def burst(table, seed, max_model_len, base_dir):
    """``n`` requests of 64 + 8 tokens, all at t = 0."""
    n = int(table.get("n", 5))
    return [RequestSpec(f"b{i}", 0.0, 64, 8) for i in range(n)]


class FlatCost:
    """Every non-empty step takes ``STEP`` seconds, whatever the batch."""

    STEP = 0.01

    def __init__(self, model, gpu, **kwargs):
        self.model = model

    def step_time(self, batch):
        return 0.0 if batch.is_empty else self.STEP

    def decode_step_times(self, num_decode, ctx_sums, num_logits=None):
        n = np.broadcast_to(np.asarray(num_decode), np.shape(ctx_sums))
        return np.where(n > 0, self.STEP, 0.0).astype(np.float64)

    def breakdown(self, batch):
        return {"flat": self.step_time(batch)}
'''


@pytest.fixture
def plugmod(tmp_path, monkeypatch, request):
    """A fresh module name per test (the registries are process-wide)."""
    name = f"plug_{request.node.name.replace('[', '_').replace(']', '_').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _write(tmp_path, text: str):
    p = tmp_path / "cfg.toml"
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(p)


ENGINE = '[engine]\nmax_model_len = 2048\nmax_num_seqs = 8\n'


def test_workload_generator_and_cost_model_from_the_users_module(tmp_path, plugmod, capsys):
    cfg = _write(tmp_path, f'{ENGINE}cost_model = "{plugmod}:FlatCost"\n'
                           f'[workload]\nkind = "{plugmod}:burst"\nn = 6\n')  # fmt: skip
    assert main(["run", cfg, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["num_requests"] == 6 and s["completed"] == 6  # the builder's n, not a default
    assert s["config"]["engine"]["cost_model"] == f"{plugmod}:FlatCost"
    # Every step takes the plug-in's 10 ms: TPOT is exactly that, the engine's TTFT one prefill step (the
    # headline TTFT is the client's: vllm's default [frontend] adds the request path)
    assert s["mean_tpot_ms"] == pytest.approx(10.0) and s["mean_ttft_engine_ms"] == pytest.approx(10.0)
    assert s["mean_ttft_ms"] > 10.0


def test_router_from_the_users_module_in_a_cluster(tmp_path, plugmod, capsys):
    cfg = _write(tmp_path, f'{ENGINE}cost_model = "constant"\n[cluster]\nreplicas = 3\n'
                           f'router = "{plugmod}:LastReplica"\n[workload]\nrate = 50.0\nnum_requests = 12\n'
                           'prompt = {dist = "fixed", value = 32}\noutput = {dist = "fixed", value = 4}\n')  # fmt: skip
    assert main(["cluster", cfg, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    served = [r["requests_served"] for r in s["replicas"]]
    assert served == [0, 0, 12]


def _fake_entry_points(monkeypatch, eps: list[importlib.metadata.EntryPoint]) -> None:
    def entry_points(**kw):
        group = kw.get("group")
        return [ep for ep in eps if group is None or ep.group == group]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_entry_points_are_loaded_when_a_config_names_them(tmp_path, plugmod, monkeypatch, capsys):
    EP = importlib.metadata.EntryPoint
    _fake_entry_points(monkeypatch, [
        EP(name="ep-last", value=f"{plugmod}:LastReplica", group="servesim.routers"),
        EP(name="ep-burst", value=f"{plugmod}:burst", group="servesim.workloads"),
        EP(name="ep-flat", value=f"{plugmod}:FlatCost", group="servesim.cost_models"),
    ])  # fmt: skip
    cfg = _write(tmp_path, f'{ENGINE}cost_model = "ep-flat"\n[cluster]\nreplicas = 2\nrouter = "ep-last"\n'
                           '[workload]\nkind = "ep-burst"\nn = 4\n')  # fmt: skip
    assert main(["cluster", cfg, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert [r["requests_served"] for r in s["replicas"]] == [0, 4]
    assert s["mean_tpot_ms"] == pytest.approx(10.0)


def test_a_policy_package_registers_through_its_entry_point(tmp_path, monkeypatch, capsys):
    (tmp_path / "ep_policy_pkg.py").write_text(textwrap.dedent('''
        from policies.base import register
        from policies.vllm import VllmPolicy

        @register("ep-fifo")
        def make(limits, options):
            return VllmPolicy(limits)
    '''), encoding="utf-8")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake_entry_points(monkeypatch, [importlib.metadata.EntryPoint(
        name="ep-fifo", value="ep_policy_pkg", group="servesim.policies")])  # fmt: skip
    cfg = _write(tmp_path, '[engine]\npolicy = "ep-fifo"\ncost_model = "constant"\nmax_model_len = 2048\n'
                           '[workload]\nrate = 20.0\nnum_requests = 5\nprompt = 16\noutput = 4\n')  # fmt: skip
    assert main(["run", cfg, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 5


@pytest.mark.parametrize("table, value, words", [
    ("[engine]", 'cost_model = "rooflin"', ["unknown cost model 'rooflin'", "did you mean 'roofline'"]),
    ("[cluster]", 'router = "least-kvv"', ["unknown router 'least-kvv'", "did you mean 'least-kv'"]),
    ("[workload]", 'kind = "opne"', ["unknown workload 'opne'", "did you mean 'open'"]),
    ("[engine]", 'policy = "vlm"', ["unknown policy 'vlm'", "did you mean 'vllm'"]),
    ("[workload]", 'kind = "no_such_mod_abc:gen"', ["cannot import module 'no_such_mod_abc'"]),
    ("[cluster]", 'router = "json:dumpz"', ["module 'json' registers no router 'dumpz'"]),
])  # fmt: skip
def test_unknown_names_are_one_line_with_did_you_mean(tmp_path, capsys, table, value, words):
    rest = {"[engine]": "", "[cluster]": "[cluster]\nreplicas = 2\n", "[workload]": ""}[table]
    body = f"{table}\n{value}\n" if table != "[cluster]" else f"{rest}{value}\n"
    wl = "" if table == "[workload]" else "[workload]\nrate = 1.0\nnum_requests = 2\nprompt = 8\noutput = 2\n"
    cfg = _write(tmp_path, body + wl)
    assert main(["run", cfg]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("servesim: error: ")
    for w in words:
        assert w in err


def test_an_entry_point_that_fails_to_load_is_one_line(tmp_path, monkeypatch, capsys):
    _fake_entry_points(monkeypatch, [importlib.metadata.EntryPoint(
        name="broken", value="no_such_pkg_xyz.mod:Router", group="servesim.routers")])  # fmt: skip
    cfg = _write(tmp_path, '[cluster]\nreplicas = 2\nrouter = "broken"\n'
                           '[workload]\nrate = 1.0\nnum_requests = 2\nprompt = 8\noutput = 2\n')  # fmt: skip
    assert main(["run", cfg]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "entry point 'no_such_pkg_xyz.mod:Router'" in err and "does not load" in err
