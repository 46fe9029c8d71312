"""Which card, how many, at what cost: the card search against brute force on a small grid, instances
sharing a card, the ranked answer's forms, and its bad inputs (each one line, before any simulation)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from sim.app.card_search import closed_loop, deployments, run_shared_card, search_cards
from sim.app.config import config_from_dict
from sim.app.prices import gpu_hour_price
from sim.app.replicate import run_one
from sim.app.sizing import judge
from sim.core.errors import ConfigError
from tests.test_sweep import run_cli

SLO = {"p99_ttft_ms": 500, "p99_tpot_ms": 30}
RAW = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "A100 40GB"},
    "engine": {"max_model_len": 2048},
    "workload": {"kind": "closed", "num_clients": 4, "num_requests": 48,
                 "prompt": {"dist": "uniform", "low": 1200, "high": 1600},
                 "output": {"dist": "uniform", "low": 100, "high": 200}},
    "slo": SLO,
}  # fmt: skip
GPUS, DTYPES, TARGET = ["RTX 4090", "A100 40GB"], ["fp16", "int8"], 12


def brute_capacity(gpu: str, dtype: str, top: int = 24) -> int:
    """Every client count from 1 up: the largest n such that 1..n all meet the SLOs (one seed)."""
    cap = 0
    for n in range(1, top + 1):
        raw = {**RAW, "hardware": {"gpu": gpu}, "model": {"name": "seed-7b", "dtype": dtype},
               "engine": {**RAW["engine"], "max_num_seqs": 64}, "workload": {**RAW["workload"], "num_clients": n}}  # fmt: skip
        if not judge(pd.DataFrame([run_one(config_from_dict(raw), 0)]), SLO).passed:
            break
        cap = n
    return cap


def test_the_search_agrees_with_brute_force_on_a_small_grid():
    res = search_cards(config_from_dict(RAW), gpus=GPUS, dtypes=DTYPES, target_concurrency=TARGET,
                       max_num_seqs=[64], replications=1, jobs=1)  # fmt: skip
    tab = res.table().set_index(["gpu", "dtype"])
    costs = {}
    for gpu in GPUS:
        for dt in DTYPES:
            name = gpu_hour_price(None, gpu).gpu
            cap = brute_capacity(gpu, dt)
            row = tab.loc[(name, dt)]
            assert row["capacity_clients"] == cap, (gpu, dt)  # bisection on clients finds the same edge
            units = math.ceil(TARGET / cap)
            assert row["gpus"] == units and row["cost_per_hour"] == pytest.approx(units * row["price_per_gpu_hour"])
            costs[(name, dt)] = units * row["price_per_gpu_hour"]
    best = min(costs, key=costs.get)
    assert (res.best["gpu"], res.best["dtype"]) == best  # the cheapest by brute force ranks first
    assert res.table()["cost_per_hour"].is_monotonic_increasing
    assert res.best["meets_slo_at_target"] and res.best["slo_margin_at_target"] > 0  # checked at 12 / units
    assert res.num_simulations < 4 * 24  # fewer runs than the brute force's


def test_memory_and_kernel_decide_what_fits_and_instances_share_one_card(tmp_path):
    cfg = config_from_dict({**RAW, "engine": {**RAW["engine"], "max_model_len": 4096}})
    deps = deployments(cfg, ["T4", "RTX 4090"], ["fp16", "fp8", "int8"], None, None, [1, 2])
    assert len(deps) == 12
    res = search_cards(cfg, gpus=["T4", "RTX 4090"], dtypes=["fp16", "fp8", "int8"], instances=[1, 2],
                       target_concurrency=4, max_num_seqs=[16], replications=1, jobs=1)  # fmt: skip
    by = {r.deployment.label: r for r in res.results}
    assert not by["T4 fp16"].fits and "max_model_len 4096" in by["T4 fp16"].reason  # 0.07 GiB of KV left
    assert not by["T4 fp8"].fits and "compute capability" in by["T4 fp8"].reason  # no FP8 path on Turing
    assert by["T4 int8"].fits and by["T4 int8"].kernel == "int8-w8a8"
    assert not by["RTX 4090 fp16, 2 per card"].fits  # 0.45 of 24 GB cannot hold 14 GB of weights
    two = by["RTX 4090 int8, 2 per card"]
    assert two.fits and two.kv_tokens < by["RTX 4090 int8"].kv_tokens  # half the memory each
    tab = res.table()
    assert tab["rank"].notna().sum() >= 2 and tab.loc[tab["rank"].isna(), "reason"].notna().all()
    res.figure().write_html(tmp_path / "cards.html")
    d = json.loads(json.dumps(res.to_dict()))
    assert d["best"]["deployment"] == tab.iloc[0]["deployment"] and d["currency"] == "USD"
    # two instances on one card: one cluster run, the card priced once
    row = run_shared_card(closed_loop(config_from_dict({**RAW, "model": {"name": "seed-7b", "dtype": "int8"},
                                                        "hardware": {"gpu": "RTX 4090"},
                                                        "engine": {"max_model_len": 2048,
                                                                   "gpu_memory_utilization": 0.45}}), 4),
                          0, SLO, instances=2)  # fmt: skip
    assert row["num_finished"] == 48 and row["cost_per_hour"] == pytest.approx(gpu_hour_price(None, "RTX 4090").per_hour)


def test_target_rate_on_an_open_loop_and_bad_inputs():
    open_raw = {**RAW, "workload": {"rate": 1.0, "num_requests": 30, "prompt": {"dist": "fixed", "value": 256},
                                    "output": {"dist": "fixed", "value": 32}}}  # fmt: skip
    res = search_cards(config_from_dict(open_raw), gpus=["H100"], target_rate=20.0, max_num_seqs=[32],
                       replications=1, jobs=1, goal="throughput")  # fmt: skip
    b = res.best
    assert b["gpus"] == math.ceil(20.0 / b["capacity_req/s"]) and b["cost_per_1m_output_at_capacity"] > 0
    cfg = config_from_dict(RAW)
    bad = [
        (dict(gpus=["H100"]), "give one target"),
        (dict(gpus=["H100"], target_rate=1.0, target_concurrency=2), "give one target"),
        (dict(gpus=["H100"], target_rate=1.0), "closed loop: give --target-concurrency"),
        (dict(gpus=["H100"], target_concurrency=0), "--target-concurrency: expected an integer >= 1"),
        (dict(gpus=["H99"], target_concurrency=2), "unknown GPU 'H99'"),
        (dict(gpus=["H100"], dtypes=["fp4x"], target_concurrency=2), "unknown dtype 'fp4x'"),
        (dict(gpus=["H100"], kv_dtypes=["int3"], target_concurrency=2), "unknown kv_cache_dtype 'int3'"),
        (dict(gpus=["H100"], tps=[0], target_concurrency=2), "--tp: expected integers from 1 to 8"),
        (dict(gpus=["H100"], instances=[9], target_concurrency=2), "--instances-per-gpu: expected integers"),
        (dict(gpus=["H100", "h100"], target_concurrency=2), "'H100' and 'h100' are the same card"),
        (dict(gpus=["MI300X"], target_concurrency=2), "no price for MI300X"),
        (dict(gpus=["H100"], target_concurrency=2, goal="knee"), "--target-concurrency sizes clients"),
    ]
    for kw, match in bad:
        with pytest.raises(ConfigError, match=match):
            search_cards(cfg, replications=1, **kw)
    with pytest.raises(ConfigError, match="--target-concurrency needs synthetic lengths"):
        closed_loop(config_from_dict({**RAW, "workload": {"kind": "sessions", "rate": 1.0}}), 4)


def test_cli_card_search_one_line_errors_and_json(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nname = "seed-7b"\ndtype = "fp16"\n[hardware]\ngpu = "A100 40GB"\n[engine]\n'
                    'max_model_len = 2048\n[workload]\nrate = 1.0\nnum_requests = 30\n'
                    'prompt = { dist = "fixed", value = 256 }\noutput = { dist = "fixed", value = 32 }\n'
                    '[slo]\np99_ttft_ms = 1000\np99_tpot_ms = 50\n')  # fmt: skip
    argv = ["size", str(path), "--gpus", "A100 40GB,H100", "--target-rate", "4", "--max-num-seqs", "32",
            "--replications", "1", "--jobs", "1"]  # fmt: skip
    assert run_cli([*argv, "--json", "--gpu-hour", "H100=0.01", "--out", str(tmp_path / "o")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["gpu"] == "H100 SXM" and d["best"]["price_per_gpu_hour"] == 0.01  # the CLI price wins
    assert (tmp_path / "o" / "cards.html").is_file() and (tmp_path / "o" / "cards.csv").is_file()
    for extra, match in ((["--gpu-hour-usd", "-2"], "--gpu-hour-usd"), (["--goal", "knee"], "--goal knee"),
                         (["--instances-per-gpu", "9"], "--instances-per-gpu")):  # fmt: skip
        code = run_cli([*argv, *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and match in err[0], err
    assert run_cli(["size", str(path), "--target-rate", "4"]) == 2
    assert "need --gpus" in capsys.readouterr().err
