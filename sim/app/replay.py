"""Replay a real run (workloads.runs.RealRun) through the simulator with the run's engine settings.

The config: the run's model and [engine] settings (vLLM names), ``--gpu`` or the GPU the run names,
``async_scheduling = true`` unless the run records it (vLLM V1's GPU default since late 2025; --set
engine.async_scheduling=false for older servers), the ``[frontend]`` priors when the run's latencies are
client-side (fitted values when the profile carries them: ``metadata.frontend``), the client's timeout
when the run has one, and ``--set SECTION.KEY=VALUE`` on top. ``workload.rate`` / ``workload.arrival`` /
``workload.burstiness`` redraw the arrivals (required for a Prometheus scrape, which has none);
``workload.max_concurrency`` / ``workload.client_timeout_s`` replace the run's.

``max_per_stage`` keeps the first N requests of each stage and starts each kept stage where the previous
one's kept requests ended (plus its mean gap), as a shorter run at the same load: deterministic, so a fit's
objective is a function of its parameters only. So that a short stage is not mostly its own ramp-up, W more
requests are replayed before the N and left out of the stage's statistics (``warmup``): W = rate × the
stage's real mean E2E, the requests in flight at steady state by Little's law (at most 2 N: an overloaded
stage has no steady state).
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import simpy

from sim.app.config import apply_overrides, config_from_dict, override_key, parse_value
from sim.app.frontend import FrontendConfig, apply_frontend, with_frontend
from sim.app.progress import run_bar, run_env
from sim.app.results import SimResult, request_metrics
from sim.app.simulate import Setup, collect, resolve
from sim.core.errors import ConfigError, ServesimError
from sim.core.request import RequestSpec
from sim.core.spec import MAX_ARRIVAL_S
from sim.cost.hardware import device_gpu, get_gpu, list_gpus, match_device
from sim.cost.models import get_model
from sim.cost.profiles import CalibrationProfile, get_profile
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource
from workloads.gen.arrivals import ArrivalConfig
from workloads.runs import RealRun

WARMUP_E2E = 3.0  # warm-up length in mean E2E times: the batch takes a few of them to settle
WORKLOAD_KEYS = ("rate", "arrival", "burstiness", "max_concurrency", "client_timeout_s")


class ConcurrencyLimitedSource:
    """Open-loop send times behind a client-side limit of ``limit`` requests in flight (``vllm bench serve
    --max-concurrency``: a semaphore; a request waits for a slot, then is sent, and its latency starts then)."""

    arrivals_ignore_finishes = False

    def __init__(self, specs: list[RequestSpec], limit: int) -> None:
        self.specs = sorted(specs, key=lambda s: s.arrival_time)
        self.limit, self.i, self.active = int(limit), 0, 0
        self.frees: list[float] = []  # when slots come free (finish times reported by on_done)
        self.last_free = 0.0

    def _release(self, now: float) -> None:
        while self.frees and self.frees[0] <= now:
            self.last_free = heapq.heappop(self.frees)
            self.active -= 1

    def peek_time(self) -> float | None:
        if self.i >= len(self.specs):
            return None
        t = self.specs[self.i].arrival_time
        if self.active < self.limit:
            return t
        return max(t, self.frees[0]) if self.frees else None

    def pop_due(self, now: float) -> list[RequestSpec]:
        out = []
        self._release(now)
        while self.i < len(self.specs) and self.active < self.limit and self.specs[self.i].arrival_time <= now:
            s = self.specs[self.i]
            out.append(dataclasses.replace(s, arrival_time=max(s.arrival_time, self.last_free)))
            self.i += 1
            self.active += 1
        return out

    def on_done(self, spec: RequestSpec, now: float) -> None:
        heapq.heappush(self.frees, now)

    def remaining(self) -> list[RequestSpec]:
        return list(self.specs[self.i :])


@dataclass
class Replay:
    """A prepared replay: the config, the resolved setup, the specs with their stages, the client settings."""

    run: RealRun
    cfg: Any
    setup: Setup
    specs: list[RequestSpec]
    stage_of: dict[str, int]
    warmup: set[str]
    max_concurrency: int | None
    client_timeout_s: float | None
    settings: dict[str, Any]


def resolve_gpu(name: str | None, where: str) -> str:
    """A catalogue GPU name from a user's or a device's name ('NVIDIA GeForce RTX 4090' -> 'RTX 4090')."""
    if not name:
        raise ConfigError(f"{where} does not say which GPU it ran on: give --gpu NAME (one of "
                          f"{', '.join(list_gpus())})")
    card, agrees = match_device(str(name))
    if card is not None and agrees:
        return card
    why = f"its memory is not {card}'s" if card is not None else "not in the catalogue"
    raise ConfigError(f"{where}: GPU {name!r} is {why}; give --gpu NAME (one of {', '.join(list_gpus())})")


def warmup_counts(run: RealRun) -> list[int]:
    """Per stage, the requests in flight at steady state (rate × real mean E2E; 0 where either is unknown)."""
    out = []
    for st, m in zip(run.stages, run.measured, strict=True):
        e2e = m.get("e2el_mean_ms")
        out.append(int(math.ceil(WARMUP_E2E * st.rate * e2e / 1e3)) if st.rate and e2e and math.isfinite(e2e) else 0)
    return out


def cap_stages(specs: list[RequestSpec], stage_of: np.ndarray, run: RealRun,
               n: int | list[int] | None) -> tuple[list, np.ndarray]:  # fmt: skip
    """The first ``n`` requests of every stage (or ``n[k]`` of stage k), later stages shifted to follow the
    kept ones (module doc). Warm-up requests are not added here (``prepare`` does)."""
    if n is None:
        return specs, stage_of
    caps = list(n) if isinstance(n, list) else [n] * len(run.stages)
    if len(caps) != len(run.stages) or any(c < 1 for c in caps):
        raise ConfigError(f"max_per_stage must be >= 1 per stage, got {n}")
    out, stages, shift_end = [], [], 0.0
    for k in range(len(run.stages)):
        idx = np.flatnonzero(stage_of == k)
        if not idx.size:
            continue
        kept = idx[: caps[k]]
        t = np.array([specs[i].arrival_time for i in idx])
        gap = (t[-1] - t[0]) / (len(idx) - 1) if len(idx) > 1 else 0.0
        if run.stages[k].rate:
            gap = 1.0 / run.stages[k].rate
        t0 = specs[kept[0]].arrival_time
        offset = shift_end - t0 if k > 0 else 0.0
        for i in kept:
            out.append(dataclasses.replace(specs[i], arrival_time=specs[i].arrival_time + offset))
            stages.append(k)
        shift_end = out[-1].arrival_time + gap
    return out, np.asarray(stages)


def _workload_overrides(overrides: list[str]) -> tuple[list[str], dict[str, Any]]:
    rest, wl = [], {}
    for item in overrides:
        head = override_key(item)
        if head.startswith("workload."):
            key = head.removeprefix("workload.")
            if key not in WORKLOAD_KEYS:
                raise ConfigError(f"--set {item!r}: a replay takes workload.{{{', '.join(WORKLOAD_KEYS)}}} only (the "
                                  "rest of the workload is the run's own)")
            if "=" not in item:
                raise ConfigError(f"--set {item!r}: expected section.key=value")
            wl[key] = parse_value(item.split("=", 1)[1].strip())
        else:
            rest.append(item)
    return rest, wl


MAX_SEED = 2**64 - 1  # [simulation] seed's range


def replay_seed(overrides: list[str] | None) -> int | None:
    """``--set simulation.seed=N``, checked (None: not given): the seed of what a replay draws (a Prometheus
    scrape's lengths, arrivals rebuilt or redrawn by the run's loader or from --set workload.rate), so the
    command can read the run with it before ``prepare``."""
    seed = None
    for item in overrides or []:
        if override_key(item) != "simulation.seed":
            continue
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        v = parse_value(item.split("=", 1)[1].strip(), "--set simulation.seed")
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SEED:
            raise ConfigError(f"--set {item!r}: simulation.seed must be an integer from 0 to {MAX_SEED}, got {v!r}")
        seed = v
    return seed


def _check_replay_sets(rest: list[str], gpu: str | None, profile: str | None, draws: bool = False) -> None:
    """A --set the replay would not use is refused, not dropped: the run's requests are replayed to their
    end from their own seeds ([simulation]; only ``simulation.seed`` where the replay ``draws`` something),
    the comparison judges no SLO and prices nothing ([slo], [cost]). The card and the profile are --gpu /
    --profile: the front end's latencies are read from them before the --set is applied, so
    ``hardware.gpu`` / ``hardware.profile`` by --set would split the two."""
    for item in rest:
        key = override_key(item)
        section = key.split(".", 1)[0]
        if key == "simulation.seed" and draws:
            continue
        if section in ("simulation", "slo", "cost"):
            why = {"simulation": "the replay runs each request of the run to its end, arrivals from the run or "
                                 "from --set workload.rate" + ("; nothing in this one is drawn, so a seed changes "
                                                               "nothing" if key == "simulation.seed" else ""),
                   "slo": "the comparison judges no SLO", "cost": "the comparison prices nothing"}[section]
            raise ConfigError(f"--set {item!r}: not used by a replay ({why}); allowed: [model], [hardware], "
                              f"[engine], [frontend] keys and workload.{{{', '.join(WORKLOAD_KEYS)}}}")
        for flag, k in (("--gpu", "hardware.gpu"), ("--profile", "hardware.profile")):
            if key == k:
                given = gpu if flag == "--gpu" else profile
                both = f" (given too: {flag} {given!r})" if given is not None else ""
                raise ConfigError(f"--set {item!r}: a replay takes {k} from {flag}{both}; allowed: {flag} alone")


def _run_setting(exc: ServesimError, run: RealRun, rest: list[str]) -> ServesimError:
    """A config error about a setting the run file supplied (``[engine] max_num_seqs: ...`` from its metadata,
    not from --set) with the file's path in front, so the one line names where the value came from."""
    m = re.match(r"\[(\w+)\] (\w+)", str(exc))
    if m is None or str(run.settings_file or run.source) in str(exc):
        return exc
    sec, key = m.groups()
    from_run = (sec == "engine" and key in run.engine) or (sec == "hardware" and key in run.hardware) or \
        (sec == "model" and key == "dtype" and run.dtype is not None)
    if not from_run or any(override_key(o) == f"{sec}.{key}" for o in rest):
        return exc
    return type(exc)(f"{run.settings_file or run.source}: {exc} (the run's own setting; --set {sec}.{key}=... "
                     "replaces it)")


