"""How each shipped profile (sim/cost/data/profiles/<slug>.json) is fitted: which files, which operators.

``servesim fit --recipe <slug>`` re-runs one of these (``--data ../shared/data/microbench`` for the recipes on the
public microbenchmarks; h200-sxm reads the packaged sim/cost/data/microbench); the shipped JSON is exactly its
output (``recipe_command``). Choices, with the reason for each:

* RTX 4090: LLMServingSim vLLM 0.19 Llama-3.1-8B TP1 tables, every operator (the same stack as the real
  vLLM run in shared/data/e2e, so the fidelity report compares like with like). One model means one KV width
  (2 * 8 KV heads * 128 * 2 bytes), so the decode term kv_coef * attn_ctx_pad_tokens + attn_per_seq_s is one
  number: the two fields cannot be told apart and the optimiser stopped anywhere on that line (the shipped file
  once had 15.0 / 0.130 us, a refit with numpy 2.4 / scipy 1.17 23.9 / 0.090 us, with identical predictions).
  Likewise every prefill chunk (<= 2048 tokens) is below prefill_kv_floor * prefill_kv_sat_tokens, so occupancy
  sits on the floor and the saturation point is not in the data. Both keep the prior; the fit is then unique.
* RTX PRO 6000 Blackwell: the dense models (Llama-3.1-8B and Qwen3-32B, TP1 and TP2 rank shapes). The
  Qwen3-30B-A3B tables are left out: MoE (moe.csv is not a cost-model term yet) and their small dense layers
  fit in the 128 MB L2, which a one-layer profile serves from cache.
* H100 SXM: GEMMs from the LLMServingSim v0 layer tables (Llama-3.1-8B TP1, Llama-3.1-70B TP4, Mixtral-8x7B
  TP2 attention projections and LM head), attention from the BLIS FlashInfer microbenchmarks. The v0 norm,
  RoPE and attention timings are left out: 17-20 µs for an RMSNorm of one token (and 286 µs for 2048 tokens of
  the 70B) is host-timed eager PyTorch, not a kernel vLLM runs; its prefill attention is an older kernel
  (2048 tokens: 177 µs against 100 µs for FlashInfer). Elementwise, sampler and mixed-batch terms keep the
  Hopper prior. The BLIS prefill files hold causal prefills without cached context, which cannot identify the
  occupancy floor for short chunks after long contexts, so that floor keeps its prior.
* H200 SXM: servesim's own measurements (sim/cost/data/microbench/h200-sxm, shipped with the package, so this
  recipe needs no ``--data``), fitted over the shipped H100 SXM profile (``base``): the same GH100 chip at the
  same clocks with more, faster HBM (4.8 against 3.35 TB/s), so fractions of peak and fixed microsecond costs
  carry over. Only the three TP1 models are fitted; Llama-2-70B TP4 and CodeLlama-34B TP2 shards are held out.

  - GEMMs (eta_compute, eta_bandwidth, roofline_p, t0_gemm_s) from these samples: cuBLAS bf16 in vLLM as in the
    suite. 6.5 % MAPE on all 575 GEMMs, 6.2 % on the 230 held-out TP-shard GEMMs (H100 terms 8.1 / 7.8 %, prior
    11.4 / 12.0 %). eta_compute 0.73 (722 TFLOP/s) is below the best single shapes (771-809 TFLOP/s at 512-2048
    tokens) because big GEMMs slow down: 680 TFLOP/s mean at 16,384 tokens, a drop the model has no term for.
  - Decode attention: eta_kv from these samples (memory-bound, so the fraction of HBM bandwidth is what the
    suite measures whatever the kernel): 0.935, against 0.945 for FlashInfer on H100. The fixed costs
    (attn_t0_s 18.6 µs, attn_per_seq_s, attn_ctx_pad_tokens 21.4) are the H100 fit's (``from_base``): SDPA on a
    contiguous cache fits 6.6 µs per call, vLLM's paged kernels more; the H100 profile with them replays real
    vLLM H100 runs at ITL +0.3 … +2.4 % (bench/results/fidelity.md §5). They are fitted with the group and then
    reset, not frozen: frozen at 18.6 µs, the fit pushes eta_kv to its bound 1.0 to make SDPA's small calls
    faster. Against SDPA's timings the shipped terms are +7 % on bandwidth-bound calls (n·ctx ≥ 256K tokens)
    and +92 % on the rest (their fixed cost); a plain fit gets 2.2 % / 11.6 %.
  - Prefill attention keeps the H100 fit (eta_fa 0.758, causal ramp 498 tokens; compute-bound, same clocks):
    PyTorch SDPA is not vLLM's kernel. With no cached context it reaches 0.46-0.62 of peak at 4-8K tokens (the
    H100 terms predict 11-23 % less time), after a cached context (the lower-right causal mask) 0.24-0.35 for
    chunks of 1K+ tokens, which drags a plain fit's eta_fa to 0.31 (18 % MAPE, P90 49 %; +45 % on the prefills
    without context).
  - Elementwise, sampler, mixed-batch, step overhead and all-reduce keep the H100 profile's values, which are
    the Hopper prior (as in the H100 recipe): the suite's norms, RoPE, SiLU and sampler are eager unfused
    PyTorch (a plain fit gives eta_elementwise 0.13), its step loop is not vLLM's, and one GPU has no all-reduce.

  Per operator MAPE on all five models' samples / on the two held-out TP shards (``.venv/bin/python
  bench/h200_profile.py``, which also splits decode and prefill as above):

  ==============  =====  ============  ============  ============  ============
  operator        n      prior         H100 terms    plain fit     shipped
  ==============  =====  ============  ============  ============  ============
  gemm            575    11.4 / 12.0   8.1 / 7.8     6.5 / 6.2     6.5 / 6.2
  attn_decode     345    39.3 / 47.7   76.6 / 92.9   10.0 / 11.4   77.3 / 93.4
  attn_prefill    200    51.5 / 39.9   60.6 / 47.8   18.0 / 18.4   60.8 / 47.9
  ==============  =====  ============  ============  ============  ============

  The copy benchmark (diagnostic, not fitted) reads 4.14-4.17 TB/s for a 256 MB copy but 2.68-2.71 TB/s for
  512 MB and 1 GB copies in every run, not explained; decode attention reading 4.3 GB per call reaches
  4.5 TB/s, so the slow large copies are not the HBM's limit for reads.

  The base is the shipped h100-sxm.json: refitting H100 means refitting this recipe too
  (tests/test_h200_profile.py fails until then).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from sim.core.errors import ConfigError, UnknownNameError
from sim.cost.calibrate.fit import FitResult, fit_profile, holdout_errors, with_metadata
from sim.cost.calibrate.importers import load_path
from sim.cost.calibrate.samples import Microbench, merge
from sim.cost.hardware import get_gpu
from sim.cost.profiles import PROFILE_DIR, CalibrationProfile, prior_profile

# Where a recipe's sources live unless `servesim fit --data` says otherwise:
# "shared": the public microbenchmarks of the workspace (../shared/data/microbench; not shipped with the package);
# "package": servesim's own measurements, shipped with the package (sim/cost/data/microbench).
DATA_ROOTS: dict[str, Path] = {
    "shared": Path(__file__).resolve().parents[4] / "shared" / "data" / "microbench",
    "package": Path(__file__).resolve().parents[1] / "data" / "microbench",
}
_DATA_ARG = {"shared": "../shared/data/microbench", "package": "sim/cost/data/microbench"}


@dataclass(frozen=True)
class Source:
    path: str  # relative to the recipe's microbenchmark root (DATA_ROOTS[recipe.data])
    ops: tuple[str, ...] | None = None  # None: every operator the file has


@dataclass(frozen=True)
class Recipe:
    slug: str
    gpu: str
    sources: tuple[Source, ...]
    freeze: frozenset[str] = field(default_factory=frozenset)  # held at the base while their group is fitted
    note: str = ""
    data: str = "shared"  # key of DATA_ROOTS
    base: str = "prior"  # what groups without samples (and frozen fields) keep: the prior or a shipped profile's slug
    from_base: frozenset[str] = field(default_factory=frozenset)  # fitted with their group, then set to the base's


# sim/cost/data/microbench/h200-sxm: the fit reads the TP1 models; the TP-sharded ones are held-out shapes
H200_FIT_MODELS = ("llama-3-1-8b", "llama-2-7b", "qwen2-5-7b")
H200_HELD_OUT_MODELS = ("llama-2-70b-tp4", "codellama-34b-tp2")


def h200_sources(models: tuple[str, ...], ops: tuple[str, ...] | None = None) -> tuple[Source, ...]:
    """The packaged H200 samples of these model folders (``ops``: only those operators)."""
    return tuple(Source(f"h200-sxm/{m}/samples.csv", ops) for m in models)

_LSS = "llmservingsim"
_V0 = "llmservingsim-v0/H100"

RECIPES: dict[str, Recipe] = {
    "rtx-4090": Recipe(
        "rtx-4090",
        "RTX 4090",
        (Source(f"{_LSS}/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1"),),
        freeze=frozenset({"attn_ctx_pad_tokens", "prefill_kv_sat_tokens"}),
        note="LLMServingSim vLLM 0.19.0 (CUDA 12.8, eager, one layer) Llama-3.1-8B bf16 TP1 tables",
    ),
    "rtx-pro-6000-blackwell": Recipe(
        "rtx-pro-6000-blackwell",
        "RTX PRO 6000 Blackwell",
        tuple(
            Source(f"{_LSS}/RTXPRO6000/{m}/bf16/tp{t}")
            for m in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B")
            for t in (1, 2)
        ),
        note="LLMServingSim vLLM 0.19.0 (CUDA 13.0, eager, one layer) Llama-3.1-8B and Qwen3-32B bf16 TP1/TP2 tables",
    ),
    "h100-sxm": Recipe(
        "h100-sxm",
        "H100 SXM",
        (
            Source(f"{_V0}/meta-llama/Llama-3.1-8B/tp1/layers.csv", ("gemm",)),
            Source(f"{_V0}/meta-llama/Llama-3.1-70B/tp4/layers.csv", ("gemm",)),
            Source(f"{_V0}/mistralai/Mixtral-8x7B-v0.1/tp2/layers.csv", ("gemm",)),
            Source("blis-h100-attention/decode/h100"),
            Source("blis-h100-attention/prefill/h100"),
        ),
        freeze=frozenset({"prefill_kv_floor", "prefill_kv_sat_tokens"}),
        note="LLMServingSim v0 H100 layer GEMMs + BLIS/InferSim FlashInfer attention (bf16)",
    ),
    "h200-sxm": Recipe(
        "h200-sxm",
        "H200 SXM",
        h200_sources(H200_FIT_MODELS, ("gemm", "attn_decode")),
        note="servesim's own H200 measurements (TP1 Llama-3.1-8B, Llama-2-7B, Qwen2.5-7B; PyTorch 2.11): GEMMs "
             "(cuBLAS bf16) and decode eta_kv (SDPA), over the shipped H100 SXM profile, whose decode fixed costs "
             "(attn_t0_s, attn_per_seq_s, attn_ctx_pad_tokens: FlashInfer's, not SDPA's, so metadata.fit_error of "
             "attn_decode is large for small calls) and prefill attention terms are kept",
        data="package",
        base="h100-sxm",
        from_base=frozenset({"attn_t0_s", "attn_per_seq_s", "attn_ctx_pad_tokens"}),
    ),
}


def get_recipe(slug: str) -> Recipe:
    if slug not in RECIPES:
        raise UnknownNameError(f"unknown fit recipe {slug!r}; known: {', '.join(RECIPES)}")
    return RECIPES[slug]


def recipe_root(recipe: Recipe, root: str | Path | None = None) -> Path:
    """The microbenchmark folder a recipe reads: ``root`` when given, else its own (DATA_ROOTS)."""
    return Path(root) if root is not None else DATA_ROOTS[recipe.data]


def recipe_base(recipe: Recipe) -> CalibrationProfile:
    """The profile a recipe's fit starts from: the GPU's prior, or another GPU's shipped profile whose fractions of
    peak and fixed times are transplanted (same chip, other memory: see the h200-sxm recipe)."""
    gpu = get_gpu(recipe.gpu)
    if recipe.base == "prior":
        return prior_profile(gpu)
    shipped = CalibrationProfile.load(PROFILE_DIR / f"{recipe.base}.json")
    return replace(shipped, gpu=gpu.name, description="", metadata={})


def load_recipe_data(recipe: Recipe, root: str | Path | None = None) -> Microbench:
    """The samples a recipe fits on, read from ``root`` (the microbenchmark folder; default: the recipe's own)."""
    base = recipe_root(recipe, root)
    if not base.is_dir():
        raise ConfigError(f"microbenchmark folder not found: {base}")
    benches: list[Microbench] = []
    for src in recipe.sources:
        for mb in load_path(base / src.path, gpu=recipe.gpu):
            mb = mb.select(src.ops)
            # label rows by their path under the root, so reports and profiles do not depend on where it lives
            rel = Path(str(mb.meta.get("path", ""))).resolve()
            try:
                rel = rel.relative_to(base.resolve())
            except ValueError:
                pass
            mb.meta = {**mb.meta, "path": str(rel)}
            if rel.suffix != ".csv":  # an LLMServingSim directory: keep each table's own name
                mb.samples["file"] = [str(rel / Path(f).name) for f in mb.samples["file"]]
            else:
                mb.samples["file"] = str(rel)
            benches.append(mb)
    return merge(benches)


def recipe_command(slug: str) -> str:
    data = get_recipe(slug).data
    arg = "" if data == "package" else f" --data {_DATA_ARG[data]}"  # a packaged recipe needs no --data
    return f"servesim fit --recipe {slug}{arg} --out sim/cost/data/profiles/{slug}.json"


def fit_recipe(slug: str, root: str | Path | None = None) -> tuple[CalibrationProfile, FitResult, Microbench]:
    """Fit one shipped profile from its recipe; the profile carries its provenance in ``metadata``.

    ``root``: the microbenchmark folder (default: the recipe's own, DATA_ROOTS[recipe.data])."""
    recipe = get_recipe(slug)
    gpu = get_gpu(recipe.gpu)
    bench = load_recipe_data(recipe, root)
    kept = ("the spec-sheet prior" if recipe.base == "prior"
            else f"the shipped {recipe.base} profile's values (fractions of peak, fixed times)")
    res = fit_profile(bench, gpu, recipe_base(recipe), freeze=recipe.freeze, from_base=recipe.from_base,
                      description=(
        f"Fitted on {recipe.note} by `{recipe_command(slug)}` (sim/cost/calibrate/recipes.py); groups without "
        f"samples keep {kept} (metadata.groups). Engine overheads are the BLIS prior, not measured."
    ))
    extra: dict[str, object] = {"gpu_profile": True, "recipe": slug, "frozen": sorted(recipe.freeze)}
    if recipe.base != "prior":
        extra |= {"base": recipe.base, "from_base": sorted(recipe.from_base)}
    return with_metadata(res, bench, command=recipe_command(slug), extra=extra), res, bench


def recipe_holdout(slug: str, bench: Microbench, frac: float) -> pd.DataFrame:
    """holdout_errors of a recipe's fit (its base, frozen and from-base fields) on ``bench`` (its samples)."""
    recipe = get_recipe(slug)
    return holdout_errors(bench, get_gpu(recipe.gpu), recipe_base(recipe), frac=frac, freeze=recipe.freeze,
                          from_base=recipe.from_base)
