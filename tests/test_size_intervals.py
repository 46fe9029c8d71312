"""`size --intervals`: percentile SLOs judged on the prediction interval of the real value (replication
spread plus the profile's calibration residuals, sim/app/intervals.py) instead of the simulated value's
t-bound; a simulator known to under-predict the tail then sizes more conservatively."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from sim.app.sizing import judge, size
from sim.cli.main import main
from tests.test_sizing import SLO, base


def _rows(vals):
    return pd.DataFrame({"slo_p99_ttft_ms": vals, "saturated": [False] * len(vals)})


def test_residuals_move_the_bound():
    vals = [800.0, 820.0, 810.0]  # ms
    plain = judge(_rows(vals), {"p99_ttft_ms": 1000})
    assert plain.passed
    # the simulator under-predicts this tail by ~30 % (ln(sim/real) ≈ -0.36): the real P99 is ~1.15 s
    under = judge(_rows(vals), {"p99_ttft_ms": 1000}, calibration=lambda key: [-0.40, -0.33, -0.36, -0.35])
    assert not under.passed and under.checks["p99_ttft_ms"]["bound"] > 1100
    # one that over-predicts lets the same runs pass with room to spare
    over = judge(_rows(vals), {"p99_ttft_ms": 1000}, calibration=lambda key: [0.20, 0.22, 0.18, 0.21])
    assert over.passed and over.checks["p99_ttft_ms"]["bound"] < plain.checks["p99_ttft_ms"]["bound"]


def test_size_with_calibration_is_more_conservative_when_the_tail_is_under_predicted():
    cfg = base()
    plain = size(cfg, SLO, max_num_seqs=[8], replications=3, jobs=1)
    cal = size(cfg, SLO, max_num_seqs=[8], replications=3, jobs=1, calibration=lambda key: [-0.5, -0.45, -0.55])
    assert 0 < cal.candidates[0].capacity < plain.candidates[0].capacity


def _profile_with_residuals(tmp_path, residuals):
    from sim.cost.hardware import get_gpu
    from sim.cost.profiles import get_profile

    prof = get_profile(get_gpu("H100 SXM"))
    path = tmp_path / "fitted.json"
    prof.save(path) if hasattr(prof, "save") else path.write_text(json.dumps(prof.to_dict()))
    raw = json.loads(path.read_text())
    raw.setdefault("metadata", {})["calibration"] = {"residuals_log": residuals}
    path.write_text(json.dumps(raw))
    return path


def test_cli_needs_a_profile_with_residuals(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nname = "Llama-3.1-8B"\n[hardware]\ngpu = "H100 SXM"\n[workload]\nrate = 2.0\n'
                   'num_requests = 30\nprompt = 200\noutput = 20\n[slo]\np99_ttft_ms = 1000\n')
    assert main(["size", str(cfg), "--intervals", "--max-num-seqs", "8"]) == 2
    err = capsys.readouterr().err
    assert "--intervals" in err and "residuals" in err and len(err.strip().splitlines()) == 1
    prof = _profile_with_residuals(tmp_path, {"ttft_p99_ms": [-0.1, -0.12, -0.08]})
    rc = main(["size", str(cfg), "--intervals", "--max-num-seqs", "8", "--replications", "2", "--jobs", "1",
               "--set", f'hardware.profile="{prof}"', "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rec = json.loads(out)["recommendation"]
    assert math.isfinite(rec["slo_checks"]["p99_ttft_ms"]["bound"])


@pytest.mark.parametrize("key", ["p99_ttft_ms", "p90_tpot_ms", "p50_e2el_ms"])
def test_percentile_keys_find_their_residuals(key):
    from sim.app.intervals import calibration_residuals
    from sim.cost.profiles import CalibrationProfile

    stat, fam = key.split("_")[:2]
    prof = CalibrationProfile.__new__(CalibrationProfile)
    object.__setattr__(prof, "metadata", {"calibration": {"residuals_log": {f"{fam}_{stat}_ms": [0.1, 0.2, 0.3]}}})
    assert list(calibration_residuals(prof, key)) == [0.1, 0.2, 0.3]
