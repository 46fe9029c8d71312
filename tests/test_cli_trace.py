"""``servesim trace stats``: argument parsing, table and JSON output, errors as ServesimError."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sim.cli import trace as cli_trace
from sim.core.errors import ConfigError, ServesimError, TraceFormatError

AZURE = [
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.2224670,879,0",
    "2023-11-16 18:15:52.2224670,91,16",
]
SHARED = Path(__file__).resolve().parents[2] / "shared"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="servesim")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_trace.add_parser(sub)
    args = parser.parse_args(argv)
    assert args.command == "trace" and args.trace_command == "stats"
    return args.func(args)


@pytest.fixture
def azure(tmp_path: Path) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text("\r\n".join(AZURE))
    return path


def test_table_output(azure, capsys):
    assert run(["trace", "stats", str(azure)]) == 0
    out = capsys.readouterr().out
    assert "(azure)" in out
    assert "4 in file, 4 loaded; skipped 0, clipped 1, failed 0" in out
    assert "duration 5.5 s" in out
    prompt = next(line for line in out.splitlines() if line.startswith("prompt "))
    assert prompt.split() == ["prompt", "435.0", "385.0", "734.1", "864.5", "879"]  # numpy linear percentiles
    assert "GeneratedTokens 0 raised to 1" in out


def test_json_output_and_shared_options(azure, capsys):
    assert (
        run(
            [
                "trace",
                "stats",
                str(azure),
                "--json",
                "--start",
                "4",
                "--time-scale",
                "0.5",
                "--max-model-len",
                "400",
            ]
        )
        == 0
    )
    st = json.loads(capsys.readouterr().out)
    assert st["count"] == 3 and st["format"] == "azure"
    assert st["first_arrival_s"] == pytest.approx(0.5 * 0.314579)
    assert st["duration_s"] == pytest.approx(0.5 * (5.541877 - 4.314579))
    assert st["prompt_len_max"] == 399 and st["num_clipped"] == 2
    assert any("window" in n for n in st["notes"])


def test_sample_flag_parses_fraction_and_count(azure, capsys):
    run(["trace", "stats", str(azure), "--json", "--sample", "2", "--seed", "5"])
    assert json.loads(capsys.readouterr().out)["count"] == 2
    run(["trace", "stats", str(azure), "--json", "--sample", "0.5"])
    assert json.loads(capsys.readouterr().out)["count"] == 2


def test_skip_bad_rows_flag(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    path.write_text("\n".join([*AZURE, "2023-11-16 18:15:53.0,abc,1"]))
    with pytest.raises(TraceFormatError, match=r"azure\.csv:6: ContextTokens: 'abc' is not an integer"):
        run(["trace", "stats", str(path)])
    assert run(["trace", "stats", str(path), "--skip-bad-rows"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1" in out and "azure.csv:6: ContextTokens" in out


def test_format_options_reach_their_loader(tmp_path, capsys):
    path = tmp_path / "BurstGPT.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
    )
    run(["trace", "stats", str(path), "--json"])
    st = json.loads(capsys.readouterr().out)
    assert (st["count"], st["num_failed"]) == (2, 1)
    run(["trace", "stats", str(path), "--json", "--model", "ChatGPT", "--include-failed"])
    assert json.loads(capsys.readouterr().out)["count"] == 2
    stats = tmp_path / "lens.csv"
    stats.write_text("num_prefill_tokens,num_decode_tokens\n10,20\n30,40\n")
    run(["trace", "stats", str(stats), "--json", "--rate", "4", "--arrival", "constant"])
    st = json.loads(capsys.readouterr().out)
    assert st["first_arrival_s"] == pytest.approx(0.25) and st["duration_s"] == pytest.approx(0.25)


def test_errors_are_servesim_errors(azure, tmp_path):
    with pytest.raises(ConfigError, match="'model' does not apply to format 'azure'"):
        run(["trace", "stats", str(azure), "--model", "GPT-4"])
    with pytest.raises(ConfigError, match="not both"):
        run(["trace", "stats", str(azure), "--time-scale", "2", "--rate-scale", "2"])
    with pytest.raises(ServesimError, match="no such trace file"):
        run(["trace", "stats", str(tmp_path / "missing.csv")])
    with pytest.raises(ServesimError, match="unknown trace format"):
        run(["trace", "stats", str(azure), "--format", "xml"])


def test_real_mooncake_json(capsys):
    path = SHARED / "data" / "traces" / "mooncake_synthetic_trace.jsonl"
    if not path.is_file():
        pytest.skip("../shared absent")
    run(["trace", "stats", str(path), "--json", "--limit", "100"])
    st = json.loads(capsys.readouterr().out)
    assert st["count"] == 100 and st["has_prefix_identity_frac"] == 1.0 and st["num_rows"] == 3993
