"""Hostile trace and length inputs (sweep 2: T1, T2, T4, T5, T8, S4, S8, S14, H4, U3 and a few of U2/U4):
each ends in exit code 2 and one line naming the file and line or the option, the value and what is
allowed, before any engine runs. One case per root cause; tests/test_bad_inputs.py holds the harness."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.test_bad_inputs import QUICK, no_simulation, run_bad_case  # noqa: F401

BIG = 10**20  # past int64
ROW = {"arrival_time": 0.0, "prompt_len": 100, "output_len": 10}
MOON = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}
BENCH = {"input_toks": 100, "output_toks": 10, "arrival_time_ns": 0}
BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
SHAREGPT = [{"conversations": [{"from": "human", "value": "hello there friend"},
                               {"from": "gpt", "value": "hi back to you"}]}] * 3
DEEP = "[" * 100_000 + "]" * 100_000


def _write(tmp: Path, name: str, text: str | bytes) -> str:
    p = tmp / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return str(p)


def _jsonl(tmp: Path, *rows: dict | str, name: str = "t.jsonl") -> str:
    return _write(tmp, name, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _run(tmp: Path, trace: str, extra: str = "") -> list[str]:
    """``servesim run`` on a small config replaying ``trace`` with ``[workload]`` lines ``extra``."""
    cfg = ('[model]\nname = "Mistral-7B"\n[hardware]\ngpu = "RTX 4090"\n[engine]\nmax_model_len = 8192\n'
           f'[workload]\ntrace = "{trace}"\n{extra}\n')
    return ["run", _write(tmp, "c.toml", cfg)]


def _stats(path: str, *flags: str) -> list[str]:
    return ["trace", "stats", path, *flags]


def _prompt(spec: str) -> list[str]:
    return ["run", QUICK, "--set", "workload.num_requests=20", "--set", f"workload.prompt={spec}"]


def _truncated_gz(text: str) -> bytes:
    z = gzip.compress(text.encode())
    return z[: len(z) // 2]


def _csv_prompt(tmp: Path, text: str | bytes, name: str = "lens.csv") -> list[str]:
    return _prompt(f'{{dist="empirical",csv="{_write(tmp, name, text)}",column="len"}}')


CASES = [
    # ---- T2: token counts and priorities past int64 (the bound: MAX_LEN = 10**9 tokens) ----
    ("jsonl-prompt_len-1e20", lambda t: _stats(_jsonl(t, {**ROW, "prompt_len": BIG})),
     ["t.jsonl:1", "field 'prompt_len'", str(BIG), "1 <= value <= 1000000000"]),
    ("jsonl-priority-1e20", lambda t: _stats(_jsonl(t, {**ROW, "priority": BIG})),
     ["t.jsonl:1", "field 'priority'", str(BIG), "-2147483647 <= value <= 2147483647"]),
    ("mooncake-input_length-1e20", lambda t: _stats(_jsonl(t, {**MOON, "input_length": BIG})),
     ["t.jsonl:1", "input_length", str(BIG), "<= 1000000000"]),
    ("empirical-values-bigint", lambda t: _prompt(f'{{dist="empirical",values=[{10**23}]}}'),
     ["workload.prompt.values[0]", str(10**23), "1 <= value <= 1000000000"]),
    ("sharegpt-tokens_per_word-1e300", lambda t: _run(t, _write(t, "s.json", json.dumps(SHAREGPT)),
                                                      "rate = 1.0\ntokens_per_word = 1e300"),
     ["s.json", "entry 0", "tokens_per_word 1e+300", "at most 1000000000"]),
    ("vllm-bench-arrival_time_ns-no-float", lambda t: _stats(_jsonl(t, {**BENCH, "arrival_time_ns": 10**400})),
     ["t.jsonl:1", "arrival_time_ns", "401 digits"]),
    # ---- S4 / S14: length lists and CSV columns ----
    ("empirical-values-1e20", lambda t: _prompt('{dist="empirical",values=[1e20]}'),
     ["workload.prompt.values[0]", "1e+20", "<= 1000000000"]),
    ("empirical-csv-negative", lambda t: _csv_prompt(t, "len\n-100\n200\n"),
     ["lens.csv row 2", "'len'", "-100", "0 <= value <= 1000000000"]),
    ("empirical-csv-two-len-columns", lambda t: _csv_prompt(t, "len,len\n1,2\n"), ["'len'", "2 columns", "lens.csv"]),
    ("lognormal-every-draw-below-min", lambda t: _prompt('{dist="lognormal",mu=-50,sigma=0}'),
     ["workload.prompt", "mu=-50 sigma=0", "clipped to min", "exp(mu + 6*sigma) >= 0.5"]),
    ("lognormal-every-draw-past-MAX_LEN", lambda t: _prompt('{dist="lognormal",mu=50,sigma=0}'),
     ["workload.prompt", "mu=50 sigma=0", "1000000000"]),
    # ---- T4 ----
    ("trace-seed-negative", lambda t: _run(t, _jsonl(t, ROW), "seed = -1"), ["trace option seed", "-1", ">= 0"]),
    # ---- T5: file errors ----
    ("trace-csv-gz-truncated", lambda t: _stats(_write(t, "a.csv.gz", _truncated_gz(AZURE + "".join(
        f"2023-11-16 18:15:{i % 60:02d},{i},{i % 97}\n" for i in range(5000)))), "--format", "azure"),
     ["a.csv.gz", "cannot read"]),
    ("trace-gz-corrupt-deflate", lambda t: _stats(_write(t, "t.jsonl.gz", gzip.compress(b"x" * 50)[:10] + b"\xff" * 40)),
     ["t.jsonl.gz", "cannot read"]),
    ("vllm-bench-not-utf8", lambda t: _stats(_write(t, "b.jsonl", b'{"input_toks": 1, "x": "caf\xe9"}\n'), "--format",
                                             "vllm-bench"), ["b.jsonl", "UTF-8"]),
    ("empirical-csv-not-utf8-deep", lambda t: _csv_prompt(t, b"len\n" + b"100\n" * 200_000 + b"1\xe9\n"),
     ["workload.prompt.csv", "lens.csv", "not UTF-8"]),
    ("empirical-csv-directory", lambda t: _prompt(f'{{dist="empirical",csv="{t}",column="len"}}'),
     ["workload.prompt.csv", "is a directory"]),
    ("empirical-csv-table", lambda t: _prompt('{dist="empirical",csv={a=1},column="len"}'),
     ["workload.prompt.csv", "expected the path of a CSV file", "{'a': 1}"]),
    ("trace-dev-null", lambda t: _stats("/dev/null"), ["/dev/null", "not a regular file"]),
    # ---- T1: JSON nested past the decoder's stack, and integers past its 4300 digits ----
    ("jsonl-deep-first-line", lambda t: _stats(_jsonl(t, json.dumps(ROW)[:-1] + f', "output_key": {DEEP}}}')),
     ["t.jsonl:1", "nested too deeply"]),
    ("jsonl-deep-later-line", lambda t: _stats(_jsonl(t, ROW, json.dumps(ROW)[:-1] + f', "output_key": {DEEP}}}')),
     ["t.jsonl:2", "nested too deeply"]),
    ("jsonl-deep-key-parsed", lambda t: _stats(_jsonl(t, {**ROW, "output_key": json.loads("[" * 700 + "]" * 700)})),
     ["t.jsonl:1", "field 'output_key'", "nested too deeply"]),
    ("mooncake-deep-later-line", lambda t: _stats(_jsonl(t, MOON, json.dumps(MOON)[:-1] + f', "x": {DEEP}}}'),
                                                  "--format", "mooncake"), ["t.jsonl:2", "nested too deeply"]),
    ("sharegpt-deep", lambda t: _stats(_write(t, "s.json", DEEP), "--rate", "1"), ["s.json", "nested too deeply"]),
    ("jsonl-int-5000-digits", lambda t: _stats(_jsonl(t, json.dumps(ROW).replace("100", "1" + "0" * 5000))),
     ["t.jsonl:1", "4300 digits"]),
    # ---- T8 / S8: loader options ----
    ("burstgpt-model-int", lambda t: _run(t, _write(t, "b.csv", BURST + "5,ChatGPT,100,20,120,Conv\n"), "model = 5"),
     ["trace option model", "5"]),
    ("sharegpt-tokens_per_word-string", lambda t: _run(t, _write(t, "s.json", json.dumps(SHAREGPT)),
                                                       'rate = 1.0\ntokens_per_word = "a"'),
     ["tokens_per_word", "'a'", "finite number > 0"]),
    ("sharegpt-tokens_per_word-bool", lambda t: _run(t, _write(t, "s.json", json.dumps(SHAREGPT)),
                                                     "rate = 1.0\ntokens_per_word = true"), ["tokens_per_word", "True"]),
    ("jsonl-skip_bad_rows-string", lambda t: _run(t, _jsonl(t, {**ROW, "arrival_time": -1}, ROW), 'skip_bad_rows = "no"'),
     ["skip_bad_rows", "'no'", "true or false"]),
    ("mooncake-spread_ties-string", lambda t: _run(t, _jsonl(t, MOON), 'spread_ties = "no"'),
     ["spread_ties", "'no'", "true or false"]),
    ("burstgpt-include_failed-string", lambda t: _run(t, _write(t, "b.csv", BURST + "5,ChatGPT,100,20,120,Conv\n"),
                                                      'include_failed = "no"'), ["include_failed", "'no'"]),
    # ---- H4: rows with more fields than the header ----
    ("csv-first-row-too-long", lambda t: _stats(_write(t, "a.csv", AZURE + "2023-11-16 18:15:46,374,44" + ",1" * 10
                                                       + "\n2023-11-16 18:15:47,375,45\n")),
     ["a.csv:2", "expected 3 fields, found 13"]),
    # ---- U3: past the clock (MAX_ARRIVAL_S), naming the cause ----
    ("trace-time_scale-past-the-clock", lambda t: _run(t, _jsonl(t, ROW, {**ROW, "arrival_time": 0.4}), "time_scale = 1e300"),
     ["trace option time_scale", "1e+300", "time_scale <= 2.5e+09"]),
    ("trace-rate_scale-subnormal", lambda t: _stats(_jsonl(t, ROW), "--rate-scale", "5e-324"),
     ["trace option rate_scale", "5e-324"]),
    ("trace-rate_scale-past-the-clock", lambda t: _stats(_jsonl(t, ROW, {**ROW, "arrival_time": 0.4}), "--rate-scale",
                                                         "1e-300"), ["trace option rate_scale", "1e-300", "rate_scale >="]),
    ("sharegpt-rate-past-the-clock", lambda t: _run(t, _write(t, "s.json", json.dumps(SHAREGPT)), "rate = 1e-300"),
     ["trace option rate", "1e-300", "rate >= 3e-09"]),
    ("token-counts-rate-past-the-clock", lambda t: _stats(_write(t, "tc.csv", "num_prefill_tokens,num_decode_tokens\n"
                                                                 "100,10\n200,20\n"), "--rate", "1e-300"),
     ["trace option rate", "1e-300", "rate >= 2e-09"]),
    ("mooncake-timestamp-past-the-clock", lambda t: _stats(_jsonl(t, {**MOON, "timestamp": 1e300})),
     ["t.jsonl:1", "field 'timestamp'", "1e+300 ms", "1e+09 s"]),
    ("burstgpt-timestamp-past-the-clock", lambda t: _stats(_write(t, "b.csv", BURST + "0,ChatGPT,100,20,120,Conv\n"
                                                                  "1e300,ChatGPT,100,20,120,Conv\n")),
     ["b.csv:3", "field 'Timestamp'", "'1e300'", "earliest row (line 2)", "1e+09 s"]),
    ("azure-span-40-years", lambda t: _run(t, _write(t, "a.csv", AZURE + "1990-01-01 00:00:00,374,44\n"
                                                     "2030-01-01 00:00:00,396,109\n")),
     ["a.csv:3", "field 'TIMESTAMP'", "'2030-01-01 00:00:00'", "earliest row (line 2)", "1e+09 s"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_trace_input_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


def test_csv_first_row_with_a_million_fields_is_read_in_one_linear_pass(tmp_path, capsys, monkeypatch):
    """H4: a first data row with 1,000,000 extra fields (pandas' C reader makes the surplus an index, about
    0.5 ms a field, and its python engine took minutes) is read by one pass of the csv module instead."""
    import workloads.tracefmt.rows as rows

    folded = []
    real_fold = rows._read_folded
    monkeypatch.setattr(rows, "_read_folded", lambda path, names: folded.append(path) or real_fold(path, names))
    path = _write(tmp_path, "a.csv", AZURE + "2023-11-16 18:15:46,374,44" + "," * 1_000_000 + "\n"
                  + "2023-11-16 18:15:47,1,2\n")
    run_bad_case(_stats(path), ["a.csv:2", "expected 3 fields, found 1000003"], capsys)
    assert len(folded) == 1  # the first row's length was seen before pandas read the file


def test_a_cap_past_every_length_is_no_cap(tmp_path, capsys):
    """max_prompt_len / max_model_len past int64 used to overflow numpy (OverflowError); every length is at
    most MAX_LEN, so such a cap changes nothing."""
    path = _jsonl(tmp_path, ROW)
    assert main(_stats(path, "--max-prompt-len", str(BIG), "--max-model-len", str(BIG), "--json")) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["prompt_len_max"] == 100 and stats["num_clipped"] == 0
