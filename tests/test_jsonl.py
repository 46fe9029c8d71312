"""The servesim JSONL trace: round trips, ordering, id assignment, malformed rows, skipping, clipping."""

from __future__ import annotations

import json

import pytest

from sim.core.errors import TraceFormatError
from sim.core.request import RequestSpec
from workloads.tracefmt.jsonl import LoadedTrace, load_jsonl, save_jsonl


def write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


SPECS = [
    RequestSpec("a", 0.0, 5, 3),
    RequestSpec("b", 0.5, 4, 2, priority=1, session_id="s1", token_ids=(1, 2, 3, 4)),
    RequestSpec("c", 1.25, 1000, 7, hash_ids=(11, 12), hash_block_size=512),
    RequestSpec("d", 2.0, 40, 9, segments=((("sys", 3), 32), (("u", "d"), 8)), output_key=("o", "d")),
    RequestSpec("e", 2.0, 3, 1, priority=-2),
]


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip_all_content_kinds(tmp_path, name):
    path = tmp_path / name
    assert save_jsonl(SPECS, path) == len(SPECS)
    loaded = load_jsonl(path)
    assert isinstance(loaded, LoadedTrace)
    assert loaded.specs == SPECS  # exact: floats via repr, keys list → tuple
    assert (loaded.num_skipped, loaded.num_clipped) == (0, 0)
    assert loaded.specs[3].shares_content and loaded.specs[3].segments[0][0] == ("sys", 3)
    # LoadedTrace behaves like the list of specs.
    assert len(loaded) == 5 and loaded[1] == SPECS[1] and list(loaded) == SPECS


def test_written_rows_leave_out_defaults(tmp_path):
    save_jsonl(SPECS[:1], tmp_path / "t.jsonl")
    row = json.loads((tmp_path / "t.jsonl").read_text())
    assert row == {"request_id": "a", "arrival_time": 0.0, "prompt_len": 5, "output_len": 3}


def test_sorted_by_arrival_stable_and_missing_ids_numbered_in_arrival_order(tmp_path):
    p = write(
        tmp_path / "t.jsonl",
        [
            {"arrival_time": 3.0, "prompt_len": 1, "output_len": 1},
            {"arrival_time": 1.0, "prompt_len": 2, "output_len": 1},
            "",
            {"arrival_time": 1.0, "prompt_len": 3, "output_len": 1, "request_id": "x"},
            {"arrival_time": 0, "prompt_len": 4.0, "output_len": 1},
        ],
    )
    specs = load_jsonl(p).specs
    assert [s.prompt_len for s in specs] == [4, 2, 3, 1]  # ties at t=1 keep file order
    assert [s.request_id for s in specs] == ["r0", "r1", "x", "r3"]


def test_prompt_len_may_be_omitted_with_token_ids(tmp_path):
    p = write(tmp_path / "t.jsonl", [{"arrival_time": 0, "output_len": 2, "token_ids": [9, 8, 7]}])
    (s,) = load_jsonl(p).specs
    assert s.prompt_len == 3 and s.token_ids == (9, 8, 7)


GOOD = {"arrival_time": 0.5, "prompt_len": 10, "output_len": 5}


