"""Scale (not a test): wall time, peak RSS and steps/s of one engine at 10k / 100k / 1M requests, with and
without ``--out``, each run its own ``servesim run`` process measured by ``/usr/bin/time``-style rusage.

    .venv/bin/python bench/scale.py [--sizes 10000,100000] [--rate 2.0] [--no-out | --out-only] [--horizon S]
                                    [--tree DIR ...]

The config is examples/quickstart.toml (Mistral-7B on an RTX 4090, Poisson at ``--rate`` req/s, a load it
sustains) with ``num_requests`` set; ``--horizon`` cuts every run at that many simulated seconds (the lazy
workload then generates only what arrives). Runs alternate without / with ``--out`` at each size, and a
machine probe is printed before and after: this machine's speed drifts, compare ratios within one run.
``--tree DIR`` (repeatable) runs every size in each of those checkouts too (e.g. ``git archive REV``
unpacked somewhere), alternating with this one, so two versions are compared in one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from speed import machine_probe  # noqa: E402


def one(n: int, rate: float, out: str | None, horizon: float | None, repo: Path = REPO) -> dict:
    """One ``servesim run`` of the tree at ``repo`` in a child process: its wall time, peak RSS and steps."""
    argv = [sys.executable, "-m", "sim.cli.main", "run", str(repo / "examples" / "quickstart.toml"),
            "--set", f"workload.num_requests={n}", "--set", f"workload.rate={rate}", "--json"]  # fmt: skip
    if horizon is not None:
        argv += ["--set", f"simulation.horizon={horizon}"]
    if out is not None:
        argv += ["--out", out]
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=repo, stdout=so, stderr=se, env={**os.environ, "PYTHONPATH": str(repo)})
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (peak RSS), not all children's
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if proc.returncode != 0:
        raise SystemExit(f"servesim run failed ({proc.returncode}): {stderr.strip()[-500:]}")
    summary = json.loads(stdout[stdout.index("{"):])
    steps = summary.get("num_steps")
    return {"n": n, "out": out is not None, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024, "steps": steps,
            "finished": summary["num_finished"], "duration_s": summary["duration"]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated request counts (1000000 takes long)")
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--horizon", type=float, default=None)
    ap.add_argument("--no-out", action="store_true", help="skip the --out runs")
    ap.add_argument("--out-only", action="store_true", help="only the --out runs (a 1M-request run is minutes)")
    ap.add_argument("--tree", action="append", default=[], help="another checkout to run too, alternating")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    trees = [REPO, *(Path(t).resolve() for t in args.tree)]
    print(f"machine probe (10 M additions): {machine_probe():.2f} s")
    rows = []
    for n in sizes:
        for with_out in [False] if args.no_out else [True] if args.out_only else [False, True]:
            for tree in trees:
                with tempfile.TemporaryDirectory() as d:
                    r = one(n, args.rate, d if with_out else None, args.horizon, tree)
                r["tree"] = tree
                rows.append(r)
                name = "" if len(trees) == 1 else f"{tree.name:>12s}  "
                print(f"{name}{n:>9,} req  out={'yes' if with_out else 'no ':3s}  wall {r['wall_s']:7.1f} s  "
                      f"cpu {r['cpu_s']:7.1f} s  peak RSS {r['peak_rss_mb']:7.0f} MB  {r['n'] / r['wall_s']:8,.0f} "
                      f"req/s  {r['finished']:,} finished", flush=True)
    print(f"machine probe (10 M additions): {machine_probe():.2f} s")
    for tree in trees:
        for n in sizes:
            pair = [r for r in rows if r["n"] == n and r["tree"] == tree]
            if len(pair) == 2:
                print(f"{'' if len(trees) == 1 else tree.name + ': '}{n:>9,} req: --out costs "
                      f"x{pair[1]['wall_s'] / pair[0]['wall_s']:.2f} wall, "
                      f"x{pair[1]['peak_rss_mb'] / pair[0]['peak_rss_mb']:.2f} peak RSS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
