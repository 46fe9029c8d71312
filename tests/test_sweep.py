"""Sweeps: grid parsing and validation, local process pool with progress, Ray, Parquet, the CLI."""

from __future__ import annotations

import argparse
import io
import json
import math

import pandas as pd
import pytest

from sim.app.config import config_from_dict
from sim.app.sweep import aggregate, expand_grid, parse_grid, run_sweep, split_values
from sim.core.errors import ConfigError, ServesimError

RAW = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "24GB"},
    "engine": {"max_model_len": 4096, "overhead_gib": 1.5, "cost_model": "constant", "constant_step_s": 0.02},
    "workload": {"rate": 2.0, "num_requests": 60, "prompt": {"dist": "uniform", "low": 50, "high": 300},
                 "output": {"dist": "uniform", "low": 10, "high": 60}},
}  # fmt: skip
GRID = ["engine.max_num_seqs=2,8", "workload.rate=1,4"]
METRICS = ["request_throughput", "p99_ttft_ms", "mean_tpot_ms", "saturated"]


def base():
    return config_from_dict(RAW)


def run_cli(argv: list[str]) -> int:
    """The real `servesim` entry point when sweep/size are registered there, else the same wiring."""
    from sim.cli import main as cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if argv[0] in sub.choices:
        return cli.main(argv)
    from sim.cli import size as cli_size
    from sim.cli import sweep as cli_sweep

    cli_size.add_parser(sub)
    cli_sweep.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ServesimError as exc:
        print(f"servesim: error: {exc}", file=__import__("sys").stderr)
        return 2


def test_values_are_toml_and_commas_inside_tables_do_not_split():
    grid = parse_grid(["engine.kv_cache_dtype=auto,fp8", "workload.rate=1,2.5,inf",
                       'workload.prompt={dist = "fixed", value = 64},{dist = "uniform", low = 1, high = 9}'])  # fmt: skip
    assert grid["engine.kv_cache_dtype"] == ["auto", "fp8"]
    assert grid["workload.rate"][:2] == [1, 2.5] and math.isinf(grid["workload.rate"][2])
    assert grid["workload.prompt"][1] == {"dist": "uniform", "low": 1, "high": 9}
    assert split_values('[1, 2],"a,b",3') == ["[1, 2]", '"a,b"', "3"]


@pytest.mark.parametrize(
    "item, match",
    [
        ("engine.max_num_seq=16,32", "unknown key in \\[engine\\]"),
        ("engin.max_num_seqs=16", "unknown section 'engin'"),
        ("max_num_seqs=16", "expected SECTION.KEY"),
        ("engine.max_num_seqs", "expected SECTION.KEY=V1,V2"),
        ("simulation.seed=1,2", "--replications"),
        ("engine.max_num_seqs=1,,2", "empty value"),
    ],
)
def test_bad_grid_items(item, match):
    with pytest.raises(ConfigError, match=match):
        parse_grid([item])


def test_duplicate_axis_is_rejected():
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["workload.rate=1", "workload.rate=2"])


def test_points_are_the_product_in_order_and_each_is_validated():
    pts = expand_grid(base(), parse_grid(GRID))
    assert [p.params for p in pts] == [
        {"engine.max_num_seqs": 2, "workload.rate": 1}, {"engine.max_num_seqs": 2, "workload.rate": 4},
        {"engine.max_num_seqs": 8, "workload.rate": 1}, {"engine.max_num_seqs": 8, "workload.rate": 4},
    ]  # fmt: skip
    assert pts[3].cfg.engine.max_num_seqs == 8 and pts[3].cfg.workload["rate"] == 4
    with pytest.raises(ConfigError, match="engine.max_num_seqs=0"):
        expand_grid(base(), {"engine.max_num_seqs": [4, 0]})
    with pytest.raises(ConfigError, match=r"grid point 1 \(workload.rate=-1\).*rate"):
        run_sweep(base(), {"workload.rate": [1, -1]})
    with pytest.raises(ConfigError, match="unknown key 'rat'"):
        run_sweep(base(), {"workload.rat": [1]})


