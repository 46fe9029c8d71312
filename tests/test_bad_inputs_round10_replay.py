"""The hostile corpus, tenth round (2026-12-06), the replay of real runs and the trace loaders: a server
setting in meta.json engine_kwargs that the replay dropped (4), a vllm-bench max_model_len its own requests
contradict (6), an arrival_time column dropped without a word (8), a malformed burstiness beside start_times
(10), --set simulation.seed where the replay draws (16), an empty requests.jsonl (24) and servesim JSONL rows
wrapped in one JSON list (25). Bad input: one line, exit 2, before any engine runs; beside each, the nearest
valid input still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.core.errors import ConfigError, TraceFormatError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "tests" / "data" / "runs" / "vllm_bench_result.json"
PROM = REPO / "tests" / "data" / "runs" / "prometheus"
RTX = REPO.parent / "shared" / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"

ROWS = [{"input_toks": 100, "output_toks": 10, "arrival_time": 100.0 + 0.5 * i, "queued_ts": 1000.001 + 0.5 * i,
         "scheduled_ts": 1000.002 + 0.5 * i, "first_token_ts": 1000.02 + 0.5 * i, "last_token_ts": 1000.12 + 0.5 * i}
        for i in range(4)]  # fmt: skip
HW = {"device_name": "NVIDIA H100 80GB HBM3"}


@pytest.fixture
def no_replay(monkeypatch, no_simulation):  # noqa: F811
    """As no_simulation, for the replay's own engine too (sim/app/replay.py builds one directly)."""

    def boom(*a, **k):
        raise AssertionError("a replay ran before the input was checked")

    monkeypatch.setattr("sim.app.replay.Engine", boom)


def _ej(tmp: Path, engine_kwargs: dict | None = None, kv_cache: dict | None = None, rows: list | None = None) -> str:
    """An engine-JSONL run directory: requests.jsonl (ROWS) and meta.json with the given tables."""
    d = tmp / "ej"
    d.mkdir(parents=True, exist_ok=True)
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (ROWS if rows is None else rows)))
    meta = {"model": "meta-llama/Llama-3.1-8B", "hardware": HW, "engine_kwargs": engine_kwargs or {}}
    if kv_cache is not None:
        meta["kv_cache"] = kv_cache
    (d / "meta.json").write_text(json.dumps(meta))
    return str(d)


def _bench(tmp: Path, **changes: object) -> str:
    """The vllm bench result fixture with top-level keys changed (None: removed)."""
    res = json.loads(BENCH.read_text())
    for k, v in changes.items():
        if v is None:
            res.pop(k, None)
        else:
            res[k] = v
    tmp.mkdir(parents=True, exist_ok=True)
    p = tmp / "bench.json"
    p.write_text(json.dumps(res))
    return str(p)


def _prepare(path: str, *overrides: str, seed: int = 0, gpu: str | None = None):
    from sim.app.replay import prepare
    from workloads.runs import load_run

    return prepare(load_run(path, seed=seed), gpu, overrides=list(overrides), max_per_stage=4)


# ---- 4: engine-JSONL meta.json engine_kwargs: every server setting replayed, from either table ---------------
SERVER = {"max_num_seqs": 64, "async_scheduling": False, "enable_chunked_prefill": False,
          "enable_prefix_caching": False, "gpu_memory_utilization": 0.5, "block_size": 32, "max_model_len": 8192}


def test_engine_kwargs_server_settings_are_replayed(tmp_path):
    rep = _prepare(_ej(tmp_path, SERVER))
    eng = rep.settings["engine"]
    for k, v in SERVER.items():
        assert eng[k] == v, (k, eng)
    assert rep.setup.limits.async_scheduling is False
    assert rep.settings["max_num_seqs"] == 64
    # the same pool as the same settings under kv_cache (gmu 0.5, block size 32), not the 0.9 default's
    kv = {k: SERVER.pop(k) for k in ("gpu_memory_utilization", "block_size", "enable_prefix_caching")}
    other = _prepare(_ej(tmp_path / "kv", SERVER, kv))
    assert other.settings["num_gpu_blocks"] == rep.settings["num_gpu_blocks"]
    assert rep.settings["num_gpu_blocks"] < _prepare(_ej(tmp_path / "d", {"max_model_len": 8192}))\
        .settings["num_gpu_blocks"]  # fmt: skip


