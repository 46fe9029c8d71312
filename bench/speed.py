"""Speed benchmark (not a test): the Azure LLM inference 2023 conversation trace through the `vllm`
policy, Llama-3-8B on one A100-80GB, max_num_seqs 128. Prints wall seconds, requests/s and steps/s.

    .venv/bin/python bench/speed.py [--trace PATH] [--repeat N] [--profile]

Without ../shared, a generated trace with the same statistics is used (19,366 requests over ~1 h,
lognormal lengths matching mean input 1155 / output 211). Target: <= 3 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import csv
import gc
import time
from datetime import datetime
from pathlib import Path

_COLLECTING = gc.isenabled()
gc.disable()  # as the CLI loads its libraries (sim/cli/main.py): no collections that find nothing
import numpy as np  # noqa: E402
import simpy  # noqa: E402

from policies.base import make_policy  # noqa: E402
from sim.app.config import config_from_dict  # noqa: E402
from sim.app.heap import before_exit, paused  # noqa: E402
from sim.app.progress import run_env  # noqa: E402
from sim.app.setup import resolve  # noqa: E402
from sim.core.request import RequestSpec  # noqa: E402
from sim.engine.loop import Engine  # noqa: E402
from sim.engine.recorder import FRAME_COLUMNS, Recorder, StepTable  # noqa: E402
from sim.engine.sources import OpenSource  # noqa: E402

if _COLLECTING:
    gc.enable()

AZURE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def _ns(stamp: str) -> int:
    """Nanoseconds since 1970 of the trace's naive 'YYYY-MM-DD HH:MM:SS[.fffffff]' (7 digits in the Azure
    files: more than datetime keeps, so the fraction is read as digits)."""
    whole, _, frac = stamp.partition(".")
    d = datetime.fromisoformat(whole) - _EPOCH
    return (d.days * 86400 + d.seconds) * 10**9 + int((frac + "000000000")[:9])


_EPOCH = datetime(1970, 1, 1)


def azure_specs(path: Path) -> list[RequestSpec]:
    """The trace's requests, arrivals in seconds from the first. The project's reader is
    ``workloads.tracefmt.csvtraces.load_azure`` (bad rows, notes, both Azure years), which reads with pandas;
    this bench parses its one known file with the csv module instead, so that its process times the
    simulator and not pandas' and pyarrow's imports (~0.3 s)."""
    with open(path, newline="") as f:
        rows = csv.reader(f)
        head = next(rows)
        it, ip, io = (head.index(c) for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
        recs = [(_ns(r[it]), int(r[ip]), int(r[io])) for r in rows]
    t0 = recs[0][0] if recs else 0
    specs = []
    for i, (t, p, o) in enumerate(recs):
        whole, part = divmod(t - t0, 10**9)  # as pandas' total_seconds: whole seconds + the fraction
        specs.append(RequestSpec(request_id=f"r{i}", arrival_time=whole + part / 1e9, prompt_len=max(p, 1),
                                 output_len=max(o, 1)))
    return specs


def synthetic_specs(n: int = 19366, duration: float = 3520.0, seed: int = 0) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, duration, n))

    def ln(mean: float, cv: float, size: int) -> np.ndarray:
        s2 = np.log1p(cv**2)
        return np.maximum(1, rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), size)).astype(int)

    p, o = np.minimum(ln(1155, 1.0, n), 8000), np.minimum(ln(211, 0.9, n), 2000)
    return [RequestSpec(request_id=f"r{i}", arrival_time=float(a), prompt_len=int(b), output_len=int(c))
            for i, (a, b, c) in enumerate(zip(t, p, o, strict=True))]


def machine_probe() -> float:
    """Seconds for 10 M pure-Python additions: the same code on this kind of shared 2-core machine
    varies by a third from hour to hour, so results are printed with the machine's speed beside them."""
    t0 = time.perf_counter()
    s = 0
    for i in range(10_000_000):
        s += i
    return time.perf_counter() - t0


def bench_setup(async_scheduling: bool | None = None):
    """Llama-3-8B on one A100-80GB, the vllm policy with max_num_seqs 128 (the issue's configuration);
    ``async_scheduling``: vLLM's two-deep batch queue on or off (None: the preset's default)."""
    engine = {"policy": "vllm", "max_num_seqs": 128, "max_model_len": 8192}
    if async_scheduling is not None:
        engine["async_scheduling"] = async_scheduling
    return resolve(config_from_dict({
        "model": {"name": "Meta-Llama-3-8B"},
        "hardware": {"gpu": "A100-80GB-SXM"},
        "engine": engine,
    }))


def run_once(setup, specs: list[RequestSpec], profile: bool = False) -> tuple[float, float, int]:
    """One simulation from scratch: (wall seconds, simulated seconds, engine steps)."""
    t0 = time.perf_counter()
    if profile:
        import cProfile
        import pstats
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    env = simpy.Environment(initial_time=0.0)
    with paused():  # as simulate() builds the KV pool (sim/app/heap.py)
        policy = make_policy("vllm", setup.limits)
    rec = Recorder()
    Engine(env, policy, setup.cost_model, OpenSource(specs), rec, async_scheduling=setup.limits.async_scheduling)
    run_env(env)  # servesim's run loop (sim/app/progress.py): env.run() with the heap frozen
    steps = StepTable([rec]).columns(FRAME_COLUMNS)["step"]  # the step table's columns (a pandas frame of
    # them adds only the ~0.3 s pandas import, which a CLI run pays when it writes outputs)
    wall = time.perf_counter() - t0
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return wall, env.now, len(steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=AZURE)
    ap.add_argument("--repeat", type=int, default=3, help="runs to time (the best and the median are shown)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--async-scheduling", choices=("true", "false"), default=None,
                    help="vLLM's async scheduling on or off (default: the vllm preset's)")
    ap.add_argument("--no-probe", action="store_true",
                    help="skip the machine probes (bench/vs_vidur.py probes between the processes it times)")
    args = ap.parse_args()
    specs = azure_specs(args.trace) if args.trace.exists() else synthetic_specs()
    source_name = str(args.trace) if args.trace.exists() else "generated (Azure conv statistics)"
    setup = bench_setup(None if args.async_scheduling is None else args.async_scheduling == "true")
    walls, probes = [], [] if args.no_probe else [machine_probe()]
    for _ in range(1 if args.profile else max(args.repeat, 1)):
        wall, sim_s, steps = run_once(setup, specs, args.profile)
        walls.append(wall)
    if not args.no_probe:
        probes.append(machine_probe())
    best, median = min(walls), float(np.median(walls))
    print(f"trace: {source_name}: {len(specs)} requests, simulated {sim_s:.0f} s, {steps:,} steps")
    print("runs: " + ", ".join(f"{w:.2f}" for w in walls) + " s" + ("; machine probe (10 M additions) "
          + " / ".join(f"{p:.2f}" for p in probes) + " s before / after" if probes else ""))
    print(f"wall {best:.2f} s best, {median:.2f} s median; {len(specs) / best:,.0f} requests/s, "
          f"{steps / best:,.0f} steps/s")


if __name__ == "__main__":
    main()
    before_exit()  # as the CLI ends (sim/app/heap.py)
