"""Trace requests whose hash ids start the same share their block hashes (sim.core.hash_prefixes): every
request still gets exactly the hashes it computes alone, for any KV block size (dividing the hash block
or not, partial last id blocks, ids that part mid-way), each distinct block is hashed once, and a run
is bit-identical with and without the sharing."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.app.config import config_from_dict
from sim.app.simulate import simulate
from sim.core.hash_prefixes import share_hash_id_prefixes
from sim.core.request import PrefixHashes, Request, RequestSpec
from workloads.tracefmt import load_trace


def spec(i: int, ids: list[int], prompt_len: int, hbs: int = 8, out: int = 6) -> RequestSpec:
    return RequestSpec(f"r{i}", float(i), prompt_len, out, hash_ids=tuple(ids), hash_block_size=hbs)


def alone(s: RequestSpec, bs: int, n: int) -> list[int]:
    return Request(dataclasses.replace(s, prefix_hashes=None)).block_hashes(bs, n)[: n // bs]


SEEN = [0]


class CountingRequest(Request):
    """Counts the block identities it builds (each one is a block hashed): a subclass rather than a
    patched method, as a compiled Request's methods cannot be patched (sim/native.py)."""

    def _segment_hashes(self, first, last, bs, parent, out):
        SEEN[0] += max(last - first, 0)
        return super()._segment_hashes(first, last, bs, parent, out)