def test_engine_kwargs_null_is_vllms_default(tmp_path):
    from workloads.runs import load_run

    run = load_run(_ej(tmp_path, {"max_num_seqs": None, "block_size": None, "async_scheduling": None},
                       {"block_size": 16}))  # fmt: skip
    assert run.engine == {"block_size": 16}


@pytest.mark.parametrize("ek,kv,frags", [
    ({"gpu_memory_utilization": 0.5}, {"gpu_memory_utilization": 0.9},
     ["engine_kwargs.gpu_memory_utilization' is 0.5", "kv_cache.gpu_memory_utilization' is 0.9"]),
    ({"num_gpu_blocks_override": 1000}, {"num_gpu_blocks": 2000},
     ["engine_kwargs.num_gpu_blocks_override' is 1000", "kv_cache.num_gpu_blocks' is 2000"]),
])
def test_engine_kwargs_and_kv_cache_disagreeing_are_refused(ek, kv, frags, tmp_path, capsys, no_replay):
    run_bad_case(["compare", _ej(tmp_path, ek, kv), "--max-per-stage", "4"], ["meta.json", *frags], capsys)


def test_block_size_vllm_changed_at_start_up_is_the_one_replayed(tmp_path):
    """vLLM forces a block size some backends need (FlashMLA: 64) over the one it was given: kv_cache holds
    the one it ran with, replayed and said."""
    from workloads.runs import load_run

    run = load_run(_ej(tmp_path, {"block_size": 16, "max_model_len": 8192}, {"block_size": 64}))
    assert run.engine["block_size"] == 64
    assert any("engine_kwargs.block_size 16 but kv_cache.block_size 64" in n for n in run.notes)


@pytest.mark.skipif(not RTX.is_dir(), reason="../shared is absent")
def test_the_real_rtx4090_run_keeps_its_settings():
    """Its given settings as before, then what its resolved_config says vLLM 0.19 ran with (the same as the
    preset's defaults: its figures in the README do not move)."""
    from workloads.runs import load_run

    run = load_run(RTX)
    assert run.engine == {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_model_len": 32768,
                          "kv_cache_dtype": "auto", "block_size": 16, "gpu_memory_utilization": 0.9,
                          "enable_prefix_caching": True, "num_gpu_blocks_override": 2588,
                          "enable_chunked_prefill": True, "async_scheduling": True, "scheduling_policy": "fcfs"}
    assert list(run.engine)[:8] == ["max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_dtype",
                                    "block_size", "gpu_memory_utilization", "enable_prefix_caching",
                                    "num_gpu_blocks_override"]  # fmt: skip


# ---- 6: a recorded max_model_len shorter than a served prompt ------------------------------------------------
def test_bench_max_model_len_below_a_served_prompt_is_refused(tmp_path, capsys, no_replay):
    path = _bench(tmp_path, max_model_len="50")
    run_bad_case(["compare", path, "--max-per-stage", "4"],
                 [path, "'max_model_len': 50", "896-token prompt", "vLLM refuses a prompt longer"], capsys)


def test_engine_jsonl_max_model_len_below_a_served_prompt_is_refused(tmp_path, capsys, no_replay):
    run_bad_case(["compare", _ej(tmp_path, {"max_model_len": 50}), "--max-per-stage", "4"],
                 ["meta.json", "engine_kwargs.max_model_len", "50", "100-token prompt"], capsys)


def test_bench_output_past_its_own_max_model_len_gets_a_true_note(tmp_path):
    """Prompts within the run's max_model_len, prompt + output past it (a count from re-tokenized text can):
    cut to fit, and the note does not tell the user to give a larger one."""
    for mml in (None, "900"):  # the run's own, or a larger one by --set: the counts run over the run's
        sets = () if mml is None else (f"engine.max_model_len={mml}",)
        rep = _prepare(_bench(tmp_path / str(mml), max_model_len="896"), *sets)
        note = next(n for n in rep.run.notes if "cut to fit" in n)
        assert "the run recorded max_model_len 896" in note and "--set engine.max_model_len" not in note, note
    smaller = _prepare(_bench(tmp_path / "s", max_model_len="896"), "engine.max_model_len=600")
    note = next(n for n in smaller.run.notes if "cut to fit" in n)
    assert "the run's own max_model_len was 896: give it with --set engine.max_model_len=896" in note, note


