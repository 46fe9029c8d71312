"""The mypyc build of the hot modules (sim/native.py): same results as the sources, and never stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import sim.native as native
from sim.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

# A run that goes through every compiled module: the vllm scheduler with async scheduling, prefix caching
# on shared content (hashing, hits, evictions), chunked prompts, preemptions in a small pool, decode runs.
CHILD = r"""
import hashlib, json, sys
import sim.native as native
from sim.core.errors import ConfigError
from sim.app.config import config_from_dict
from sim.app.simulate import simulate
cfg = config_from_dict({
    "model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
    "engine": {"policy": "vllm", "max_num_seqs": 48, "num_gpu_blocks_override": 900, "max_num_batched_tokens": 512},
    "workload": {"num_requests": 400, "rate": 30.0,
                 "shared_prefix": {"num_groups": 4, "prefix_len": 256},
                 "prompt": {"dist": "lognormal", "mean": 600, "std": 300, "min": 16, "max": 3000},
                 "output": {"dist": "lognormal", "mean": 120, "std": 80, "min": 4, "max": 800}},
})
res = simulate(cfg)
digest = {name: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()
          for name, df in (("requests", res.requests), ("steps", res.steps))}
# conversations through the front end (workloads/gen/session_source.py): turns built slot by slot, at arrival
ses = simulate(config_from_dict({
    "model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"}, "engine": {"policy": "vllm"},
    "workload": {"kind": "sessions", "num_sessions": 60, "rate": 2.0, "think_time": 1.0,
                 "turns": {"dist": "uniform", "low": 1, "high": 8}, "message": {"dist": "uniform", "low": 20, "high": 300},
                 "output": {"dist": "uniform", "low": 5, "high": 120}, "system_prompt": {"num_prompts": 2, "len": 100}},
}))
digest["sessions"] = hashlib.sha256(ses.requests.drop(columns=["wall_time_s"], errors="ignore").to_csv(index=False).encode()
                                    + ses.steps.to_csv(index=False).encode()).hexdigest()
# clusters (the compiled gateway, inbox, timing, views and rotor): finishes counted from runs' views, and
# a polled router reading the replicas mid-run
from sim.app.cluster import simulate_cluster
for name, router, gateway in (("lo", "least-outstanding", {}), ("kv", "least-kv", {"poll_interval_s": 0.05})):
    c = simulate_cluster({"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
        "engine": {"policy": "vllm", "max_num_seqs": 32},
        "workload": {"num_requests": 300, "rate": 40.0,
                     "prompt": {"dist": "lognormal", "mean": 600, "std": 300, "min": 16, "max": 3000},
                     "output": {"dist": "lognormal", "mean": 120, "std": 80, "min": 4, "max": 800}},
        "cluster": {"replicas": 4, "router": router, "gateway": gateway}})
    digest["cluster_" + name] = hashlib.sha256(c.requests.drop(columns=["wall_time_s"], errors="ignore")
                                               .to_csv(index=False).encode() + c.steps.to_csv(index=False).encode()).hexdigest()
print(json.dumps({"active": native.active(), "preemptions": int(res.steps["num_preempted"].sum()), **digest}))
"""


def _child(pure: bool) -> dict:
    env = {**os.environ, native.PURE_ENV: "1" if pure else "0"}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(native.state() != "compiled", reason="no current mypyc build here: nothing to compare")
def test_compiled_and_interpreted_give_identical_tables():
    compiled, pure = _child(pure=False), _child(pure=True)
    assert compiled["active"] and not pure["active"]
    assert compiled["preemptions"] > 0  # the run exercises the preemption paths too
    assert compiled == {**pure, "active": True}


def _fake_build(tmp_path: Path, sources: dict) -> Path:
    """A build folder with a manifest and an (empty) file for each compiled module and the library."""
    for m in native.MODULES:
        f = tmp_path / (m.replace(".", "/") + native._suffix())
        f.parent.mkdir(parents=True, exist_ok=True)
        f.touch()
    (tmp_path / ("x__mypyc" + native._suffix())).touch()
    (tmp_path / "manifest.json").write_text(json.dumps({"sources": sources, "library": "x__mypyc" + native._suffix()}))
    return tmp_path


def test_a_build_is_used_only_when_it_matches_every_source_and_this_python(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "native_dir", lambda: tmp_path)
    assert native.state() == "none"
    current = native._fingerprint()
    _fake_build(tmp_path, current)
    assert native.state() == "compiled"
    # an imported project module counts too: the compiled code enforces its types (RequestSpec's fields)
    assert "sim.core.spec" in current and "policies.vllm_options" in current
    for key in ("sim.core.spec", "policies.vllm", "python"):
        _fake_build(tmp_path, {**current, key: "0"})
        assert native.state() == "stale", key
    _fake_build(tmp_path, current)
    _built = tmp_path / ("policies/vllm" + native._suffix())
    _built.unlink()
    assert native.state() == "stale"  # a partial build is all-or-nothing too


def test_a_stale_build_is_never_imported(monkeypatch, tmp_path):
    """A stale build: one warning, and no finder (every module imports from its source); nothing is ever
    built beside the sources, so Python's own import cannot find a build either."""
    monkeypatch.setattr(native, "native_dir", lambda: tmp_path)
    _fake_build(tmp_path, {**native._fingerprint(), "sim.core.request": "0"})
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, native._FromBuild)])
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        native.install()
    assert not native.active()
    assert len(seen) == 1 and "do not match their sources" in str(seen[0].message)
    for package in native.PACKAGES:
        assert not list((REPO / package).rglob("*.so")), "an extension module beside the sources"