@settings(max_examples=120, deadline=None)
@given(
    paths=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=2, max_size=7),
    tails=st.lists(st.integers(1, 8), min_size=7, max_size=7),
    bs=st.sampled_from([1, 3, 5, 8, 13, 16]),
    seed=st.integers(0, 2**16),
)
def test_shared_hashes_equal_each_requests_own(paths, tails, bs, seed):
    """Ids from a 3-letter alphabet, so prompts share and part at every depth; each prompt's last id
    block is partial (1..8 of 8 tokens); KV blocks of 1..16 tokens straddle id blocks; any order."""
    specs = [spec(i, p, (len(p) - 1) * 8 + tails[i]) for i, p in enumerate(paths)]
    shared = share_hash_id_prefixes(specs)
    reqs = [Request(s) for s in shared]
    for i in np.random.default_rng(seed).permutation(len(reqs)):
        s = shared[i]
        total = s.prompt_len + s.output_len
        assert reqs[i].block_hashes(bs, s.prompt_len)[: s.prompt_len // bs] == alone(s, bs, s.prompt_len)
        assert reqs[i].block_hashes(bs, total)[: total // bs] == alone(s, bs, total)
        assert reqs[i].block_hashes(bs * 2, total)[: total // (bs * 2)] == alone(s, bs * 2, total)


def test_prompts_that_part_mid_way_share_their_common_blocks_once():
    specs = [spec(0, [1, 2, 3, 4], 32), spec(1, [1, 2, 5, 6], 32), spec(2, [1, 2, 3, 7], 32), spec(3, [9], 8)]
    shared = share_hash_id_prefixes(specs)
    a, b, c = (s.prefix_hashes for s in shared[:3])
    assert a is c and a is not None and b is not None and a.parent is b and b.parent is None
    assert len(a.segments) == 3 and len(b.segments) == 2
    assert shared[3] is specs[3]  # shares nothing: returned as it was
    want = {bs: [alone(s, bs, 32) for s in specs[:3]] for bs in (4, 5, 16)}
    distinct = {bs: len({h for hs in want[bs] for h in hs}) for bs in want}
    seen = SEEN
    for bs in want:
        seen[0] = 0
        got = [CountingRequest(s).block_hashes(bs, 32)[: 32 // bs] for s in shared[:3]]
        assert got == want[bs]
        assert seen[0] == distinct[bs], bs  # every distinct prompt block hashed exactly once
    seen[0] = 0
    for s in specs[:3]:  # without the sharing each request hashes all its blocks
        CountingRequest(s).block_hashes(4, 32)
    assert seen[0] == 3 * 8


def test_only_hash_id_specs_that_share_get_prefix_hashes():
    ph = PrefixHashes(((("h", 1), 8),))
    given_ph = dataclasses.replace(spec(0, [1, 2], 16), prefix_hashes=ph)
    tokens = RequestSpec("t", 0.0, 16, 4, token_ids=tuple(range(16)), hash_ids=(1, 2), hash_block_size=8)
    plain = RequestSpec("p", 0.0, 16, 4)
    empty = spec(5, [], 8)  # no ids: the whole prompt is its own
    other_size = [spec(6, [1, 2], 8, hbs=4), spec(7, [1, 2, 4], 12, hbs=4)]  # same ids, 4-token blocks
    specs = [given_ph, tokens, plain, empty, spec(3, [1, 2], 16), spec(4, [1, 3], 12), *other_size]
    out = share_hash_id_prefixes(specs)
    assert out[:4] == specs[:4] and out[0].prefix_hashes is ph and out[1].prefix_hashes is None
    assert out[3].prefix_hashes is None
    assert out[4].prefix_hashes is out[5].prefix_hashes and out[4].prefix_hashes.segments == ((("h", 1), 8),)
    assert out[6].prefix_hashes is out[7].prefix_hashes and out[6].prefix_hashes.segments == (
        (("h", 1), 4),
        (("h", 2), 4),
    )
    for s in out[4:]:
        total = s.prompt_len + s.output_len
        assert Request(s).block_hashes(2, total)[: total // 2] == alone(s, 2, total)


def _trace(path, fmt: str, n: int = 150) -> None:
    """A trace whose prompts follow 4 trees of ids (with 2 branches below the root), plus 0-1 own ids."""
    rng = np.random.default_rng(7)
    hbs = 512 if fmt == "mooncake" else 40
    rows = []
    for i in range(n):
        k = int(rng.integers(1, 7))
        tree, branch = int(rng.integers(0, 4)), int(rng.integers(0, 2))
        own = [10**6 + i] * int(rng.integers(0, 2))
        ids = [tree * 100 + j * 10 + (branch if j else 0) for j in range(k)] + own
        plen = (len(ids) - 1) * hbs + int(rng.integers(1, hbs + 1))
        t, out = round(i * (0.05 if fmt == "mooncake" else 0.002), 3), int(rng.integers(4, 120))
        if fmt == "mooncake":
            rows.append({"timestamp": t * 1000, "input_length": plen, "output_length": out, "hash_ids": ids})
        else:
            rows.append({"arrival_time": t, "prompt_len": plen, "output_len": out, "hash_ids": ids,
                         "hash_block_size": hbs})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("fmt, blocks", [("mooncake", 512), ("jsonl", 128)])
def test_runs_are_unchanged_by_sharing(tmp_path, monkeypatch, fmt, blocks):
    """The same trace with sharing and with the specs left unshared (prefix_hashes None): identical
    per-request and per-step tables and prefix-cache counters (a small KV pool: evictions, preemptions)."""
    path = tmp_path / "trace.jsonl"
    _trace(path, fmt)
    loaded = load_trace(path, format=fmt)
    assert sum(s.prefix_hashes is not None for s in loaded.specs) > 100
    raw = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
           "engine": {"policy": "vllm", "max_num_seqs": 16, "num_gpu_blocks_override": blocks, "max_model_len": blocks * 16},
           "workload": {"trace": str(path), "format": fmt}}  # fmt: skip
    shared = simulate(config_from_dict(raw))
    monkeypatch.setattr("workloads.tracefmt.core.share_hash_id_prefixes", list)
    assert all(s.prefix_hashes is None for s in load_trace(path, format=fmt).specs)
    alone_run = simulate(config_from_dict(raw))
    assert shared.requests.equals(alone_run.requests) and shared.steps.equals(alone_run.steps)
    pc = shared.meta["prefix_cache"]
    assert pc == alone_run.meta["prefix_cache"] and pc["hits"] > 0
    assert shared.requests["num_cached_tokens"].sum() > 0 and shared.requests["num_preemptions"].sum() > 0
