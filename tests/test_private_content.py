"""A request's own content (past ``hash_end``) is never hashed while it runs (sim/kv/manager.py), and that
changes no result: the same runs with every block hashed as vLLM hashes it (``private_from`` dropped, so
segments count as shareable to their end) give identical request and step tables, under preemption
(recompute, a pool too small for the load), chunked prefill and async scheduling; and a conversation's turns
registering their own part when freed (``private_until_done``) give the tables of registering it as it fills."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

import workloads.gen.draws as draws
from sim.app.results import summarize
from sim.core.spec import HASH_ALL, RequestSpec


def _run(raw: dict[str, Any]) -> Any:
    from sim.app.config import config_from_dict
    from sim.app.simulate import simulate

    return simulate(config_from_dict({"frontend": None, **raw}))


WORKLOAD = {"num_requests": 200, "rate": 20.0, "shared_prefix": {"num_groups": 3, "prefix_len": 200},
            "prompt": {"dist": "uniform", "low": 210, "high": 900}, "output": {"dist": "uniform", "low": 4, "high": 300}}
BASE = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"}}
CASES = {
    "preempting": {"engine": {"policy": "vllm", "max_num_seqs": 32, "num_gpu_blocks_override": 160,
                              "max_model_len": 2048, "async_scheduling": False}},
    "preempting_async": {"engine": {"policy": "vllm", "max_num_seqs": 32, "num_gpu_blocks_override": 160,
                                    "max_model_len": 2048, "async_scheduling": True}},
    "chunked": {"engine": {"policy": "vllm", "max_num_seqs": 16, "num_gpu_blocks_override": 400,
                           "max_num_batched_tokens": 256, "max_model_len": 2048}},
}


def _tables(res: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    return res.requests.reset_index(drop=True), res.steps.reset_index(drop=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_private_part_changes_no_table(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {**BASE, **CASES[case], "workload": dict(WORKLOAD)}
    own = _run(raw)
    if case != "chunked":  # the resume path (KV-7) is reached
        assert summarize(own)["num_preemptions"] > 0
    spec = draws.Draws.spec
    monkeypatch.setattr(draws.Draws, "spec", lambda self, *a, **k: replace(spec(self, *a, **k), private_from=None))
    every = _run(raw)
    for a, b in zip(_tables(own), _tables(every), strict=True):
        pd.testing.assert_frame_equal(a, b)
    a, b = summarize(own), summarize(every)
    a["meta"].pop("wall_time_s"), b["meta"].pop("wall_time_s")
    assert a == b


SESSIONS = {"kind": "sessions", "num_sessions": 40, "rate": 2.0, "turns": {"dist": "uniform", "low": 2, "high": 6},
            "message": {"dist": "uniform", "low": 20, "high": 120}, "output": {"dist": "uniform", "low": 10, "high": 120},
            "system_prompt": {"num_prompts": 2, "len": 100}, "think_time": 0.5}  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_turn_registered_when_done_changes_no_table(async_scheduling: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversation's turn registers its own part (new message, answer) when it is freed, not as it
    fills (``private_until_done``): its next turn still hits all of it, and nothing else can look for it."""
    import workloads.gen.sessions as sessions

    raw = {**BASE, "engine": {"policy": "vllm", "max_num_seqs": 16, "num_gpu_blocks_override": 90,
                              "max_model_len": 1400, "async_scheduling": async_scheduling},
           "workload": dict(SESSIONS)}  # fmt: skip
    own = _run(raw)
    a = summarize(own)
    assert a["num_preemptions"] > 0 and a["prefix_cache_hit_rate"] > 0.2  # resumes and next turns hit
    spec = sessions.Conversation.spec
    monkeypatch.setattr(sessions.Conversation, "spec", lambda self, *x, **k: replace(
        spec(self, *x, **k), private_from=None, private_until_done=False))
    every = _run(raw)
    for x, y in zip(_tables(own), _tables(every), strict=True):
        pd.testing.assert_frame_equal(x, y)
    b = summarize(every)
    a["meta"].pop("wall_time_s"), b["meta"].pop("wall_time_s")
    assert a == b


def test_hash_end_follows_the_content() -> None:
    def spec(**kw: Any) -> RequestSpec:
        return RequestSpec(request_id="r", arrival_time=0.0, prompt_len=64, output_len=8, **kw)

    assert spec().hash_end == 0  # nobody shares it: never hashed
    assert spec(token_ids=tuple(range(64))).hash_end == 64  # the output is its own
    assert spec(hash_ids=(1, 2)).hash_end == 64
    assert spec(token_ids=tuple(range(64)), output_key="o1").hash_end == HASH_ALL  # a later turn may repeat it
    assert spec(segments=((("s", 0), 64),)).hash_end == HASH_ALL  # segments may name an output
    assert spec(segments=((("s", 0), 16), (("u", "r"), 48)), private_from=16).hash_end == 16
    assert spec(private_from=3).hash_end == 0
    assert spec(segments=((("s", 0), 64),), private_from=10).arriving_at(2.0).hash_end == 10


@pytest.mark.parametrize("bad", [-1, 2.5, "x"])
def test_bad_private_from_is_one_clear_error(bad: Any) -> None:
    from sim.core.errors import ConfigError

    with pytest.raises(ConfigError, match="private_from"):
        RequestSpec(request_id="r", arrival_time=0.0, prompt_len=64, output_len=8, private_from=bad)
