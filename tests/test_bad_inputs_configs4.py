"""The hostile corpus, fourth round on configs (2026-12-05): counts past int64 in a sessions workload
(a traceback), engine limits TGI refuses at start-up (max_batch_total_tokens below max_total_tokens), preset
counts past int32, think_dist without think_time, repeated priority levels, and messages that named the
wrong field (max_model_len 1, a NaN preset knob, an empty model name, a [[stream]]'s own error). Each
ends in exit code 2 and one line before any engine runs; what must still work is beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401
from tests.test_bad_inputs_part3 import BASE  # one small A100 config, its [workload] last

ENGINE = BASE.split("[workload]")[0]  # [model], [hardware], [engine] (max_model_len 4096)
SESSIONS = """[workload]
kind = "sessions"
num_sessions = 4
rate = 1.0
turns = 2
message = 50
output = 10
"""
CLOSED = """[workload]
kind = "closed"
num_clients = 2
num_requests = 6
prompt = 50
output = 10
"""
BIG = 2**64


def _engine(extra: str) -> str:
    return ENGINE.replace("[engine]\n", "[engine]\n" + extra + "\n") + BASE[BASE.index("[workload]"):]


CASES = [
    ("sessions-system-prompts-past-int64", ENGINE + SESSIONS + f"system_prompt = {{num_prompts = {BIG}, len = 10}}\n",
     ["workload.system_prompt.num_prompts", str(BIG), "at most"]),
    ("sessions-system-prompt-len-past-any-length", ENGINE + SESSIONS + f"system_prompt = {{num_prompts = 2, len = {BIG}}}\n",
     ["workload.system_prompt.len", "at most"]),
    ("sessions-think_dist-without-think_time", ENGINE + SESSIONS + 'think_dist = "fixed"\n',
     ["think_dist = 'fixed' without think_time"]),
    ("closed-think_dist-without-think_time", ENGINE + CLOSED + 'think_dist = "exponential"\n',
     ["workload.think_dist = 'exponential' without think_time"]),
    ("priority-level-twice", BASE + "priority = {levels = [0, 0]}\n", ["workload.priority.levels", "0 given twice"]),
    ("tgi-max_batch_total_tokens-below-max_total_tokens",
     _engine('policy = "tgi"\nmax_batch_total_tokens = 2048\nmax_batch_prefill_tokens = 1024'),
     ["max_model_len (TGI's max_total_tokens) = 4096", "max_batch_total_tokens = 2048"]),
    ("tgi-max_batch_total_tokens-below-prefill", _engine('policy = "tgi"\nmax_batch_total_tokens = 1024'),
     ["max_batch_prefill_tokens = 4096", "max_batch_total_tokens = 1024"]),
    ("vllm-long_prefill_token_threshold-past-int32", _engine(f"long_prefill_token_threshold = {2**63}"),
     ["[engine] long_prefill_token_threshold", "int32", str(2**63)]),
    ("tgi-max_concurrent_requests-past-int32", _engine(f'policy = "tgi"\nmax_concurrent_requests = {2**40}'),
     ["[engine] max_concurrent_requests", "int32"]),
    ("llamacpp-n_keep-past-int32", _engine(f'policy = "llamacpp"\nn_keep = {-2**40}'), ["[engine] n_keep", "int32"]),
    ("max_model_len-1", BASE.replace("max_model_len = 4096", "max_model_len = 1"),
     ["[engine] max_model_len", "got 1", "2 <= value"]),
    ("watermark-nan", _engine("watermark = nan"), ["[engine] watermark", "finite number", "nan"]),
    ("model-name-empty", BASE.replace('name = "Llama-3.1-8B"', 'name = ""'), ["[model] name", "got ''"]),
    ("stream-bad-rate", ENGINE + '[[stream]]\nname = "a"\nrate = -1.0\nnum_requests = 5\nprompt = 50\noutput = 5\n'
     "[cluster]\nreplicas = 2\n", ["[[stream]] 'a'", "workload.rate", "-1.0"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(("name", "text", "fragments"), CASES, ids=[c[0] for c in CASES])
def test_config_refused_in_one_line(tmp_path, capsys, name, text, fragments):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    run_bad_case(["run", str(cfg)], fragments, capsys)


@pytest.mark.parametrize("text", [
    ENGINE + SESSIONS + "system_prompt = {num_prompts = 3, len = 20}\nthink_time = 1.0\nthink_dist = \"fixed\"\n",
    ENGINE + CLOSED + "think_time = 0.0\nthink_dist = \"fixed\"\n",  # an explicit 0 with its shape is a choice
    _engine('scheduling_policy = "priority"') + "priority = {levels = [0, 1], weights = [1, 1]}\n",
    # a llama.cpp slot shorter than max_model_len: the requests past it are rejected with llama.cpp's 400,
    # each counted with its reason (a policy comparison shares one max_model_len), not refused up front
    _engine('policy = "llamacpp"\nn_ctx = 2048'),
    _engine('policy = "tgi"\nmax_batch_total_tokens = 8192'),
    _engine("long_prefill_token_threshold = 4096"),  # up to max_model_len, as vLLM's SchedulerConfig allows
    BASE.replace("max_model_len = 4096", "max_model_len = 2").replace("prompt = 100", "prompt = 1").replace(
        "output = 10", "output = 1"),
], ids=["sessions-think", "closed-think-0", "priorities", "llamacpp-short-slot", "tgi-total", "threshold-max-model-len",
        "max_model_len-2"])
def test_the_nearest_valid_config_runs(tmp_path, capsys, text):
    from sim.cli.main import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    assert main(["run", str(cfg), "--json"]) == 0, capsys.readouterr().err


def test_tgi_max_batch_total_tokens_without_max_model_len_runs(tmp_path, capsys):
    """TGI checks max_total_tokens against max_batch_total_tokens only where it is given: a config that sets
    the batch total alone (the model's context is the preset's default) runs as it did."""
    from sim.cli.main import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(_engine('policy = "tgi"\nmax_batch_total_tokens = 16000').replace("max_model_len = 4096\n", ""))
    assert main(["run", str(cfg), "--json"]) == 0, capsys.readouterr().err


def test_empirical_length_csv_beside_the_config(tmp_path, monkeypatch, capsys):
    """An empirical distribution's csv is relative to the config file, as a trace is (it was read from the
    current directory)."""
    from sim.cli.main import main

    d = tmp_path / "cfgdir"
    d.mkdir()
    (d / "lens.csv").write_text("a\n40\n60\n80\n")
    wl = ('[workload]\nrate = 2.0\nnum_requests = 5\nprompt = {dist = "empirical", csv = "lens.csv", column = "a"}\n'
          "output = 5\n")
    (d / "c.toml").write_text(ENGINE + wl)
    monkeypatch.chdir(tmp_path)  # not the config's folder
    assert main(["run", str(Path("cfgdir") / "c.toml"), "--json"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["compare", "x" * 5000],
    ["trace", "stats", "x" * 5000],
    ["run", str(Path(__file__).resolve().parents[1] / "examples" / "quickstart.toml"), "--set",
     "workload.trace=" + "x" * 5000],
], ids=["compare", "trace-stats", "run-set-trace"])
def test_a_path_past_the_systems_name_limit_is_one_line(argv, capsys):
    """A 5,000-character name: the OS refuses it when it is first looked at (ENAMETOOLONG, an OSError
    traceback before); now one line naming it, exit 2."""
    run_bad_case(argv, ["path 'xxxx", "5000 characters", "too long"], capsys)


def test_intervals_at_a_level_two_replications_cannot_bound(capsys):
    """99.99 % on two replications: t of thousands, exp past a float (an OverflowError after the runs):
    the bound is unbounded ("-") or printed in e-notation, exit 0."""
    from sim.cli.main import main

    q = str(Path(__file__).resolve().parents[1] / "examples" / "quickstart.toml")
    rc = main(["run", q, "--set", "workload.num_requests=6", "--intervals", "--replications", "2", "--level", "0.9999"])
    out = capsys.readouterr().out
    assert rc == 0 and "99.99 % prediction intervals" in out
    assert max(len(w) for w in out.split()) < 40  # no number printed with a hundred digits
