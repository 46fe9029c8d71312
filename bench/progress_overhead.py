"""Does the progress bar cost anything? One 20,000-request run (Llama-3.1-8B on an H100, roofline) with and
without the bar driven by sim/app/progress.run_env, twice each: wall time, and the same end time and finish
times (the bar only reads a counter between SimPy steps).

    PYTHONPATH=. python bench/progress_overhead.py 2>/dev/null
"""

from __future__ import annotations

import sys
import time

from sim.app.config import config_from_dict
from sim.app.simulate import simulate

CFG = config_from_dict({
    "model": {"name": "Llama-3.1-8B"}, "hardware": {"gpu": "H100 SXM"}, "engine": {"max_model_len": 8192},
    "workload": {"rate": 20.0, "num_requests": 20000,
                 "prompt": {"dist": "lognormal", "mean": 800, "std": 400, "max": 4000},
                 "output": {"dist": "lognormal", "mean": 200, "std": 100, "max": 1000}},
})  # fmt: skip

if __name__ == "__main__":
    for _ in range(2):
        for progress in (False, True):
            t0 = time.perf_counter()
            r = simulate(CFG, progress=progress)
            print(f"progress={progress!s:5} wall {time.perf_counter() - t0:.2f} s  end {r.meta['end_time']:.3f} s  "
                  f"sum of finish times {r.requests['finish_time'].sum():.6f}", file=sys.__stdout__)
