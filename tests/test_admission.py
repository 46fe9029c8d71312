"""Admission control (issue 3): waiting-queue cap and queue timeout, reported as rejections with reasons."""

from __future__ import annotations

import pytest
import simpy

from policies.admission import QUEUE_FULL, QUEUE_TIMEOUT, AdmissionControl, with_admission
from policies.base import make_policy
from sim.app.config import config_from_dict
from sim.app.results import summarize
from sim.app.simulate import simulate
from sim.core.errors import ConfigError
from sim.core.request import RequestSpec, Status
from sim.cost.costmodel import ConstantCostModel
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource
from tests.helpers import limits, req, step


def _specs(rows):
    return [RequestSpec(request_id=f"r{i}", arrival_time=t, prompt_len=p, output_len=o)
            for i, (t, p, o) in enumerate(rows)]  # fmt: skip


def _run(specs, policy="vllm", max_waiting=None, timeout=None, fast_forward=True, **lim):
    env = simpy.Environment()
    pol = with_admission(make_policy(policy, limits(**lim)), max_waiting, timeout)
    eng = Engine(env, pol, ConstantCostModel(step_s=1.0), OpenSource(specs), Recorder(), None, fast_forward)
    env.run()
    return eng


def test_no_knobs_no_wrapper():
    p = make_policy("vllm", limits())
    assert with_admission(p, None, None) is p
    assert isinstance(with_admission(p, 3, None), AdmissionControl)


def test_queue_full_rejects_arrivals_beyond_max_waiting():
    p = with_admission(make_policy("vllm", limits(max_num_seqs=1)), max_waiting=2, queue_timeout_s=None)
    reasons = [p.add_request(req(f"r{i}", 10, 5), 0.0) for i in range(4)]
    assert reasons == [None, None, QUEUE_FULL, QUEUE_FULL]
    step(p)  # r0 runs, r1 waits: room for one more
    assert p.add_request(req("r4", 10, 5), 1.0) is None
    assert p.add_request(req("r5", 10, 5), 1.0) == QUEUE_FULL


def test_queue_timeout_drops_requests_never_scheduled():
    # One slot, 20-token outputs at one step per second: r1 and r2 wait ~20 s; the timeout is 5 s.
    specs = _specs([(0.0, 10, 20), (0.5, 10, 20), (1.0, 10, 20), (30.0, 10, 3)])
    eng = _run(specs, timeout=5.0, max_num_seqs=1)
    by_id = {r.request_id: r for r in eng.requests}
    assert by_id["r0"].status is Status.FINISHED and by_id["r3"].status is Status.FINISHED
    for rid in ("r1", "r2"):
        r = by_id[rid]
        assert r.status is Status.REJECTED and r.finish_reason == QUEUE_TIMEOUT
        assert r.scheduled_time is None
        # dropped at the first step boundary after the deadline, one step (1 s) at most later
        assert 5.0 < r.finish_time - r.queued_time <= 6.0


def test_timeouts_do_not_depend_on_fast_forward():
    specs = _specs([(0.0, 10, 40), (0.2, 10, 40), (0.4, 10, 5), (12.0, 50, 30), (12.5, 10, 10)])
    a = _run(specs, timeout=7.0, max_num_seqs=1, fast_forward=True)
    b = _run(specs, timeout=7.0, max_num_seqs=1, fast_forward=False)
    key = [(r.request_id, r.status, r.finish_reason, r.finish_time) for r in a.requests]
    assert key == [(r.request_id, r.status, r.finish_reason, r.finish_time) for r in b.requests]
    assert any(r.finish_reason == QUEUE_TIMEOUT for r in a.requests)


def test_preempted_requests_do_not_time_out():
    # Tight pool: the later request is preempted and waits again, longer than the timeout.
    specs = _specs([(0.0, 8, 30), (0.0, 8, 30)])
    eng = _run(specs, timeout=2.0, block_size=4, num_gpu_blocks=11, max_num_batched_tokens=64,
               enable_prefix_caching=False)  # fmt: skip
    assert any(r.num_preemptions for r in eng.requests)
    assert all(r.status is Status.FINISHED for r in eng.requests)


def test_timeout_works_with_the_priority_queue():
    p = with_admission(make_policy("vllm", limits(max_num_seqs=1, scheduling_policy="priority")), None, 1.0)
    for i, prio in enumerate((0, 2, 1)):
        p.add_request(req(f"r{i}", 10, 50, priority=prio), 0.0)
    step(p, 0.0)
    plan = p.schedule(1.5)
    assert sorted(r.request_id for r, why in plan.rejected) == ["r1", "r2"]
    assert len(p.waiting) == 0


def test_summary_reports_rejection_reasons():
    cfg = config_from_dict({
        "engine": {"max_num_seqs": 1, "max_waiting": 3, "queue_timeout_s": 4.0, "cost_model": "constant",
                   "constant_step_s": 0.1, "max_model_len": 1024},
        "workload": {"num_requests": 40, "rate": 20.0, "arrival": "constant",
                     "prompt": {"dist": "fixed", "value": 32}, "output": {"dist": "fixed", "value": 20}},
    })  # fmt: skip
    s = summarize(simulate(cfg))
    reasons = s["rejection_reasons"]
    assert reasons.get(QUEUE_FULL, 0) > 0 and reasons.get(QUEUE_TIMEOUT, 0) > 0
    assert s["num_rejected"] == sum(reasons.values()) == s["failed"]
    assert s["num_finished"] + s["num_rejected"] == 40


@pytest.mark.parametrize(
    ("engine", "match"),
    [
        ({"max_waiting": 0}, "max_waiting"),
        ({"queue_timeout_s": -1.0}, "queue_timeout_s"),
        ({"max_waiting": "many"}, "max_waiting"),
    ],
)
def test_admission_knob_validation(engine, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict({"engine": engine})