def test_the_finder_loads_only_the_compiled_modules(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "native_dir", lambda: tmp_path)
    finder = native._FromBuild()
    spec = finder.find_spec("policies.vllm")
    assert spec is not None and spec.origin == str(tmp_path / ("policies/vllm" + native._suffix()))
    assert finder.find_spec("sim.engine.sources") is None  # not compiled: the usual import


@pytest.mark.skipif(native.state() != "compiled", reason="no current mypyc build here")
def test_an_installed_servesim_started_elsewhere_runs_the_build(tmp_path):
    """The shared library sits at the repository root, off sys.path when Python starts in another
    directory: the installed package must still load it (sim/native.py _load_shared_library)."""
    code = "import sim, sim.native as n, policies.vllm as v; print(sim.__file__, n.active(), v.__file__)"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", native.PURE_ENV)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0 and "No module named 'sim'" in out.stderr:
        pytest.skip("sim is not installed in this environment (run from a source tree)")
    assert out.returncode == 0, out.stderr
    where, active, vllm_file = out.stdout.split()
    if Path(where).resolve().parents[1] != REPO:
        pytest.skip(f"the installed sim is another tree's ({where})")
    assert active == "True" and vllm_file.endswith(".so")


def test_make_rebuilds_when_any_source_of_the_build_changes():
    """The Makefile's NATIVE_SRC (what ``make native`` depends on) covers every module the build's manifest
    records: an edit to any of them rebuilds, instead of leaving the finder to fall back to the sources."""
    try:
        out = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                              "print-native-src: ; @echo $(NATIVE_SRC)", "print-native-src"],
                             cwd=REPO, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no GNU make here: {e}")
    listed = set(out.stdout.split())
    needed = {str(native.source(m).relative_to(REPO)) for m in native.dependencies()}
    assert needed and not needed - listed, sorted(needed - listed)


def test_a_spec_holds_plain_numbers_whatever_it_is_given():
    """Workloads draw with numpy; the spec keeps plain ints and floats, so the compiled modules (which
    refuse a numpy integer where they expect an int) and the interpreted ones see the same values."""
    import numpy as np

    from sim.core.errors import ConfigError
    from sim.core.request import Request, RequestSpec

    s = RequestSpec("a", np.float32(1.5), np.int64(7), np.int32(3), priority=np.int8(2), hash_block_size=16.0)
    assert [type(v) for v in (s.arrival_time, s.prompt_len, s.output_len, s.priority, s.hash_block_size)] == [
        float, int, int, int, int]
    assert (s.arrival_time, s.prompt_len, s.output_len, s.priority) == (1.5, 7, 3, 2)
    r = Request(s)
    assert (r.prompt_len, r.num_tokens, r.arrival_time) == (7, 7, 1.5)
    for bad, field in ((dict(prompt_len=5.5), "prompt_len"), (dict(output_len="3"), "output_len"),
                       (dict(arrival_time=None), "arrival_time"), (dict(priority=True), "priority")):
        kw = {"request_id": "b", "arrival_time": 0.0, "prompt_len": 5, "output_len": 3, **bad}
        with pytest.raises(ConfigError, match=f"request b: {field} must be"):
            RequestSpec(**kw)
    # a front end's shifted copy: the fields dataclasses.replace gives, the time a plain float, checked
    import dataclasses

    shifted = s.arriving_at(np.float64(2.25))
    assert shifted == dataclasses.replace(s, arrival_time=2.25) and type(shifted.arrival_time) is float
    assert shifted.shares_content == s.shares_content and shifted.prefix_hashes is s.prefix_hashes
    with pytest.raises(ConfigError, match=r"request a: arrival_time must be >= 0 and <= 1e\+09 s.*got -1.0"):
        s.arriving_at(-1.0)


