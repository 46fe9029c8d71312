"""Decode attention at large batch x long context against the BLIS H100 FlashInfer microbenchmarks
(../shared/data/microbench/blis-h100-attention/decode/h100/*.csv; skipped when ../shared is absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cost.calibrate.import_blis import load_blis_attention
from sim.cost.calibrate.opmodel import predict
from sim.cost.hardware import get_gpu
from sim.cost.profiles import get_profile

DECODE = Path(__file__).resolve().parents[2] / "shared/data/microbench/blis-h100-attention/decode/h100"
pytestmark = pytest.mark.skipif(not DECODE.is_dir(), reason="../shared microbenchmarks absent")


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    gpu = get_gpu("H100 SXM")
    s = pd.concat([load_blis_attention(f, gpu=gpu.name).samples for f in sorted(DECODE.glob("*.csv"))],
                  ignore_index=True)
    s["err"] = predict(get_profile(gpu), gpu, s) / s.time_s.to_numpy() - 1
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