@pytest.mark.parametrize(
    "row, field",
    [
        ('{"arrival_time": 0.5, "prompt_len": 10,', "(json)"),
        ("[1, 2]", "(row)"),
        ({"arrival_time": 0.5, "prompt_len": 10}, "output_len"),
        ({"prompt_len": 10, "output_len": 5}, "arrival_time"),
        ({"arrival_time": 0.5, "output_len": 5}, "prompt_len"),
        ({**GOOD, "prompt_len": -3}, "prompt_len"),
        ({**GOOD, "output_len": 0}, "output_len"),
        ({**GOOD, "prompt_len": "10"}, "prompt_len"),
        ({**GOOD, "prompt_len": 10.5}, "prompt_len"),
        ({**GOOD, "prompt_len": True}, "prompt_len"),
        ({**GOOD, "arrival_time": -1}, "arrival_time"),
        ({**GOOD, "arrival_time": "noon"}, "arrival_time"),
        ({**GOOD, "request_id": 7}, "request_id"),
        ({**GOOD, "session_id": 7}, "session_id"),
        ({**GOOD, "priority": "high"}, "priority"),
        ({**GOOD, "token_ids": [1, 2]}, "prompt_len"),
        ({**GOOD, "prompt_len": 2, "token_ids": [1, "a"]}, "token_ids"),
        ({**GOOD, "hash_ids": [1]}, "hash_block_size"),
        ({**GOOD, "hash_block_size": 16}, "hash_block_size"),
        ({**GOOD, "hash_ids": [1], "hash_block_size": 0}, "hash_block_size"),
        ({**GOOD, "prompt_len": 2, "token_ids": [1, 2], "hash_ids": [1], "hash_block_size": 16}, "hash_ids"),
        ({**GOOD, "segments": [["sys", 4]]}, "segments"),
        ({**GOOD, "segments": [[{"a": 1}, 10]]}, "segments"),
        ({**GOOD, "promt_len": 10}, "promt_len"),
    ],
)
def test_malformed_row_names_file_line_and_field(tmp_path, row, field):
    p = write(tmp_path / "bad.jsonl", [GOOD, row, GOOD])
    with pytest.raises(TraceFormatError) as e:
        load_jsonl(p)
    msg = str(e.value)
    assert f"{p}:2:" in msg
    assert f"field '{field}'" in msg


def test_duplicate_request_id(tmp_path):
    p = write(
        tmp_path / "t.jsonl", [{**GOOD, "request_id": "q"}, {**GOOD, "request_id": "q", "arrival_time": 9}]
    )
    with pytest.raises(
        TraceFormatError, match=r"t\.jsonl:2: field 'request_id': duplicate 'q' \(first on line 1\)"
    ):
        load_jsonl(p)


def test_skip_bad_rows_counts_and_keeps_the_good_ones(tmp_path):
    p = write(
        tmp_path / "t.jsonl",
        [GOOD, "not json", {**GOOD, "output_len": -1}, {**GOOD, "arrival_time": 1.0}, {"arrival_time": 2}],
    )
    loaded = load_jsonl(p, skip_bad_rows=True)
    assert len(loaded.specs) == 2 and [s.arrival_time for s in loaded.specs] == [0.5, 1.0]
    assert loaded.num_skipped == 3
    assert len(loaded.errors) == 3 and ":2:" in loaded.errors[0] and ":5:" in loaded.errors[2]


def test_extra_fields_can_be_ignored(tmp_path):
    p = write(tmp_path / "t.jsonl", [{**GOOD, "model": "llama"}])
    with pytest.raises(TraceFormatError, match="field 'model'"):
        load_jsonl(p)
    assert len(load_jsonl(p, extra="ignore").specs) == 1


def test_max_model_len_clips_and_counts(tmp_path):
    p = write(
        tmp_path / "t.jsonl",
        [
            {"arrival_time": 0, "prompt_len": 10, "output_len": 5},  # fits
            {"arrival_time": 1, "prompt_len": 90, "output_len": 50},  # output clipped to 10
            {"arrival_time": 2, "output_len": 5, "token_ids": list(range(120))},  # prompt to 99, output 1
            {
                "arrival_time": 3,
                "prompt_len": 200,
                "output_len": 5,
                "hash_ids": [1, 2, 3, 4],
                "hash_block_size": 64,
            },
            {"arrival_time": 4, "prompt_len": 120, "output_len": 3, "segments": [["sys", 64], ["u", 56]]},
        ],
    )
    loaded = load_jsonl(p, max_model_len=100)
    s = loaded.specs
    assert loaded.num_clipped == 4
    assert all(x.prompt_len + x.output_len <= 100 for x in s)
    assert (s[0].prompt_len, s[0].output_len) == (10, 5)
    assert (s[1].prompt_len, s[1].output_len) == (90, 10)
    assert s[2].token_ids == tuple(range(99)) and s[2].output_len == 1
    assert s[3].prompt_len == 99 and s[3].hash_ids == (1, 2)  # ceil(99/64) ids still cover the prompt
    assert s[4].segments == (("sys", 64), ("u", 35))


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="no such trace file"):
        load_jsonl(tmp_path / "nope.jsonl")


def test_unwritable_content_key(tmp_path):
    spec = RequestSpec("z", 0.0, 4, 1, segments=((frozenset({1}), 4),))
    with pytest.raises(TraceFormatError, match="request z"):
        save_jsonl([spec], tmp_path / "t.jsonl")