def test_plain_spec_is_the_constructors_spec():
    """plain_spec (a generated request, slot by slot) leaves every slot, and its type, as the dataclass
    constructor does, and hands anything its checks refuse to the constructor, which names it."""
    import numpy as np

    from sim.core.errors import ConfigError
    from sim.core.spec import RequestSpec, plain_spec

    for args in (("r1", 1.5, 10, 5, 0), ("r2", 0.0, 1, 1, -3), ("r3", 2.0, np.int64(7), 3, 1)):
        got, want = plain_spec(*args), RequestSpec(*args)
        assert got == want
        assert [getattr(got, n) for n in RequestSpec.__slots__] == [getattr(want, n) for n in RequestSpec.__slots__]
        assert [type(getattr(got, n)) for n in RequestSpec.__slots__] == [
            type(getattr(want, n)) for n in RequestSpec.__slots__]
    for bad, field in (((0.0, 0, 5), "prompt_len"), ((-1.0, 5, 5), "arrival_time"), ((0.0, 5, 2.5), "output_len")):
        with pytest.raises(ConfigError, match=f"request b: {field} must be"):
            plain_spec("b", *bad, 0)


def test_turn_spec_is_the_constructors_spec():
    """A conversation's turn built slot by slot (session_source.Turns.spec) leaves every slot, and its
    type, as the constructor does, for every turn of generated conversations; a conversation the
    once-per-conversation checks refuse (a numpy length, a zero output, content that does not add up)
    builds each turn through the constructor, which converts or names what it refuses."""
    import dataclasses

    import numpy as np

    from sim.core.errors import ConfigError
    from sim.core.spec import HASH_ALL, RequestSpec
    from workloads.gen.session_source import Turns
    from workloads.gen.sessions import build_session_workload

    wl = build_session_workload({"kind": "sessions", "num_sessions": 12, "rate": 0.6, "think_time": 2.0,
                                 "turns": {"dist": "uniform", "low": 1, "high": 6},
                                 "message": {"dist": "uniform", "low": 10, "high": 90},
                                 "output": {"dist": "uniform", "low": 5, "high": 60},
                                 "system_prompt": {"num_prompts": 3, "len": 70}}, 5)  # fmt: skip

    def want(conv, k, t):
        prompt = conv.prompt_len(k)
        return RequestSpec(f"s{conv.index}t{k}", t, prompt, int(conv.outputs[k]), session_id=f"s{conv.index}",
                           segments=conv.segments(k), output_key=conv.output_key(k),
                           private_from=prompt - int(conv.messages[k]), private_until_done=k < conv.num_turns - 1)

    def slots(spec):
        return [(getattr(spec, n), type(getattr(spec, n))) for n in RequestSpec.__slots__]

    turns = 0
    for conv in wl.conversations:
        assert Turns(conv).plain
        for k in range(conv.num_turns):
            got = conv.spec(k, 3.0 + k)
            assert slots(got) == slots(want(conv, k, 3.0 + k))
            turns += 1
    assert turns > 12 and got.shares_content and got.hash_end == got.private_from < HASH_ALL
    conv = next(c for c in wl.conversations if c.num_turns > 1)
    odd = dataclasses.replace(conv, messages=(np.int64(conv.messages[0]), *conv.messages[1:]))
    assert not Turns(odd).plain and slots(odd.spec(1, 2.0)) == slots(want(conv, 1, 2.0))  # converted
    zero = dataclasses.replace(conv, outputs=(0, *conv.outputs[1:]))
    assert not Turns(zero).plain
    with pytest.raises(ConfigError, match="output_len must be >= 1"):
        zero.spec(0, 1.0)
    short = Turns(conv)
    short.prompt_lens = [p + 1 for p in short.prompt_lens]  # prompts past their segments
    short.plain = short._plain()
    assert not short.plain
    with pytest.raises(ConfigError, match="segment lengths do not add up"):
        short.spec(0, 1.0, None)
    with pytest.raises(ConfigError, match="arrival_time must be"):
        Turns(conv).spec(0, 2e9, None)


