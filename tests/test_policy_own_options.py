"""Adding a policy with its own knobs touches one file (issue 10, item 4): this one.

``fifo-capped`` is vLLM V1's scheduler with a waiting-queue cap, ``max_queue_len``: an arrival that finds
the queue full is rejected. Its options class declares the knob (type, default, validation), its
defaults for the shared limits and an engine-native alias; ``register(..., options=...)`` is all the
wiring. Nothing in sim/ or policies/ knows about it, yet ``[engine] max_queue_len`` works from a config
dict, a TOML file and ``--set``, and a bad value or a misspelled key each give one clear ConfigError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from policies.base import PolicyLimits, policy_defaults, register
from policies.options import PolicyOptions, invalid
from policies.vllm import VllmPolicy
from sim.app.config import config_from_dict, load_config
from sim.app.simulate import simulate
from sim.cli.main import main
from sim.core.errors import ConfigError
from sim.core.request import Request


@dataclass(frozen=True)
class FifoCappedOptions(PolicyOptions):
    LIMITS = {"max_num_seqs": 2, "max_num_batched_tokens": 1024}  # this preset's defaults
    ALIASES = {"max_running": "max_num_seqs"}  # "its engine's" name for a shared limit

    max_queue_len: int = 16

    def validate(self) -> None:
        if self.max_queue_len < 1:
            raise invalid("max_queue_len", self.max_queue_len, ">= 1")


class FifoCappedPolicy(VllmPolicy):
    name = "fifo-capped"

    def __init__(self, limits: PolicyLimits, options: FifoCappedOptions | None = None) -> None:
        super().__init__(limits)
        self.max_queue_len = (options or FifoCappedOptions()).max_queue_len

    def add_request(self, req: Request, now: float) -> str | None:
        if len(self.waiting) >= self.max_queue_len:
            return f"queue full (max_queue_len {self.max_queue_len})"
        return super().add_request(req, now)


@register("fifo-capped", options=FifoCappedOptions)
def _make(limits: PolicyLimits, options: FifoCappedOptions) -> FifoCappedPolicy:
    return FifoCappedPolicy(limits, options)


# ---- the tests --------------------------------------------------------------------------------------
BURST = {"num_requests": 20, "rate": 1000.0, "prompt": {"dist": "fixed", "value": 100},
         "output": {"dist": "fixed", "value": 50}}  # fmt: skip


def run(engine: dict, workload: dict = BURST):
    cfg = config_from_dict({"engine": {"policy": "fifo-capped", "max_model_len": 2048, **engine},
                            "workload": workload})  # fmt: skip
    return simulate(cfg)


def test_the_knob_reaches_the_policy_and_caps_the_queue():
    res = run({"max_queue_len": 3})
    df = res.requests
    assert res.meta["policy_options"] == {"max_queue_len": 3}
    assert res.meta["limits"]["max_num_seqs"] == 2  # the preset's own default for a shared limit
    rejected = df[df["status"] == "rejected"]
    assert len(rejected) > 0 and (rejected["finish_reason"] == "queue full (max_queue_len 3)").all()
    assert (df["status"].isin(["finished", "rejected"])).all()
    # The default (16) admits more of the same burst.
    assert (run({}).requests["status"] == "finished").sum() > (df["status"] == "finished").sum()


def test_defaults_and_alias():
    assert policy_defaults("fifo-capped") == {"max_num_seqs": 2, "max_num_batched_tokens": 1024,
                                              "max_queue_len": 16}  # fmt: skip
    assert run({"max_running": 4}).meta["limits"]["max_num_seqs"] == 4
    with pytest.raises(ConfigError, match="same knob"):
        run({"max_running": 4, "max_num_seqs": 3})


def test_from_toml_and_set(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(
        '[engine]\npolicy = "fifo-capped"\nmax_model_len = 2048\nmax_queue_len = 5\n'
        '[workload]\nnum_requests = 20\nrate = 1000.0\nprompt = {dist = "fixed", value = 100}\n'
        'output = {dist = "fixed", value = 50}\n'
    )
    assert load_config(path).engine.options == {"max_queue_len": 5}
    assert load_config(path, ["engine.max_queue_len=2"]).engine.options == {"max_queue_len": 2}
    assert main(["run", str(path), "--json", "--set", "engine.max_queue_len=1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["config"]["engine"]["max_queue_len"] == 1
    assert summary["meta"]["policy_options"] == {"max_queue_len": 1}
    assert main(["run", str(path), "--set", "engine.max_queue_len=0"]) == 2
    assert capsys.readouterr().err.strip().endswith("[engine] max_queue_len must be >= 1, got 0")


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"max_queue_len": 0}, r"^\[engine\] max_queue_len must be >= 1, got 0$"),
        ({"max_queue_len": "8"}, r"^\[engine\] max_queue_len: expected int, got '8'$"),
        (
            {"max_queue_length": 8},
            r"^\[engine\] unknown key 'max_queue_length' for preset 'fifo-capped'; did you mean "
            r"'max_queue_len'\? \(preset 'fifo-capped' accepts its own knobs: max_queue_len; "
            r"engine-native names: max_running \(= max_num_seqs\); and the shared knobs: policy, ",
        ),
    ],
)
def test_a_bad_value_or_a_misspelled_key_is_one_clear_error(engine, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"engine": {"policy": "fifo-capped", **engine}})


def test_other_presets_refuse_the_knob():
    with pytest.raises(ConfigError, match=r"max_queue_len does not apply to preset 'vllm'; it is a knob "
                                          r"of: fifo-capped"):  # fmt: skip
        config_from_dict({"engine": {"preset": "vllm", "max_queue_len": 4}})


def test_the_cli_finds_a_policy_in_the_users_own_module(tmp_path):
    """``policy = "package.module:name"``: a fresh CLI process imports the module (its @register runs);
    before, a policy registered in the user's own file was "unknown policy" to the CLI."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = tmp_path / "plugin.toml"
    cfg.write_text(
        '[engine]\npolicy = "tests.test_policy_own_options:fifo-capped"\nmax_queue_len = 3\nmax_model_len = 2048\n'
        '[workload]\nnum_requests = 20\nrate = 1000.0\nprompt = {dist = "fixed", value = 100}\n'
        'output = {dist = "fixed", value = 50}\n'
    )
    out = subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(cfg), "--json"], cwd=root,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["config"]["engine"]["policy"] == "fifo-capped" and summary["num_rejected"] > 0
    by_factory = config_from_dict({"engine": {"policy": "tests.test_policy_own_options:_make"}})
    assert by_factory.engine.policy == "fifo-capped"
    for bad, match in (("no_such_module_xyz:fifo-capped", "cannot import module 'no_such_module_xyz'"),
                       ("tests.test_policy_own_options:nope", "registers no policy 'nope'")):
        with pytest.raises(Exception, match=match):
            config_from_dict({"engine": {"policy": bad}})
