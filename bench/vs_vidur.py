"""servesim against Vidur side by side (not a test): alternating pairs of processes on the same request list.

    .venv/bin/python bench/vs_vidur.py [--pairs 3]

Each pair times one ``bench/speed.py --repeat 1 --no-probe`` process (Python's start, imports, reading the
Azure conversation trace, the simulation and its step table) and one Vidur process on the same trace
(``../shared/tools/vidur-peer/run.sh``: Vidur at microsoft/vidur 7d47513, its linear-regression predictor
from a warm cache), each as its own wall time and peak RSS, with a machine probe before every pair: this
machine's speed drifts by a third from hour to hour, so only ratios within a pair are compared. Issue 12
asks for servesim's process at <= 1/20 of Vidur's. Without ``../shared`` (or before ``run.sh prepare``)
it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEER = REPO.parent / "shared" / "tools" / "vidur-peer" / "run.sh"
sys.path.insert(0, str(REPO / "bench"))
from speed import machine_probe  # noqa: E402


def timed(argv: list[str], cwd: Path) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stdout + stderr) of one child process, from its own rusage."""
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[:3])} failed: {text.strip()[-400:]}")
    return wall, usage.ru_maxrss / 1024, text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="alternating pairs to time (each ~1 min)")
    args = ap.parse_args(argv)
    if not PEER.exists():
        print(f"vs_vidur: {PEER} not found (needs ../shared): nothing to compare")
        return 0
    prep = subprocess.run(["bash", str(PEER), "azure"], cwd=REPO, capture_output=True, text=True)
    if prep.returncode != 0:
        print(f"vs_vidur: Vidur is not set up ({prep.stderr.strip()}); run: bash {PEER} prepare")
        return 0
    trace = prep.stdout.strip().splitlines()[-1]
    ratios = []
    for i in range(1, args.pairs + 1):
        probe = machine_probe()
        s_wall, s_rss, s_out = timed([sys.executable, "bench/speed.py", "--repeat", "1", "--no-probe"], REPO)
        with tempfile.TemporaryDirectory(prefix="vidur-out-") as d:
            v_wall, v_rss, _ = timed(["bash", str(PEER), "run", trace, d], REPO)
        sim_s = re.search(r"runs: ([\d.]+) s", s_out)
        ratios.append(v_wall / s_wall)
        print(f"pair {i}: machine probe {probe:.2f} s | servesim process {s_wall:.2f} s "
              f"(simulation {sim_s.group(1) if sim_s else '?'} s), {s_rss:.0f} MB | Vidur process {v_wall:.1f} s, "
              f"{v_rss:.0f} MB | Vidur / servesim x{ratios[-1]:.1f}", flush=True)
    print(f"machine probe {machine_probe():.2f} s; Vidur / servesim per process: "
          f"x{min(ratios):.1f} .. x{max(ratios):.1f} over {len(ratios)} pairs (issue 12 target: x20)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
