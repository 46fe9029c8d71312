"""Fit a CalibrationProfile to microbenchmark samples, operator group by operator group.

Each group owns a few profile fields and is fitted on its own kernels only, with bounds that keep the
values physical (efficiencies in (0, 1], times >= 0), by bounded least squares on log(predicted/measured):
relative error is what MAPE measures and what matters across shapes that span four decades of time.
Groups run in dependency order (attention prefill uses the decode floor and η_kv; mixed batches use both).
costmodel.md §1.1 lesson (BLIS): fitting per kernel with physical bounds keeps coefficients meaningful,
where a global end-to-end fit shifts time onto correlated terms.

Hold-out is by shape range, not at random (``holdout_mask``): per file and operator the largest shapes are
kept out of the fit, so the held-out error measures extrapolation to bigger problems.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from sim.core.errors import ConfigError
from sim.cost.calibrate import opmodel
from sim.cost.calibrate.samples import Microbench
from sim.cost.hardware import GpuSpec
from sim.cost.profiles import CalibrationProfile, prior_profile


@dataclass(frozen=True)
class Param:
    name: str
    lo: float
    hi: float
    scale: float = 1.0  # optimiser variable × scale = profile value (keeps variables O(1))
    init: float | None = None  # extra start (scaled units) for terms that are off (0) in the priors


@dataclass(frozen=True)
class Group:
    name: str
    ops: tuple[str, ...]
    params: tuple[Param, ...]


US = 1e-6
# Bounds: efficiencies are fractions of the spec-sheet peak (≤ 1 by definition); fixed times are bounded well
# above anything measured (costmodel.md §2.2: t0 5-8 µs per GEMM, 11-13 µs attention floor).
GROUPS: tuple[Group, ...] = (
    Group(
        "gemm",
        ("gemm",),
        (
            Param("eta_compute", 0.02, 1.0),
            Param("eta_bandwidth", 0.02, 1.0),
            Param("roofline_p", 1.0, 8.0),
            Param("t0_gemm_s", 0.0, 200.0, US),
        ),
    ),
    Group(
        "elementwise",
        ("elementwise_layer", "elementwise_step"),
        (
            Param("eta_elementwise", 0.02, 1.0),
            Param("layer_fixed_s", 0.0, 500.0, US),
            Param("step_elementwise_fixed_s", 0.0, 500.0, US),
        ),
    ),
    Group(
        "sampler",
        ("sampler",),
        (
            Param("sampler_t0_s", 0.0, 2000.0, US),
            Param("sampler_bytes_per_elem", 0.0, 64.0),
        ),
    ),
    Group(
        "attn_decode",
        ("attn_decode",),
        (
            Param("attn_t0_s", 0.0, 200.0, US),
            Param("eta_kv", 0.02, 1.0),
            Param("attn_per_seq_s", 0.0, 20.0, US),
            Param("attn_ctx_pad_tokens", 0.0, 512.0),
        ),
    ),
    Group(
        "attn_prefill",
        ("attn_prefill",),
        (
            Param("eta_fa", 0.02, 1.0),
            Param("prefill_kv_floor", 0.01, 1.0),
            Param("prefill_kv_sat_tokens", 16.0, 1e6),
            Param("prefill_causal_ramp_tokens", 0.0, 1e5, init=500.0),
            Param("prefill_chunk_t0_s", 0.0, 500.0, US, init=10.0),
        ),
    ),
    Group(
        "attn_mixed",
        ("attn_mixed",),
        (
            Param("mixed_decode_gqa_reread", 0.0, 1.0),
            Param("mixed_decode_head_token_s", 0.0, 1e4, 1e-12, init=250.0),
            Param("mixed_decode_seq_token_s", 0.0, 1e3, 1e-9, init=30.0),
        ),
    ),
    Group(
        "allreduce",
        ("allreduce",),
        (
            Param("allreduce_latency_s", 0.0, 2000.0, US),
            Param("allreduce_bw_eff", 0.02, 1.0),
        ),
    ),
    Group(
        "step_overhead",
        ("step_overhead",),
        (
            Param("step_overhead_s", 0.0, 100_000.0, US),
            Param("per_seq_overhead_s", 0.0, 1000.0, US),
        ),
    ),
)


def ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred - meas) / meas


def error_table(profile: CalibrationProfile, gpu: GpuSpec, samples: pd.DataFrame) -> pd.DataFrame:
    """Per (file, op): n, MAPE, P90 and max absolute % error, mean signed % error (bias)."""
    if samples.empty:
        return pd.DataFrame(columns=["file", "op", "n", "mape", "p90", "max", "bias"])
    pred = opmodel.predict(profile, gpu, samples)
    meas = samples["time_s"].to_numpy()
    df = samples[["file", "op"]].assign(err=ape(pred, meas), signed=(pred - meas) / meas)
    rows = []
    for (f, op), g in df.groupby(["file", "op"], sort=True):
        e = g["err"].to_numpy()
        rows.append(
            dict(
                file=f,
                op=op,
                n=len(e),
                mape=float(e.mean()),
                p90=float(np.quantile(e, 0.9)),
                max=float(e.max()),
                bias=float(g["signed"].mean()),
            )
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------- hold-out


def _size_key(df: pd.DataFrame, op: str) -> np.ndarray:
    """The 'problem size' a shape range is cut on."""

    def c(name: str) -> np.ndarray:
        v = df[name].to_numpy(float)
        return np.where(np.isfinite(v), v, 0.0)

    if op == "attn_decode":
        return c("kv_decode")
    if op == "attn_prefill":
        return c("kv_prefill") + c("chunk")
    if op == "attn_mixed":
        return c("n_decode") * c("kv_decode") + c("kv_prefill") + c("chunk")
    if op in ("copy", "allreduce"):
        return c("nbytes")
    return c("m")


def holdout_mask(samples: pd.DataFrame, frac: float = 0.2) -> np.ndarray:
    """True for held-out rows: per (file, op), the rows whose size key is in the top ``frac`` of its distinct
    values (at least one value held out when a file has two or more distinct sizes)."""
    if not 0 < frac < 1:
        raise ConfigError(f"hold-out fraction must be in (0, 1), got {frac}")
    mask = np.zeros(len(samples), dtype=bool)
    for (_, op), idx in samples.groupby(["file", "op"], sort=False).indices.items():
        key = _size_key(samples.iloc[idx], op)
        distinct = np.unique(key)
        if len(distinct) < 2:
            continue
        cut = distinct[min(len(distinct) - 1, int(math.floor((1 - frac) * len(distinct))))]
        mask[idx] = key >= cut
    return mask


# ---------------------------------------------------------------------------------------------- fitting


@dataclass
class FitResult:
    profile: CalibrationProfile
    errors: pd.DataFrame  # error_table of the fitted profile on the samples it was fitted on
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # per group: status, n, params
    notes: list[str] = field(default_factory=list)


def _fit_group(
    group: Group, prof: CalibrationProfile, gpu: GpuSpec, rows: pd.DataFrame, freeze: set[str]
) -> CalibrationProfile:
    params = [p for p in group.params if p.name not in freeze]
    if not params:
        return prof
    meas = np.log(rows["time_s"].to_numpy())
    lo = np.array([p.lo for p in params])
    hi = np.array([p.hi for p in params])

    def make(x: np.ndarray) -> CalibrationProfile:
        return replace(prof, **{p.name: float(v * p.scale) for p, v in zip(params, x, strict=True)})

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(opmodel.predict(make(x), gpu, rows)) - meas

    x_base = np.clip([getattr(prof, p.name) / p.scale for p in params], lo, hi)
    # Deterministic multi-start: the base values, halved and doubled (max() and clip() kinks make the surface
    # piecewise smooth, so a single start can stall on a face).
    starts = [x_base, np.clip(0.5 * x_base, lo, hi), np.clip(2.0 * x_base + 0.01 * (hi - lo), lo, hi)]
    if any(p.init is not None for p in params):
        x_init = np.clip(
            [p.init if p.init is not None else v for p, v in zip(params, x_base, strict=True)], lo, hi
        )
        starts.append(x_init)
    best = None
    for x0 in starts:
        x0 = np.clip(x0, lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
        r = least_squares(
            resid, x0, bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=400, loss="soft_l1", f_scale=0.1
        )
        if best is None or r.cost < best.cost:
            best = r
    return make(best.x)


def fit_profile(
    bench: Microbench,
    gpu: GpuSpec,
    base: CalibrationProfile | None = None,
    *,
    freeze: set[str] | frozenset[str] = frozenset(),
    from_base: set[str] | frozenset[str] = frozenset(),
    train: np.ndarray | None = None,
    description: str = "",
) -> FitResult:
    """Fit every group that has samples; groups without data keep ``base`` (default: the GPU's prior).

    ``freeze``: fields held at ``base`` while their group is fitted. ``from_base``: fields fitted with their group
    and then set back to ``base``'s value: nuisance terms of the measured kernel (e.g. the fixed cost of another
    attention library than the engine's), estimated so the group's other fields are not bent to absorb them.
    ``train``: optional boolean mask of the rows to fit on (the rest are ignored here; see holdout_mask).
    """
    base = base or prior_profile(gpu)
    keep, notes = physical_mask(bench, gpu)
    if train is not None:
        keep &= train
    samples = bench.samples[keep]
    prof = replace(base, gpu=gpu.name, source="fitted")
    groups: dict[str, dict[str, Any]] = {}
    for g in GROUPS:
        rows = samples[samples.op.isin(g.ops)]
        if rows.empty:
            groups[g.name] = {
                "status": "kept from base profile (no samples)",
                "n": 0,
                "params": {p.name: getattr(prof, p.name) for p in g.params},
            }
            continue
        if g.name == "allreduce":  # measured all-reduces replace the published per-interconnect figures
            prof = replace(prof, allreduce_model="profile")
        prof = _fit_group(g, prof, gpu, rows, set(freeze))
        reset = sorted(p.name for p in g.params if p.name in from_base and p.name not in freeze)
        prof = replace(prof, **{f: getattr(base, f) for f in reset})
        groups[g.name] = {
            "status": "fitted",
            "n": int(len(rows)),
            "params": {p.name: getattr(prof, p.name) for p in g.params},
            "frozen": sorted(p.name for p in g.params if p.name in freeze),
            "from_base": reset,
        }
    if description:
        prof = replace(prof, description=description)
    return FitResult(prof, error_table(prof, gpu, samples), groups, notes)


def roofline_floor(gpu: GpuSpec, samples: pd.DataFrame) -> np.ndarray:
    """The fastest physically possible time of each gemm / attn_decode row at 100 % of the spec-sheet peaks
    (NaN for other ops): max(FLOPs/peak, bytes/HBM bandwidth)."""
    out = np.full(len(samples), np.nan)
    ops = samples["op"].to_numpy()
    g = ops == "gemm"
    if g.any():
        d = samples[g]
        m, k, n = (d[c].to_numpy(float) for c in ("m", "k", "n"))
        flops, nbytes = 2 * m * k * n, k * n * d["w_bytes"].fillna(2).to_numpy() + m * (k + n) * 2
        out[g] = np.maximum(flops / gpu.bf16_flops, nbytes / gpu.mem_bandwidth)
    a = ops == "attn_decode"
    if a.any():
        d = samples[a]
        kv = 2 * d["nkv"].to_numpy(float) * d["hd"].to_numpy(float) * d["kv_bytes"].fillna(2).to_numpy()
        out[a] = kv * d["n_decode"].to_numpy(float) * d["kv_decode"].to_numpy(float) / gpu.mem_bandwidth
    return out


def physical_mask(bench: Microbench, gpu: GpuSpec) -> tuple[np.ndarray, list[str]]:
    """False for rows faster than the spec-sheet roofline, with a note per file.

    Such rows exist for a reason the cost model must not learn from: a one-layer profiler re-runs the same
    kernel, so weights or KV that fit in L2 (72 MB on the RTX 4090, 128 MB on the RTX PRO 6000) are served
    from cache, which never happens in a full model. They can also mean wrong units or the wrong GPU.
    """
    floor = roofline_floor(gpu, bench.samples)
    bad = np.isfinite(floor) & (bench.samples["time_s"].to_numpy() < floor)
    notes = []
    if bad.any():
        d = bench.samples[bad]
        for (f, op), grp in d.groupby(["file", "op"]):
            worst = float((floor[bad][d.index.get_indexer(grp.index)] / grp["time_s"].to_numpy()).max())
            notes.append(
                f"dropped {len(grp)} {op} rows of {f} faster than the {gpu.name} spec-sheet roofline (up to "
                f"{worst:.2f}x): L2-resident in a one-layer profile, boost clocks above the rated peak, or wrong units/GPU"
            )
    return ~bad, notes


def holdout_errors(
    bench: Microbench,
    gpu: GpuSpec,
    base: CalibrationProfile | None = None,
    *,
    frac: float = 0.2,
    freeze: set[str] | frozenset[str] = frozenset(),
    from_base: set[str] | frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """Fit on the small shapes, score on the held-out large ones; per (file, op) train and held-out errors."""
    test = holdout_mask(bench.samples, frac)
    res = fit_profile(bench, gpu, base, freeze=freeze, from_base=from_base, train=~test)
    keep, _ = physical_mask(bench, gpu)
    tr = error_table(res.profile, gpu, bench.samples[~test & keep]).rename(
        columns={
            "n": "n_train",
            "mape": "mape_train",
            "p90": "p90_train",
            "max": "max_train",
            "bias": "bias_train",
        }
    )
    te = error_table(res.profile, gpu, bench.samples[test & keep]).rename(
        columns={
            "n": "n_test",
            "mape": "mape_test",
            "p90": "p90_test",
            "max": "max_test",
            "bias": "bias_test",
        }
    )
    out = tr.merge(te, on=["file", "op"], how="outer")
    for c in ("n_train", "n_test"):
        out[c] = out[c].fillna(0).astype(int)
    return out


def with_metadata(
    res: FitResult, bench: Microbench, *, command: str = "", extra: dict[str, Any] | None = None
) -> CalibrationProfile:
    """The fitted profile carrying its provenance: sources and their versions, fit error per operator, the
    status of each parameter group, notes and the command that rebuilds it (no timestamps: reproducible)."""
    sources = bench.meta.get("sources", [bench.meta])
    keys = ("path", "format", "model", "tp", "device_name", "vllm_version", "cuda_version", "torch_version",
            "driver_version", "heads", "mfu_units", "mfu_implied_peak_tflops")
    src = [{k: s[k] for k in keys if s.get(k) not in (None, "")} for s in sources]
    err = [
        {"file": r.file, "op": r.op, "n": int(r.n), "mape": round(float(r.mape), 4), "p90": round(float(r.p90), 4),
         "bias": round(float(r.bias), 4)}
        for r in res.errors.itertuples()
    ]
    groups = {
        g: {"status": v["status"], "n": v["n"], **{k: v[k] for k in ("frozen", "from_base") if v.get(k)}}
        for g, v in res.groups.items()
    }
    notes = list(res.notes)
    for s in sources:
        notes += [n for n in s.get("notes", []) if n not in notes]
    meta = {"fit_command": command, "sources": src, "fit_error": err, "groups": groups, "notes": notes,
            **(extra or {})}
    return replace(res.profile, metadata=meta)
