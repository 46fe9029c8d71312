"""The hostile corpus, eighth round (fuzz8, 2026-12-06): real-run files that ended in a traceback. Each
is now one line and exit 2 before any engine runs; an unwritable stdout is one line and exit 1."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bad_inputs import run_bad_case
from tests.test_bad_inputs_runs import _ej, _ip

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "runs"
HUGE = "1" + "0" * 400  # a JSON / Prometheus integer past any float


def _prom(t: Path, old: str, new: str) -> str:
    d = t / "prom"
    shutil.copytree(RUNS / "prometheus", d)
    after = d / "metrics_after.prom"
    text = after.read_text()
    assert old in text
    after.write_text(text.replace(old, new, 1))
    return str(d)


def _prom_sum(t: Path) -> str:
    """The scrapes with the first histogram sum written as an integer of 401 digits."""
    d = Path(_prom(t, "", ""))
    after = d / "metrics_after.prom"
    after.write_text(re.sub(r"(_seconds_sum\{[^}]*\}) \S+", rf"\1 {HUGE}", after.read_text(), count=1))
    return str(d)


def _bench(t: Path) -> str:
    text = (RUNS / "vllm_bench_result.json").read_text()
    data = json.loads(text)
    data["median_itl_ms"] = 0  # a placeholder, replaced by the integer json cannot hold as a float
    (t / "b.json").write_text(json.dumps(data).replace('"median_itl_ms": 0', f'"median_itl_ms": {HUGE}'))
    return str(t / "b.json")


def _ip_empty(t: Path) -> str:
    d = _ip(t)
    (Path(d) / "results" / "per_request_lifecycle_metrics.json").write_text("[]")
    return d


PROM = ["--gpu", "RTX 4090", "--set", "engine.max_model_len=8192", "--set", "workload.rate=5"]
CASES = [
    ("prometheus-le-nan", lambda t: ["compare", _prom(t, 'le="2.5"', 'le="NaN"'), *PROM], ["le='NaN'", "not a bound"]),
    ("prometheus-huge-value", lambda t: ["compare", _prom_sum(t), *PROM], ["metrics_after.prom", "int too large"]),
    ("bench-huge-aggregate", lambda t: ["compare", _bench(t)], ["median_itl_ms", "finite number"]),
    ("engine-jsonl-huge-time", lambda t: ["compare", _ej(t, row0={"arrival_time": int(HUGE)}), "--set",
                                          "engine.max_model_len=8192"], ["arrival_time", "finite number"]),
    ("inference-perf-no-records", lambda t: ["compare", _ip_empty(t), "--gpu", "RTX 4090", "--set",
                                             "model.name=Llama-2-7B", "--set", "engine.max_model_len=4096"],
     ["per_request_lifecycle_metrics.json", "no request records"]),
]


@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_round8_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_stdout_on_a_full_device_is_one_line():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "sim.cli.main", "models"], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, timeout=120)  # fmt: skip
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert lines[-1] == "servesim: error: cannot write the output (No space left on device)", done.stderr