def _arrivals(wl: dict[str, Any], n: int, seed: int) -> np.ndarray:
    """``n`` send times redrawn from --set workload.rate / arrival / burstiness, each checked by name, the
    last inside the clock's range (sim/core/spec.py MAX_ARRIVAL_S)."""
    given = " ".join(f"workload.{k}={wl[k]!r}" for k in ("rate", "arrival", "burstiness") if k in wl)
    rate = wl["rate"]
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
        raise ConfigError(f"--set workload.rate={rate!r}: expected a number > 0 (requests/s; inf = all at once)")
    try:
        arr = ArrivalConfig(wl.get("arrival", "gamma" if "burstiness" in wl else "poisson"), float(rate),
                            wl.get("burstiness", 1.0))  # fmt: skip
        t = np.asarray(arr.sample(n, np.random.default_rng(seed)), float)
    except ConfigError as e:
        raise ConfigError(f"--set {given}: {e}") from None
    if n and not (np.isfinite(t).all() and t.max() <= MAX_ARRIVAL_S):
        raise ConfigError(f"--set workload.rate={rate!r}: {n} requests at that rate are sent until "
                          f"{float(np.nanmax(t)):g} s; expected at most {MAX_ARRIVAL_S:g} s (the clock's range): "
                          f"allowed workload.rate >= {n / MAX_ARRIVAL_S:g}")
    return t


