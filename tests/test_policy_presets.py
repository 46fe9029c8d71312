"""Every engine preset runs by name (``engine.preset``) with its knobs validated (issue 3, "Done when")."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import policy_defaults, policy_names
from sim.app.config import config_from_dict
from sim.app.simulate import resolve, simulate
from sim.cli.main import main
from sim.core.errors import ConfigError

PRESETS = ["vllm", "vllm-v0", "trtllm", "llamacpp", "ollama", "hf-static", "static", "tgi", "orca", "sarathi"]

WORKLOAD = {"num_requests": 24, "rate": 8.0, "prompt": {"dist": "uniform", "low": 20, "high": 600},
            "output": {"dist": "uniform", "low": 5, "high": 80},
            "shared_prefix": {"num_groups": 2, "prefix_len": 64}}  # fmt: skip


def test_every_preset_is_registered():
    assert set(PRESETS) <= set(policy_names())


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_to_completion(preset):
    cfg = config_from_dict({"engine": {"preset": preset, "max_model_len": 2048}, "workload": WORKLOAD})
    res = simulate(cfg)
    df = res.requests
    assert len(df) == 24 and (df["status"] == "finished").all()
    assert (df["num_output_tokens"] == df["output_len"]).all()
    assert res.meta["limits"]["max_model_len"] == 2048


def test_preset_from_the_cli(tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        '[engine]\npreset = "trtllm"\nmax_model_len = 2048\ncapacity_scheduler_policy = "MAX_UTILIZATION"\n'
        '[workload]\nnum_requests = 10\nrate = 5.0\nprompt = {dist = "fixed", value = 100}\n'
        'output = {dist = "fixed", value = 20}\n'
    )
    assert main(["run", str(cfg), "--json", "--set", "engine.max_batch_size=4"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["completed"] == 10
    assert summary["config"]["engine"]["policy"] == "trtllm"
    assert summary["meta"]["limits"]["max_num_seqs"] == 4 and summary["meta"]["limits"]["block_size"] == 32
    assert main(["run", str(cfg), "--set", "engine.n_parallel=4"]) == 2
    assert "n_parallel does not apply to preset 'trtllm'" in capsys.readouterr().err


def test_preset_and_policy_must_agree():
    assert config_from_dict({"engine": {"preset": "tgi"}}).engine.policy == "tgi"
    assert config_from_dict({"engine": {"preset": "tgi", "policy": "tgi"}}).engine.policy == "tgi"
    with pytest.raises(ConfigError, match="disagree"):
        config_from_dict({"engine": {"preset": "tgi", "policy": "vllm"}})


@pytest.mark.parametrize(
    ("engine", "match"),
    [
        (
            {"preset": "vllm", "n_parallel": 4},
            r"n_parallel does not apply to preset 'vllm'; it is a knob of: llamacpp",
        ),
        ({"preset": "vllm", "swap_space": 8.0}, "swap_space does not apply"),
        ({"preset": "vllm", "preemption_mode": "swap"}, "vllm-v0"),
        ({"preset": "llamacpp", "capacity_scheduler_policy": "MAX_UTILIZATION"}, "capacity_scheduler_policy"),
        ({"preset": "trtllm", "max_batch_size": 8, "max_num_seqs": 16}, "same knob"),
        ({"preset": "trtllm", "capacity_scheduler_policy": "FASTEST"}, "capacity_scheduler_policy"),
        ({"preset": "trtllm", "scheduling_policy": "priority"}, "scheduling_policy"),
        ({"preset": "tgi", "waiting_served_ratio": -1.0}, "waiting_served_ratio"),
        ({"preset": "orca", "enable_chunked_prefill": True}, "ORCA-3"),
        ({"preset": "static", "enable_chunked_prefill": True, "max_num_batched_tokens": 8192}, "HF-1"),
        ({"preset": "hf-static", "enable_prefix_caching": True}, "has no prefix cache"),
        ({"preset": "llamacpp", "enable_prefix_caching": True}, "no paged prefix cache.*cache_prompt"),
        ({"preset": "ollama", "enable_chunked_prefill": True}, "num_batch tokens at a time"),
        ({"preset": "sarathi", "enable_chunked_prefill": False}, "SAR-2"),
        ({"preset": "llamacpp", "n_ctx": 10_000_000}, "n_ctx"),
        ({"preset": "ollama", "num_ctx": 4096, "num_parallel": 1000}, "num_ctx x num_parallel"),
        ({"preset": "tgi", "max_batch_total_tokens": 10**9}, "max_batch_total_tokens"),
        ({"preset": "vllm-v0", "swap_space": -1.0}, "swap_space"),
        ({"preset": "nope"}, "unknown policy 'nope'"),
        ({"preset": "tgi", "max_new_tokens": 64}, "max_new_tokens does not apply"),
        ({"preset": "sarathi", "long_prefill_token_threshold": 64}, "long_prefill_token_threshold"),
        ({"preset": "trtllm", "scheduler_reserve_full_isl": False}, "scheduler_reserve_full_isl"),
    ],
)
def test_knob_validation(engine, match):
    with pytest.raises(Exception, match=match) as info:
        from policies.base import make_policy

        s = resolve(config_from_dict({"engine": {"max_model_len": 2048, **engine}}))
        make_policy(s.policy, s.limits, s.options)
    assert "ServesimError" in [c.__name__ for c in type(info.value).__mro__]


def test_wrong_type_names_the_knob():
    with pytest.raises(ConfigError, match=r"\[engine\] n_parallel: expected int"):
        config_from_dict({"engine": {"preset": "llamacpp", "n_parallel": "4"}})


def test_engine_native_aliases_fill_the_limits():
    def lim(**e):
        return resolve(config_from_dict({"engine": {"max_model_len": 2048, **e}})).limits

    t = lim(
        preset="trtllm", max_batch_size=8, max_num_tokens=1024, tokens_per_block=64, enable_block_reuse=False
    )
    assert (t.max_num_seqs, t.max_num_batched_tokens, t.block_size, t.enable_prefix_caching) == (
        8,
        1024,
        64,
        False,
    )
    c = lim(preset="llamacpp", n_parallel=4, n_batch=512)
    assert (c.max_num_seqs, c.max_num_batched_tokens) == (4, 512)
    o = lim(preset="ollama", num_parallel=2, num_batch=256)
    assert (o.max_num_seqs, o.max_num_batched_tokens) == (2, 256)
    g = lim(preset="tgi", max_batch_prefill_tokens=1000)
    assert g.max_num_batched_tokens == 1000
    s = lim(preset="sarathi", chunk_size=256)
    assert s.max_num_batched_tokens == 256


def test_preset_defaults_follow_engines_md():
    assert policy_defaults("trtllm")["block_size"] == 32  # tokens_per_block (§2.1)
    assert policy_defaults("trtllm")["capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT"
    assert policy_defaults("vllm-v0")["watermark"] == 0.01 and policy_defaults("vllm-v0")["swap_space"] == 4.0
    assert policy_defaults("sarathi")["max_num_batched_tokens"] == 512  # chunk_size
    assert policy_defaults("sarathi")["max_num_seqs"] == 128
    tgi = policy_defaults("tgi")
    assert (tgi["max_concurrent_requests"], tgi["waiting_served_ratio"], tgi["max_waiting_tokens"]) == (
        128,
        0.3,
        20,
    )
    lc = policy_defaults("llamacpp")
    assert (lc["n_ctx"], lc["max_num_batched_tokens"], lc["max_num_seqs"], lc["slot_prompt_similarity"]) == (
        4096, 2048, 1, 0.5)  # fmt: skip
    ol = policy_defaults("ollama")
    assert (ol["max_num_seqs"], ol["max_queue"], ol["max_num_batched_tokens"], ol["num_keep"]) == (
        1,
        512,
        512,
        4,
    )


# Slot engines (llama.cpp, Ollama) answer quiet() with None: their cache is not the paged pool the
# fast-forward reads, so the fast_forward=True run is the step-by-step path again and the test says so.
NEVER_FAST_FORWARDS = ("llamacpp", "ollama")
FAST_FORWARDS = ("vllm", "vllm-v0", "trtllm", "tgi", "orca", "sarathi")


@pytest.mark.parametrize("preset", FAST_FORWARDS + NEVER_FAST_FORWARDS + ("vllm-async",))
def test_fast_forward_gives_the_same_run(preset):
    """The fast-forward must be exact for a preset: jumping over quiet decode stretches changes nothing; and the
    jump must really happen (or, for a preset that cannot jump, provably not happen). ``vllm`` runs both of its
    loops: synchronous, and async (its default)."""
    from tests.invariants import check_fast_forward_exact, fast_forwarded_steps, run_checked

    raw = {
        "engine": {"preset": preset, "max_model_len": 2048, "num_gpu_blocks_override": 400},
        "workload": WORKLOAD,
    }
    if preset == "vllm":
        raw["engine"]["async_scheduling"] = False
    elif preset == "vllm-async":
        raw["engine"].update(preset="vllm", async_scheduling=True)
    if preset in ("llamacpp", "ollama"):
        del raw["engine"]["num_gpu_blocks_override"]
    cfg = config_from_dict(raw)
    (a, obs_a), (b, obs_b) = run_checked(cfg, fast_forward=True), run_checked(cfg, fast_forward=False)
    exact = ["request_id", "num_output_tokens", "num_preemptions", "status"]
    assert a.requests[exact].equals(b.requests[exact])
    for col in ("first_token_time", "finish_time"):  # summed step by step vs in one go: rounding only
        assert np.allclose(a.requests[col], b.requests[col], rtol=0, atol=1e-9)
    check_fast_forward_exact(a, b)
    # Observable, not policy internals: a step-table row that no schedule() call produced came from a
    # fast-forwarded decode run. Stepping one at a time, every row is a schedule() call.
    assert fast_forwarded_steps(b, obs_b) == 0 and len(b.steps) <= obs_b.schedule_calls
    if preset in NEVER_FAST_FORWARDS:
        assert fast_forwarded_steps(a, obs_a) == 0 and obs_a.schedule_calls == obs_b.schedule_calls, (
            f"{preset} fast-forwards now: move it to FAST_FORWARDS"
        )
    else:
        assert fast_forwarded_steps(a, obs_a) > 0, f"{preset}: no step of the run was fast-forwarded"
        assert obs_a.schedule_calls < obs_b.schedule_calls


specs_strategy = st.lists(
    st.tuples(st.floats(0, 30), st.integers(1, 200), st.integers(1, 60)), min_size=1, max_size=20
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=specs_strategy,
    preset=st.sampled_from(["vllm-v0", "trtllm", "tgi", "orca", "sarathi"]),
    blocks=st.integers(20, 80),
    seqs=st.integers(1, 6),
    option=st.sampled_from(
        [
            {},
            {"preemption_mode": "swap"},
            {"capacity_scheduler_policy": "MAX_UTILIZATION"},
            {"capacity_scheduler_policy": "STATIC_BATCH"},
            {"enable_chunked_prefill": False},
        ]
    ),
)
def test_conservation_across_presets(rows, preset, blocks, seqs, option):
    """Every request ends finished (all its tokens) or rejected with a reason; the KV pool ends empty."""
    import simpy

    from policies.base import make_policy
    from sim.core.request import RequestSpec, Status
    from sim.cost.costmodel import ConstantCostModel
    from sim.engine.loop import Engine
    from sim.engine.recorder import Recorder
    from sim.engine.sources import OpenSource
    from tests.helpers import limits

    defaults = policy_defaults(preset)
    opts = {
        k: v
        for k, v in defaults.items()
        if k
        not in (
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "enable_prefix_caching",
            "enable_chunked_prefill",
        )
    }
    chunked = defaults.get("enable_chunked_prefill", True)
    for k, v in option.items():
        if k == "enable_chunked_prefill":
            chunked = v if preset not in ("sarathi",) else chunked
        elif k in opts:
            opts[k] = v
    if preset == "vllm-v0":
        opts["num_cpu_blocks"] = 10_000
    if preset == "orca":
        chunked = False
    lim = limits(block_size=8, num_gpu_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=512,
                 max_model_len=512, enable_prefix_caching=False, enable_chunked_prefill=chunked)  # fmt: skip
    specs = [RequestSpec(request_id=f"r{i}", arrival_time=t, prompt_len=p, output_len=o)
             for i, (t, p, o) in enumerate(rows)]  # fmt: skip
    env = simpy.Environment()
    pol = make_policy(preset, lim, opts)
    eng = Engine(env, pol, ConstantCostModel(step_s=1.0), OpenSource(specs), Recorder())
    env.run(until=100_000)
    assert len(eng.requests) == len(specs)
    for r in eng.requests:
        if r.status is Status.REJECTED:
            assert r.finish_reason
        else:
            assert r.status is Status.FINISHED and r.num_output_tokens == r.output_len, (
                r.request_id,
                r.status,
            )
    kv = pol.kv
    assert kv.num_free_blocks == kv.usable_blocks and kv.num_cpu_used_blocks == 0
    kv.check_invariants()