# ---- 8: an arrival_time the format does not define: checked, and said unread ---------------------------------
@pytest.mark.parametrize("body", ["100,20,-1\n50,5,0.5\n", "100,20,nan\n50,5,0.5\n", "100,20,inf\n50,5,0.5\n"])
@pytest.mark.parametrize("rate", [[], ["--rate", "2"]])
def test_token_counts_bad_arrival_time_is_refused(body, rate, tmp_path, capsys):
    p = tmp_path / "tc.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens,arrival_time\n" + body)
    run_bad_case(["trace", "stats", str(p), *rate], [f"{p}:2", "arrival_time", ">= 0"], capsys)


def test_token_counts_arrival_time_is_said_unread(tmp_path, capsys):
    from workloads.tracefmt import load_trace

    p = tmp_path / "tc.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens,arrival_time\n100,20,1\n50,5,0.5\n")
    notes = load_trace(p, rate=2.0).notes
    assert any("'arrival_time' not read" in n and "drawn arrivals" in n for n in notes), notes
    with pytest.raises(ConfigError, match="column 'arrival_time': the token-counts format has no arrival times"):
        load_trace(p)
    p.write_text("num_prefill_tokens,num_decode_tokens\n100,20\n")  # no such column: no such note
    assert not any("arrival_time" in n for n in load_trace(p, rate=2.0).notes)


@pytest.mark.parametrize("t", ["-1", "NaN", "\"3\""])
def test_vllm_bench_jsonl_bad_arrival_time_is_refused(t, tmp_path, capsys):
    p = tmp_path / "vb.jsonl"
    p.write_text(f'{{"input_toks":100,"output_toks":10,"arrival_time":{t}}}\n')
    run_bad_case(["trace", "stats", str(p), "--rate", "1"], [f"{p}:1", "arrival_time", "finite number >= 0"], capsys)


def test_vllm_bench_jsonl_arrival_time_is_said_unread(tmp_path):
    from workloads.tracefmt import load_trace

    p = tmp_path / "vb.jsonl"
    p.write_text('{"input_toks":100,"output_toks":10,"arrival_time":3}\n{"input_toks":50,"output_toks":5,'
                 '"arrival_time":1}\n')  # fmt: skip
    notes = load_trace(p, rate=1.0).notes
    assert sum("'arrival_time' not read" in n for n in notes) == 1, notes
    with pytest.raises(ConfigError, match="field 'arrival_time' is not read: vllm-bench JSONL records"):
        load_trace(p)
    p.write_text('{"input_toks":100,"output_toks":10,"arrival_time":3,"arrival_time_ns":5}\n')
    tr = load_trace(p)
    assert any("arrival_time_ns used" in n for n in tr.notes) and tr.specs[0].arrival_time == 5e-9


# ---- 10: burstiness checked whether or not start_times make it unused ------------------------------------------
@pytest.mark.parametrize("b", ["x", 0, -1, None])
def test_bench_malformed_burstiness_with_start_times_is_refused(b, tmp_path, capsys, no_replay):
    path = _bench(tmp_path) if b is None else _bench(tmp_path, burstiness=b)
    if b is None:  # null: written as such
        res = json.loads(Path(path).read_text())
        res["burstiness"] = None
        Path(path).write_text(json.dumps(res))
    run_bad_case(["compare", path, "--max-per-stage", "4"], [path, "burstiness", "expected a number > 0"], capsys)


def test_bench_good_burstiness_with_start_times_still_loads(tmp_path):
    from workloads.runs import load_run

    assert load_run(_bench(tmp_path, burstiness=0.5)).arrivals == "recorded"


