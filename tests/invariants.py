"""Named simulator invariants, one checker each, shared by tests/test_invariants.py (and usable anywhere).

* ``check_requests_conserved``: every request of the workload is finished, rejected or timed out with a
  reason, in flight at the horizon, or not arrived; each exactly once, and the counts add up.
* ``check_kv_conserved`` (per step, via ``run_checked``) and ``check_kv_steps`` (the step table): KV blocks are
  neither lost nor invented: free + held == the pool's usable blocks, cached-free blocks are a part of the
  free ones, and a finished run returns every block.
* ``check_fast_forward_exact``: a run with the engine's decode fast-forward on equals the run stepped one step
  at a time, request by request (every timestamp) and step by step (every step-table column).

``run_checked`` runs ``sim.app.simulate.simulate`` itself (not a copy of it) with two observers patched in: a
recorder that checks the KV invariant after every step and every fast-forwarded run, and a count of the
policy's ``schedule`` calls, so a test can tell from outside the policy whether a run was fast-forwarded (a
step-table row that no ``schedule`` call produced came from a decode run).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import pandas as pd

import sim.app.simulate as simulate_mod
from sim.app.config import RunConfig
from sim.app.frontend import CLIENT_COLUMNS
from sim.app.results import STATUSES, SimResult
from sim.engine.recorder import Recorder
from sim.engine.request_log import REQUEST_COLUMNS
from sim.kv.manager import KVCacheManager
from workloads.synthetic import build_workload

TIME_COLUMNS = ("arrival_time", "queued_time", "scheduled_time", "first_token_time", "finish_time")


@dataclass
class Observed:
    """What ``run_checked`` saw besides the result."""

    kv_checks: int = 0  # step boundaries at which the KV invariant was checked
    policy: object = None
    engine: object = None
    engine_requests: list = field(default_factory=list)

    @property
    def schedule_calls(self) -> int:
        """Calls of policy.schedule (each priced step comes from one, or from a run), as the engine
        counts them (a compiled policy's methods cannot be wrapped)."""
        return self.engine.num_schedules if self.engine is not None else 0  # type: ignore[attr-defined]


# ---- invariant 1: requests conserved ------------------------------------------------------------------


def workload_ids(cfg: RunConfig, max_model_len: int) -> list[str]:
    """The request ids the run's workload generates (rebuilt the way ``simulate`` builds it)."""
    wl = dict(cfg.workload)
    wl.pop("client_timeout_s", None)  # the engine's, not the generator's
    if cfg.simulation.num_requests is not None:
        wl["num_requests"] = cfg.simulation.num_requests
    w = build_workload(wl, seed=cfg.simulation.seed, max_model_len=max_model_len)
    if hasattr(w, "conversations"):  # sessions: every turn of every conversation
        return [f"s{c.index}t{k}" for c in w.conversations for k in range(c.num_turns)]
    if hasattr(w, "num_clients"):  # closed loop: r0.. in issue order
        return [f"r{i}" for i in range(w.num_requests)]
    return [s.request_id for s in w.specs]


def check_requests_conserved(res: SimResult, expected_ids: list[str], horizon: float | None) -> dict[str, int]:
    """Each workload request appears once, in one of STATUSES, consistently with its timestamps."""
    df = res.requests
    ids = df["request_id"].tolist()
    assert len(ids) == len(set(ids)), "a request is reported twice"
    assert set(ids) == set(expected_ids), (
        f"lost {sorted(set(expected_ids) - set(ids))[:5]}, invented {sorted(set(ids) - set(expected_ids))[:5]}"
    )
    counts = df["status"].value_counts().to_dict()
    assert set(counts) <= set(STATUSES), counts
    assert sum(counts.get(s, 0) for s in STATUSES) == len(expected_ids), counts
    end = res.meta["end_time"]
    for r in df.itertuples():
        if r.status == "finished":
            assert r.finish_reason in ("length", "max_model_len", "stop"), (r.request_id, r.finish_reason)
            assert 1 <= r.num_output_tokens <= r.output_len, (r.request_id, r.num_output_tokens, r.output_len)
            if r.finish_reason == "length":
                assert r.num_output_tokens == r.output_len, r.request_id
            assert r.arrival_time <= r.scheduled_time <= r.first_token_time <= r.finish_time <= end, r.request_id
        elif r.status == "rejected":  # refused, queue full, timed out...: never without a reason
            assert isinstance(r.finish_reason, str) and r.finish_reason, r.request_id
            assert r.arrival_time <= r.finish_time <= end, r.request_id
        elif r.status == "timed_out":  # the client gave up: aborted at the first boundary after its deadline
            timeout = res.config["workload"]["client_timeout_s"]
            assert r.finish_reason == "client timeout", r.request_id
            assert r.arrival_time + timeout <= r.finish_time + 1e-9 and r.finish_time <= end, r.request_id
        elif r.status == "in_flight":
            assert horizon is not None, f"{r.request_id} unfinished without a horizon"
            assert r.arrival_time <= horizon and math.isnan(r.finish_time), r.request_id
        else:  # not_arrived
            assert horizon is not None and r.arrival_time >= min(horizon, end), r.request_id
    if horizon is None:
        assert counts.get("in_flight", 0) == counts.get("not_arrived", 0) == 0, counts
    return counts


# ---- invariant 2: KV blocks conserved -----------------------------------------------------------------


def check_kv_conserved(kv, requests) -> None:
    """At a step boundary: free + held == usable, cached-free within free, CPU swap pool balanced.

    ``requests``: every request the engine admitted (the holders are found among them). For the paged
    manager the held blocks are counted twice, from the pool's reference counts and from the requests'
    block tables; the slot engines' token accounting (llama.cpp / Ollama, block size 1) is checked likewise.
    """
    usable = kv.usable_blocks
    free = kv.num_free_blocks
    cached_free = kv.num_cached_free_blocks
    assert 0 <= free <= usable, (free, usable)
    assert 0 <= cached_free <= free, (cached_free, free)
    if isinstance(kv, KVCacheManager):
        pool = kv.pool
        referenced = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
        held: set[int] = set()
        for r in requests:
            if kv.holds(r):
                held.update(kv.get_block_ids(r))
        assert free + referenced == usable, f"pool: free {free} + referenced {referenced} != usable {usable}"
        assert free + len(held) == usable, f"tables: free {free} + held {len(held)} != usable {usable}"
        assert abs(kv.usage - (1.0 - free / usable)) < 1e-12
        kv.check_invariants()  # the manager's own deeper checks (queue order, hashes, ref counts)
        if kv._cpu is not None:
            cpu = kv.cpu
            swapped = sum(cpu.num_held(r.request_id) for r in requests)
            assert swapped == cpu.num_used_blocks <= kv.num_cpu_blocks, (swapped, cpu.num_used_blocks)
    else:
        used = kv.used
        assert 0 <= used <= usable and free + used == usable, (free, used, usable)


def check_kv_steps(steps: pd.DataFrame, usable: int) -> None:
    """The step table's KV columns agree with a pool of ``usable`` blocks at every step."""
    if steps.empty:
        return
    free = steps["num_free_blocks"].to_numpy()
    cached = steps["num_cached_blocks"].to_numpy()
    assert ((free >= 0) & (free <= usable)).all(), "free blocks outside [0, pool]"
    assert ((cached >= 0) & (cached <= free)).all(), "more cached-free than free blocks"
    assert np.allclose(steps["kv_usage"].to_numpy(), 1.0 - free / usable, rtol=0, atol=1e-12)
    assert (steps["num_swapped_blocks"].to_numpy() >= 0).all()


def check_kv_at_end(res: SimResult, obs: Observed) -> None:
    """Without a horizon every request is done, so every block is back (cached or plain free)."""
    kv = obs.policy.kv
    assert kv.num_free_blocks == kv.usable_blocks, (kv.num_free_blocks, kv.usable_blocks)
    if hasattr(kv, "num_cpu_used_blocks"):
        assert kv.num_cpu_used_blocks == 0


# ---- invariant 3: fast-forward exact ------------------------------------------------------------------


def check_same_requests(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Request tables equal column by column: counts and labels exactly, times to 1e-9 s (a run sums its
    step times in one cumsum, step by step adds them one at a time: rounding differs, nothing else)."""
    assert list(a.columns) == list(b.columns)
    assert list(a.columns[: len(REQUEST_COLUMNS)]) == list(REQUEST_COLUMNS)
    assert set(a.columns[len(REQUEST_COLUMNS) :]) <= set(CLIENT_COLUMNS)  # [frontend]'s, after the engine's
    assert len(a) == len(b)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if col in TIME_COLUMNS or col in CLIENT_COLUMNS:
            assert np.allclose(x.astype(float), y.astype(float), rtol=0, atol=1e-9, equal_nan=True), col
        else:
            assert pd.Series(x).equals(pd.Series(y)), col


def check_same_steps(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Step tables equal in every column: counts exactly, times and fractions to 1e-9."""
    assert list(a.columns) == list(b.columns), (list(a.columns), list(b.columns))
    assert len(a) == len(b), f"{len(a)} steps fast-forwarded vs {len(b)} step by step"
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":
            assert np.allclose(x, y, rtol=1e-9, atol=1e-9), col
        else:
            assert (x == y).all(), col


def check_fast_forward_exact(on: SimResult, off: SimResult) -> None:
    check_same_requests(on.requests, off.requests)
    check_same_steps(on.steps, off.steps)
    assert np.allclose(np.sort(np.repeat(on.itl_values, on.itl_weights)),
                       np.sort(np.repeat(off.itl_values, off.itl_weights)), rtol=0, atol=1e-9)  # fmt: skip


def fast_forwarded_steps(res: SimResult, obs: Observed) -> int:
    """Step-table rows no ``schedule`` call produced: they came from fast-forwarded decode runs.

    (A schedule call that finds nothing to run prices no step, so this undercounts, never overcounts.)"""
    return max(len(res.steps) - obs.schedule_calls, 0)


# ---- the run ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _observed(obs: Observed, check_kv: bool):
    real_make = simulate_mod.Setup.make_policy

    def make_policy(setup):
        pol = real_make(setup)
        obs.policy = pol
        return pol

    class CheckingRecorder(Recorder):
        def _check(self) -> None:
            if check_kv:
                check_kv_conserved(obs.policy.kv, obs.engine_requests)
                obs.kv_checks += 1

        def on_step(self, *a, **kw) -> None:
            super().on_step(*a, **kw)
            self._check()

        def on_decode_run(self, *a, **kw) -> None:
            super().on_decode_run(*a, **kw)
            self._check()

        def on_run_columns(self, *a, **kw) -> None:
            super().on_run_columns(*a, **kw)
            self._check()

    real_engine = simulate_mod.Engine

    def engine(*a, **kw):
        eng = real_engine(*a, **kw)
        obs.engine = eng
        obs.engine_requests = eng.requests  # the engine appends to this list as requests arrive
        return eng

    with (
        mock.patch.object(simulate_mod.Setup, "make_policy", make_policy),
        mock.patch.object(simulate_mod, "Recorder", CheckingRecorder),
        mock.patch.object(simulate_mod, "Engine", engine),
    ):
        yield


def run_checked(cfg: RunConfig, *, fast_forward: bool = True, check_kv: bool = True) -> tuple[SimResult, Observed]:
    """``simulate(cfg)`` with the KV invariant checked after every step (and every fast-forwarded run)."""
    obs = Observed()
    with _observed(obs, check_kv):
        res = simulate_mod.simulate(cfg, fast_forward=fast_forward)
    return res, obs


# ---- on every result: tests/conftest.py ----------------------------------------------------------------


def check_any_result(res: SimResult) -> None:
    """What holds for any result, whatever made it: each request once and in one of STATUSES, a finished
    one's times ordered (arrival <= scheduled <= first token <= finish) and its token count within its
    output, a rejected or timed-out one with a reason, KV usage in [0, 1], steps of non-negative length."""
    df = res.requests
    assert not df["request_id"].duplicated().any(), "a request is reported twice"
    status = df["status"]
    assert status.isin(STATUSES).all(), sorted(set(status) - set(STATUSES))
    fin = df[status == "finished"]
    t = [fin[c].to_numpy(float) for c in ("arrival_time", "scheduled_time", "first_token_time", "finish_time")]
    for a, b in zip(t, t[1:], strict=False):
        assert (a <= b + 1e-9).all(), "a finished request's times are out of order"
    n_out = fin["num_output_tokens"].to_numpy(float)
    assert ((n_out >= 1) & (n_out <= fin["output_len"].to_numpy(float))).all(), "output tokens out of range"
    ended = df[status.isin(["rejected", "timed_out"])]
    assert ended["finish_reason"].notna().all(), "a request ended without a reason"
    steps = res.step_columns(("kv_usage", "duration"))  # the stored columns: the result stays as built
    if len(steps["duration"]):
        kv = steps["kv_usage"].astype(float)
        assert ((kv >= -1e-12) & (kv <= 1 + 1e-12)).all(), "KV usage outside [0, 1]"
        assert (steps["duration"].astype(float) >= 0).all(), "a step of negative length"