def test_local_pool_matches_inline_with_progress_and_common_seeds(tmp_path):
    err = io.StringIO()
    df = run_sweep(base(), parse_grid(GRID), replications=2, jobs=2, progress=True, stream=err)
    assert len(df) == 8 and list(df["point"]) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(df["seed"]) == [0, 1] * 4  # the same seeds at every point (CRN)
    assert df["error"].isna().all()
    assert "sweep: 100%" in err.getvalue() and "8/8" in err.getvalue()  # the tqdm bar
    inline = run_sweep(base(), parse_grid(GRID), replications=2, jobs=1)
    pd.testing.assert_frame_equal(df[METRICS], inline[METRICS])
    # more slots, less queueing at the high rate; overload shows as saturation at 2 slots
    hi2 = df[(df["engine.max_num_seqs"] == 2) & (df["workload.rate"] == 4)]
    hi8 = df[(df["engine.max_num_seqs"] == 8) & (df["workload.rate"] == 4)]
    assert hi2["p99_ttft_ms"].mean() > 2 * hi8["p99_ttft_ms"].mean()
    path = tmp_path / "r.parquet"
    df.to_parquet(path, index=False)
    back = pd.read_parquet(path)
    assert list(back.columns) == list(df.columns) and len(back) == 8
    agg = aggregate(df, list(parse_grid(GRID)))
    assert len(agg) == 4
    row = agg.iloc[0]
    assert row["request_throughput_lo"] <= row["request_throughput"] <= row["request_throughput_hi"]


def test_mixed_type_axis_still_writes_parquet(tmp_path):
    df = run_sweep(base(), {"engine.max_num_batched_tokens": [512, None]}, jobs=1)
    df.to_parquet(tmp_path / "m.parquet")
    assert len(pd.read_parquet(tmp_path / "m.parquet")) == 2


def test_ray_backend_on_a_local_instance():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        df = run_sweep(base(), parse_grid(GRID), replications=1, backend="ray")
    finally:
        ray.shutdown()
    local = run_sweep(base(), parse_grid(GRID), replications=1, jobs=1)
    assert df["error"].isna().all()
    pd.testing.assert_frame_equal(df[METRICS], local[METRICS])


def test_cli_writes_one_parquet_row_per_point_and_replication(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[model]\nname = "seed-7b"\ndtype = "fp16"\n[hardware]\ngpu = "24GB"\n'
        '[engine]\nmax_model_len = 4096\noverhead_gib = 1.5\ncost_model = "constant"\n'
        "[workload]\nrate = 2.0\nnum_requests = 40\nprompt = 100\noutput = 20\n"
    )
    out = tmp_path / "res.parquet"
    rc = run_cli(["sweep", str(cfg), "--grid", "engine.max_num_seqs=2,4", "--replications", "2",
                  "--jobs", "1", "--out", str(out), "--slo", "p99_ttft:1000", "tpot:50"])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    df = pd.read_parquet(out)
    assert len(df) == 4 and "engine.max_num_seqs" in df and "p99_ttft_ms" in df
    # the percentile SLO's check, in ms like its target, and the per-request one's attainment
    assert (df["slo_p99_ttft_ms"] == df["p99_ttft_ms"]).all() and df["slo_attainment"].notna().all()
    assert captured.err == "" and "±" in captured.out  # no bar: stderr is not a terminal
    rc = run_cli(["sweep", str(cfg), "--grid", "workload.rate=-2", "--out", str(out)])
    assert rc == 2 and "rate" in capsys.readouterr().err
    rc = run_cli(["sweep", str(cfg), "--grid", "engine.max_num_seqs=2", "--json", "--no-progress",
                  "--out", str(tmp_path / "r.csv")])  # fmt: skip
    assert rc == 0 and json.loads(capsys.readouterr().out)[0]["engine.max_num_seqs"] == 2