# ---- 16: --set simulation.seed where the replay draws, refused where it would change nothing -------------------
def test_seed_is_used_where_the_replay_draws_arrivals(tmp_path):
    sets = ("engine.max_model_len=8192", "workload.rate=2")
    a, b = (_prepare(str(PROM), *sets, f"simulation.seed={s}", seed=s, gpu="H100") for s in (0, 1))
    assert [s.arrival_time for s in a.specs] != [s.arrival_time for s in b.specs]
    assert b.settings["seed"] == 1
    # a run read with another seed is read again with the one given: the same replay as the command's
    c = _prepare(str(PROM), *sets, "simulation.seed=1", gpu="H100")
    assert [(s.arrival_time, s.prompt_len, s.output_len) for s in c.specs] == \
        [(s.arrival_time, s.prompt_len, s.output_len) for s in b.specs]  # fmt: skip
    bench = _bench(tmp_path, start_times=None)  # arrivals redrawn by the loader
    d, e = (_prepare(bench, f"simulation.seed={s}", seed=s) for s in (0, 7))
    assert [s.arrival_time for s in d.specs] != [s.arrival_time for s in e.specs]


def test_seed_on_the_command_line(capsys):
    from sim.cli.main import main

    rc = main(["compare", str(PROM), "--gpu", "H100", "--set", "engine.max_model_len=8192", "--set",
               "workload.rate=2", "--set", "simulation.seed=3", "--max-per-stage", "4", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(out)["settings"]["seed"] == 3
    assert "seed 3" in " ".join(json.loads(out)["run"]["notes"])  # the drawn lengths, from the same seed


@pytest.mark.parametrize("value", ["-1", "1.5", "x", "true"])
def test_bad_seed_is_refused(value, capsys, no_replay):
    run_bad_case(["compare", str(PROM), "--gpu", "H100", "--set", "workload.rate=2", "--set",
                  f"simulation.seed={value}"], ["simulation.seed", "an integer from 0"], capsys)  # fmt: skip


def test_seed_where_nothing_is_drawn_is_refused(tmp_path, capsys, no_replay):
    run_bad_case(["compare", str(BENCH), "--set", "simulation.seed=1"],
                 ["simulation.seed", "not used by a replay", "nothing in this one is drawn"], capsys)
    run_bad_case(["compare", _ej(tmp_path), "--set", "simulation.seed=1"], ["not used by a replay"], capsys)


# ---- 24: an empty requests.jsonl is said to be empty ----------------------------------------------------------
@pytest.mark.parametrize("body", ["", "\n  \n"])
def test_empty_requests_jsonl_is_said_empty(body, tmp_path, capsys, no_replay):
    d = Path(_ej(tmp_path))
    (d / "requests.jsonl").write_text(body)
    run_bad_case(["compare", str(d)], [str(d / "requests.jsonl"), "empty (no requests)"], capsys)
    run_bad_case(["compare", str(d / "requests.jsonl")], ["requests.jsonl", "empty"], capsys)


# ---- 25: JSONL rows in one JSON list are not ShareGPT -------------------------------------------------------
@pytest.mark.parametrize("row,kind", [({"arrival_time": 0, "prompt_len": 3, "output_len": 5}, "servesim JSONL"),
                                      ({"input_toks": 3, "output_toks": 5}, "vllm-bench JSONL")])
@pytest.mark.parametrize("rate", [[], ["--rate", "1"]])
def test_jsonl_rows_in_a_json_list_are_refused(row, kind, rate, tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps([row, row]))
    run_bad_case(["trace", "stats", str(p), *rate], [str(p), f"a JSON list of {kind} rows",
                                                     "one JSON object per line"], capsys)  # fmt: skip


def test_sharegpt_lists_still_load(tmp_path):
    from workloads.tracefmt import load_trace

    conv = {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]}
    p = tmp_path / "sg.json"
    p.write_text(json.dumps([conv, {"prompt_len": 7, "output_len": 3}]))
    assert [s.prompt_len for s in load_trace(p, rate=1.0).specs] == [3, 7]
    q = tmp_path / "sg.jsonl"  # vLLM reads a ShareGPT list whatever its name
    q.write_text(json.dumps([conv]))
    assert load_trace(q, rate=1.0).format == "sharegpt"
    r = tmp_path / "rows.json"  # servesim rows in a list are refused under any name
    r.write_text(json.dumps([{"arrival_time": 1, "prompt_len": 2, "output_len": 2}]))
    with pytest.raises(TraceFormatError, match="a JSON list of servesim JSONL rows"):
        load_trace(r, rate=1.0)


# ---- 4, continued: resolved_config.scheduler_config, what vLLM ran with ---------------------------------------
def _with_resolved(d: str, scheduler: dict) -> str:
    meta = json.loads((Path(d) / "meta.json").read_text())
    meta["resolved_config"] = {"scheduler_config": scheduler, "cache_config": {"anything": 1}}
    (Path(d) / "meta.json").write_text(json.dumps(meta))
    return d


def test_resolved_scheduler_config_is_replayed_and_wins(tmp_path):
    """A run that left async scheduling and chunking unset ran its version's defaults, which its meta.json
    dumps (resolved_config.scheduler_config): those are replayed, the resolved value over a given one."""
    d = _with_resolved(_ej(tmp_path, {"max_num_seqs": 64, "max_model_len": 8192}),
                       {"async_scheduling": False, "enable_chunked_prefill": True, "max_num_seqs": 48,
                        "max_num_batched_tokens": 1024, "policy": "fcfs", "stream_interval": 1})  # fmt: skip
    from workloads.runs import load_run

    run = load_run(d)
    assert run.engine["async_scheduling"] is False and run.engine["max_num_seqs"] == 48
    assert run.engine["max_num_batched_tokens"] == 1024 and run.engine["scheduling_policy"] == "fcfs"
    assert any("max_num_seqs 64 given, 48 resolved" in n for n in run.notes)
    rep = _prepare(d)
    assert rep.setup.limits.async_scheduling is False and rep.setup.limits.max_num_seqs == 48


@pytest.mark.parametrize("scheduler,frag", [({"async_scheduling": "yes"}, "scheduler_config.async_scheduling"),
                                            ({"max_num_seqs": 0}, "scheduler_config.max_num_seqs"),
                                            ({"policy": "lifo"}, "scheduler_config.policy")])  # fmt: skip
def test_resolved_scheduler_config_bad_values_are_refused(scheduler, frag, tmp_path, capsys, no_replay):
    run_bad_case(["compare", _with_resolved(_ej(tmp_path), scheduler), "--gpu", "H100 SXM"], ["meta.json", frag],
                 capsys)


# ---- the review of round 10 ---------------------------------------------------------------------------------
def test_a_bench_prompt_a_few_tokens_past_max_model_len_is_cut_not_refused(tmp_path, capsys, no_replay):
    """vllm bench counts prompts with its own tokenizer: a few tokens over the server's max_model_len (at most
    max(16, 1 %)) are the tokenizers' difference, cut to fit in a note; well past it, the file contradicts
    itself."""
    from workloads.runs import load_run

    res = json.loads(BENCH.read_text())
    res["input_lens"][0], res["output_lens"][0] = 8192 + 16, 1
    ok = tmp_path / "over.json"
    ok.write_text(json.dumps(res))
    rep = _prepare(str(ok))
    assert any("cut to fit" in n and "client-side counts" in n for n in rep.run.notes), rep.run.notes
    res["input_lens"][0] = 8192 + 100
    bad = tmp_path / "far.json"
    bad.write_text(json.dumps(res))
    with pytest.raises(TraceFormatError, match="8292-token prompt"):
        load_run(str(bad))


@pytest.mark.parametrize("given,want", [("8k", 8000), ("8K", 8192), ("auto", -1)])
def test_bench_metadata_max_model_len_in_vllms_spellings(given, want, tmp_path):
    from workloads.runs import load_run

    assert load_run(_bench(tmp_path, max_model_len=given)).engine["max_model_len"] == want


@pytest.mark.parametrize("key,asked,resolved", [("max_model_len", -1, 40960), ("kv_cache_dtype", "auto", "fp8")])
def test_engine_jsonl_values_that_ask_vllm_to_choose_take_the_resolved_one(key, asked, resolved, tmp_path):
    """-1 (the longest that fits) and auto (the model's dtype) ask vLLM to choose at start-up: kv_cache's value
    beside one is what it ran with, not a contradiction."""
    from workloads.runs import load_run

    ek = {"max_model_len": 8192, key: asked}
    run = load_run(_ej(tmp_path, ek, {key: resolved}))
    assert run.engine[key] == resolved
    assert any(f"engine_kwargs.{key}" in n and "resolved to" in n for n in run.notes)
