"""Bad input through the Python API (a notebook's calls) and the config checks a second fuzz round found
missing (2026-12-05): each raises a ServesimError subclass with one line naming what was wrong, never an
AttributeError or TypeError from deep inside; and the valid calls that used to fail now run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.core.errors import ServesimError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401
from tests.test_bad_inputs_part3 import BASE  # one small A100 config, its [workload] last

ROOT = Path(__file__).resolve().parents[1]
Q = str(ROOT / "examples" / "quickstart.toml")
SMALL = {"workload": {"num_requests": 10}}


def _api_cases():
    import servesim
    from sim.app.cluster import simulate_cluster
    from sim.app.config import config_from_dict, load_config
    from sim.app.simulate import simulate

    cfg = {"workload": {"num_requests": 5}}
    return [
        ("run-list", lambda: servesim.run([1, 2]), ["config must be", "list"]),
        ("run-bytes", lambda: servesim.run(b"x.toml"), ["bytes"]),
        ("run-int", lambda: servesim.run(5), ["int"]),
        ("config-list", lambda: config_from_dict([1]), ["dict of tables", "list"]),
        ("config-none", lambda: config_from_dict(None), ["NoneType"]),
        ("config-int-key", lambda: config_from_dict({1: {}}), ["key 1", "string keys"]),
        ("config-nested-int-key", lambda: config_from_dict({"engine": {1: 2}}), ["engine", "key 1"]),
        ("simulate-dict", lambda: simulate(cfg), ["RunConfig", "dict"]),
        ("simulate-path", lambda: simulate(Q), ["RunConfig", "str"]),
        ("cluster-none", lambda: simulate_cluster(None), ["cluster config", "NoneType"]),
        ("cluster-runconfig", lambda: simulate_cluster(config_from_dict(cfg)), ["RunConfig", "simulate"]),
        ("compare-overrides-str", lambda: servesim.compare(ROOT / "tests" / "data" / "runs" / "vllm_bench_result.json",
                                                            overrides="engine.max_num_seqs=4"), ["overrides", "str"]),
        ("compare-overrides-list-of-dicts", lambda: servesim.compare("r.json", overrides=[{"engine": 1}]),
         ["not a string"]),
        ("compare-max-per-stage-str", lambda: servesim.compare("r.json", max_per_stage="5"), ["max_per_stage", "'5'"]),
        ("compare-max-per-stage-float", lambda: servesim.compare("r.json", max_per_stage=2.5), ["max_per_stage"]),
        ("compare-profile-int", lambda: servesim.compare("r.json", profile=5), ["profile", "int"]),
        ("size-slo-list", lambda: servesim.size(Q, slo=[1]), ["SLOs", "list"]),
        ("size-slo-str", lambda: servesim.size(Q, slo="p99_ttft:1000"), ["SLOs", "str"]),
        ("size-seqs-int", lambda: servesim.size(Q, max_num_seqs=4), ["max_num_seqs", "int"]),
        ("size-seqs-str", lambda: servesim.size(Q, max_num_seqs="8,16"), ["max_num_seqs", "str"]),
        ("load-config-none", lambda: load_config(None), ["load_config", "NoneType"]),
        ("load-config-dict", lambda: load_config({}), ["load_config", "dict"]),
    ]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("i", range(22))
def test_api_bad_input_is_a_servesim_error(i):
    name, call, fragments = _api_cases()[i]
    with pytest.raises(ServesimError) as exc:
        call()
    msg = str(exc.value)
    assert "\n" not in msg, (name, msg)
    for f in fragments:
        assert f in msg, (name, f, msg)


def test_api_case_count():
    assert len(_api_cases()) == 22


def test_run_merges_into_a_file_or_a_loaded_config():
    """A file without [cost] took cost={...} as None.update; frontend={"enabled": False} clashed with the
    front end's filled-in defaults: both were valid calls."""
    import servesim

    for config in (Q, servesim.load_config(Q)):
        assert len(servesim.run(config, cost={"gpu_hour_usd": 2.0}, **SMALL).requests) == 10
        res = servesim.run(config, frontend={"enabled": False}, **SMALL)
        assert len(res.requests) == 10 and res.config.frontend is None  # off: no front end


