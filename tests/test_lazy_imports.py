"""The run path loads no result-table libraries: resolving a config and running the engine (what
bench/speed.py times per process, and what a sweep worker does before it asks for frames) must not import
pandas, which loads pyarrow (~0.3 s of a process's start, ~90 MB), nor scipy. A frame, when asked for,
imports pandas then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RUN_PATH = """
import sys
sys.path.insert(0, {bench!r})
import simpy
from policies.base import make_policy
from sim.app.config import config_from_dict
from sim.app.setup import resolve
from sim.core.request import RequestSpec
from sim.engine.loop import Engine
from sim.engine.recorder import FRAME_COLUMNS, Recorder, StepTable
from sim.engine.sources import OpenSource
import speed
setup = resolve(config_from_dict({{"model": {{"name": "Meta-Llama-3-8B"}}, "hardware": {{"gpu": "A100-80GB-SXM"}}}}))
specs = [RequestSpec(request_id=f"r{{i}}", arrival_time=0.1 * i, prompt_len=100, output_len=20) for i in range(50)]
env = simpy.Environment()
rec = Recorder()
engine = Engine(env, make_policy("vllm", setup.limits), setup.cost_model, OpenSource(specs), rec)
env.run()
n = len(StepTable([rec]).columns(FRAME_COLUMNS)["step"])
heavy = sorted(m for m in ("pandas", "pyarrow", "scipy") if m in sys.modules)
rec.steps_frame()
print(n, ",".join(heavy) or "-", "pandas" in sys.modules)
"""


def test_resolving_and_running_load_no_pandas() -> None:
    out = subprocess.run([sys.executable, "-c", RUN_PATH.format(bench=str(REPO / "bench"))], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split()
    steps, heavy, later = int(out[0]), out[1], out[2]
    assert steps > 20  # the run happened
    assert heavy == "-", f"the run path imported {heavy}"
    assert later == "True"  # the frame still works, importing pandas when asked


CLI_RUN = """
import sys
sys.argv = ["servesim", "run", "examples/quickstart.toml", "--set", "workload.num_requests=5", "--set",
            "workload.num_requests=5", "--vllm-args", "--max-num-seqs 8"]
from sim.cli.main import main
main()
print(",".join(sorted(m for m in ("scipy", "multiprocessing", "ray") if m in sys.modules)) or "-", file=sys.stderr)
"""


def test_a_cli_run_with_set_loads_no_scipy() -> None:
    """``servesim run --set`` checks the --set list for repeats (sim/app/values.py): that check once lived in
    sim/app/sweep.py, whose import brought scipy and a process pool into every run (~0.4 s and ~60 MB of a
    process's start, session 27)."""
    err = subprocess.run([sys.executable, "-c", CLI_RUN], cwd=REPO, capture_output=True, text=True,
                         check=True).stderr.strip().splitlines()
    assert err[-1] == "-", f"servesim run --set imported {err[-1]}"
