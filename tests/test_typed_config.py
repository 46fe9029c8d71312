"""The typed config sections (sim/core/typed.py): pydantic models made from the section dataclasses give
one-line errors with a "did you mean", and `servesim schema` is a JSON Schema the shipped examples pass."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from sim.app.config import EngineConfig, config_from_dict
from sim.app.schema import config_schema, section_schema
from sim.cli.main import main
from sim.core.errors import ConfigError
from sim.core.typed import section_model

ROOT = Path(__file__).resolve().parents[1]
jsonschema = pytest.importorskip("jsonschema")


@pytest.mark.parametrize("raw, line", [
    ({"engine": {"max_num_seq": 4}}, "did you mean 'max_num_seqs'?"),
    ({"simulation": {"sed": 1}}, "[simulation] unknown key 'sed'; did you mean 'seed'? known keys: seed, horizon"),
    ({"hardware": {"tensor_parallel": 2}}, "did you mean 'tensor_parallel_size'?"),
    ({"frontend": {"engine_hop": 0.1}}, "[frontend] unknown key 'engine_hop'; did you mean 'engine_hop_s'?"),
    ({"cost": {"usd": 1}}, "[cost] unknown key 'usd'"),
    ({"simulaton": {}}, "unknown section(s) ['simulaton']; did you mean [simulation]?"),
    ({"engine": {"gpu_memory_utilization": 1.5}},
     "[engine] gpu_memory_utilization: out of range, got 1.5; allowed 0 < value <= 1"),
    ({"engine": {"max_num_seqs": True}}, "[engine] max_num_seqs: expected int or null"),
    ({"engine": {"block_size": 7}}, "[engine] block_size: got 7; allowed 1, 8, 16, 32, 64, 128 or 256"),
    # equal is not enough: pydantic's literal check let 16.0 through as 16 and true as 1 (1-token blocks)
    ({"engine": {"block_size": 16.0}}, "[engine] block_size: got 16.0; allowed 1, 8, 16, 32, 64, 128 or 256"),
    ({"engine": {"block_size": True}}, "[engine] block_size: got True; allowed 1, 8, 16, 32, 64, 128 or 256"),
    ({"engine": {"scheduling_policy": "lifo"}}, "[engine] scheduling_policy: got 'lifo'; allowed 'fcfs' or 'priority'"),
    ({"simulation": {"horizon": float("nan")}},
     "[simulation] horizon: must be a finite number, got nan; allowed 0 < value <= 1e+09 seconds"),
    ({"engine": {"policy": "trtllm", "max_batch_size": "8"}}, "[engine] max_batch_size: expected int, got '8'"),
])  # fmt: skip
def test_bad_values_are_one_line_naming_key_value_and_allowed(raw, line):
    with pytest.raises(ConfigError) as exc:
        config_from_dict(raw)
    msg = str(exc.value)
    assert line in msg and "\n" not in msg, msg


def test_ints_become_floats_and_the_runtime_form_stays_a_dataclass():
    cfg = config_from_dict({"engine": {"gpu_memory_utilization": 1, "max_num_seqs": 8}})
    assert cfg.engine.gpu_memory_utilization == 1.0 and isinstance(cfg.engine.gpu_memory_utilization, float)
    bumped = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, max_num_seqs=16))
    assert bumped.engine.max_num_seqs == 16 and cfg.engine.max_num_seqs == 8
    assert config_from_dict(cfg.to_dict()) == cfg
    assert "options" not in section_model(EngineConfig).model_fields  # the preset's keys are its own model's


def test_policy_options_are_checked_by_their_model():
    with pytest.raises(ConfigError, match=r"^\[engine\] n_parallel: expected int, got 2.5$"):
        config_from_dict({"engine": {"policy": "llamacpp", "n_parallel": 2.5}})
    cfg = config_from_dict({"engine": {"policy": "llamacpp", "n_parallel": 2}})
    assert cfg.engine.options == {"n_parallel": 2}


def _validator() -> object:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_shipped_example_passes_the_schema_and_a_typo_does_not():
    v = _validator()
    examples = sorted((ROOT / "examples").glob("*.toml"))
    assert examples
    for p in examples:
        errors = list(v.iter_errors(tomllib.loads(p.read_text())))
        assert not errors, (p.name, [e.message for e in errors])
    bad = {"engine": {"max_num_seq": 4}, "simulation": {"seed": -1}, "hardware": {"tensor_parallel_size": "2"}}
    msgs = " | ".join(e.message for e in v.iter_errors(bad))
    assert "max_num_seq" in msgs and "-1" in msgs and "'2'" in msgs, msgs


def test_engine_schema_lists_each_presets_knobs_and_who_owns_them():
    props = section_schema("engine")["properties"]
    assert props["max_num_seqs"]["anyOf"][0] == {"minimum": 1, "maximum": 2**31 - 1, "type": "integer"}
    assert "trtllm" in props["max_batch_size"]["description"] and "llamacpp" in props["n_parallel"]["description"]
    assert "vllm" in props["policy"]["enum"]


def test_schema_command_prints_json_and_rejects_an_unknown_section(capsys):
    assert main(["schema", "--section", "simulation"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["properties"]["seed"]["maximum"] == 2**64 - 1 and out["additionalProperties"] is False
    assert main(["schema", "--section", "bogus"]) == 2
    assert "--section 'bogus': not a config section" in capsys.readouterr().err