def test_compare_overrides_take_numpy_scalars():
    from servesim import _set_strings

    assert _set_strings({"engine": {"max_num_seqs": np.int64(8), "gpu_memory_utilization": np.float32(0.5)}}) == \
        ["engine.max_num_seqs=8", "engine.gpu_memory_utilization=0.5"]
    assert _set_strings({"workload": {"rate": float("inf")}}) == ["workload.rate=inf"]  # TOML's inf, not JSON's


# ---- config checks, through the CLI ---------------------------------------------------------------------
PD = """[cluster]
router = "round-robin"
[[replica]]
name = "p"
role = "prefill"
{p}
[[replica]]
name = "d"
role = "decode"
"""

CLI_CASES = [
    ("pd-model-mismatch", PD.format(p='model = { name = "Mistral-7B" }'), ["'p' and 'd'", "model"]),
    ("pd-block-size-mismatch", PD.format(p="engine = { block_size = 32 }").replace(
        'role = "decode"', 'role = "decode"\nengine = { block_size = 16 }'), ["block_size 32 vs 16"]),
    ("pd-kv-dtype-mismatch", PD.format(p='engine = { kv_cache_dtype = "fp8" }').replace(
        'role = "decode"', 'role = "decode"\nengine = { kv_cache_dtype = "bf16" }'), ["kv_cache_dtype 'fp8' vs 'bf16'"]),
    ("stream-name-list", '[cluster]\nreplicas = 2\n[[stream]]\nname = [1]\nrate = 1.0\nnum_requests = 5\n'
                         'prompt = 10\noutput = 5\n', ["[[stream]] #1", "name [1]"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,body,fragments", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_config_checks_one_line_exit_2(name, body, fragments, tmp_path, capsys):
    text = BASE if "[[stream]]" not in body else BASE.split("[workload]")[0]
    p = tmp_path / "c.toml"
    p.write_text(text + body)
    run_bad_case(["run", str(p)], fragments, capsys)


@pytest.mark.usefixtures("no_simulation")
def test_empty_trace_path_names_the_field(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text(BASE.split("[workload]")[0] + '[workload]\ntrace = ""\n')
    run_bad_case(["run", str(p)], ["workload.trace", "''"], capsys)


def test_pd_replicas_that_agree_once_resolved_run(tmp_path):
    """An alias of the same model, the preset's block size given on one side only (the other takes it by
    default), the model's own KV dtype named on one side and "auto" on the other: not a mismatch."""
    from sim.app.cluster_config import load_cluster

    for p in ('model = { name = "llama-3.1-8b" }', "engine = { block_size = 16 }",
              'engine = { kv_cache_dtype = "bf16" }', 'engine = { kv_cache_dtype = "bfloat16" }'):
        path = tmp_path / "c.toml"
        path.write_text(BASE + PD.format(p=p))
        assert len(load_cluster(path)[""].replicas) == 2


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("p,fragments", [
    ('engine = { kv_cache_dtype = "fp8" }', ["kv_cache_dtype 'fp8' vs 'auto' (= 'bf16')"]),
    ("engine = { block_size = 32 }", ["block_size 32 vs 16 (the vllm preset's default)"]),
], ids=["fp8-vs-auto", "block-32-vs-default"])
def test_pd_replicas_that_differ_once_resolved_are_refused(p, fragments, tmp_path, capsys):
    """One side's value against the other's default: fp8 KV cannot be read as the decode side's bf16 KV,
    32-token blocks not as 16-token ones."""
    path = tmp_path / "c.toml"
    path.write_text(BASE + PD.format(p=p))
    run_bad_case(["run", str(path)], ["'p' and 'd'", *fragments], capsys)


def test_run_takes_numpy_scalars_as_numbers():
    import servesim

    res = servesim.run(Q, engine={"max_num_seqs": np.int64(8), "gpu_memory_utilization": np.float64(0.85)},
                       workload={"num_requests": np.int32(10)})
    assert len(res.requests) == 10 and res.config.engine.max_num_seqs == 8


def test_size_takes_any_sequence_of_max_num_seqs():
    """A range or a numpy array is a list of candidates (the type check must not refuse them)."""
    from sim.app.config import load_config
    from sim.app.sizing import candidate_grid

    cfg = load_config(Q)
    for seqs in ([4, 8], range(4, 9, 4), np.array([4, 8])):
        assert [c["engine.max_num_seqs"] for c in candidate_grid(cfg, seqs, None)] == [4, 8]
