"""Differential test: servesim's ``vllm`` policy against vLLM's real V1 scheduler, step by step.

    .venv/bin/python bench/vllm_diff.py --workloads 200 --seed 0 \
        [--oracle-python /tmp/vllm-oracle-venv/bin/python] [--jobs 2] [--cache out/vllm_diff]

Random workloads (arrival steps, prompt/output lengths, shared-prefix groups, tight block pools that
force preemption, budgets that force chunking, prefix caching and chunked prefill on and off, fcfs and
priority, sometimes a long-prefill threshold, a max_model_len that caps outputs or
scheduler_reserve_full_isl off) run through both:

- the oracle, ``../shared/tools/vllm-oracle/oracle.py`` (vLLM 0.33's Scheduler, KVCacheManager and
  BlockPool with fake model outputs; install per its README, outside the repository). Its import takes
  15-20 s, so each oracle subprocess imports it once and runs a batch of workloads; ``--jobs`` run in
  parallel. Traces are cached under ``--cache`` keyed by workload and oracle.py content, so a rerun after
  a servesim fix needs no vLLM at all (``--no-oracle`` compares cached traces only);
- servesim's ``vllm`` policy, driven directly with the oracle's step semantics (vllm-oracle README):
  for step = 0, 1, ...: add the requests arriving at this step, schedule if anything is in the system
  (or something finished last step: the engine's extra empty step), apply one sampled token to each
  row whose prompt is done, finish the done ones. One step per time unit (a constant cost model).
  With ``--async-scheduling`` both sides run vLLM's async scheduling: a step schedules the next batch
  before the previous batch's output is applied (a 2-deep batch queue, ``servesim_trace``).
  ``--watermark F`` or ``LOW,HIGH`` (drawn per workload) sets vLLM V1's admission watermark.
  It runs twice: with every prompt given as segments, and with ungrouped prompts left as unique content
  (the KV manager's no-hashing shortcut), see ``request_specs``.

Each step's record is compared field by field (``FIELDS``). Exit status 0 iff every step of every
workload is identical. bench/README.md has the results and the fixes they led to.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from policies.base import PolicyLimits, StepPlan  # noqa: E402
from policies.vllm import VllmOptions, VllmPolicy  # noqa: E402
from sim.core.request import Request, RequestSpec  # noqa: E402

ORACLE_DIR = REPO.parent / "shared" / "tools" / "vllm-oracle"
DEFAULT_ORACLE_PYTHON = Path("/tmp/vllm-oracle-venv/bin/python")
DEFAULT_CACHE = REPO / "out" / "vllm_diff"
MAX_STEPS = 20_000  # both sides stop here; a livelock would show as a run that long

# Fields of one oracle trace line that servesim must reproduce exactly (vllm-oracle README).
# ``updated_batch`` (async scheduling only) is not compared.
FIELDS = (
    "arrived", "scheduled", "num_scheduled_tokens", "admitted", "preempted", "finished",
    "num_running", "num_waiting", "num_free_blocks", "num_free_blocks_end", "num_cached_hashes",
    "usable_blocks", "kv_usage", "prefix_cache",
)
PREFIX_STATS = ("queries", "hits", "requests", "preempted_queries", "preempted_hits")
# Every output token of the oracle is the same fake token (oracle.py FAKE_TOKEN), so outputs of two
# requests with equal prompts are equal content: one shared output key says so.
FAKE_OUTPUT_KEY = ("o", "fake")
CONTENT_MODES = ("segments", "unique")
# With content="unique" servesim does not hash what nobody can share, so its hash-map size differs.
FIELDS_UNIQUE = tuple(f for f in FIELDS if f != "num_cached_hashes")


# ---- workloads --------------------------------------------------------------------------------------
def gen_workload(seed: int, index: int, async_scheduling: bool = False,
                 watermark: float | tuple[float, float] = 0.0) -> dict[str, Any]:
    """Workload ``index`` of ``seed`` in the oracle's format: ``{"params": {...}, "requests": [...]}``.

    ``async_scheduling`` and ``watermark`` (a value, or a (low, high) range drawn per workload from its
    own stream) only set those params: the requests and the other params do not depend on them.

    Each workload draws its own config, so 200 workloads cover the on/off switches in combination.
    Invariants the oracle needs (and servesim would otherwise reject): every prompt is shorter than
    max_model_len, every request fits the pool on its own, and without chunked prefill the budget
    covers max_model_len.
    """
    rng = np.random.default_rng([seed, index])

    def pick(options: Sequence[Any]) -> Any:
        return options[int(rng.integers(len(options)))]

    bs = int(pick([8, 16, 16, 16, 32]))
    caching = bool(rng.random() < 0.65)
    chunked = bool(rng.random() < 0.7)
    policy = "priority" if rng.random() < 0.3 else "fcfs"
    n_req = int(rng.integers(2, 26))
    prompt_max = int(pick([24, 64, 160, 400]))
    out_max = int(pick([3, 16, 64, 160]))
    burst = rng.random() < 0.2
    gaps = [0, 0, 0, 1, 1, 2, 4]
    n_groups = int(pick([0, 1, 2, 3, 3]))
    group_len = [
        int(pick([bs, 2 * bs, 4 * bs])) if rng.random() < 0.5 else int(rng.integers(1, prompt_max + 1))
        for _ in range(n_groups)
    ]
    share = float(rng.uniform(0.3, 0.95))

    reqs: list[dict[str, Any]] = []
    step = 0
    for i in range(n_req):
        if not burst:
            step += int(pick(gaps))
        prompt = int(rng.integers(1, prompt_max + 1))
        r: dict[str, Any] = {"id": f"r{i}", "arrival_step": step, "prompt_len": prompt,
                             "output_len": int(rng.integers(1, out_max + 1))}
        if n_groups and rng.random() < share:
            g = int(rng.integers(n_groups))
            plen = group_len[g] if rng.random() < 0.75 else int(rng.integers(1, group_len[g] + bs + 1))
            u = rng.random()
            if u < 0.15:  # the whole prompt is the shared prefix: equal prompts, equal (fake) outputs
                r["prompt_len"] = plen
            elif u < 0.75:  # usually the whole shared prefix is there, plus a few own tokens
                r["prompt_len"] = plen + int(rng.integers(0, 2 * bs + 1))
            r["prefix_group"] = f"g{g}"
            r["prefix_len"] = plen
        if policy == "priority":
            r["priority"] = int(rng.integers(0, 4))
        reqs.append(r)

    longest = max(r["prompt_len"] + r["output_len"] for r in reqs)
    max_prompt = max(r["prompt_len"] for r in reqs)
    max_model_len = -(-longest // bs) * bs  # the oracle's default
    if rng.random() < 0.2 and max_prompt + 1 < longest:
        max_model_len = int(rng.integers(max_prompt + 1, longest))  # some outputs end at max_model_len
    need = [-(-min(r["prompt_len"] + r["output_len"], max_model_len) // bs) for r in reqs]
    if rng.random() < 0.6:  # tight: a few requests at most, preemption likely
        slack = int(rng.integers(0, max(need) + 1))
    else:
        slack = int(rng.integers(0, 2 * sum(need) + 1))
    num_gpu_blocks = 1 + max(need) + slack
    max_num_seqs = int(pick([1, 2, 3, 4, 8, 16, 64]))
    if chunked:
        budget = int(pick([8, 16, 32, 50, 64, 128, 256, 512, 2048]))
    else:
        budget = max_model_len + int(pick([0, 0, 16, 100, 300]))
    budget = max(budget, max_num_seqs)
    threshold = 0 if rng.random() < 0.7 else int(rng.integers(1, 129))
    threshold = min(threshold, max_model_len)  # vLLM's SchedulerConfig refuses a larger one
    reserve_full_isl = bool(rng.random() >= 0.15)  # vLLM 0.33 default true; false admits by chunk only
    params = {
        "block_size": bs, "num_gpu_blocks": num_gpu_blocks, "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget, "enable_prefix_caching": caching,
        "enable_chunked_prefill": chunked, "long_prefill_token_threshold": threshold,
        "max_model_len": max_model_len, "policy": policy, "watermark": 0.0,
        "scheduler_reserve_full_isl": reserve_full_isl, "prefix_len": 0, "async_scheduling": False, "seed": 0,
        "max_steps": MAX_STEPS,
    }
    params["async_scheduling"] = bool(async_scheduling)
    if isinstance(watermark, tuple):
        lo, hi = watermark
        watermark = round(float(np.random.default_rng([seed, index, 1]).uniform(lo, hi)), 4)
    params["watermark"] = float(watermark)
    return {"params": params, "requests": reqs}


def workload_key(workload: dict[str, Any], oracle_sha: str) -> str:
    blob = json.dumps(workload, sort_keys=True) + oracle_sha
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---- servesim side ----------------------------------------------------------------------------------
def request_specs(workload: dict[str, Any], content: str = "segments") -> list[tuple[int, RequestSpec]]:
    """(arrival step, spec) per request, content mirroring oracle.make_prompts.

    The oracle draws token ids per request and overwrites the first ``min(prefix_len, prompt_len)`` with
    its group's prefix (one draw per group, so shorter prefixes of a group agree). As segments: the
    group's tokens, then the request's own. ``content="unique"`` gives requests outside any group no
    segments at all, which takes servesim's shortcut for content nobody shares (never hashed while it
    runs, sim/kv/manager.py); the trace must be the same but for ``num_cached_hashes``.
    """
    if content not in CONTENT_MODES:
        raise ValueError(f"content must be one of {CONTENT_MODES}, got {content!r}")
    out: list[tuple[int, RequestSpec]] = []
    per_step: dict[int, int] = {}
    default_plen = int(workload["params"].get("prefix_len", 0))
    for r in workload["requests"]:
        rid = str(r["id"])
        step = int(r["arrival_step"])
        n = int(r["prompt_len"])
        k = 0
        if r.get("prefix_group") is not None:
            k = min(int(r.get("prefix_len", default_plen)), n)
        segs: list[tuple[Any, int]] = []
        if k:
            segs.append((("g", str(r["prefix_group"])), k))
        if n - k:
            segs.append((("u", rid), n - k))
        idx = per_step.get(step, 0)
        per_step[step] = idx + 1
        spec = RequestSpec(
            request_id=rid,
            arrival_time=step + 1e-6 * idx,  # oracle.py: arrival_time = step + 1e-6 * order within the step
            prompt_len=n,
            output_len=int(r["output_len"]),
            priority=int(r.get("priority", 0)),
            segments=tuple(segs) if k or content == "segments" else None,
            output_key=FAKE_OUTPUT_KEY,
        )
        out.append((step, spec))
    return out


def policy_limits(params: dict[str, Any]) -> PolicyLimits:
    return PolicyLimits(
        max_num_seqs=int(params["max_num_seqs"]),
        max_num_batched_tokens=int(params["max_num_batched_tokens"]),
        max_model_len=int(params["max_model_len"]),
        block_size=int(params["block_size"]),
        num_gpu_blocks=int(params["num_gpu_blocks"]),
        enable_prefix_caching=bool(params["enable_prefix_caching"]),
        enable_chunked_prefill=bool(params["enable_chunked_prefill"]),
        long_prefill_token_threshold=int(params.get("long_prefill_token_threshold", 0)),
        scheduler_reserve_full_isl=bool(params.get("scheduler_reserve_full_isl", True)),
        scheduling_policy=str(params.get("policy", "fcfs")),
        async_scheduling=bool(params.get("async_scheduling", False)),
    )


def _stats_delta(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: now[k] - before[k] for k in PREFIX_STATS}


def servesim_trace(workload: dict[str, Any], content: str = "segments") -> list[dict[str, Any]]:
    """servesim's ``vllm`` policy on ``workload``, one record per step in the oracle's format.

    The loop is the oracle's (EngineCore.step, or step_with_batch_queue with async_scheduling): each
    step schedules if the scheduler has requests and queues the batch; with a 2-deep queue (async) a
    step whose queue is not yet full returns without applying any output, otherwise the oldest batch's
    output is applied (``update``). Sync is the same loop with a 1-deep queue.
    """
    params = workload["params"]
    # The class itself rather than the registry, so that half-built presets elsewhere cannot break this.
    pol = VllmPolicy(policy_limits(params), VllmOptions(watermark=float(params.get("watermark", 0.0))))
    kv = pol.kv
    usable = kv.usable_blocks
    by_step: dict[int, list[RequestSpec]] = {}
    for step, spec in request_specs(workload, content):
        by_step.setdefault(step, []).append(spec)
    last_arrival = max(by_step) if by_step else 0
    max_steps = int(params.get("max_steps", MAX_STEPS))
    depth = 2 if params.get("async_scheduling") else 1

    trace: list[dict[str, Any]] = []
    stats = kv.prefix_cache_stats()
    # vLLM's has_requests() also counts requests finished since the last schedule()
    finished_since_schedule = False
    queue: deque[StepPlan] = deque()  # batches scheduled, output not applied yet (newest first)
    step = 0
    while step < max_steps:
        if step > last_arrival and not pol.has_unfinished() and not finished_since_schedule and not queue:
            break
        arrived = []
        for spec in by_step.get(step, ()):
            reason = pol.add_request(Request(spec), float(step))
            if reason is not None:
                raise ValueError(f"servesim rejected {spec.request_id}: {reason} (the oracle never rejects)")
            arrived.append(spec.request_id)
        rec: dict[str, Any] = {"step": step, "arrived": arrived}
        plan = None
        if pol.has_unfinished() or finished_since_schedule:
            plan = pol.schedule(float(step))
            finished_since_schedule = False
            queue.appendleft(plan)
            admitted_ids = {id(r) for r in plan.admitted}
            admitted = {}
            for r, n in plan.scheduled:
                if id(r) in admitted_ids:
                    # finalize_plan advanced num_computed_tokens by n: the rest are prefix hits.
                    kind = "resumed" if r.num_preemptions > 0 else "new"
                    admitted[r.request_id] = {"kind": kind, "cached": r.num_computed_tokens - n}
            now_stats = kv.prefix_cache_stats()
            rec.update(
                scheduled=[[r.request_id, n] for r, n in plan.scheduled],
                num_scheduled_tokens=sum(n for _, n in plan.scheduled),
                admitted=admitted,
                preempted=sorted(r.request_id for r in plan.preempted),
                prefix_cache=_stats_delta(now_stats, stats),
            )
            stats = now_stats
        else:
            rec.update(scheduled=[], num_scheduled_tokens=0, admitted={}, preempted=[], prefix_cache=None)
        free_after = kv.num_free_blocks
        n_running, n_waiting = pol.num_running, pol.num_waiting
        hold = plan is not None and len(queue) < depth and (bool(plan.scheduled) or pol.has_unfinished())
        finished: list[Request] = []
        if queue and not hold:
            finished = pol.update(queue.pop(), float(step + 1))
            finished_since_schedule = finished_since_schedule or bool(finished)
        rec.update(
            finished=[r.request_id for r in finished],
            num_running=n_running,
            num_waiting=n_waiting,
            num_free_blocks=free_after,
            num_free_blocks_end=kv.num_free_blocks,
            num_cached_hashes=kv.pool.num_cached_hashes,
            usable_blocks=usable,
            kv_usage=round(1.0 - free_after / usable, 6),
        )
        trace.append(rec)
        step += 1
    return trace


# ---- comparison -------------------------------------------------------------------------------------
@dataclass
class Diff:
    """The first step where the two traces differ, with both records (None past a trace's end)."""

    step: int
    fields: list[str]
    oracle: dict[str, Any] | None
    servesim: dict[str, Any] | None

    def describe(self, width: int = 400) -> str:
        lines = [f"first difference at step {self.step}: {', '.join(self.fields)}"]
        for f in self.fields:
            o = "<no step>" if self.oracle is None else self.oracle.get(f)
            s = "<no step>" if self.servesim is None else self.servesim.get(f)
            lines.append(f"    {f}: oracle={_clip(o, width)}")
            lines.append(f"    {' ' * len(f)}  servesim={_clip(s, width)}")
        return "\n".join(lines)


def _clip(v: Any, width: int) -> str:
    s = json.dumps(v)
    return s if len(s) <= width else s[: width - 3] + "..."


def _norm(rec: dict[str, Any], f: str) -> Any:
    v = rec.get(f)
    if f == "kv_usage" and v is not None:
        return round(float(v), 6)
    if f == "preempted" and v is not None:
        return sorted(v)
    return v


@dataclass
class Comparison:
    steps: int  # steps compared (the longer trace's length)
    matched: int  # steps identical in every field
    diff: Diff | None  # first difference, None if identical
    diff_fields: dict[str, int] = field(default_factory=dict)  # field -> number of steps it differs in


def compare_traces(oracle: Sequence[dict[str, Any]], sim: Sequence[dict[str, Any]],
                   fields: Iterable[str] = FIELDS) -> Comparison:
    fields = tuple(fields)
    n = max(len(oracle), len(sim))
    matched = 0
    first: Diff | None = None
    counts: dict[str, int] = {}
    for i in range(n):
        o = oracle[i] if i < len(oracle) else None
        s = sim[i] if i < len(sim) else None
        if o is None or s is None:
            bad = ["<trace length>"]
        else:
            bad = [f for f in fields if _norm(o, f) != _norm(s, f)]
            if o.get("step", i) != s.get("step", i):
                bad.insert(0, "step")
        if not bad:
            matched += 1
            continue
        for f in bad:
            counts[f] = counts.get(f, 0) + 1
        if first is None:
            first = Diff(step=i, fields=bad, oracle=o, servesim=s)
    return Comparison(steps=n, matched=matched, diff=first, diff_fields=counts)


# ---- oracle side ------------------------------------------------------------------------------------
# Runs inside the oracle's Python: imports oracle.py from its directory (not copied) once, then calls
# its run() per workload, exactly as its main() does for one workload file.
_BOOTSTRAP = r"""
import contextlib, io, json, os, sys, traceback
oracle_dir, jobs_path = sys.argv[1], sys.argv[2]
sys.path.insert(0, oracle_dir)
import oracle
jobs = json.load(open(jobs_path))
for i, job in enumerate(jobs):
    with open(job["workload"]) as f:
        w = json.load(f)
    p = dict(oracle.DEFAULTS)
    p.update(w.get("params", {}))
    err, buf = io.StringIO(), io.StringIO()
    ok = True
    try:
        with contextlib.redirect_stderr(err):
            oracle.run(w["requests"], p, buf, quiet=False)
    except KeyboardInterrupt:
        raise
    except BaseException:
        traceback.print_exc(file=err)
        ok = False
    warn = [l for l in err.getvalue().splitlines() if l.startswith("# WARNING")]
    if not ok or warn:
        with open(job["trace"] + ".err", "w") as f:
            f.write(err.getvalue())
    else:
        tmp = job["trace"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(buf.getvalue())
        os.replace(tmp, job["trace"])
    print(f"oracle {i + 1}/{len(jobs)} {'ok' if ok and not warn else 'FAILED'}", flush=True)
"""


def run_oracle(jobs: list[tuple[Path, Path]], python: Path, oracle_dir: Path, n_proc: int,
               quiet: bool = False) -> None:
    """Run the oracle on (workload file, trace file) jobs in ``n_proc`` parallel batch processes."""
    if not jobs:
        return
    n_proc = max(1, min(n_proc, len(jobs)))
    chunks = [jobs[i::n_proc] for i in range(n_proc)]
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, chunk in enumerate(chunks):
            jobs_path = Path(tmp) / f"jobs{k}.json"
            jobs_path.write_text(json.dumps([{"workload": str(w), "trace": str(t)} for w, t in chunk]))
            log = open(Path(tmp) / f"log{k}.txt", "w")  # noqa: SIM115 (closed below)
            # oracle.py rewrites a dummy model config under tempfile.gettempdir() on every run: one
            # temp dir per process, or parallel processes read each other's half-written file.
            own_tmp = Path(tmp) / f"tmp{k}"
            own_tmp.mkdir()
            env = dict(os.environ, TMPDIR=str(own_tmp))
            p = subprocess.Popen([str(python), "-c", _BOOTSTRAP, str(oracle_dir), str(jobs_path)],
                                 stdout=subprocess.PIPE, stderr=log, text=True, cwd=tmp, env=env)
            procs.append((p, log))
        done = 0
        for p, log in procs:
            assert p.stdout is not None
            for line in p.stdout:
                done += 1
                if not quiet and (done % 10 == 0 or done == len(jobs) or "FAILED" in line):
                    print(f"  oracle: {done}/{len(jobs)} workloads run" + (" (a FAILURE)" if "FAILED" in line
                                                                          else ""), flush=True)
            p.wait()
            log.close()
            if p.returncode != 0:
                tail = Path(log.name).read_text()[-3000:]
                raise RuntimeError(f"oracle process failed (exit {p.returncode}):\n{tail}")


def read_trace(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- recorded fixture (tests/data/vllm_oracle_tiny.jsonl) -------------------------------------------
# Small workloads, each of which a servesim fix was needed for (bench/README.md), plus one per config
# with preemption; the unit tests replay them without vLLM. Rewrite with ``--write-fixture PATH``.
FIXTURE_SEED = 1
FIXTURE_INDICES = {
    622: "free order: uncached blocks reused first", 298: "prefix stats at admission",
    1658: "no chunked prefill: admission stops at a prompt over the budget",
    751: "unique content: free order of the never-hashed blocks",
    1225: "preemption, cache off, chunked off, fcfs", 1604: "preemption, cache off, chunked off, priority",
    202: "preemption, cache off, chunked on, fcfs", 392: "preemption, cache off, chunked on, priority",
    340: "preemption, cache on, chunked off, fcfs", 430: "preemption, cache on, chunked off, priority",
    432: "preemption, cache on, chunked on, fcfs", 530: "preemption, cache on, chunked on, priority",
}
HANDMADE = {
    # vLLM 0.33: the lowest-priority request preempts itself and the running loop goes on (step 2).
    "priority self-preemption": {
        "params": {"block_size": 8, "num_gpu_blocks": 5, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                   "enable_prefix_caching": False, "enable_chunked_prefill": True,
                   "long_prefill_token_threshold": 0, "max_model_len": 24, "policy": "priority"},
        "requests": [{"id": "lo", "arrival_step": 0, "prompt_len": 15, "output_len": 6, "priority": 5},
                     {"id": "hi", "arrival_step": 1, "prompt_len": 12, "output_len": 6, "priority": 0}],
    },
    # the oracle README's example (shared/tools/vllm-oracle/tiny.json): hits on blocks prefilled this step
    "hit on blocks prefilled in the same step": {
        "params": {"block_size": 16, "num_gpu_blocks": 200, "max_num_seqs": 8, "max_num_batched_tokens": 512,
                   "enable_prefix_caching": True, "enable_chunked_prefill": True,
                   "long_prefill_token_threshold": 0, "max_model_len": 112, "policy": "fcfs"},
        "requests": [
            {"id": "a", "arrival_step": 0, "prompt_len": 100, "output_len": 3, "prefix_group": "sys", "prefix_len": 64},
            {"id": "b", "arrival_step": 0, "prompt_len": 80, "output_len": 2, "prefix_group": "sys", "prefix_len": 64},
            {"id": "c", "arrival_step": 2, "prompt_len": 70, "output_len": 2, "prefix_group": "sys", "prefix_len": 64},
        ],
    },
}
# Only in the watermark fixtures: b's whole prompt fits the free blocks, but not above the watermark
# (int(0.1 x 21) = 2 blocks) while a runs; alone in the system it is admitted (no watermark then).
HANDMADE_WATERMARK = {
    "watermark holds b back while a runs": {
        "params": {"block_size": 8, "num_gpu_blocks": 21, "max_num_seqs": 8, "max_num_batched_tokens": 128,
                   "enable_prefix_caching": False, "enable_chunked_prefill": True,
                   "long_prefill_token_threshold": 0, "max_model_len": 120, "policy": "fcfs", "watermark": 0.1},
        "requests": [{"id": "a", "arrival_step": 0, "prompt_len": 40, "output_len": 6},
                     {"id": "b", "arrival_step": 1, "prompt_len": 112, "output_len": 2}],
    },
}
_EMPTY_BY_DEFAULT = ("arrived", "scheduled", "admitted", "preempted", "finished")


def fixture_workloads(async_scheduling: bool = False,
                      watermark: float | tuple[float, float] = 0.0) -> list[tuple[str, dict[str, Any]]]:
    """The fixture workloads; with ``async_scheduling`` / ``watermark`` set as in ``gen_workload``."""
    out = []
    for name, w in [*HANDMADE.items(), *(HANDMADE_WATERMARK.items() if watermark else ())]:
        w = json.loads(json.dumps(w))
        if async_scheduling:
            w["params"]["async_scheduling"] = True
        if watermark and name not in HANDMADE_WATERMARK:
            w["params"]["watermark"] = watermark[1] if isinstance(watermark, tuple) else watermark
        out.append((name, w))
    out += [(f"seed {FIXTURE_SEED} #{i}: {why}", gen_workload(FIXTURE_SEED, i, async_scheduling, watermark))
            for i, why in FIXTURE_INDICES.items()]
    return out


def compact_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A trace line with only what ``expand_record`` cannot rebuild (keeps the fixture small)."""
    out = {"step": rec["step"]}
    for f in FIELDS:
        if f in ("usable_blocks", "kv_usage") or (f in _EMPTY_BY_DEFAULT and not rec[f]):
            continue
        if f == "num_free_blocks_end" and rec[f] == rec["num_free_blocks"]:
            continue
        if f == "num_scheduled_tokens" and rec[f] == sum(n for _, n in rec["scheduled"]):
            continue
        if f == "prefix_cache" and rec[f] is not None and not any(rec[f].values()):
            continue  # all zero (None, for a step that did not schedule, is kept)
        out[f] = rec[f]
    return out


def expand_record(rec: dict[str, Any], usable_blocks: int) -> dict[str, Any]:
    out = dict(rec)
    for f in _EMPTY_BY_DEFAULT:
        out.setdefault(f, {} if f == "admitted" else [])
    out.setdefault("num_scheduled_tokens", sum(n for _, n in out["scheduled"]))
    out.setdefault("num_free_blocks_end", out["num_free_blocks"])
    out.setdefault("prefix_cache", dict.fromkeys(PREFIX_STATS, 0))
    out["usable_blocks"] = usable_blocks
    out["kv_usage"] = round(1.0 - out["num_free_blocks"] / usable_blocks, 6)
    return out


def read_fixture(path: Path) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(name, workload, oracle trace) per line of a fixture file written by ``--write-fixture``."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                usable = int(d["workload"]["params"]["num_gpu_blocks"]) - 1
                out.append((d["name"], d["workload"], [expand_record(r, usable) for r in d["trace"]]))
    return out


# ---- driver -----------------------------------------------------------------------------------------
def coverage(workload: dict[str, Any], trace: Sequence[dict[str, Any]]) -> dict[str, int]:
    """What a workload exercised, from the oracle trace (to show the test is not vacuous)."""
    pre = sum(len(t["preempted"]) for t in trace)
    hits = sum((t["prefix_cache"] or {}).get("hits", 0) + (t["prefix_cache"] or {}).get("preempted_hits", 0)
               for t in trace)
    prompt = {str(r["id"]): int(r["prompt_len"]) for r in workload["requests"]}
    chunks = sum(1 for t in trace for rid, n in t["scheduled"]
                 if rid in t["admitted"] and t["admitted"][rid]["cached"] + n < prompt[rid])
    return {"preemptions": pre, "hit_tokens": hits, "partial_prefill_admissions": chunks,
            "steps": len(trace), "requests": len(workload["requests"])}


def config_label(params: dict[str, Any]) -> str:
    label = (f"cache={'on' if params['enable_prefix_caching'] else 'off'} "
             f"chunked={'on' if params['enable_chunked_prefill'] else 'off'} {params['policy']}")
    if params.get("async_scheduling"):
        label += " async"
    if params.get("watermark"):
        label += " watermark"
    return label


def _watermark_arg(s: str) -> float | tuple[float, float]:
    """``--watermark``: a fraction, or ``LOW,HIGH`` drawn per workload."""
    parts = [float(x) for x in s.split(",")]
    if len(parts) == 1 and 0 <= parts[0] < 1:
        return parts[0]
    if len(parts) == 2 and 0 <= parts[0] <= parts[1] < 1:
        return (parts[0], parts[1])
    raise argparse.ArgumentTypeError(f"watermark must be F or LOW,HIGH with 0 <= F < 1, got {s!r}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", type=int, default=200, help="number of random workloads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--oracle-python", type=Path,
                    default=Path(os.environ.get("VLLM_ORACLE_PYTHON", DEFAULT_ORACLE_PYTHON)))
    ap.add_argument("--oracle-dir", type=Path, default=ORACLE_DIR)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="workloads and oracle traces")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel oracle processes")
    ap.add_argument("--no-oracle", action="store_true", help="compare cached oracle traces only")
    ap.add_argument("--only", type=int, nargs="*", help="workload indices to run (default: all)")
    ap.add_argument("--show", type=int, default=5, help="mismatches to print in full")
    ap.add_argument("--content", choices=(*CONTENT_MODES, "both"), default="both",
                    help="how servesim is told prompt content (request_specs); default: both ways")
    ap.add_argument("--write-fixture", type=Path,
                    help="run the fixture workloads (FIXTURE_INDICES, HANDMADE) and write them with their "
                         "oracle traces to this file (tests/data/vllm_oracle_tiny.jsonl)")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="every workload with async_scheduling (the oracle's AsyncScheduler + 2-deep queue)")
    ap.add_argument("--watermark", type=_watermark_arg, default=0.0,
                    help="vLLM V1 watermark: F, or LOW,HIGH drawn per workload (e.g. 0.01,0.2)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    mode = {"async_scheduling": a.async_scheduling, "watermark": a.watermark}

    oracle_py = a.oracle_dir / "oracle.py"
    if not oracle_py.exists():
        print(f"vllm_diff: no oracle at {oracle_py} (see ../shared/tools/vllm-oracle/README.md)", file=sys.stderr)
        return 2
    oracle_sha = hashlib.sha256(oracle_py.read_bytes()).hexdigest()
    a.cache.mkdir(parents=True, exist_ok=True)
    if a.write_fixture:
        named = fixture_workloads(**mode)
    else:
        named = [(str(i), gen_workload(a.seed, i, **mode)) for i in (a.only if a.only else range(a.workloads))]
    items = []
    for name, w in named:
        key = workload_key(w, oracle_sha)
        wpath, tpath = a.cache / f"{key}.workload.json", a.cache / f"{key}.trace.jsonl"
        if not wpath.exists():
            wpath.write_text(json.dumps(w, indent=1))
        items.append((name, w, key, wpath, tpath))

    missing = [(wp, tp) for _, _, _, wp, tp in items if not tp.exists()]
    if missing and not a.no_oracle:
        if not a.oracle_python.exists():
            print(f"vllm_diff: oracle python {a.oracle_python} not found; install per "
                  f"{a.oracle_dir / 'README.md'} or pass --oracle-python (or --no-oracle)", file=sys.stderr)
            return 2
        for _, tp in missing:
            with contextlib.suppress(FileNotFoundError):
                Path(str(tp) + ".err").unlink()
        t0 = time.perf_counter()
        print(f"running the oracle on {len(missing)} workloads ({a.jobs} processes)...", flush=True)
        run_oracle(missing, a.oracle_python, a.oracle_dir, a.jobs, quiet=a.quiet)
        print(f"  oracle done in {time.perf_counter() - t0:.0f} s", flush=True)

    if a.write_fixture:
        with open(a.write_fixture, "w") as f:
            for name, w, _key, _wpath, tpath in items:
                trace = [compact_record(r) for r in read_trace(tpath)]
                f.write(json.dumps({"name": name, "workload": w, "trace": trace}, separators=(",", ":")) + "\n")
        print(f"wrote {len(items)} workloads to {a.write_fixture} ({a.write_fixture.stat().st_size} bytes)")

    modes = CONTENT_MODES if a.content == "both" else (a.content,)
    n_ok = n_cmp = 0
    steps = dict.fromkeys(modes, 0)
    matched = dict.fromkeys(modes, 0)
    failures: list[tuple[str, str, str, str, Comparison]] = []
    errors: list[tuple[str, str, str]] = []
    per_config: dict[str, list[int]] = {}
    cov_tot: dict[str, int] = {}
    cov_wl: dict[str, int] = {}
    t0 = time.perf_counter()
    for i, w, key, _wpath, tpath in items:
        if not tpath.exists():
            err = Path(str(tpath) + ".err")
            errors.append((i, key, err.read_text()[-600:] if err.exists() else "no oracle trace"))
            continue
        oracle_trace = read_trace(tpath)
        label = config_label(w["params"])
        comps = {}
        try:
            for mode in modes:
                fields = FIELDS if mode == "segments" else FIELDS_UNIQUE
                comps[mode] = compare_traces(oracle_trace, servesim_trace(w, mode), fields)
        except Exception as e:  # a crash is a finding too: report it with the workload
            errors.append((i, key, f"servesim raised {type(e).__name__}: {e}"))
            continue
        n_cmp += 1
        per_config.setdefault(label, [0, 0])[0] += 1
        for k, v in coverage(w, oracle_trace).items():
            cov_tot[k] = cov_tot.get(k, 0) + v
            cov_wl[k] = cov_wl.get(k, 0) + (v > 0)
        for mode, c in comps.items():
            steps[mode] += c.steps
            matched[mode] += c.matched
            if c.diff is not None:
                failures.append((i, key, label, mode, c))
        if all(c.diff is None for c in comps.values()):
            n_ok += 1
            per_config[label][1] += 1
    t_sim = time.perf_counter() - t0

    n_bad = len({i for i, *_ in failures})
    print(f"\nworkloads compared: {n_cmp}   identical: {n_ok}   with a difference: {n_bad}"
          f"   not compared (errors): {len(errors)}")
    for mode in modes:
        what = "" if mode == "segments" else " (all fields but num_cached_hashes)"
        print(f"steps compared, content={mode}: {steps[mode]}   identical: {matched[mode]}{what}")
    print(f"(servesim side {t_sim:.1f} s)")
    print("by config (identical/compared):")
    for label in sorted(per_config):
        tot, ok = per_config[label]
        print(f"    {label:<40} {ok}/{tot}")
    print("coverage (total; workloads with any): " + ", ".join(
        f"{k} {cov_tot[k]} ({cov_wl[k]})" for k in ("preemptions", "hit_tokens", "partial_prefill_admissions")
        if k in cov_tot))
    if failures:
        agg: dict[str, int] = {}
        for *_, c in failures:
            assert c.diff is not None
            for f in c.diff.fields:
                agg[f] = agg.get(f, 0) + 1
        print("first-differing fields over failing runs: "
              + ", ".join(f"{f} {n}" for f, n in sorted(agg.items(), key=lambda x: -x[1])))
    for i, key, label, mode, c in failures[: a.show]:
        assert c.diff is not None
        print(f"\n--- workload {i} [{label}] content={mode}: {a.cache / (key + '.workload.json')}")
        print(c.diff.describe())
    for i, key, msg in errors[: a.show]:
        print(f"\n--- workload {i} not compared ({key}): {msg.strip()}")
    return 0 if not failures and not errors and n_cmp == len(items) else 1


if __name__ == "__main__":
    sys.exit(main())
