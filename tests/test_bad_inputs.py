"""Bad input at the edges: one clear line on stderr naming the field and the value, exit code 2, no
traceback, and nothing simulated first (issue 13). Each case is run in-process through the CLI's main(),
so any exception other than a ServesimError fails the test with its traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.helpers import small_toml

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "examples" / "quickstart.toml")
SEED = str(ROOT / "examples" / "seed_24gb.toml")
SIZING = str(ROOT / "examples" / "sizing_7b_24gb.toml")

SMALL = small_toml(20, 60)

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
}
BIN = "\x00BIN"  # marker: write bytes that are not UTF-8 / not JSON


def _hf(tmp: Path, **changes) -> str:
    cfg = dict(LLAMA)
    cfg.update(changes)
    p = tmp / "config.json"
    p.write_text(json.dumps(cfg).replace('"INF"', "1e400"))
    return str(p)


def _small(tmp: Path) -> str:
    p = tmp / "small.toml"
    p.write_text(SMALL)
    return str(p)


# (id, argv builder (tmp -> argv), fragments the one line must contain)
CASES = [
    # numbers
    ("num_requests-1e12", lambda t: ["run", QUICK, "--set", "workload.num_requests=1e12"],
     ["num_requests", "1000000000000"]),
    ("sim-num_requests-huge", lambda t: ["run", QUICK, "--set", "simulation.num_requests=100000000000"],
     ["num_requests", "100000000000"]),
    ("overhead_gib-nan", lambda t: ["run", QUICK, "--set", "engine.overhead_gib=nan"], ["overhead_gib", "nan"]),
    ("overhead_gib-neg", lambda t: ["run", QUICK, "--set", "engine.overhead_gib=-1"], ["overhead_gib", "-1"]),
    ("overhead_gib-inf", lambda t: ["run", QUICK, "--set", "engine.overhead_gib=inf"], ["overhead_gib", "inf"]),
    ("seed-neg", lambda t: ["run", QUICK, "--set", "simulation.seed=-1"], ["seed", "-1"]),
    ("constant_step_s-inf", lambda t: ["run", QUICK, "--set", "engine.cost_model=\"constant\"",
                                       "--set", "engine.constant_step_s=inf"], ["constant_step_s", "inf"]),
    ("constant_step_s-1e300", lambda t: ["run", QUICK, "--set", "engine.cost_model=\"constant\"",
                                         "--set", "engine.constant_step_s=1e300"], ["constant_step_s", "1e+300"]),
    ("constant_step_s-nan", lambda t: ["run", QUICK, "--set", "engine.constant_step_s=nan"],
     ["constant_step_s", "nan"]),
    # a knob of another cost model: it would change nothing
    ("constant_step_s-roofline", lambda t: ["run", QUICK, "--set", "engine.constant_step_s=0.5"],
     ["constant_step_s = 0.5", "'roofline'", 'cost_model = "constant"']),
    ("vllm-args-bad-quantization", lambda t: ["run", QUICK, "--vllm-args", "-q bogusquant"],
     ["--quantization 'bogusquant'", "not a vLLM quantization method", "gptq"]),
    ("gpu_memory_utilization-nan", lambda t: ["run", QUICK, "--set", "engine.gpu_memory_utilization=nan"],
     ["gpu_memory_utilization", "nan"]),
    ("queue_timeout_s-inf", lambda t: ["run", QUICK, "--set", "engine.queue_timeout_s=inf"],
     ["queue_timeout_s", "inf"]),
    ("horizon-nan", lambda t: ["run", QUICK, "--set", "simulation.horizon=nan"], ["horizon", "nan"]),
    ("lognormal-std-1e300", lambda t: ["run", QUICK, "--set",
                                       'workload.prompt={dist="lognormal",mean=1000,std=1e300}'], ["std", "1e+300"]),
    ("lognormal-mean-1e300", lambda t: ["run", QUICK, "--set",
                                        'workload.prompt={dist="lognormal",mean=1e300,std=1}'], ["mean", "1e+300"]),
    ("normal-mean-1e300", lambda t: ["run", QUICK, "--set",
                                     'workload.prompt={dist="normal",mean=1e300,std=1}'], ["mean", "1e+300"]),
    ("rate-nan", lambda t: ["run", QUICK, "--set", "workload.rate=nan"], ["rate", "nan"]),
    ("slo-nan", lambda t: ["run", QUICK, "--set", "slo.ttft_ms=nan"], ["ttft_ms", "nan"]),
    ("plan-usable-gib-nan", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", "RTX 4090",
                                       "--usable-gib", "nan"], ["--usable-gib", "nan"]),
    ("plan-usable-gib-inf", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", "RTX 4090",
                                       "--usable-gib", "inf"], ["--usable-gib", "inf"]),
    ("plan-overhead-gib-nan", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", "RTX 4090",
                                         "--overhead-gib", "nan"], ["--overhead-gib", "nan"]),
    ("plan-util-nan", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", "RTX 4090",
                                 "--gpu-memory-utilization", "nan"], ["gpu_memory_utilization", "nan"]),
    # HF config.json
    ("hf-heads-0", lambda t: ["plan", "--model", _hf(t, num_attention_heads=0), "--gpu", "H100"],
     ["num_attention_heads", "0"]),
    ("hf-hidden-string", lambda t: ["plan", "--model", _hf(t, hidden_size="4096"), "--gpu", "H100"],
     ["hidden_size", "'4096'"]),
    ("hf-layers-list", lambda t: ["plan", "--model", _hf(t, num_hidden_layers=[32]), "--gpu", "H100"],
     ["num_hidden_layers", "[32]"]),
    ("hf-vocab-1e400", lambda t: ["plan", "--model", _hf(t, vocab_size="INF"), "--gpu", "H100"],
     ["vocab_size", "inf"]),
    ("hf-layers-neg", lambda t: ["plan", "--model", _hf(t, num_hidden_layers=-4), "--gpu", "H100"],
     ["num_hidden_layers", "-4"]),
    ("hf-inter-float", lambda t: ["plan", "--model", _hf(t, intermediate_size=14336.5), "--gpu", "H100"],
     ["intermediate_size", "14336.5"]),
    ("hf-kv-heads-not-dividing", lambda t: ["plan", "--model", _hf(t, num_key_value_heads=5), "--gpu", "H100"],
     ["num_key_value_heads", "5", "32"]),
    ("hf-kv-heads-more", lambda t: ["plan", "--model", _hf(t, num_key_value_heads=64), "--gpu", "H100"],
     ["num_key_value_heads", "64"]),
    ("hf-bool-heads", lambda t: ["plan", "--model", _hf(t, num_attention_heads=True), "--gpu", "H100"],
     ["num_attention_heads", "True"]),
    ("hf-binary", lambda t: ["plan", "--model", _binary(t, "config.json"), "--gpu", "H100"], ["config.json"]),
    ("hf-via-run", lambda t: ["run", QUICK, "--set", f'model.name="{_hf(t, num_attention_heads=0)}"'],
     ["num_attention_heads", "0"]),
    # files
    ("config-not-utf8", lambda t: ["run", _binary(t, "bad.toml")], ["bad.toml", "UTF-8"]),
    ("out-is-a-file", lambda t: ["run", _small(t), "--out", _file(t)], ["--out", "afile"]),
    ("out-under-a-file", lambda t: ["run", _small(t), "--out", _file(t) + "/sub"], ["--out", "afile"]),
    ("size-out-is-a-file", lambda t: ["size", SIZING, "--out", _file(t)], ["--out", "afile"]),
    # silently ignored
    ("sarathi-chunk_size-0", lambda t: ["run", _small(t), "--set", 'engine.policy="sarathi"',
                                        "--set", "engine.chunk_size=0"], ["chunk_size", "0"]),
    ("trtllm-max_batch_size-0", lambda t: ["run", _small(t), "--set", 'engine.policy="trtllm"',
                                           "--set", "engine.max_batch_size=0"], ["max_batch_size", "0"]),
    ("static-max_new_tokens-0", lambda t: ["run", _small(t), "--set", 'engine.policy="static"',
                                           "--set", "engine.max_new_tokens=0"], ["max_new_tokens", "0"]),
    ("block_size-7", lambda t: ["run", QUICK, "--set", "engine.block_size=7"], ["block_size", "7", "16"]),
    ("block_size-512", lambda t: ["run", QUICK, "--set", "engine.block_size=512"], ["block_size", "512", "256"]),
    ("size-min-attainment-2", lambda t: ["size", SIZING, "--min-attainment", "2"], ["--min-attainment", "2"]),
    ("size-min-attainment-nan", lambda t: ["size", SIZING, "--min-attainment", "nan"],
     ["--min-attainment", "nan"]),
    ("size-level-1", lambda t: ["size", SIZING, "--level", "1"], ["--level", "1"]),
    ("size-replications-0", lambda t: ["size", SIZING, "--replications", "0"], ["--replications", "0"]),
    ("size-tol-nan", lambda t: ["size", SIZING, "--tol", "nan"], ["--tol", "nan"]),
    # traces
    ("trace-hash_ids-count", lambda t: ["trace", "stats", _trace(t, hash_ids=[1, 2, 3, 4])],
     ["hash_ids", "4", "2"]),
    ("trace-hash_ids-too-few", lambda t: ["trace", "stats", _trace(t, hash_ids=[1])], ["hash_ids", "1"]),
    ("dist-table", lambda t: ["run", QUICK, "--set", "workload.prompt={dist={x=1}}"], ["dist", "{'x': 1}"]),
    ("dist-list", lambda t: ["run", QUICK, "--set", "workload.output={dist=[1]}"], ["dist", "[1]"]),
]


def _binary(tmp: Path, name: str) -> str:
    p = tmp / name
    p.write_bytes(b"\xff\xfe\x00\x01binary\x80\x81")
    return str(p)


def _file(tmp: Path) -> str:
    p = tmp / "afile"
    p.write_text("x")
    return str(p)


def _trace(tmp: Path, **row) -> str:
    base = {"request_id": "a", "arrival_time": 0.0, "prompt_len": 20, "output_len": 5, "hash_block_size": 16}
    p = tmp / "t.jsonl"
    p.write_text(json.dumps({**base, **row}) + "\n")
    return str(p)


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail if an engine is started: bad input must be caught before the clock starts."""
    import sim.app.simulate as simulate_mod

    def boom(*a, **k):
        raise AssertionError("an engine ran before the input was checked")

    monkeypatch.setattr(simulate_mod, "Engine", boom)


