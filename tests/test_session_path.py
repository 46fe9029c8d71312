"""Sessions through a front end time their own arrivals (SessionSource.with_path): the same source, call
for call, as the generic wrapper (sim/app/frontend.py FrontendSource) around the bare one, and the same run."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from sim.app.config import config_from_dict
from sim.app.frontend import FrontendConfig, FrontendSource, with_frontend
from sim.app.simulate import simulate
from workloads.gen.sessions import SessionSource, build_session_workload

WL = {
    "kind": "sessions", "num_sessions": 40, "turns": {"dist": "uniform", "low": 1, "high": 6},
    "message": {"dist": "uniform", "low": 20, "high": 400}, "output": {"dist": "uniform", "low": 5, "high": 80},
    "system_prompt": {"num_prompts": 3, "len": 200}, "think_time": 0.5,
}  # fmt: skip
# a slow input path (10 ms a 1k tokens) so that sends and arrivals interleave across conversations
FE = FrontendConfig(request_overhead_s=0.002, tokenize_s_per_token=1e-5, engine_hop_s=0.001,
                    output_s_per_request=0.0005, stream_chunk_s=0.0, network_rtt_s=0.004)  # fmt: skip


def _ids(specs):
    """Every slot, with its type (the shared hashes by the content they describe: each source has its own)."""
    from sim.core.spec import RequestSpec

    def slot(s, n):
        v = getattr(s, n)
        return (n, None if v is None else v.segments) if n == "prefix_hashes" else (n, v, type(v))

    return [[slot(s, n) for n in RequestSpec.__slots__] for s in specs]


TIES = {"num_clients": 6, "message": {"dist": "fixed", "value": 100}, "think_dist": "fixed"}  # equal arrivals


@pytest.mark.parametrize("loop", [{"rate": 3.0}, {"num_clients": 5}, {"rate": 50.0, "think_dist": "fixed"}, TIES])
@pytest.mark.parametrize("seed", [0, 1])
def test_own_path_answers_as_the_wrapper_does(loop, seed):
    """Driven alike (each turn answered after a random service time), both answer every call the same:
    the next time, the turns due, their response delays and sends, and what remains at every stop."""
    w = build_session_workload({**WL, **loop}, seed)
    sa: dict[str, float] = {}
    sb: dict[str, float] = {}
    a = FrontendSource(SessionSource(w), FE, sa)
    b, _ = with_frontend(SessionSource(w), FE)
    assert isinstance(b, SessionSource) and b.path is FE
    sb = b.send_time
    rng = np.random.default_rng(seed)
    busy: list[tuple[float, str]] = []  # (finish, request id)
    specs: dict[str, object] = {}
    stops = 0
    while True:
        ta, tb = a.peek_time(), b.peek_time()
        assert ta == tb
        if busy and (ta is None or busy[0][0] <= ta):
            t, rid = busy.pop(0)
            a.on_done(specs[rid], t)
            b.on_done(specs[rid], t)
            continue
        if ta is None:
            break
        now = ta + float(rng.choice([0.0, 0.003]))  # sometimes past the next time, as a step boundary is
        got_a, got_b = a.pop_due(now), b.pop_due(now)
        assert _ids(got_a) == _ids(got_b)
        for s in got_b:
            assert a.response_delay(s) == b.response_delay(s)
            specs[s.request_id] = s
            busy.append((now + float(rng.uniform(0.05, 2.0)), s.request_id))
        busy.sort()
        if rng.random() < 0.05:  # what a horizon here would list (the wrapper notes sends as it goes)
            stops += 1
            assert _ids(a.remaining()) == _ids(b.remaining())
    assert stops and not a.remaining() and not b.remaining()
    assert sa == sb and len(sb) == w.num_requests


def _run(raw, monkeypatch, own: bool):
    if not own:
        monkeypatch.setattr(SessionSource, "with_path", lambda self, path, send_time: None)
        w = build_session_workload(raw["workload"], 0)
        assert isinstance(with_frontend(SessionSource(w), FE)[0], FrontendSource)  # the patch takes
    res = simulate(config_from_dict(copy.deepcopy(raw)))
    monkeypatch.undo()
    return res


@pytest.mark.parametrize("horizon", [None, 4.0])
def test_same_run_as_through_the_wrapper(monkeypatch, horizon):
    """A vLLM run (a front end by default) of sessions gives the same requests and steps either way,
    with a horizon cutting conversations short (their turns not arrived at engine-side times)."""
    raw = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
           "engine": {"policy": "vllm", "max_num_seqs": 16},
           "workload": {**WL, "rate": 4.0}, "simulation": {"seed": 3}}  # fmt: skip
    if horizon is not None:
        raw["simulation"]["horizon"] = horizon
    own, wrapped = _run(raw, monkeypatch, True), _run(raw, monkeypatch, False)
    drop = ["wall_time_s"]
    pd.testing.assert_frame_equal(own.requests.drop(columns=drop, errors="ignore"),
                                  wrapped.requests.drop(columns=drop, errors="ignore"))  # fmt: skip
    pd.testing.assert_frame_equal(own.steps, wrapped.steps)
    assert (own.requests["status"] == "not_arrived").any() == (horizon is not None)


def test_plug_in_inputs_work_compiled_or_not():
    """What a hand-built workload or a plug-in may hand the compiled source and rotor, as interpreted code
    takes it: numpy counts and indices, conversations in a tuple, content as a list, a numpy arrival time,
    subclasses, pickling."""
    import dataclasses
    import pickle

    from routers.base import ReplicaView
    from routers.rotor import Rotor
    from workloads.gen.session_source import Turns
    from workloads.gen.sessions import Conversation

    w = build_session_workload({**WL, "num_clients": 3}, 0)
    odd = dataclasses.replace(w, num_clients=np.int64(3), conversations=tuple(w.conversations))
    assert _ids(SessionSource(odd).pop_due(0.0)) == _ids(SessionSource(w).pop_due(0.0))

    class ListContent(Conversation):
        def content(self):
            return list(super().content())

    conv = w.conversations[0]
    listed = ListContent(**{f.name: getattr(conv, f.name) for f in dataclasses.fields(conv)})
    assert not Turns(listed).plain
    assert _ids([listed.spec(0, 1.0)]) == _ids([conv.spec(0, 1.0)])  # the constructor makes it a tuple
    got = Turns(conv).spec(0, np.float64(2.0), None)
    assert type(got.arrival_time) is float and _ids([got]) == _ids([conv.spec(0, 2.0)])

    class Counting(SessionSource):
        def pop_due(self, now):
            self.calls = getattr(self, "calls", 0) + 1
            return super().pop_due(now)

    src = Counting(w)
    assert src.pop_due(0.0) and src.calls == 1
    again = pickle.loads(pickle.dumps(SessionSource(w)))
    assert _ids(again.pop_due(0.0)) == _ids(SessionSource(w).pop_due(0.0))
    views = [ReplicaView(index=np.int64(i), name=f"r{i}", outstanding=i % 2) for i in range(4)]
    rotor = Rotor()
    assert [rotor.pick(views, lambda v: v.outstanding).name for _ in range(3)] == ["r0", "r2", "r0"]
