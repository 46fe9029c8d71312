"""Validation of the shipped H200 SXM profile (not a test): per operator, the error of each candidate on
servesim's own H200 measurements (sim/cost/data/microbench/h200-sxm).

    .venv/bin/python bench/h200_profile.py            # Markdown tables on stdout, a few seconds

Candidates, each scored by MAPE (and mean signed error, "bias") of opmodel.predict against every sample:

* prior: the spec-sheet prior for H200 SXM (``prior_profile``, the Hopper family values);
* H100: the shipped H100 SXM profile's fields on the H200 spec sheet (fractions of peak and fixed times
  transplanted; what the h200-sxm recipe starts from);
* fit: ``servesim fit`` of every group on the three TP1 models, from the prior (the plain fit, for reference);
* shipped: the h200-sxm recipe (sim/cost/calibrate/recipes.py), i.e. sim/cost/data/profiles/h200-sxm.json.

Both fits read the three TP1 models only (recipes.H200_FIT_MODELS); the TP-sharded Llama-2-70B TP4 and
CodeLlama-34B TP2 (recipes.H200_HELD_OUT_MODELS) are shapes no fit has seen. Extra rows split decode attention
into bandwidth-bound calls (n_decode * ctx >= 256K tokens) and the rest, and prefill attention into prefills
without cached context and chunks after one (SDPA's lower-right causal mask runs at about 0.34 of peak there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.cost.calibrate import opmodel  # noqa: E402
from sim.cost.calibrate.fit import fit_profile, physical_mask  # noqa: E402
from sim.cost.calibrate.recipes import (  # noqa: E402
    H200_FIT_MODELS,
    H200_HELD_OUT_MODELS,
    Recipe,
    fit_recipe,
    get_recipe,
    h200_sources,
    load_recipe_data,
    recipe_base,
)
from sim.cost.hardware import get_gpu  # noqa: E402
from sim.cost.profiles import prior_profile  # noqa: E402

OPS = ("gemm", "attn_decode", "attn_prefill", "elementwise_layer", "elementwise_step", "sampler", "step_overhead",
       "copy")


def h200_samples(models) -> pd.DataFrame:
    """Every sample of these models' folders, labelled by path, rows faster than the roofline dropped (none are)."""
    recipe = Recipe("h200-all", "H200 SXM", h200_sources(models), data="package")
    bench = load_recipe_data(recipe)
    keep, _ = physical_mask(bench, get_gpu("H200 SXM"))
    return bench.samples[keep].reset_index(drop=True)


def candidates() -> dict[str, object]:
    gpu = get_gpu("H200 SXM")
    tp1 = Recipe("h200-tp1", "H200 SXM", h200_sources(H200_FIT_MODELS), data="package")
    return {
        "prior": prior_profile(gpu),
        "H100": recipe_base(get_recipe("h200-sxm")),
        "fit": fit_profile(load_recipe_data(tp1), gpu).profile,
        "shipped": fit_recipe("h200-sxm")[0],
    }


def subsets(s: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    out = [(op, s[s.op == op]) for op in OPS]
    d, p = s[s.op == "attn_decode"], s[s.op == "attn_prefill"]
    big = d.n_decode * d.kv_decode >= 262144
    out.insert(2, ("  decode, n·ctx ≥ 256K", d[big]))
    out.insert(3, ("  decode, n·ctx < 256K", d[~big]))
    out.insert(5, ("  prefill, no context", p[p.kv_prefill == 0]))
    out.insert(6, ("  prefill after context", p[p.kv_prefill > 0]))
    return out


def table(s: pd.DataFrame, profiles: dict[str, object]) -> str:
    gpu = get_gpu("H200 SXM")
    names = list(profiles)
    lines = ["| operator | n | " + " | ".join(f"{n} MAPE (bias)" for n in names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    for label, rows in subsets(s):
        cells = []
        meas = rows["time_s"].to_numpy()
        for p in profiles.values():
            rel = opmodel.predict(p, gpu, rows) / meas - 1
            cells.append(f"{100 * np.abs(rel).mean():.1f} % ({100 * rel.mean():+.0f} %)")
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    profiles = candidates()
    every = h200_samples(H200_FIT_MODELS + H200_HELD_OUT_MODELS)
    held = every[every.file.str.split("/").str[1].isin(H200_HELD_OUT_MODELS)]
    print("## All H200 samples (5 models)\n")
    print(table(every, profiles))
    print(f"\n## Held-out shapes: {', '.join(H200_HELD_OUT_MODELS)} (not in either fit)\n")
    print(table(held, profiles))
    shipped = profiles["shipped"]
    print("\nshipped h200-sxm: " + ", ".join(
        f"{k} {getattr(shipped, k):.4g}" for k in ("eta_compute", "eta_bandwidth", "roofline_p", "t0_gemm_s",
                                                    "eta_kv", "attn_t0_s", "attn_ctx_pad_tokens", "eta_fa")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