def _check_client(mc: Any, timeout: Any) -> None:
    """max_concurrency: an integer >= 1 (requests in flight); client_timeout_s: a number > 0 (seconds)."""
    if mc is not None and (isinstance(mc, bool) or not isinstance(mc, int | float) or not mc >= 1
                           or not float(mc).is_integer()):  # fmt: skip
        raise ConfigError(f"--set workload.max_concurrency={mc!r}: expected an integer >= 1 (requests in flight)")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0):
        raise ConfigError(f"--set workload.client_timeout_s={timeout!r}: expected a number > 0 (seconds)")


def _fit_max_model_len(run: RealRun, specs: list[RequestSpec], max_len: int) -> list[RequestSpec]:
    """A request the run served has prompt + output <= its max_model_len; one longer than the replay's is cut
    to fit (prompt first, then output) and counted in a note, so it is served as it was, not rejected without
    a word. Recorded lengths: the replay's max_model_len is smaller than the run's (the note says how to give
    it), or, where it is at least the run's recorded one (whose prompts the loader checked), the recorded
    output counts run over that (one from re-tokenized text can); drawn lengths (a Prometheus scrape) may
    simply come out longer."""
    p = np.fromiter((s.prompt_len for s in specs), np.int64, len(specs))
    o = np.fromiter((s.output_len for s in specs), np.int64, len(specs))
    over = p + o > max_len
    if run.format == "inference-perf" and run.requests is not None and "ok" in run.requests:
        over &= run.requests["ok"].to_numpy(bool)[: len(specs)]  # a failed request may have been refused
    if not over.any():
        return specs
    from workloads.tracefmt.jsonl import clip_spec

    out = list(specs)
    for i in np.flatnonzero(over):
        out[i] = clip_spec(specs[i], max_len) or specs[i]  # token ids, hash ids and segments cut with the prompt
    if run.format == "prometheus":
        note = f"{int(over.sum())} drawn requests cut to fit max_model_len {max_len} (prompt first, then output)"
    else:
        i = int(np.flatnonzero(over)[0])
        head = f"{int(over.sum())} served requests longer than the replay's max_model_len {max_len} (the first: " \
               f"{specs[i].request_id}, {p[i]} + {o[i]} tokens) cut to fit; "
        own = run.engine.get("max_model_len")
        if isinstance(own, bool) or not isinstance(own, int) or own < 1:  # none, or vLLM's -1 (auto)
            note = head + "the run's own max_model_len was larger: give it with --set engine.max_model_len=N"
        elif own > max_len:
            note = head + f"the run's own max_model_len was {own}: give it with --set engine.max_model_len={own}"
        else:
            note = head + (f"the run recorded max_model_len {own}, where vLLM stops a request: the recorded "
                           "counts run over it (client-side counts, from another tokenizer or re-tokenized text, can)")
    if note not in run.notes:
        run.notes.append(note)
    return out


