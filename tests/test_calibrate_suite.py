"""The PyTorch microbenchmark suite on the CPU (CI smoke test): tiny shapes, seconds, not a GPU profile."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from sim.cli.calibrate import main  # noqa: E402
from sim.cost.calibrate.fit import fit_profile  # noqa: E402
from sim.cost.calibrate.suite import SuiteConfig, measured_spec, run_allreduce, run_suite  # noqa: E402
from sim.cost.profiles import CalibrationProfile  # noqa: E402


def test_cpu_smoke_suite_and_fit():
    bench = run_suite(SuiteConfig(smoke=True, device="cpu"))
    ops = set(bench.samples.op)
    assert {"copy", "gemm", "attn_decode", "attn_prefill", "elementwise_layer", "elementwise_step", "sampler",
            "step_overhead"} <= ops
    assert "allreduce" not in ops  # one device
    assert bench.meta["gpu_profile"] is False and bench.meta["smoke"] is True
    assert bench.meta["torch_version"] == torch.__version__ and bench.meta["device"] == "cpu"
    assert (bench.samples.time_s > 0).all()
    # bigger GEMMs take longer: the timer measures the work, not noise
    g = bench.samples[(bench.samples.op == "gemm") & (bench.samples.name == "gate_up_proj")].sort_values("m")
    assert g.time_s.iloc[-1] > g.time_s.iloc[0]
    spec = measured_spec(bench, bench.gpu)
    res = fit_profile(bench, spec)
    for name in ("eta_compute", "eta_bandwidth", "eta_kv", "eta_fa", "eta_elementwise"):
        assert 0 < getattr(res.profile, name) <= 1
    assert res.groups["step_overhead"]["status"] == "fitted"
    assert res.profile.step_overhead_s > 0


def test_calibrate_cli_smoke_writes_a_marked_profile(tmp_path):
    rc = main(["calibrate", "--smoke", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    assert (tmp_path / "samples.csv").is_file() and (tmp_path / "fit_report.md").is_file()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["gpu_profile"] is False
    [path] = [p for p in tmp_path.glob("*.json") if p.name != "meta.json"]
    prof = CalibrationProfile.load(path)
    assert prof.metadata["gpu_profile"] is False and "NOT a GPU profile" in prof.description
    assert prof.metadata["torch_version"] == torch.__version__
    assert "Held out by shape range" in (tmp_path / "fit_report.md").read_text()
    # the samples it wrote can be refitted by `servesim fit`
    assert main(["fit", str(tmp_path / "samples.csv"), "--gpu", "RTX 4090", "--out", str(tmp_path / "re.json")]) == 0


def test_allreduce_benchmark_runs_over_two_processes():
    res = run_allreduce(2, "gloo", [4096, 1 << 20], iters=3)
    assert [b for b, _ in res] == [4096, 1 << 20]
    assert all(t > 0 for _, t in res)


def test_sdpa_fallback_uses_bottom_right_causal_mask_and_gqa():
    from sim.cost.calibrate.suite import _sdpa

    q, k = torch.randn(1, 8, 4, 32), torch.randn(1, 2, 10, 32)
    got = _sdpa(torch, q, k, k, True)
    kk = k.repeat_interleave(4, 1)
    mask = torch.ones(4, 10, dtype=torch.bool).tril(6)  # query i sees the 6 cached keys and new keys <= i
    ref = torch.nn.functional.scaled_dot_product_attention(q, kk, kk, attn_mask=mask)
    assert torch.allclose(got, ref, atol=1e-5)


def test_sdpa_without_cached_context_and_without_gqa_matches_the_plain_masks():
    from sim.cost.calibrate.suite import _sdpa

    F = torch.nn.functional
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 4, 6, 16)  # S == T: is_causal
    ref = F.scaled_dot_product_attention(q, k, k, attn_mask=torch.ones(6, 6, dtype=torch.bool).tril())
    assert torch.allclose(_sdpa(torch, q, k, k, True), ref, atol=1e-5)
    k2 = torch.randn(2, 4, 9, 16)  # S < T, heads equal: lower-right bias
    ref2 = F.scaled_dot_product_attention(q, k2, k2, attn_mask=torch.ones(6, 9, dtype=torch.bool).tril(3))
    assert torch.allclose(_sdpa(torch, q, k2, k2, True), ref2, atol=1e-5)
    q1 = torch.randn(3, 8, 1, 16)  # decode: one query sees every key
    k3 = torch.randn(3, 2, 9, 16)
    ref3 = F.scaled_dot_product_attention(q1, k3.repeat_interleave(4, 1), k3.repeat_interleave(4, 1))
    assert torch.allclose(_sdpa(torch, q1, k3, k3, True), ref3, atol=1e-5)
