"""The knee of the throughput curve over max_num_seqs: found where it is known (synthetic curves), on a
small simulated sweep whose KV pool caps the batch, and in `servesim size --goal knee` / `sweep`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.app.config import config_from_dict
from sim.app.knee import find_knee, gains_per_doubling, knee_candidates
from sim.app.sizing import size
from sim.core.errors import ConfigError
from tests.test_sweep import run_cli

POW2 = [2**k for k in range(11)]  # 1 .. 1024


def test_a_hard_ceiling_has_its_knee_at_the_ceiling():
    k = find_knee(POW2, [min(x, 32) for x in POW2], latency=POW2, memory=[min(x, 32) for x in POW2])
    assert k.max_num_seqs == 32 and k.gains[:5] == [1.0] * 5 and k.gains[5] == 0.0
    assert k.latency_growth == pytest.approx(1024 / 32 - 1) and k.memory_growth == 0.0
    assert "latency +3100%" in k.reason


@pytest.mark.parametrize("gain, knee", [(0.1, 256), (0.25, 64), (0.5, 32)])
def test_a_saturating_curve_has_its_knee_where_the_gain_per_doubling_falls_below_the_threshold(gain, knee):
    # T(x) = x / (1 + x/32): T(2x)/T(x) - 1 = 1 / (1 + x/16), below `gain` once x > 16 (1/gain - 1)
    tp = [x / (1 + x / 32) for x in POW2]
    g = gains_per_doubling(POW2, tp)
    assert g == pytest.approx([1 / (1 + x / 16) for x in POW2[:-1]])
    assert find_knee(POW2, tp, gain=gain).max_num_seqs == knee


def test_uneven_settings_noise_order_and_no_knee():
    x = [10, 20, 40, 80]
    assert gains_per_doubling(x, np.sqrt(x)) == pytest.approx([np.sqrt(2) - 1] * 3)
    assert find_knee(x, np.sqrt(x), gain=0.1).max_num_seqs is None  # +41% per doubling to the end
    assert find_knee(x[::-1], np.sqrt(x[::-1]), gain=0.5).max_num_seqs == 10  # any order
    bump = [1, 1.02, 1.5, 1.51, 1.52]  # flat, then a late jump: the knee is after the jump
    assert find_knee([1, 2, 4, 8, 16], bump).max_num_seqs == 4
    flat = find_knee([1, 2, 4], [5, 5, 5], latency=[1, 1, 1], memory=[0.5, 0.5, 0.5])
    assert flat.max_num_seqs == 1 and "no longer binds" in flat.reason
    assert knee_candidates(100) == [1, 2, 4, 8, 16, 32, 64]
    for bad in (0, 1.0, -0.1, True):
        with pytest.raises(ConfigError, match="--knee-gain"):
            find_knee([1, 2], [1, 2], gain=bad)
    with pytest.raises(ConfigError, match="distinct"):
        find_knee([2, 2], [1, 2])


# Constant 20 ms steps; 64 + 20 tokens = 6 blocks a request and 48 blocks: at most 8 requests run at once.
RAW = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "A100 40GB"},
    "engine": {"max_model_len": 512, "cost_model": "constant", "constant_step_s": 0.02,
               "num_gpu_blocks_override": 48, "enable_prefix_caching": False,
               "async_scheduling": False},  # the knee's reason as the synchronous loop frees blocks
    "workload": {"rate": 1.0, "num_requests": 64, "prompt": {"dist": "fixed", "value": 64},
                 "output": {"dist": "fixed", "value": 20}},
}  # fmt: skip


def test_size_goal_knee_finds_the_kv_ceiling_of_a_simulated_sweep(tmp_path):
    res = size(config_from_dict(RAW), goal="knee", max_num_seqs=[1, 2, 4, 8, 16, 32], replications=1)
    (k,) = res.knees
    assert k.max_num_seqs == 8, k
    tp = dict(zip(k.settings, k.throughput, strict=True))
    assert tp[8] / tp[4] > 1.5 and tp[32] / tp[8] < 1.1  # linear to the ceiling, flat past it
    assert "no longer binds" in k.reason  # the KV pool, not max_num_seqs, holds the batch past 8
    tab = res.table()
    assert tab.loc[tab["knee"], "engine.max_num_seqs"].tolist() == [8] and tab["recommended"].sum() == 1
    assert "knee: max_num_seqs=8" in res.format()
    d = json.loads(json.dumps(res.to_dict()))
    assert d["knees"][0]["max_num_seqs"] == 8 and d["knee_gain"] == 0.1
    res.figure().write_html(tmp_path / "knee.html")
    assert (tmp_path / "knee.html").stat().st_size > 1000


def test_cli_size_knee_and_sweep_knee_column(tmp_path, capsys):
    path = tmp_path / "c.toml"
    lines = ['[model]\nname = "seed-7b"\ndtype = "fp16"\n[hardware]\ngpu = "A100 40GB"\n[engine]\n',
             'max_model_len = 512\ncost_model = "constant"\nconstant_step_s = 0.02\nnum_gpu_blocks_override = 48\n',
             'enable_prefix_caching = false\n[workload]\nrate = 1000.0\nnum_requests = 64\n',
             'prompt = { dist = "fixed", value = 64 }\noutput = { dist = "fixed", value = 20 }\n']  # fmt: skip
    path.write_text("".join(lines))
    out = tmp_path / "k"
    assert run_cli(["size", str(path), "--goal", "knee", "--max-num-seqs", "2,4,8,16", "--replications", "1",
                    "--jobs", "1", "--json", "--out", str(out)]) == 0  # fmt: skip
    d = json.loads(capsys.readouterr().out)
    assert d["recommendation"]["settings"]["engine.max_num_seqs"] == 8 and (out / "size.html").is_file()
    assert run_cli(["size", str(path), "--goal", "knee", "--knee-gain", "2"]) == 2
    assert "--knee-gain" in capsys.readouterr().err
    assert run_cli(["sweep", str(path), "--grid", "engine.max_num_seqs=2,4,8,16", "--out", str(tmp_path / "s.csv"),
                    "--jobs", "1", "--no-progress", "--json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    assert [r["engine.max_num_seqs"] for r in rows if r["knee"]] == [8]
