"""Importers of the public microbenchmark formats (small files in tmp_path, then the real shared files), and
`servesim fit` on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.cli.calibrate import main
from sim.core.errors import ConfigError, TraceFormatError
from sim.cost.calibrate.importers import (
    gpu_name,
    load_blis_attention,
    load_layers_csv,
    load_llmservingsim,
    load_path,
    load_vidur_attention,
    load_vidur_mlp,
    sniff,
)
from sim.cost.calibrate.recipes import RECIPES, fit_recipe
from sim.cost.profiles import PROFILE_DIR, CalibrationProfile

SHARED = Path(__file__).resolve().parents[2] / "shared"
MICRO = SHARED / "data" / "microbench"
needs_shared = pytest.mark.skipif(not MICRO.is_dir(), reason="../shared microbench data absent")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def lss_dir(tmp_path) -> Path:
    base = tmp_path / "perf/RTX4090/meta-llama/Llama-3.1-8B/bf16"
    write(base / "meta.yaml", "vllm_version: 0.19.0\ncuda_version: '12.8'\ngpu: NVIDIA GeForce RTX 4090\n"
          "model: meta-llama/Llama-3.1-8B\nengine_effective:\n  tensor_parallel_size: 1\n")
    d = base / "tp2"
    rows = ["layer,tokens,time_us"]
    for m in (1, 16):
        for layer, t in (("qkv_proj", 30.0), ("o_proj", 20.0), ("gate_up_proj", 120.0), ("down_proj", 60.0),
                         ("layernorm", 2.0), ("rotary_emb", 2.5), ("act_fn", 3.0), ("embedding", 3.0),
                         ("final_layernorm", 2.0)):
            rows.append(f"{layer},{m},{t * (1 + m / 100)}")
    write(d / "dense.csv", "\n".join(rows) + "\n")
    write(d / "attention.csv", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,0,0,1.0\n"
          "0,0,4,1024,40.0\n128,512,0,0,30.0\n128,512,4,1024,70.0\n")
    write(d / "per_sequence.csv", "layer,sequences,time_us\nlm_head,1,560.0\nsampler,1,25.0\nsampler,8,30.0\n")
    return d


def test_llmservingsim_tables(lss_dir):
    assert sniff(lss_dir / "dense.csv") == "llmservingsim"
    mb = load_llmservingsim(lss_dir)
    s = mb.samples
    assert mb.gpu == "RTX 4090" and mb.meta["tp"] == 2 and mb.meta["vllm_version"] == "0.19.0"
    g = s[s.op == "gemm"].set_index(["name", "m"])
    # TP-2 rank shapes: 16 query / 4 KV heads of 128, intermediate 7168, vocab 64128
    assert tuple(g.loc[("qkv_proj", 1), ["k", "n"]]) == (4096, (16 + 8) * 128)
    assert tuple(g.loc[("gate_up_proj", 16), ["k", "n"]]) == (4096, 2 * 7168)
    assert tuple(g.loc[("down_proj", 1), ["k", "n"]]) == (7168, 4096)
    assert tuple(g.loc[("lm_head", 1), ["k", "n"]]) == (4096, 128256 / 2)
    assert g.loc[("o_proj", 1), "time_s"] == pytest.approx(20.2e-6)  # µs -> s
    ew = s[s.op == "elementwise_layer"].set_index("m")
    assert ew.loc[1, "time_s"] == pytest.approx((2 * 2.0 + 2.5 + 3.0) * 1.01e-6)
    assert s[s.op == "elementwise_step"].time_s.min() == pytest.approx(5.0 * 1.01e-6)
    att = s[s.op.str.startswith("attn")]
    assert sorted(att.op) == ["attn_decode", "attn_mixed", "attn_prefill"]  # the all-zero row is skipped
    assert set(att.nh) == {16} and set(att.nkv) == {4}
    assert sorted(s[s.op == "sampler"].vocab.unique()) == [128256]


def test_layers_csv_v0(tmp_path):
    p = write(tmp_path / "H100/meta-llama/Llama-3.1-70B/tp4/layers.csv",
              "layer_name,input,kv_cache,tp_size,latency(ns)\nq_proj,1,0,4,16243\nk_proj,1,0,4,7443\n"
              "gate_proj,64,0,4,44496\nlm_head,1,0,4,176333\nattn,64,0,4,9395\ninput_layernorm,1,0,4,17978\n")
    assert sniff(p) == "llmservingsim-v0"
    mb = load_layers_csv(p)
    s = mb.samples
    assert mb.gpu == "H100 SXM" and mb.meta["model"] == "Llama-3.1-70B" and mb.meta["tp"] == 4
    g = s[s.op == "gemm"].set_index("name")
    assert tuple(g.loc["q_proj", ["k", "n"]]) == (8192, 16 * 128)
    assert tuple(g.loc["k_proj", ["k", "n"]]) == (8192, 2 * 128)
    assert tuple(g.loc["gate_proj", ["k", "n"]]) == (8192, 28672 / 4)
    assert g.loc["q_proj", "time_s"] == pytest.approx(16.243e-6)  # ns -> s
    a = s[s.op == "attn_prefill"].iloc[0]
    assert (a.chunk, a.kv_prefill, a.nh, a.nkv) == (64, 0, 16, 2)
    # an incomplete set of norm/rope/act kernels gives no elementwise rows rather than a wrong sum
    assert not (s.op == "elementwise_layer").any()
    with pytest.raises(ConfigError, match="model"):
        load_layers_csv(write(tmp_path / "x/layers.csv", "layer_name,input,kv_cache,tp_size,latency(ns)\n"
                                                         "q_proj,1,0,1,1000\n"))


def _blis_decode(path: Path, peak: float) -> Path:
    """Two rows of a 32-8-128-tp2 decode file with an mfu column normalised to ``peak`` FLOP/s."""
    rows = ["dtype,kv_dtype,batch_size,kv_len,latency_us,mfu"]
    for b, kv, us, kvd in ((512, 8192, 5452.0, "bf16"), (256, 8192, 2800.0, "fp8")):
        mfu = 4 * 16 * 128 * b * kv / (us * 1e-6) / peak
        rows.append(f"bf16,{kvd},{b},{kv},{us},{mfu:.6f}")
    return write(path, "\n".join(rows) + "\n")


def test_blis_attention_files_and_mfu_units(tmp_path):
    dec = _blis_decode(tmp_path / "decode/h100/32-8-128-tp2.csv", 989.4e12)
    assert sniff(dec) == "blis-attention"
    mb = load_blis_attention(dec)
    s = mb.samples
    assert mb.gpu == "H100 SXM" and list(s.op) == ["attn_decode", "attn_decode"]
    assert tuple(s.iloc[0][["nh", "nkv", "hd", "n_decode", "kv_decode"]]) == (16, 4, 128, 512, 8192)
    assert list(s.kv_bytes) == [2, 1]
    assert s.time_s.iloc[0] == pytest.approx(5452e-6)
    assert mb.meta["mfu_units"] == "bf16" and mb.meta["mfu_implied_peak_tflops"] == pytest.approx(989.4, rel=1e-3)
    # the same timings with mfu normalised to the FP8 peak are recognised and noted (latency is what is fitted)
    m8 = load_blis_attention(_blis_decode(tmp_path / "fp8/h100/32-8-128-tp2.csv", 1978.9e12))
    assert m8.meta["mfu_units"] == "fp8" and any("FP8" in n for n in m8.meta["notes"])
    assert np.allclose(m8.samples.time_s, s.time_s)
    pf = write(tmp_path / "prefill/h100/32-8-128.csv",
               "dtype,seq_len,latency_us,mfu\nbf16,1024,38.098,0.228\nbf16,8192,760.382,0.731\n")
    p = load_blis_attention(pf).samples
    assert list(p.op) == ["attn_prefill"] * 2 and list(p.chunk) == [1024, 8192] and (p.kv_prefill == 0).all()
    with pytest.raises(TraceFormatError, match="expected a name like"):
        load_blis_attention(write(tmp_path / "attn.csv", "latency_us\n1\n"))


def test_vidur_mlp_and_attention(tmp_path):
    cols = "n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,num_tensor_parallel_workers"
    mlp = write(tmp_path / "profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
                cols + ",time_stats.attn_pre_proj.median,time_stats.mlp_up_proj.median,time_stats.mlp_down_proj.median\n"
                "32,8,4096,14336,128256,True,128,2,0.05,0.0,0.08\n32,8,4096,14336,128256,True,256,2,0.09,0.2,0.15\n")
    assert sniff(mlp) == "vidur-mlp"
    mb = load_vidur_mlp(mlp)
    s = mb.samples.set_index(["name", "m"])
    assert mb.gpu == "A100 80GB SXM"
    assert len(mb.samples) == 5  # the 0.0 ("not recorded") time is skipped
    assert tuple(s.loc[("attn_pre_proj", 128), ["k", "n"]]) == (4096, (16 + 8) * 128)
    assert tuple(s.loc[("mlp_up_proj", 256), ["k", "n"]]) == (4096, 14336)  # gated, per TP-2 rank
    assert s.loc[("mlp_down_proj", 128), "time_s"] == pytest.approx(0.08e-3)  # ms -> s
    att = write(tmp_path / "profiling/compute/h100/meta-llama/Meta-Llama-3-8B/attention.csv",
                "n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,batch_size,"
                "prefill_chunk_size,kv_cache_size,is_prefill,time_stats.attn_prefill.median,"
                "time_stats.attn_decode.median\n"
                "4096,32,8,16,1,4096,1,512,1024,True,0.12,\n4096,32,8,16,1,4096,32,0,2048,False,,0.2\n")
    assert sniff(att) == "vidur-attention"
    a = load_vidur_attention(att)
    assert a.gpu == "H100 SXM"
    pf, dc = a.samples.iloc[0], a.samples.iloc[1]
    assert (pf.op, pf.chunk, pf.kv_prefill, pf.time_s) == ("attn_prefill", 512, 1024, pytest.approx(0.12e-3))
    assert (dc.op, dc.n_decode, dc.kv_decode, dc.nh, dc.nkv) == ("attn_decode", 32, 2048, 32, 8)


def test_load_path_walks_folders_and_fit_cli_filters_ops(lss_dir, tmp_path):
    mbs = load_path(lss_dir.parent)
    assert len(mbs) == 1 and len(mbs[0].samples) > 10
    out = tmp_path / "p.json"
    assert main(["fit", f"{lss_dir}:gemm", "--out", str(out), "--report", str(tmp_path / "r.md")]) == 0
    prof = CalibrationProfile.load(out)
    assert prof.source == "fitted" and prof.gpu == "RTX 4090"
    assert {e["op"] for e in prof.metadata["fit_error"]} == {"gemm"}
    assert "| gemm |" in (tmp_path / "r.md").read_text()
    assert main(["fit", str(tmp_path / "missing")]) == 2
    assert main(["fit"]) == 2
    assert gpu_name("NVIDIA RTX PRO 6000 Blackwell Server Edition") == "RTX PRO 6000 Blackwell"


# ---------------------------------------------------------------------------------------------- real shared data


@needs_shared
def test_real_files_import():
    lss = load_path(MICRO / "llmservingsim/RTX4090")
    assert len(lss) == 1 and lss[0].gpu == "RTX 4090"
    counts = lss[0].samples.op.value_counts()
    assert counts["attn_decode"] == 99 and counts["attn_prefill"] == 96 and counts["attn_mixed"] == 8448
    assert counts["gemm"] == 4 * 152 + 40
    blis = load_path(MICRO / "blis-h100-attention")
    assert len(blis) == 24 and {b.gpu for b in blis} == {"H100 SXM"}
    # every BLIS file's mfu column is relative to the BF16 peak (checked, since some public files use FP8)
    assert {b.meta["mfu_units"] for b in blis if b.meta["mfu_implied_peak_tflops"]} == {"bf16"}
    v0 = load_path(MICRO / "llmservingsim-v0/H100/meta-llama/Llama-3.1-8B/tp1/layers.csv")[0]
    assert v0.gpu == "H100 SXM" and (v0.samples.op == "gemm").sum() == 8 * 2048


@needs_shared
def test_fit_cli_reproduces_the_shipped_rtx4090_profile(tmp_path):
    out = tmp_path / "rtx-4090.json"
    assert main(["fit", "--recipe", "rtx-4090", "--data", str(MICRO), "--out", str(out)]) == 0
    new, shipped = json.loads(out.read_text()), json.loads((PROFILE_DIR / "rtx-4090.json").read_text())
    assert_same_profile_json(new, shipped)
    assert new["metadata"]["sources"] == shipped["metadata"]["sources"]


def assert_same_profile_json(new: dict, shipped: dict) -> None:
    """A refit profile JSON against the shipped one: same keys, numbers to 1e-4, everything else but metadata equal."""
    assert new.keys() == shipped.keys()
    for k, v in shipped.items():
        if isinstance(v, float):
            assert new[k] == pytest.approx(v, rel=1e-4, abs=1e-12), k
        elif k != "metadata":
            assert new[k] == v, k


@needs_shared
@pytest.mark.parametrize("slug", ["h100-sxm"])
def test_other_recipes_reproduce_their_shipped_files(slug):
    profile, res, _ = fit_recipe(slug, MICRO)
    shipped = CalibrationProfile.load(PROFILE_DIR / f"{slug}.json")
    for k, v in shipped.to_dict().items():
        if isinstance(v, float):
            assert getattr(profile, k) == pytest.approx(v, rel=1e-4, abs=1e-12), k
    assert slug in RECIPES and len(res.errors)
    assert np.all(res.errors["mape"] < 0.15)
