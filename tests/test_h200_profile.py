"""The shipped H200 SXM profile: fitted by the h200-sxm recipe from servesim's own measurements, which ship with
the package (sim/cost/data/microbench/h200-sxm), so nothing here needs ../shared."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim.cli.calibrate import main
from sim.cost.calibrate import opmodel
from sim.cost.calibrate.fit import ape, fit_profile
from sim.cost.calibrate.recipes import (
    DATA_ROOTS,
    H200_FIT_MODELS,
    H200_HELD_OUT_MODELS,
    Recipe,
    fit_recipe,
    get_recipe,
    h200_sources,
    load_recipe_data,
    recipe_base,
    recipe_command,
)
from sim.cost.hardware import get_gpu
from sim.cost.profiles import PROFILE_DIR, CalibrationProfile, get_profile, prior_profile
from tests.test_calibrate_importers import assert_same_profile_json

ROOT = Path(__file__).resolve().parents[1]
GPU = get_gpu("H200 SXM")
SHIPPED = PROFILE_DIR / "h200-sxm.json"


@pytest.fixture(scope="module")
def refit():
    return fit_recipe("h200-sxm")


def _held_out_gemms():
    rec = Recipe("held-out", "H200 SXM", h200_sources(H200_HELD_OUT_MODELS, ("gemm",)), data="package")
    return load_recipe_data(rec).samples


def test_recipe_reads_the_packaged_data_only():
    recipe = get_recipe("h200-sxm")
    root = DATA_ROOTS[recipe.data]
    assert root == ROOT / "sim" / "cost" / "data" / "microbench"
    assert recipe_command("h200-sxm") == "servesim fit --recipe h200-sxm --out sim/cost/data/profiles/h200-sxm.json"
    assert recipe_command("h100-sxm").startswith("servesim fit --recipe h100-sxm --data ../shared/data/microbench")
    # every file the recipe reads is in the package data (pyproject.toml), so an installed servesim can refit it
    pats = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sim.cost"]
    for src in recipe.sources:
        for f in (root / src.path, (root / src.path).parent / "meta.json"):
            rel = f.relative_to(ROOT / "sim" / "cost")
            assert f.is_file() and any(rel.match(p) and len(rel.parts) == len(Path(p).parts) for p in pats), rel
    # the TP shards are not fitted: they are the held-out shapes
    assert not {s.path.split("/")[1] for s in recipe.sources} & set(H200_HELD_OUT_MODELS)


def test_cli_recipe_rebuilds_the_shipped_file_without_data(tmp_path):
    out = tmp_path / "h200-sxm.json"
    assert main(["fit", "--recipe", "h200-sxm", "--out", str(out)]) == 0
    new, shipped = json.loads(out.read_text()), json.loads(SHIPPED.read_text())
    assert_same_profile_json(new, shipped)  # the tolerance the other recipes are held to
    for k in ("sources", "groups", "fit_command", "base", "from_base", "frozen", "recipe"):
        assert new["metadata"][k] == shipped["metadata"][k], k


def test_get_profile_returns_the_fitted_file(refit):
    p = get_profile(GPU)
    assert p.source == "fitted" and p.gpu == "H200 SXM" and p.metadata["recipe"] == "h200-sxm"
    for k, v in refit[0].to_dict().items():
        if isinstance(v, float):
            assert getattr(p, k) == pytest.approx(v, rel=1e-4, abs=1e-12), k
    assert get_profile(GPU, "prior") == prior_profile(GPU)


def test_which_terms_come_from_where(refit):
    p, res, _ = refit
    h100 = CalibrationProfile.load(PROFILE_DIR / "h100-sxm.json")
    prior = prior_profile(GPU)
    assert recipe_base(get_recipe("h200-sxm")) == replace(h100, gpu="H200 SXM", description="")
    # fitted here: the GEMM roofline and decode eta_kv
    assert res.groups["gemm"]["status"] == "fitted" and res.groups["attn_decode"]["status"] == "fitted"
    assert 0.6 < p.eta_compute < 0.85 and p.eta_compute != h100.eta_compute
    assert 0.85 < p.eta_kv < 0.99  # a physical fraction of 4.8 TB/s, not pinned at a bound
    # decode fixed costs and every prefill term: the H100 fit's (FlashInfer), not SDPA's
    for k in ("attn_t0_s", "attn_per_seq_s", "attn_ctx_pad_tokens", "eta_fa", "prefill_kv_floor",
              "prefill_kv_sat_tokens", "prefill_causal_ramp_tokens", "prefill_chunk_t0_s"):
        assert getattr(p, k) == getattr(h100, k), k
    # elementwise, sampler, mixed batches, engine overheads, all-reduce: the Hopper prior (= the H100 file's)
    for k in ("eta_elementwise", "layer_fixed_s", "step_elementwise_fixed_s", "sampler_t0_s",
              "sampler_bytes_per_elem", "mixed_decode_gqa_reread", "step_overhead_s", "per_seq_overhead_s",
              "allreduce_model", "allreduce_latency_s", "cuda_graph_sizes"):
        assert getattr(p, k) == getattr(prior, k) == getattr(h100, k), k


def test_decode_fixed_costs_reset_not_frozen(refit):
    """Frozen at the H100 fixed cost (18.6 µs), the fit would push eta_kv to its bound to make SDPA's small
    calls (~5-10 µs) fit; fitted with its own fixed costs and then reset, eta_kv is the unconstrained fit's."""
    recipe = get_recipe("h200-sxm")
    bench = load_recipe_data(recipe)
    bench.samples = bench.samples[bench.samples.op == "attn_decode"]
    base = recipe_base(recipe)
    frozen = fit_profile(bench, GPU, base, freeze=recipe.from_base).profile
    free = fit_profile(bench, GPU, base).profile
    assert frozen.eta_kv > 0.99
    assert refit[0].eta_kv == pytest.approx(free.eta_kv, rel=1e-9)
    assert free.attn_t0_s < 10e-6 < refit[0].attn_t0_s


def test_held_out_tp_shard_gemms(refit):
    """GEMMs of Llama-2-70B TP4 and CodeLlama-34B TP2 shards, shapes the fit never saw (it reads TP1 models).

    Bound 8 %: the shipped terms give 6.2 % (in-sample on TP1 6.4-7.4 % per model); 8 % leaves room for a refit
    with other numpy/scipy versions and stays under the prior's 12.0 %. The fitted terms must also beat both
    alternatives on the same rows (H100's transplanted 7.8 %, the prior's 12.0 %)."""
    g = _held_out_gemms()
    assert len(g) == 230 and set(g.file.str.split("/").str[1]) == set(H200_HELD_OUT_MODELS)
    meas = g["time_s"].to_numpy()

    def mape(p):
        return float(ape(opmodel.predict(p, GPU, g), meas).mean())

    shipped = mape(refit[0])
    assert shipped < 0.08
    assert shipped < mape(recipe_base(get_recipe("h200-sxm"))) and shipped < mape(prior_profile(GPU))
    assert np.isfinite(shipped) and set(H200_FIT_MODELS).isdisjoint(H200_HELD_OUT_MODELS)
