"""Decode attention at large batch x long context against the BLIS H100 FlashInfer microbenchmarks
(../shared/data/microbench/blis-h100-attention/decode/h100/*.csv; skipped when ../shared is absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.core.batch import BatchSummary
from sim.cost.calibrate.import_blis import load_blis_attention
from sim.cost.calibrate.opmodel import predict
from sim.cost.costmodel import make_cost_model
from sim.cost.hardware import get_gpu
from sim.cost.profiles import get_profile

DECODE = Path(__file__).resolve().parents[2] / "shared/data/microbench/blis-h100-attention/decode/h100"
pytestmark = pytest.mark.skipif(not DECODE.is_dir(), reason="../shared microbenchmarks absent")


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    gpu = get_gpu("H100 SXM")
    s = pd.concat([load_blis_attention(f, gpu=gpu.name).samples for f in sorted(DECODE.glob("*.csv"))],
                  ignore_index=True)
    s["pred"] = predict(get_profile(gpu), gpu, s)
    s["err"] = s.pred / s.time_s.to_numpy() - 1
    s["geometry"] = s.file.str.rsplit("/", n=1).str[-1].str.removesuffix(".csv")
    s["kv_read"] = s.n_decode * s.kv_decode * 2 * s.nkv * s.hd * s.kv_bytes  # bytes per layer call
    return s


def test_saturated_decode_attention_within_a_few_percent(rows):
    # the regime of issue 11 (~128 sequences x 2.5K context) and around it: 64-512 sequences, 1K-131K context
    big = rows[(rows.n_decode >= 64) & (rows.kv_decode >= 1024)]
    assert len(big) >= 300
    assert np.abs(big.err).mean() <= 0.05
    assert abs(big.err.mean()) <= 0.03
    # worst rows are MHA layouts (nkv 16-40 per GPU), predicted 9-16 % fast: see the report in issue 11
    assert np.abs(big.err).max() <= 0.18
    near = rows[(rows.n_decode == 128) & rows.kv_decode.between(1024, 4096)]
    assert len(near) and abs(near.err.mean()) <= 0.04 and np.abs(near.err).max() <= 0.15


def test_decode_attention_all_rows(rows):
    assert np.abs(rows.err).mean() <= 0.07


def test_largest_shapes_do_not_flatten(rows):
    """The linear-in-Σctx term keeps pace with the kernel at the largest shapes of every file (up to 512 x 8K
    and 128 x 32K): no split-KV / wave / L2 regime where the real kernel grows faster than the fitted form.
    The kernels stream KV at 86-96 % of the 3.35 TB/s datasheet HBM bandwidth there, so the roofline's
    bandwidth term is the binding limit and nothing beyond it is missed (docs/decode_saturation.md)."""
    top = rows.sort_values("kv_read").groupby("geometry").tail(3)
    assert len(top) == 3 * rows.geometry.nunique() == 54
    assert abs(top.err.mean()) <= 0.02
    assert top.err.min() >= -0.10 and top.err.max() <= 0.05
    bw = top.kv_read / top.time_s
    hbm = get_gpu("H100 SXM").mem_bandwidth
    assert (bw <= hbm).all() and (bw >= 0.85 * hbm).all()


# issue 11's saturated shape, 128 sequences x 2.5K context, on the geometries of the H100 runs kept from the
# project (model, TP, BLIS file with the same per-GPU heads)
KEPT = [("Llama-2-7B", 1, "32-32-128-tp1"), ("Llama-2-70B", 4, "64-8-128-tp4"),
        ("Mixtral-8x7B", 2, "32-8-128-tp2"), ("CodeLlama-34B", 2, "64-8-128-tp2")]


@pytest.mark.parametrize(("model", "tp", "geometry"), KEPT)
def test_attention_gap_at_128x2500_is_a_small_share_of_the_step(rows, model, tp, geometry):
    """Measured attention at 128 x 2500 (linear in context between the 1024 and 4096 rows, as a
    bandwidth-bound kernel is) vs the shipped term: at most ~4 % fast, which is < 3 % of the decode step
    (attention is 29-89 % of it): the kernel term cannot be the ~13 % saturated-decode gap of issue 11."""
    r = rows[(rows.geometry == geometry) & (rows.n_decode == 128)].sort_values("kv_decode")
    meas, pred = (float(np.interp(2500, r.kv_decode, r[c])) for c in ("time_s", "pred"))
    err = pred / meas - 1
    assert -0.06 <= err <= 0.03
    cm = make_cost_model("roofline", model=model, gpu="H100 SXM", tensor_parallel_size=tp)
    batch = BatchSummary.of([2500] * 128, [], [], 128)
    bd = cm.breakdown(batch)
    share = (bd["attention_decode"] + bd["attention_fixed"]) / cm.step_time(batch)
    assert 0.2 <= share <= 0.95
    assert abs(err * share) <= 0.03
