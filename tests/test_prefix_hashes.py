"""Block hashes shared between requests (sim.core.request.PrefixHashes): a session's turns and a shared
system prompt's users hash each block once, and every request still gets exactly the hashes it would
compute alone. The run digests were taken before the sharing existed (commit 2ad7aee)."""

from __future__ import annotations

import dataclasses
import hashlib

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.app.config import config_from_dict
from sim.app.simulate import simulate
from sim.core.request import PrefixHashes, Request, RequestSpec
from workloads.gen.sessions import SessionSource, build_session_workload

SESSIONS = {"kind": "sessions", "num_sessions": 30, "rate": 0.6, "turns": {"dist": "uniform", "low": 2, "high": 8},
            "message": {"dist": "uniform", "low": 10, "high": 90}, "output": {"dist": "uniform", "low": 5, "high": 60},
            "system_prompt": {"num_prompts": 3, "len": 70}, "think_time": 2.0}  # fmt: skip


def alone(spec: RequestSpec, bs: int, n: int) -> list[int]:
    return Request(dataclasses.replace(spec, prefix_hashes=None)).block_hashes(bs, n)[: n // bs]


def test_session_turns_share_hashes_and_match_hashing_alone():
    w = build_session_workload(SESSIONS, 3)
    src = SessionSource(w)
    seen = 0
    while src.due:
        t = src.peek_time()
        for spec in src.pop_due(t):
            req = Request(spec)
            for bs in (16, 5):
                total = spec.prompt_len + spec.output_len
                assert req.block_hashes(bs, spec.prompt_len)[: spec.prompt_len // bs] == alone(spec, bs, spec.prompt_len)
                assert req.block_hashes(bs, total)[: total // bs] == alone(spec, bs, total)
            if spec.prefix_hashes is not None:  # the conversation's list holds this turn's blocks
                assert spec.prefix_hashes.for_size(16)[: total // 16] == req.block_hashes(16, total)[: total // 16]
            seen += 1
            src.on_done(spec, t)
    assert seen == w.num_requests
    assert not src.hashes  # every finished conversation's hashes were dropped by the source


def test_a_later_turn_computes_only_its_new_blocks():
    w = build_session_workload({**SESSIONS, "num_sessions": 1, "turns": {"dist": "fixed", "value": 3}}, 0)
    conv = w.conversations[0]
    ph = PrefixHashes(conv.content())
    t0 = Request(conv.spec(0, 0.0, ph))
    t0.block_hashes(16, conv.prompt_len(0) + conv.outputs[0])
    calls = []

    class Spy(Request):  # a subclass, not a patched method: a compiled Request's cannot be (sim/native.py)
        def _segment_hashes(self, first, last, bs, parent, out):
            calls.append((first, last))
            return super()._segment_hashes(first, last, bs, parent, out)

    t1 = Spy(conv.spec(1, 0.0, ph))
    t1.block_hashes(16, conv.prompt_len(1))
    assert calls == [((conv.prompt_len(0) + conv.outputs[0]) // 16, conv.prompt_len(1) // 16)]


@settings(max_examples=150, deadline=None)
@given(
    lens=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    cut=st.integers(0, 6),
    rename=st.booleans(),
    out=st.integers(1, 40),
    bs=st.sampled_from([1, 3, 4, 16]),
    order=st.permutations([0, 1, 2]),
)
def test_any_prefix_layout_gives_the_hashes_of_hashing_alone(lens, cut, rename, out, bs, order):
    """Three requests whose leading segments may or may not match the shared description (a renamed or
    truncated spec shares nothing), hashed in any order: each gets its own hashes."""
    segs = tuple((("k", i), n) for i, n in enumerate(lens))
    ph = PrefixHashes(segs)
    specs = []
    for i in range(3):
        mine = segs[: max(1, min(cut + i, len(segs)))] + ((("u", i), 7),)
        if rename and i == 1:
            mine = tuple((("s", k), n) for k, n in mine)
        p = sum(n for _, n in mine)
        specs.append(RequestSpec(f"r{i}", 0.0, p, out, segments=mine, prefix_hashes=ph))
    reqs = [Request(s) for s in specs]
    for i in order:
        total = specs[i].prompt_len + out
        assert reqs[i].block_hashes(bs, total)[: total // bs] == alone(specs[i], bs, total)


def digest(frame: pd.DataFrame) -> str:
    return hashlib.sha256(pd.util.hash_pandas_object(frame, index=True).values.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(
    "workload, want",
    [
        # pinned at the fix that makes a fast-forwarded run's step times the stepped ones to the bit (the
        # sharing's own digests, from 2ad7aee, were 247415278ded20e7 / 5110f1daf067b4a8 and
        # 2766586b2cf63467 / 9f5e57c0f7db3715: the times moved by at most 4e-14 s, nothing else)
        ({**SESSIONS, "num_sessions": 40}, (201, "d4f1f96f615a8dc9", "c7e871efe73d701f")),
        ({"num_requests": 150, "rate": 6.0, "shared_prefix": {"num_groups": 3, "prefix_len": 100},
          "prompt": {"dist": "uniform", "low": 20, "high": 900}, "output": {"dist": "uniform", "low": 4, "high": 200}},
         (150, "c2cf2ae7f0752bc6", "75e691ed0ced6dda")),
    ],
)  # fmt: skip
def test_runs_are_unchanged_by_sharing(workload, want):
    raw = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
           "engine": {"policy": "vllm", "max_num_seqs": 32, "num_gpu_blocks_override": 400, "max_model_len": 4096,
                      "async_scheduling": False}, "workload": workload,
           "frontend": None}  # fmt: skip  (digests pinned synchronous, engine-side)
    res = simulate(config_from_dict(raw))
    assert (len(res.requests), digest(res.requests), digest(res.steps)) == want
    stepped = simulate(config_from_dict(raw), fast_forward=False)  # and the fast-forward is exact, bitwise
    assert res.requests.equals(stepped.requests) and res.steps.equals(stepped.steps)
