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

REPO = Path(__file__).resolve().parents[1]

# A run that goes through every compiled module: the vllm scheduler with async scheduling, prefix caching
# on shared content (hashing, hits, evictions), chunked prompts, preemptions in a small pool, decode runs.
CHILD = r"""
import hashlib, json, sys
import sim.native as native
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


def test_a_stale_build_is_never_imported(monkeypatch, tmp_path):
    """A build whose manifest does not match the sources is "stale": install() puts a finder first that
    loads every compiled module from its source, and says so once."""
    manifest = tmp_path / "native_manifest.json"
    manifest.write_text(json.dumps(dict.fromkeys(native.MODULES, "0" * 64)))
    monkeypatch.setattr(native, "MANIFEST", manifest)
    monkeypatch.setattr(native, "extensions", lambda module: [Path(module + ".so")])
    assert native.state() == "stale"
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, native._FromSource)])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        native.install()
        native.install()  # once per process
    finders = [f for f in sys.meta_path if isinstance(f, native._FromSource)]
    assert len(finders) == 1 and sys.meta_path[0] is finders[0]
    assert len(seen) == 1 and "do not match their sources" in str(seen[0].message)
    spec = finders[0].find_spec("policies.vllm")
    assert spec is not None and spec.origin == str(REPO / "policies" / "vllm.py")
    assert finders[0].find_spec("sim.engine.loop") is None  # not a compiled module: the usual import


def test_a_matching_manifest_is_current(monkeypatch, tmp_path):
    manifest = tmp_path / "native_manifest.json"
    manifest.write_text(json.dumps({m: native._digest(m) for m in native.MODULES}))
    monkeypatch.setattr(native, "MANIFEST", manifest)
    monkeypatch.setattr(native, "extensions", lambda module: [Path(module + ".so")])
    assert native.state() == "compiled"
    monkeypatch.setattr(native, "extensions", lambda module: [] if module == "policies.vllm" else ["x"])
    assert native.state() == "stale"  # a partial build is all-or-nothing too
    monkeypatch.setattr(native, "extensions", lambda module: [])
    assert native.state() == "none"


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