def test_plug_in_inputs_work_compiled_or_not():
    """What a plug-in may hand the compiled modules, as the interpreted ones took it: lists and numpy
    numbers in a spec, an int id, arrays in a batch summary; specs with shared prefixes and the policy's
    small value types pickle and copy (user Ray tasks, checkpoints)."""
    import copy
    import pickle

    import numpy as np

    from sim.core.batch import BatchSummary
    from sim.core.policy import Quiet
    from sim.core.request import PrefixHashes, Request, RequestSpec

    ph = PrefixHashes(((("sys", 1), 32),))
    s = RequestSpec(7, 0, np.int64(48), 4, segments=[(("sys", 1), np.int64(32)), (("u", 7), 16)],
                    prefix_hashes=ph)
    assert s.request_id == "7" and s.segments == ((("sys", 1), 32), (("u", 7), 16))
    assert type(s.segments[0][1]) is int and type(s.arrival_time) is float
    t = RequestSpec("t", 0.0, 4, 2, token_ids=np.arange(4), hash_ids=[1, 2], hash_block_size=2)
    assert t.token_ids == (0, 1, 2, 3) and t.hash_ids == (1, 2)
    again = pickle.loads(pickle.dumps([s, s]))
    assert again[0] is again[1] and again[0] == s and again[0].prefix_hashes.segments == ph.segments
    assert Request(again[0]).block_hashes(16, 48) == Request(s).block_hashes(16, 48)
    b = BatchSummary.of(np.array([3, 4]), (), [], np.int64(2))
    assert (b.num_decode, b.decode_ctx_sum, b.num_logits, b.num_prefill_tokens) == (2, 7, 2, 0)
    q = Quiet(waiting_blocked=True, finishes_matter=False)
    assert copy.deepcopy(q) == q == pickle.loads(pickle.dumps(q))
    with pytest.raises(ConfigError, match="segment length must be an integer"):
        RequestSpec("x", 0.0, 4, 2, segments=[(("a", 1), 2.5), (("b", 1), 1.5)])
    with pytest.raises(ConfigError, match="request_id must be set"):
        RequestSpec(None, 0.0, 4, 2)


@pytest.mark.skipif(not native.active(), reason="running interpreted (no current build, or SERVESIM_PURE=1)")
def test_the_objects_made_each_run_are_built_by_compiled_code():
    """A class in a compiled module is built by compiled code unless a decorator swaps it for a Python
    class (a ``slots`` dataclass: its generated ``__init__`` runs interpreted). The fast-forward makes a
    DecodeRun each decode run and a pushed replica a RunView: both are built natively."""
    import inspect

    from sim.core.policy import StepPlan
    from sim.engine.fastforward import DecodeRun, RunView

    for cls in (DecodeRun, RunView, StepPlan):
        assert not inspect.isfunction(cls.__init__), cls  # a Python function: the interpreted constructor
    run = DecodeRun([], 3, [1], [2], [0, 0, 1, 1], cached_free_start=5)
    assert (run.max_steps, run.cached_free_start, run.free_blocks, run.cached_free) == (3, 5, None, None)
    view = RunView([0.0, 1.0], [1.0, 2.0], None, [], [])
    assert (view.cut_step, view.cut(1.5), view.cut_step) == (0, 2.0, 2)
    a, b, given = StepPlan(), StepPlan(), [(None, 1)]
    assert a.scheduled is not b.scheduled and a.batch is not b.batch and a.is_empty  # fresh lists, as the factories
    assert StepPlan(scheduled=given).scheduled is given and not StepPlan(scheduled=given).is_empty


def test_a_step_plan_refuses_a_misspelt_field_compiled_or_not():
    """The plan has fixed fields in both builds (as the slots dataclass had): a misspelt one fails, not
    silently adds an attribute the engine never reads; its repr names a policy's subclass."""
    from sim.core.policy import StepPlan

    plan = StepPlan()
    with pytest.raises(AttributeError):
        plan.schedule = []  # type: ignore[attr-defined]

    class Traced(StepPlan):
        pass

    assert repr(Traced()).startswith("Traced(scheduled=[]")
