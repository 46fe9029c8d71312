"""Real-trace loaders: each format written in its published shape, the shared options, errors, stats."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim.core.errors import ConfigError, TraceFormatError, UnknownNameError
from sim.core.request import RequestSpec
from workloads.tracefmt import (
    LoadedTrace,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_token_counts,
    load_trace,
    load_vllm_bench,
    sniff_format,
    trace_stats,
    vllm_random,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "data" / "traces"
E2E = SHARED / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19" / "workload-sharegpt-300-sps10.jsonl"

# ---- file builders in the published formats ----------------------------------------------------------

AZURE_2023 = [  # the first rows of AzureLLMInferenceTrace_conv.csv: CRLF, 7 fractional digits
    ("2023-11-16 18:15:46.6805900", 374, 44),
    ("2023-11-16 18:15:50.9951690", 396, 109),
    ("2023-11-16 18:15:51.2224670", 879, 55),
    ("2023-11-16 18:15:51.3910170", 91, 16),
]


def write_azure(path: Path, rows, crlf: bool = True, trailing_newline: bool = False) -> Path:
    eol = "\r\n" if crlf else "\n"
    text = eol.join(["TIMESTAMP,ContextTokens,GeneratedTokens", *(f"{a},{b},{c}" for a, b, c in rows)])
    path.write_bytes((text + (eol if trailing_newline else "")).encode())  # the real file has no final EOL
    return path


BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
BURST_ROWS = [  # seconds from midnight of the first day; a 0 response = failed request
    "5,ChatGPT,472,18,490,Conversation log",
    "45,ChatGPT,1087,0,1087,Conversation log",
    "118,GPT-4,417,276,693,API log",
    "130.5,ChatGPT,58,120,178,Conversation log",
]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write_lines(path, [json.dumps(r) for r in rows])


MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 3]},
    {"timestamp": 40, "input_length": 13, "output_length": 9, "hash_ids": [4]},
    {"timestamp": 277, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]},
    {"timestamp": 277, "input_length": 512, "output_length": 2, "hash_ids": [5]},
    {"timestamp": 277, "input_length": 700, "output_length": 3, "hash_ids": [6, 7]},
    {"timestamp": 300, "input_length": 40, "output_length": 83, "hash_ids": [8]},
]


def spec_table(trace: LoadedTrace) -> list[tuple[str, float, int, int]]:
    return [(s.request_id, round(s.arrival_time, 9), s.prompt_len, s.output_len) for s in trace.specs]


# ---- Azure ------------------------------------------------------------------------------------------


def test_azure_2023_times_relative_to_first_row_with_7_digit_fractions(tmp_path):
    tr = load_azure(write_azure(tmp_path / "azure.csv", AZURE_2023))
    assert tr.format == "azure" and tr.num_rows == 4 and len(tr) == 4
    assert spec_table(tr) == [
        ("0", 0.0, 374, 44),
        ("1", 4.314579, 396, 109),
        ("2", 4.541877, 879, 55),
        ("3", 4.710427, 91, 16),
    ]
    assert tr.num_skipped == tr.num_clipped == tr.num_failed == 0


def test_azure_2024_utc_offsets(tmp_path):
    rows = [
        ("2024-05-10 00:00:00.009930+00:00", 2048, 28),
        ("2024-05-10 00:00:00.048523+00:00", 107, 16),
        ("2024-05-10 00:00:01.500000+00:00", 33, 400),
    ]
    tr = load_azure(write_azure(tmp_path / "AzureLLMInferenceTrace_code_1week.csv", rows, crlf=False))
    assert [s.arrival_time for s in tr.specs] == pytest.approx([0.0, 0.038593, 1.49007], abs=1e-9)
    assert [s.prompt_len for s in tr.specs] == [2048, 107, 33]


def test_azure_zero_generated_tokens_is_raised_to_one_and_counted(tmp_path):
    rows = [*AZURE_2023[:2], ("2023-11-16 18:15:52.0000000", 500, 0)]
    tr = load_azure(write_azure(tmp_path / "a.csv", rows))
    assert [s.output_len for s in tr.specs] == [44, 109, 1]
    assert tr.num_clipped == 1
    assert any("GeneratedTokens 0" in n for n in tr.notes)


def test_azure_unsorted_rows_are_sorted_and_rebased_to_earliest(tmp_path):
    rows = [AZURE_2023[2], AZURE_2023[0], AZURE_2023[1]]
    tr = load_azure(write_azure(tmp_path / "a.csv", rows))
    assert [s.request_id for s in tr.specs] == ["1", "2", "0"]
    assert tr.specs[0].arrival_time == 0.0


def _azure_rows(n: int) -> list[tuple[str, int, int]]:
    return [(f"2023-11-16 18:15:{10 + i:02d}.1234567", 100 + i, 10 + i) for i in range(n)]


def test_malformed_row_names_file_line_and_column(tmp_path):
    rows = _azure_rows(20)
    rows[15] = (rows[15][0], "abc", 5)  # data row 16 = file line 17 (header is line 1)
    path = write_azure(tmp_path / "azure.csv", rows)
    with pytest.raises(TraceFormatError, match=r"azure\.csv:17: ContextTokens: 'abc' is not an integer"):
        load_azure(path)


def test_earliest_bad_line_is_reported_whatever_column(tmp_path):
    rows = _azure_rows(10)
    rows[2] = (rows[2][0], 5, "x")  # line 4, GeneratedTokens
    rows[7] = ("not a time", 5, 5)  # line 9, TIMESTAMP (checked first)
    path = write_azure(tmp_path / "azure.csv", rows)
    with pytest.raises(TraceFormatError, match=r"azure\.csv:4: GeneratedTokens: 'x' is not an integer"):
        load_azure(path)


def test_skip_bad_rows_counts_and_keeps_the_rest(tmp_path):
    rows = _azure_rows(10)
    rows[2] = (rows[2][0], 5, "x")
    rows[7] = ("not a time", 5, 5)
    rows[8] = (rows[8][0], -3, 5)
    tr = load_azure(write_azure(tmp_path / "azure.csv", rows), skip_bad_rows=True)
    assert tr.num_skipped == 3 and tr.num_rows == 10 and len(tr) == 7
    assert {s.request_id for s in tr.specs} == {"0", "1", "3", "4", "5", "6", "9"}
    assert [e.split(": ", 1)[0].rsplit(":", 1)[1] for e in tr.errors] == ["4", "9", "10"]
    assert "'not a time' is not a timestamp" in tr.errors[1] and "must be >= 0" in tr.errors[2]


def test_blank_lines_are_not_rows_but_count_as_lines(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n\n"
        "2023-11-16 18:15:47.0000000,3.5,1\n"
    )
    with pytest.raises(TraceFormatError, match=r"azure\.csv:4: ContextTokens: '3.5' is not an integer"):
        load_azure(path)


def test_missing_empty_and_wide_rows(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374\n")
    with pytest.raises(TraceFormatError, match=r"azure\.csv:2: GeneratedTokens: missing value"):
        load_azure(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,4,9\n")
    with pytest.raises(TraceFormatError, match=r"azure\.csv:2: expected 3 fields, found 4"):
        load_azure(path)
    wide = ",".join(["7"] * 20)  # wider than the parser's spare columns: the fallback path
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n{wide}\n")
    with pytest.raises(TraceFormatError, match=r"azure\.csv:3: expected 3 fields, found 20"):
        load_azure(path)
    assert len(load_azure(path, skip_bad_rows=True)) == 1


def test_missing_column_lists_columns_found(tmp_path):
    path = write_lines(tmp_path / "a.csv", ["TIMESTAMP,ContextTokens,Tokens", "2023-11-16 18:15:46.68,1,1"])
    with pytest.raises(
        TraceFormatError, match=r"missing column 'GeneratedTokens'.*'TIMESTAMP', 'ContextTokens', 'Tokens'"
    ):
        load_azure(path)


@pytest.mark.parametrize("content", ["", "\n\n", "TIMESTAMP,ContextTokens,GeneratedTokens\n"])
def test_empty_file_or_header_only(tmp_path, content):
    path = tmp_path / "a.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=r"empty file|no data rows"):
        load_azure(path)


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")


# ---- BurstGPT ---------------------------------------------------------------------------------------


def test_burstgpt_excludes_failed_rows_by_default(tmp_path):
    tr = load_burstgpt(write_lines(tmp_path / "BurstGPT_1.csv", [BURST_HEADER, *BURST_ROWS]))
    assert spec_table(tr) == [("0", 0.0, 472, 18), ("2", 113.0, 417, 276), ("3", 125.5, 58, 120)]
    assert tr.num_failed == 1 and tr.num_rows == 4 and tr.num_clipped == 0
    assert all(s.session_id is None for s in tr.specs)


def test_burstgpt_include_failed_keeps_them_with_one_token(tmp_path):
    tr = load_burstgpt(write_lines(tmp_path / "b.csv", [BURST_HEADER, *BURST_ROWS]), include_failed=True)
    assert [(s.request_id, s.output_len) for s in tr.specs] == [("0", 18), ("1", 1), ("2", 276), ("3", 120)]
    assert tr.num_failed == 1 and tr.num_clipped == 1


def test_burstgpt_model_filter_and_unknown_model(tmp_path):
    path = write_lines(tmp_path / "b.csv", [BURST_HEADER, *BURST_ROWS])
    tr = load_burstgpt(path, model="gpt-4")
    assert spec_table(tr) == [("2", 0.0, 417, 276)]  # re-based to the first kept row
    with pytest.raises(ConfigError, match=r"no rows with Model 'Claude'.*ChatGPT, GPT-4"):
        load_burstgpt(path, model="Claude")


def test_burstgpt_session_id_column(tmp_path):
    header = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"
    rows = ["1.5,s-7,0.8,ChatGPT,10,20,30,Conversation log", "2.0,,1.1,ChatGPT,5,6,11,API log"]
    tr = load_trace(write_lines(tmp_path / "burst.csv", [header, *rows]))
    assert tr.format == "burstgpt"
    assert [s.session_id for s in tr.specs] == ["s-7", None]


def test_burstgpt_bad_cell_names_column_with_space(tmp_path):
    rows = [*BURST_ROWS[:2], "118,GPT-4,many,276,693,API log"]
    path = write_lines(tmp_path / "burst.csv", [BURST_HEADER, *rows])
    with pytest.raises(TraceFormatError, match=r"burst\.csv:4: Request tokens: 'many' is not an integer"):
        load_burstgpt(path)


# ---- Mooncake ---------------------------------------------------------------------------------------


def test_mooncake_hash_ids_and_ms_times(tmp_path):
    tr = load_mooncake(write_jsonl(tmp_path / "mooncake_trace.jsonl", MOONCAKE_ROWS))
    assert [s.arrival_time for s in tr.specs] == [0.0, 0.0, 0.04, 0.277, 0.277, 0.277, 0.3]
    first = tr.specs[0]
    assert first.hash_ids == (0, 1, 2) and first.hash_block_size == 512 and first.prompt_len == 1100
    assert [s.request_id for s in tr.specs[3:6]] == ["3", "4", "5"]  # ties keep file order


def test_mooncake_spread_ties(tmp_path):
    tr = load_mooncake(write_jsonl(tmp_path / "m.jsonl", MOONCAKE_ROWS), spread_ties=True)
    want_ms = [0, 20, 40, 277, 277 + 23 / 3, 277 + 46 / 3, 300]
    assert [s.arrival_time for s in tr.specs] == pytest.approx([m / 1000 for m in want_ms])
    # the last group has no next timestamp: it spreads over the median gap between distinct stamps
    rows = [{"timestamp": t, "input_length": 5, "output_length": 5} for t in (0, 10, 30, 30)]
    tr = load_mooncake(write_jsonl(tmp_path / "m2.jsonl", rows), spread_ties=True)
    assert [s.arrival_time * 1000 for s in tr.specs] == pytest.approx([0, 10, 30, 30 + 15 / 2])


def test_mooncake_errors(tmp_path):
    rows = [MOONCAKE_ROWS[0], {"timestamp": 5, "output_length": 3, "hash_ids": [1]}]
    with pytest.raises(TraceFormatError, match=r"m\.jsonl:2: input_length: missing"):
        load_mooncake(write_jsonl(tmp_path / "m.jsonl", rows))
    path = write_lines(tmp_path / "m.jsonl", [json.dumps(MOONCAKE_ROWS[0]), "", '{"timestamp": 1,'])
    with pytest.raises(TraceFormatError, match=r"m\.jsonl:3: invalid JSON"):
        load_mooncake(path)
    rows = [MOONCAKE_ROWS[0], {**MOONCAKE_ROWS[1], "hash_ids": [1, "x"]}]
    tr = load_mooncake(write_jsonl(tmp_path / "m.jsonl", rows), skip_bad_rows=True)
    assert len(tr) == 1 and tr.num_skipped == 1 and "hash_ids: element 1" in tr.errors[0]


# ---- token-count CSVs -------------------------------------------------------------------------------

STATS_CSV = [
    "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio",
    "74,918,992,0.0806100217864923",
    "290,905,1195,0.3204419889502762",
    "1402,711,2113,1.9718706047819967",
    "2497,918,3415,2.7200435729847494",
]


def test_token_counts_with_poisson_arrivals(tmp_path):
    path = write_lines(tmp_path / "sharegpt_stats.csv", STATS_CSV)
    tr = load_token_counts(path, rate=2.0, seed=3)
    assert [(s.prompt_len, s.output_len) for s in tr.specs] == [
        (74, 918),
        (290, 905),
        (1402, 711),
        (2497, 918),
    ]
    t = [s.arrival_time for s in tr.specs]
    assert t == sorted(t) and t[0] > 0
    assert t[-1] == pytest.approx(4 / 2.0)  # vLLM bench rescales the last arrival to n / rate
    again = load_token_counts(path, rate=2.0, seed=3)
    assert [s.arrival_time for s in again.specs] == t
    assert [s.arrival_time for s in load_token_counts(path, rate=2.0, seed=4).specs] != t


def test_token_counts_sample_keeps_the_requested_rate(tmp_path):
    rows = [STATS_CSV[0], *(f"{10 + i},{5 + i},0,0" for i in range(40))]
    tr = load_token_counts(write_lines(tmp_path / "s.csv", rows), rate=4.0, sample=0.25, seed=1)
    assert len(tr) == 10 and tr.specs[-1].arrival_time == pytest.approx(10 / 4.0)


def test_token_counts_need_a_rate(tmp_path):
    with pytest.raises(ConfigError, match="rate="):
        load_token_counts(write_lines(tmp_path / "s.csv", STATS_CSV))


def test_token_counts_gamma_burstiness(tmp_path):
    rows = [STATS_CSV[0], *(f"{10 + i},{5 + i},0,0" for i in range(3000))]
    tr = load_token_counts(write_lines(tmp_path / "s.csv", rows), arrival="gamma", rate=10.0, burstiness=0.25)
    cv = trace_stats(tr)["interarrival_cv"]
    assert cv == pytest.approx(2.0, rel=0.1)  # CV = 1/sqrt(burstiness)


# ---- vLLM bench JSONL / ShareGPT / random ------------------------------------------------------------


def test_vllm_bench_jsonl_with_token_ids(tmp_path):
    rows = [
        {
            "input_toks": 3,
            "output_toks": 7,
            "arrival_time_ns": 46926808,
            "input_tok_ids": [5, 6, 7],
            "output_tok_ids": [1] * 7,
        },
        {"input_toks": 2, "output_toks": 4, "arrival_time_ns": 347938951, "input_tok_ids": [5, 6]},
    ]
    tr = load_trace(write_jsonl(tmp_path / "workload.jsonl", rows))
    assert tr.format == "vllm-bench"
    assert spec_table(tr) == [("0", 0.046926808, 3, 7), ("1", 0.347938951, 2, 4)]
    assert tr.specs[0].token_ids == (5, 6, 7)
    rows[1]["input_tok_ids"] = [1, 2, 3]
    with pytest.raises(TraceFormatError, match=r"workload\.jsonl:2: input_tok_ids: 3 ids for input_toks 2"):
        load_vllm_bench(write_jsonl(tmp_path / "workload.jsonl", rows))


def test_vllm_bench_rate_replaces_recorded_times(tmp_path):
    rows = [{"input_toks": 3, "output_toks": 7, "arrival_time_ns": 10**9 * i} for i in range(5)]
    tr = load_vllm_bench(write_jsonl(tmp_path / "w.jsonl", rows), rate=100.0)
    assert tr.specs[-1].arrival_time == pytest.approx(0.05)
    assert any("replaced" in n for n in tr.notes)


def test_sharegpt_json_first_human_and_gpt_turns(tmp_path):
    data = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "hello world foo"},
                {"from": "gpt", "value": "a b"},
                {"from": "human", "value": "ignored later turn"},
            ],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
        {
            "id": "c",
            "conversations": [
                {"from": "system", "value": "x"},
                {"from": "human", "value": "one"},
                {"from": "gpt", "value": " ".join(["w"] * 10)},
            ],
        },
        {"id": "d", "prompt_len": 300, "output_len": 25, "conversations": []},
    ]
    path = tmp_path / "ShareGPT_V3.json"
    path.write_text(json.dumps(data, indent=2))
    tr = load_trace(path, rate=math.inf)
    assert tr.format == "sharegpt" and tr.num_rows == 4
    # round(1.3 * words): 3 words → 4 tokens, 2 → 3, 1 → 1, 10 → 13
    assert [(s.request_id, s.prompt_len, s.output_len) for s in tr.specs] == [
        ("a", 4, 3),
        ("c", 1, 13),
        ("d", 300, 25),
    ]
    assert all(s.arrival_time == 0.0 for s in tr.specs)  # rate inf: all at once, like vllm bench
    assert any("1 conversations without" in n for n in tr.notes)
    with pytest.raises(ConfigError, match="rate="):
        load_trace(path)


def test_sharegpt_bad_entry_names_entry(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": 3}]}]))
    with pytest.raises(TraceFormatError, match=r"s\.json: entry 0: conversations: turn from 'human'"):
        load_vllm_bench(path, rate=1.0)


def test_vllm_random_ranges_and_shared_prefix():
    tr = vllm_random(200, input_len=100, output_len=10, range_ratio=0.5, prefix_len=32, rate=math.inf, seed=7)
    body = np.array([s.prompt_len - 32 for s in tr.specs])
    out = np.array([s.output_len for s in tr.specs])
    assert body.min() >= 50 and body.max() <= 150 and out.min() >= 5 and out.max() <= 15
    assert body.min() < 60 and body.max() > 140  # both ends of the range are reached
    assert tr.specs[0].segments[0][1] == 32
    st = trace_stats(tr, block_size=16)
    assert st["prefix_shared_frac"] == pytest.approx(199 / 200)  # all but the first reuse 2 blocks
    fixed = vllm_random(5, input_len=64, output_len=8, rate=1.0)
    assert {(s.prompt_len, s.output_len) for s in fixed.specs} == {(64, 8)}
    with pytest.raises(ConfigError, match="range_ratio"):
        vllm_random(5, range_ratio=1.0, rate=1.0)


# ---- dispatch ---------------------------------------------------------------------------------------


def test_sniff_each_format(tmp_path):
    assert sniff_format(write_azure(tmp_path / "x.csv", AZURE_2023)) == "azure"
    assert sniff_format(write_lines(tmp_path / "y.csv", [BURST_HEADER, *BURST_ROWS])) == "burstgpt"
    assert sniff_format(write_lines(tmp_path / "z.csv", STATS_CSV)) == "token-counts"
    assert sniff_format(write_jsonl(tmp_path / "m.jsonl", MOONCAKE_ROWS)) == "mooncake"
    assert (
        sniff_format(write_jsonl(tmp_path / "v.jsonl", [{"input_toks": 1, "output_toks": 1}])) == "vllm-bench"
    )
    rows = [{"arrival_time": 0.5, "prompt_len": 4, "output_len": 2}]
    assert sniff_format(write_jsonl(tmp_path / "s.jsonl", rows)) == "jsonl"
    with pytest.raises(TraceFormatError, match="unrecognised trace header"):
        sniff_format(write_lines(tmp_path / "q.csv", ["a,b", "1,2"]))


def test_unknown_format_and_misplaced_option(tmp_path):
    path = write_azure(tmp_path / "a.csv", AZURE_2023)
    with pytest.raises(UnknownNameError, match="unknown trace format 'parquet'"):
        load_trace(path, format="parquet")
    with pytest.raises(ConfigError, match="'model' does not apply to format 'azure'"):
        load_trace(path, model="GPT-4")
    with pytest.raises(TraceFormatError, match="missing column 'Request tokens'"):
        load_trace(path, format="burstgpt")


def test_servesim_jsonl_is_delegated_and_gets_the_shared_options(tmp_path):
    rows = [
        {"arrival_time": 1.0, "prompt_len": 4, "output_len": 2, "request_id": "x", "priority": 3},
        {
            "arrival_time": 3.0,
            "prompt_len": 40,
            "output_len": 2,
            "request_id": "y",
            "segments": [["sys", 40]],
        },
    ]
    tr = load_trace(write_jsonl(tmp_path / "run.jsonl", rows), time_scale=0.5, max_prompt_len=16)
    assert tr.format == "jsonl"
    assert spec_table(tr) == [("x", 0.5, 4, 2), ("y", 1.5, 16, 2)]
    assert tr.specs[0].priority == 3 and tr.specs[1].segments == (("sys", 16),)
    assert tr.num_clipped == 1


# ---- shared options ---------------------------------------------------------------------------------


def _even_trace(tmp_path: Path, n: int = 10) -> Path:
    rows = [
        {"timestamp": 1000 * i, "input_length": 100 + i, "output_length": 10 + i, "hash_ids": [i, 99]}
        for i in range(n)
    ]
    return write_jsonl(tmp_path / "even.jsonl", rows)


def test_window_rebases_to_start(tmp_path):
    tr = load_mooncake(_even_trace(tmp_path), start=2.5, end=6)
    assert spec_table(tr) == [("3", 0.5, 103, 13), ("4", 1.5, 104, 14), ("5", 2.5, 105, 15)]
    assert len(load_mooncake(_even_trace(tmp_path), end=3)) == 3  # [0, 3): 0, 1, 2


def test_time_scale_and_rate_scale(tmp_path):
    path = _even_trace(tmp_path)
    half = [s.arrival_time for s in load_mooncake(path, time_scale=0.5).specs]
    assert half == pytest.approx([0.5 * i for i in range(10)])
    assert [s.arrival_time for s in load_mooncake(path, rate_scale=2).specs] == pytest.approx(half)
    with pytest.raises(ConfigError, match="time_scale or rate_scale, not both"):
        load_mooncake(path, time_scale=0.5, rate_scale=2)
    with pytest.raises(ConfigError, match="time_scale: must be > 0"):
        load_mooncake(path, time_scale=0)


def test_sample_fraction_count_and_seed(tmp_path):
    path = _even_trace(tmp_path, 20)
    a = load_mooncake(path, sample=0.5, seed=1)
    assert len(a) == 10
    t = [s.arrival_time for s in a.specs]
    assert t == sorted(t)
    assert spec_table(load_mooncake(path, sample=0.5, seed=1)) == spec_table(a)
    assert spec_table(load_mooncake(path, sample=0.5, seed=2)) != spec_table(a)
    assert len(load_mooncake(path, sample=3)) == 3
    assert len(load_mooncake(path, sample=1.0)) == 20
    with pytest.raises(ConfigError, match="fraction must be in"):
        load_mooncake(path, sample=1.5)


def test_limit_after_window(tmp_path):
    tr = load_mooncake(_even_trace(tmp_path), start=4, limit=2)
    assert [s.request_id for s in tr.specs] == ["4", "5"]


def test_clip_options_count_and_cut_content(tmp_path):
    path = _even_trace(tmp_path)
    tr = load_mooncake(path, max_prompt_len=105, max_output_len=12)
    assert [s.prompt_len for s in tr.specs] == [100, 101, 102, 103, 104, 105, 105, 105, 105, 105]
    assert [s.output_len for s in tr.specs][:4] == [10, 11, 12, 12]
    assert tr.num_clipped == 7  # rows 3..9: outputs 13+ (and prompts 106+ from row 6)
    tr = load_mooncake(path, max_model_len=112)
    assert all(s.prompt_len + s.output_len <= 112 for s in tr.specs)
    assert (tr.specs[9].prompt_len, tr.specs[9].output_len) == (109, 3)
    assert tr.specs[0].hash_ids == (0,)  # 100 tokens need one 512-token block id
    rows = [{"input_toks": 4, "output_toks": 9, "arrival_time_ns": 0, "input_tok_ids": [1, 2, 3, 4]}]
    tr = load_vllm_bench(write_jsonl(tmp_path / "w.jsonl", rows), max_model_len=6)
    assert tr.specs[0].token_ids == (1, 2, 3, 4) and tr.specs[0].output_len == 2
    tr = load_vllm_bench(write_jsonl(tmp_path / "w.jsonl", rows), max_prompt_len=2)
    assert tr.specs[0].token_ids == (1, 2)


def test_unknown_option_lists_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"'max_len' does not apply.*valid: .*max_model_len"):
        load_mooncake(_even_trace(tmp_path), max_len=3)


# ---- stats ------------------------------------------------------------------------------------------


def test_trace_stats_on_a_hand_made_trace():
    specs = [
        RequestSpec("a", 0.0, 1024, 5, hash_ids=(1, 2)),
        RequestSpec("b", 1.0, 1024, 6, hash_ids=(1, 3)),
        RequestSpec("c", 3.0, 30, 7),
        RequestSpec("d", 6.0, 1022, 8, hash_ids=(1, 2)),
    ]
    st = trace_stats(LoadedTrace(specs=specs, num_skipped=2, num_clipped=1, num_failed=3, num_rows=9))
    assert st["count"] == 4 and st["duration_s"] == 6.0 and st["mean_rate_rps"] == pytest.approx(0.5)
    gaps = np.array([1.0, 2.0, 3.0])
    cv = gaps.std() / gaps.mean()
    assert st["interarrival_cv"] == pytest.approx(cv) and st["gamma_shape"] == pytest.approx(1 / cv**2)
    assert st["gamma_shape"] == pytest.approx(6.0)
    assert st["prompt_len_mean"] == pytest.approx(775.0) and st["prompt_len_max"] == 1024
    assert st["prompt_len_p50"] == pytest.approx(1023.0)
    assert st["output_len_p90"] == pytest.approx(7.7) and st["output_len_p99"] == pytest.approx(7.97)
    assert st["has_prefix_identity_frac"] == 0.75
    # b reuses block 1 of a; d reuses block 1 only (its 1022 tokens hold one full 512 block)
    assert st["prefix_shared_frac"] == 0.5
    assert st["ideal_prefix_hit_ratio"] == pytest.approx(1024 / 3100)
    assert (st["num_rows"], st["num_skipped"], st["num_clipped"], st["num_failed"]) == (9, 2, 1, 3)
    json.dumps(st)  # JSON-ready


def test_trace_stats_degenerate():
    st = trace_stats(LoadedTrace(specs=[RequestSpec("a", 2.0, 3, 4)]))
    assert st["count"] == 1 and st["mean_rate_rps"] is None and st["interarrival_cv"] is None
    assert st["prompt_len_p99"] == 3.0
    assert trace_stats(LoadedTrace(specs=[]))["prompt_len_mean"] is None


# ---- the real files (skipped without ../shared) ------------------------------------------------------


def _real(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path} absent")
    return path


def test_real_azure_conv():
    tr = load_trace(_real(TRACES / "AzureLLMInferenceTrace_conv.csv"))
    st = trace_stats(tr)
    assert tr.format == "azure" and st["count"] == 19366 and tr.num_skipped == 0
    # data/README.md: ~1 h, ~5.5 req/s; inputs mean 1155 / P99 4142, outputs mean 211 / P99 601
    assert st["prompt_len_mean"] == pytest.approx(1155, abs=1) and st["prompt_len_p99"] == pytest.approx(4142)
    assert st["output_len_mean"] == pytest.approx(211, abs=1) and st["output_len_p99"] == pytest.approx(601)
    assert 3400 < st["duration_s"] < 3700 and st["mean_rate_rps"] == pytest.approx(5.5, abs=0.1)


def test_real_mooncake():
    tr = load_trace(_real(TRACES / "mooncake_synthetic_trace.jsonl"))
    st = trace_stats(tr)
    assert tr.format == "mooncake" and st["count"] == 3993
    assert all(s.hash_ids and s.hash_block_size == 512 for s in tr.specs)
    assert 0.60 < st["ideal_prefix_hit_ratio"] < 0.70  # data/README.md: ideal prefix hit ratio ~64%


def test_real_sharegpt_stats():
    tr = load_trace(_real(TRACES / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"), rate=10.0)
    assert tr.format == "token-counts" and len(tr) == 30731
    assert tr.specs[-1].arrival_time == pytest.approx(30731 / 10.0)


def test_real_e2e_workload():
    tr = load_trace(_real(E2E))
    assert tr.format == "vllm-bench" and len(tr) == 300
    assert all(s.token_ids is not None and len(s.token_ids) == s.prompt_len for s in tr.specs)
    assert 25 < tr.specs[-1].arrival_time < 35  # 300 requests at ~10 req/s
