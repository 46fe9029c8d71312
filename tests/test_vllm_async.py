"""The ``vllm`` policy with async scheduling (a 2-deep batch queue) and vLLM V1's watermark.

Recorded vLLM 0.33 scheduler traces (bench/vllm_diff.py ``--write-fixture`` with ``--async-scheduling``
and/or ``--watermark 0.01,0.2``) are replayed step by step without vLLM; the rule tests below need no
recording at all."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from policies.base import PolicyLimits
from policies.vllm import VllmOptions, VllmPolicy
from sim.app.config import config_from_dict
from sim.app.simulate import resolve
from sim.core.errors import ConfigError
from sim.core.request import Request, RequestSpec, Status

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
FIXTURES = ("vllm_oracle_async.jsonl", "vllm_oracle_watermark.jsonl", "vllm_oracle_async_watermark.jsonl")


def _load_harness():
    spec = importlib.util.spec_from_file_location("vllm_diff", REPO / "bench" / "vllm_diff.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm_diff"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


vd = _load_harness()
RECORDED = [(f, *r) for f in FIXTURES for r in vd.read_fixture(DATA / f)]
SYNC = {name: trace for name, _, trace in vd.read_fixture(DATA / "vllm_oracle_tiny.jsonl")}


@pytest.mark.parametrize("content", vd.CONTENT_MODES)
@pytest.mark.parametrize("fixture,name,workload,trace", RECORDED,
                         ids=[f"{f.split('_', 2)[2][:-6]}-{n.split(':')[0]}" for f, n, _, _ in RECORDED])
def test_recorded_oracle_trace_is_reproduced_step_by_step(fixture, name, workload, trace, content):
    fields = vd.FIELDS if content == "segments" else vd.FIELDS_UNIQUE
    c = vd.compare_traces(trace, vd.servesim_trace(workload, content), fields)
    if c.diff is not None:
        pytest.fail(f"{fixture}: {name} (content={content})\n{c.diff.describe()}")
    assert c.matched == c.steps == len(trace)


def test_fixtures_exercise_the_modes():
    """Not vacuous: every async trace differs from its sync recording, some watermark traces do too."""
    by_file: dict[str, list] = {}
    for f, name, w, trace in RECORDED:
        by_file.setdefault(f, []).append((name, w, trace))
        p = w["params"]
        assert bool(p.get("async_scheduling")) == ("async" in f)
        assert (0.01 <= p.get("watermark", 0) <= 0.2) == ("watermark" in f)
    for f, recs in by_file.items():
        differ = sum(1 for n, _, t in recs if n in SYNC and vd.compare_traces(SYNC[n], t).diff is not None)
        assert differ == len(recs) - (1 if "watermark" in f else 0) if "async" in f else differ >= 3
        assert len({vd.config_label(w["params"]) for _, w, _ in recs}) == 8
        assert sum(vd.coverage(w, t)["preemptions"] for _, w, t in recs) >= 5


# ---- rules, without recordings ----------------------------------------------------------------------
def _limits(**kw) -> PolicyLimits:
    base = dict(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=120, block_size=8, num_gpu_blocks=21,
                enable_prefix_caching=False, enable_chunked_prefill=True)
    base.update(kw)
    return PolicyLimits(**base)


def _req(rid: str, prompt: int, out: int, t: float = 0.0) -> Request:
    return Request(RequestSpec(request_id=rid, arrival_time=t, prompt_len=prompt, output_len=out))


def test_async_schedules_the_next_step_before_the_output_lands():
    pol = VllmPolicy(_limits(async_scheduling=True), {})
    a = _req("a", 20, 3)
    pol.add_request(a, 0.0)
    p0 = pol.schedule(0.0)  # prefill, samples token 1
    assert p0.scheduled == [(a, 20)] and p0.sampled == [a]
    p1 = pol.schedule(1.0)  # token 1 not applied yet: one decode row on its placeholder
    assert p1.scheduled == [(a, 1)] and a.num_tokens == 20 and a.num_computed_tokens == 21
    assert pol.update(p0, 1.0) == [] and a.num_output_tokens == 1
    p2 = pol.schedule(2.0)  # samples token 3, the last
    assert p2.scheduled == [(a, 1)]
    assert pol.update(p1, 2.0) == []
    p3 = pol.schedule(3.0)  # its last token is in flight: not scheduled, but still running and holding KV
    assert p3.scheduled == [] and pol.running == [a] and pol.kv.holds(a)
    assert pol.update(p2, 3.0) == [a] and a.status is Status.FINISHED and not pol.kv.holds(a)
    assert pol.kv.num_free_blocks == pol.kv.usable_blocks and pol.update(p3, 4.0) == []


def test_async_output_of_a_preempted_request_still_lands_and_can_finish_it():
    # 3 usable blocks of 8: a (prompt 8) and b (prompt 8) fit, a's growth to a second block preempts b.
    pol = VllmPolicy(_limits(async_scheduling=True, num_gpu_blocks=3, max_model_len=16), {})
    a, b = _req("a", 8, 4), _req("b", 8, 2, 0.1)
    pol.add_request(a, 0.0)
    pol.add_request(b, 0.0)
    p0 = pol.schedule(0.0)
    assert [n for _, n in p0.scheduled] == [8, 8] and pol.kv.num_free_blocks == 0
    p1 = pol.schedule(1.0)  # a needs a block for position 8: b (the last one) is preempted
    assert p1.preempted == [b] and p1.scheduled == [(a, 1)] and b.status is Status.PREEMPTED
    # b's prefill output (its first token) lands after the preemption: appended, not resolving anything
    assert pol.update(p0, 1.0) == [] and b.num_output_tokens == 1 and b.num_tokens == 9
    assert b in pol.waiting and b.num_computed_tokens == 0


def test_watermark_holds_back_admission_only_while_others_run():
    # int(0.1 x 21) = 2 blocks; b needs 14 of the 14 free while a runs: held back, fits without watermark
    for wm, admitted_at in ((0.1, None), (0.0, 1)):
        pol = VllmPolicy(_limits(), VllmOptions(watermark=wm))
        a, b = _req("a", 40, 6), _req("b", 112, 2, 0.5)
        pol.add_request(a, 0.0)
        pol.update(pol.schedule(0.0), 1.0)
        pol.add_request(b, 1.0)
        plan = pol.schedule(1.0)
        assert (b in plan.admitted) == (admitted_at == 1)
    # alone in the system the watermark does not apply: a request needing every block is admitted
    pol = VllmPolicy(_limits(max_model_len=160), VllmOptions(watermark=0.5))
    c = _req("c", 150, 10)
    assert pol.add_request(c, 0.0) is None
    assert pol.schedule(0.0).admitted == [c] and pol.kv.num_free_blocks < pol.watermark_blocks
    with pytest.raises(ConfigError, match="watermark"):
        VllmOptions(watermark=1.0)


def test_watermark_is_an_engine_knob_of_preset_vllm():
    def setup(**engine):
        return resolve(config_from_dict({"engine": {"policy": "vllm", **engine}}))

    s = setup(watermark=0.05)
    assert s.make_policy().watermark_blocks == int(0.05 * s.limits.num_gpu_blocks)
    assert setup().make_policy().watermark_blocks == 0
    with pytest.raises(ConfigError, match=r"watermark must be in \[0, 1\)"):
        setup(watermark=1.5)
    with pytest.raises(ConfigError, match="does not apply to preset 'trtllm'"):
        setup(policy="trtllm", watermark=0.1)


# ---- the live oracle, when it is installed ------------------------------------------------------------
ORACLE_PY = Path(vd.DEFAULT_ORACLE_PYTHON)


@pytest.mark.slow
@pytest.mark.skipif(not (vd.ORACLE_DIR / "oracle.py").exists() or not ORACLE_PY.exists(),
                    reason="needs ../shared/tools/vllm-oracle and its venv (/tmp/vllm-oracle-venv)")
def test_live_oracle_async_and_watermark(tmp_path):
    assert vd.main(["--workloads", "6", "--seed", "11", "--jobs", "1", "--cache", str(tmp_path), "--quiet",
                    "--async-scheduling", "--watermark", "0.01,0.2"]) == 0