def run_bad_case(argv: list[str], fragments: list[str], capsys) -> None:
    """``servesim ARGV`` in-process: exit code 2, one line on stderr holding every fragment, no traceback."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])


@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2(name, argv, fragments, tmp_path, capsys, no_simulation):
    run_bad_case(argv(tmp_path), fragments, capsys)


# ---- valid inputs that used to fail, and the counts -------------------------------------------------


def _counts(summary: dict) -> int:
    return sum(summary[f"num_{k}"] for k in ("finished", "rejected", "in_flight", "not_arrived"))


@pytest.mark.parametrize("kind", ["closed", "sessions", "open"])
def test_counts_add_up_with_a_horizon(kind, tmp_path, capsys):
    """finished + rejected + in flight + not arrived = the workload, for a closed loop cut by the horizon
    too (seed_24gb with horizon 30 used to report 45 of 256)."""
    if kind == "closed":
        argv = ["run", SEED, "--set", "simulation.horizon=30", "--json"]
        expected = 256
    elif kind == "sessions":
        p = tmp_path / "sessions.toml"
        p.write_text(SMALL.split("[workload]")[0] + """
[workload]
kind = "sessions"
num_sessions = 30
num_clients = 4
turns = 3
message = { dist = "uniform", low = 50, high = 200 }
output = { dist = "uniform", low = 20, high = 80 }
think_time = 1.0
[simulation]
horizon = 5
""")
        argv = ["run", str(p), "--json"]
        expected = None
    else:
        argv = ["run", QUICK, "--set", "simulation.horizon=20", "--json"]
        expected = 300
    rc = main(argv)
    out, err = capsys.readouterr()
    if rc == 2 and kind == "sessions":
        pytest.skip(f"sessions keys differ: {err.strip()}")
    assert rc == 0, err
    s = json.loads(out)
    assert _counts(s) == s["num_requests"]
    if expected is not None:
        assert s["num_requests"] == expected
    assert s["num_not_arrived"] + s["num_in_flight"] > 0


def test_servesim_jsonl_with_hash_ids_is_not_mooncake(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    rows = [{"request_id": f"r{i}", "arrival_time": i * 0.1, "prompt_len": 40, "output_len": 4,
             "hash_ids": [1, 2, 3 + i], "hash_block_size": 16} for i in range(5)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["trace", "stats", str(p)]) == 0, capsys.readouterr().err


def test_run_json_into_head_prints_no_broken_pipe():
    cmd = (f"{sys.executable} -m sim.cli.main run {QUICK} --set workload.num_requests=30 --json | head -n 2")
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert len(r.stdout.splitlines()) == 2
    assert "BrokenPipe" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_out_checked_before_simulating(tmp_path, capsys, no_simulation):
    """A writable --out passes the check (the engine stub then stops the run) and the check makes nothing:
    the writers make the directory once there is something to write, so a refused input leaves no trace."""
    with pytest.raises(AssertionError, match="engine ran"):
        main(["run", _small(tmp_path), "--out", str(tmp_path / "new" / "dir")])
    assert not (tmp_path / "new").exists()
    assert main(["run", _small(tmp_path), "--out", str(tmp_path / "bad"), "--set", "workload.rate=-1"]) == 2
    assert "workload.rate" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_trtllm_defaults_fit_llama_8b_on_a_4090():
    """TensorRT-LLM profiles with dummy context requests (one logits row each), not 2048 sampler rows:
    its defaults (max_batch_size 2048, max_num_tokens 8192) fit an 8B model on 24 GB."""
    from sim.app.config import config_from_dict
    from sim.app.simulate import resolve

    setup = resolve(config_from_dict({"model": {"name": "Llama-3.1-8B"}, "hardware": {"gpu": "RTX 4090"},
                                      "engine": {"policy": "trtllm", "max_model_len": 8192}}))
    assert setup.memory.activation_bytes < 1.5 * 2**30  # the forward over 8192 tokens, ~1 GiB
    assert setup.limits.num_gpu_blocks > 1000