def _frontend_table(run: RealRun, profile: CalibrationProfile | None) -> dict[str, Any]:
    """[frontend]: the priors (or the profile's fitted values) for client-side runs; none for engine-side."""
    if run.basis != "client":
        return {"enabled": False}
    fitted = (profile.metadata or {}).get("frontend") if profile is not None else None
    return dict(fitted) if isinstance(fitted, dict) else {}


def prepare(run: RealRun, gpu: str | None = None, profile: str | None = None, overrides: list[str] | None = None,
            max_per_stage: int | None = None, seed: int = 0) -> Replay:  # fmt: skip
    """Everything resolved before the clock starts (bad input fails here, before any simulation)."""
    if max_per_stage is not None and (isinstance(max_per_stage, bool) or max_per_stage < 1):
        raise ConfigError(f"--max-per-stage: max_per_stage must be >= 1, got {max_per_stage}")
    rest, wl = _workload_overrides(list(overrides or []))
    _check_replay_sets(rest, gpu, profile, draws=run.seed is not None or "rate" in wl)
    if (given := replay_seed(rest)) is not None:  # the --set wins over the argument
        rest, seed = [o for o in rest if override_key(o) != "simulation.seed"], given
        if run.seed is not None and run.seed != seed:  # the loader drew with another: read it again with this one
            from workloads.runs import load_run

            run = load_run(run.source, run.format, seed)
    mc = wl.get("max_concurrency", run.max_concurrency)
    timeout = wl.get("client_timeout_s", run.client_timeout_s)
    _check_client(mc, timeout)
    named = any(override_key(o) == "model.name" for o in rest)  # --set model.name=... replaces it
    if not run.model and not named:
        raise ConfigError(f"{run.source}: the run does not name its model: give --set model.name=NAME")
    try:
        model = get_model(run.model).name if run.model else ""
    except ServesimError:
        if not named:
            raise ConfigError(f"{run.source}: model {run.model!r} is not in the catalogue; give --set model.name="
                              "NAME (a catalogue name or the path to its HF config.json)") from None
        model = run.model  # replaced by the --set below
    gpu_name = resolve_gpu(gpu or run.hardware.get("gpu"), str(run.source))
    if gpu and run.hardware.get("gpu"):  # --gpu is for a run that does not say (or names a card not catalogued)
        said = device_gpu(str(run.hardware["gpu"])) or gpu_name  # a partial match ('A100 ...' -> A100 80GB) may be wrong
        if said != gpu_name:
            raise ConfigError(f"--gpu {gpu}: {run.source} says it ran on {said}, and a replay is compared with the "
                              f"real run; allowed: leave --gpu out, or --gpu {said!r}")
    prof_obj = get_profile(get_gpu(gpu_name), profile) if profile and profile != "auto" else None
    engine = {"policy": "vllm", "async_scheduling": True, **run.engine}
    raw: dict[str, Any] = {
        "model": {"name": model, **({"dtype": run.dtype} if run.dtype else {})},
        "hardware": {"gpu": gpu_name, "tensor_parallel_size": run.hardware.get("tensor_parallel_size", 1),
                     "profile": profile or "auto"},
        "engine": engine,
        "simulation": {"seed": seed},
    }  # fmt: skip
    raw["frontend"] = _frontend_table(run, prof_obj)
    apply_overrides(raw, rest)
    try:
        cfg = config_from_dict(raw)
        setup = resolve(cfg)
    except ServesimError as e:
        raise _run_setting(e, run, rest) from None
    specs, stage_of = list(run.specs), run.stage_of
    if "rate" in wl or "arrival" in wl or "burstiness" in wl or run.arrivals == "unknown":
        if "rate" not in wl and run.arrivals != "unknown":  # the run has its times: arrival/burstiness alone
            k = "arrival" if "arrival" in wl else "burstiness"
            raise ConfigError(f"--set workload.{k}={wl[k]}: only with --set workload.rate=R (new arrivals drawn "
                              f"in place of the {run.format} run's recorded ones)")
        if "rate" not in wl:
            raise ConfigError(f"{run.source}: a {run.format} run records no arrival times: give the load with --set "
                              "workload.rate=R (requests/s; inf = all at once) [--set workload.arrival=poisson|"
                              "gamma|constant --set workload.burstiness=B]")
        t = _arrivals(wl, len(specs), seed)
        specs = [dataclasses.replace(s, arrival_time=float(ti)) for s, ti in zip(specs, t, strict=True)]
    specs = _fit_max_model_len(run, specs, int(setup.limits.max_model_len))
    warm_n = warmup_counts(run) if max_per_stage is not None else [0] * len(run.stages)
    if max_per_stage is not None:  # an overloaded stage has no steady state to reach: bound its warm-up
        warm_n = [min(w, 2 * max_per_stage) for w in warm_n]
    caps = None if max_per_stage is None else [max_per_stage + w for w in warm_n]
    specs, stage_of = cap_stages(specs, stage_of, run, caps)
    warmup: set[str] = set()
    for k, w in enumerate(warm_n):
        ids = [s.request_id for s, kk in zip(specs, stage_of, strict=True) if kk == k]
        if w and len(ids) > max_per_stage:  # a stage shorter than the cap is replayed whole, all counted
            warmup.update(ids[: len(ids) - max_per_stage])
    settings = {"model": cfg.model.name, "gpu": cfg.hardware.gpu, "profile": setup.meta.get("profile_source"),
                "profile_path": profile or "auto", "engine": {k: v for k, v in cfg.to_dict()["engine"].items()
                                                             if v is not None},
                "frontend": dataclasses.asdict(cfg.frontend) if cfg.frontend else None,
                "max_num_seqs": setup.limits.max_num_seqs, "max_num_batched_tokens": setup.limits.max_num_batched_tokens,
                "max_concurrency": mc, "client_timeout_s": timeout, "num_requests": len(specs),
                "max_per_stage": max_per_stage, "warmup_requests": len(warmup), "num_gpu_blocks": setup.limits.num_gpu_blocks}  # fmt: skip
    if "rate" in wl:  # the seed of the arrivals drawn here (a loader's draw names its seed in its notes)
        settings["seed"] = seed
    return Replay(run, cfg, setup, specs, {s.request_id: int(k) for s, k in zip(specs, stage_of, strict=True)}, warmup,
                  int(mc) if mc else None, float(timeout) if timeout else None, settings)


def with_profile(rep: Replay, profile: CalibrationProfile, frontend: FrontendConfig | None) -> Replay:
    """The same replay on another calibration profile and front end (what the fit varies)."""
    from sim.cost.costmodel import make_cost_model

    cfg = rep.cfg
    cost = make_cost_model(cfg.engine.cost_model, model=get_model(cfg.model.name), gpu=get_gpu(cfg.hardware.gpu),
                           dtype=cfg.model.dtype, kv_cache_dtype=cfg.engine.kv_cache_dtype,
                           tensor_parallel_size=cfg.hardware.tensor_parallel_size, profile=profile,
                           block_size=rep.setup.limits.block_size)  # fmt: skip
    return dataclasses.replace(rep, cfg=dataclasses.replace(cfg, frontend=frontend),
                               setup=dataclasses.replace(rep.setup, cost_model=cost))


def simulate_replay(rep: Replay, progress: bool = False) -> tuple[pd.DataFrame, SimResult]:
    """(per-request metrics in seconds on the run's basis, with ``stage`` and ``send``; the SimResult).
    ``progress``: a bar over the requests that arrived (sim/app/progress.py; the run is the same)."""
    t0 = time.perf_counter()
    env = simpy.Environment(initial_time=0.0)
    src = OpenSource(rep.specs) if rep.max_concurrency is None else \
        ConcurrencyLimitedSource(copy.copy(rep.specs), rep.max_concurrency)
    src, send = with_frontend(src, rep.cfg.frontend)
    rec = Recorder()
    eng = Engine(env, rep.setup.make_policy(), rep.setup.cost_model, src, rec,
                 async_scheduling=rep.setup.limits.async_scheduling, client_timeout_s=rep.client_timeout_s,
                 keep_requests=False)
    run_env(env, run_bar(rep.specs, "replay", progress), lambda: eng.num_submitted)
    res = apply_frontend(collect(rep.cfg, rep.setup, eng, src, rec, time.perf_counter() - t0), rep.cfg.frontend, send)
    # the replay compares on the real runs' bare names (seconds), as workloads/runs spells them
    df = request_metrics(res.requests).rename(columns={f"{m}_s": m for m in (
        "ttft", "tpot", "e2el", "queue_time", "ttft_engine", "e2el_engine", "ttft_client", "e2el_client")})
    df["stage"] = df["request_id"].map(rep.stage_of).astype(int)
    df["warmup"] = df["request_id"].isin(rep.warmup)
    df["send"] = df["send_time"] if "send_time" in df.columns else df["arrival_time"].astype(float)
    if rep.run.basis == "engine":
        df["ttft"], df["e2el"] = df["ttft_engine"], df["e2el_engine"]
        n_out = df["num_output_tokens"].astype(float)
        df["tpot"] = ((df["finish_time"] - df["first_token_time"]) / (n_out - 1)).where(
            (df["status"] == "finished") & (n_out > 1))
    elif rep.run.basis == "engine_aligned":  # engine times aligned to the client clock like the real ones
        lag0 = float((df["arrival_time"].astype(float) - df["send"]).min()) if len(df) else 0.0
        df["ttft"] = df["first_token_time"].astype(float) - lag0 - df["send"]
        df["e2el"] = (df["finish_time"].astype(float) - lag0 - df["send"]).where(df["status"] == "finished")
        n_out = df["num_output_tokens"].astype(float)
        df["tpot"] = ((df["finish_time"] - df["first_token_time"]) / (n_out - 1)).where(
            (df["status"] == "finished") & (n_out > 1))
    df["failed"] = df["status"].isin(("rejected", "timed_out"))
    if rep.client_timeout_s is not None:  # a client-side E2E past its deadline is a failure too
        late = (df["status"] == "finished") & (df["e2el"] > rep.client_timeout_s)
        df.loc[late, "failed"] = True
    df["ok"] = (df["status"] == "finished") & ~df["failed"]
    for c in ("ttft", "e2el", "tpot"):
        df.loc[~df["ok"], c] = math.nan
    return df, res
