"""Public microbenchmark formats -> samples (sim/cost/calibrate/samples.py).

Formats (shared/data/README.md, costmodel.md §1.1):

* LLMServingSim ``profiler/perf/<HW>/<org>/<model>/<variant>/tp<N>/``: ``dense.csv`` (layer, tokens, time_us),
  ``attention.csv`` (prefill_chunk, kv_prefill, n_decode, kv_decode, time_us), ``per_sequence.csv``
  (layer, sequences, time_us); ``meta.yaml`` one level up names the GPU and the model. The TP-N tables are
  one rank's kernels (a 1-layer model with the per-rank widths), so shapes are divided by N.
* LLMServingSim v0 ``perf_models/<HW>/<org>/<model>/tp<N>/layers.csv``: layer_name, input, kv_cache,
  tp_size, latency(ns); unfused q/k/v and gate/up projections.
* BLIS / InferSim attention: ``decode/<gpu>/<nh>-<nkv>-<hd>-tp<N>.csv`` (dtype, kv_dtype, batch_size, kv_len,
  latency_us, mfu) and ``prefill/<gpu>/<nh>-<nkv>-<hd>.csv`` (dtype, seq_len, latency_us, mfu).
* Vidur ``data/profiling/compute/<gpu>/<org>/<model>/{mlp,attention}.csv``: per-operator
  ``time_stats.<op>.median`` in milliseconds (CUDA events), shapes in n_head, n_kv_head, n_embd, ...

Every importer returns a Microbench with per-GPU shapes. Units are converted to seconds here, once.

Modules: ``common`` (shared helpers), ``llmservingsim`` (perf/ and v0), ``blis``, ``vidur``; this file
detects a file's format and dispatches (``sniff``, ``load_path``). Every public name is importable from here.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from sim.core.errors import TraceFormatError
from sim.cost.calibrate.import_blis import implied_peak, load_blis_attention, mfu_units
from sim.cost.calibrate.import_common import gpu_name
from sim.cost.calibrate.import_llmservingsim import load_layers_csv, load_llmservingsim
from sim.cost.calibrate.import_vidur import load_vidur_attention, load_vidur_mlp
from sim.cost.calibrate.samples import Microbench, load_samples_csv, not_utf8
from sim.cost.models import ModelSpec

__all__ = [
    "gpu_name",
    "implied_peak",
    "load_blis_attention",
    "load_layers_csv",
    "load_llmservingsim",
    "load_path",
    "load_vidur_attention",
    "load_vidur_mlp",
    "mfu_units",
    "sniff",
]

# ---------------------------------------------------------------------------------------------- detection


_HEADER_BYTES = 1 << 16  # a header line longer than this is no format's


def sniff(path: Path) -> str:
    """The format of one file, from its name and header. A header that is not UTF-8 text (random bytes, a
    UTF-16 export) is refused naming the file, here as in a folder: one such file stops the fit, as a file
    that cannot be read does, rather than being skipped without a word."""
    try:
        with path.open("rb") as fh:
            head = fh.readline(_HEADER_BYTES)
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror or e})") from None
    skip = len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0
    try:  # not final when the line was cut at the limit: a character split there is no error
        final = len(head) < _HEADER_BYTES or head.endswith(b"\n")
        header = codecs.getincrementaldecoder("utf-8")().decode(head[skip:], final=final).strip()
    except UnicodeDecodeError as e:
        raise not_utf8(path, head, skip + e.start) from None
    cols = set(header.split(","))
    if {"op", "time_s"} <= cols:
        return "servesim-samples"
    if path.name in ("dense.csv", "attention.csv", "per_sequence.csv") and "time_us" in cols:
        return "llmservingsim"
    if "latency(ns)" in cols and "layer_name" in cols:
        return "llmservingsim-v0"
    if "latency_us" in cols and re.fullmatch(r"\d+-\d+-\d+(?:-tp\d+)?\.csv", path.name):
        return "blis-attention"
    if any(c.startswith("time_stats.") for c in cols):
        if "is_prefill" in cols:
            return "vidur-attention"
        if "num_tokens" in cols:
            return "vidur-mlp"
    return "unknown"


def _check_named_gpu(given: str, said: str, f: Path) -> None:
    """``--gpu`` is for samples that do not say their card: one that contradicts the card their meta.json
    names would fit that card's timings as another's; refused (a card the catalogue lacks: --gpu says which)."""
    from sim.core.errors import ConfigError
    from sim.cost.hardware import device_gpu, get_gpu

    card = device_gpu(said)
    if card is not None and card != get_gpu(given).name:
        raise ConfigError(f"--gpu {given}: {f.parent / 'meta.json'} says the samples ran on {card}, and a profile "
                          f"fitted to them describes that card; allowed: leave --gpu out, or --gpu {card!r}")


def load_path(
    path: str | Path,
    *,
    model: ModelSpec | str | None = None,
    gpu: str | None = None,
) -> list[Microbench]:
    """Every recognised microbenchmark file under ``path`` (a file or a directory, searched recursively)."""
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"microbenchmark path not found: {p}")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*.csv") if f.is_file())
    out: list[Microbench] = []
    lss_dirs: set[Path] = set()
    for f in files:
        fmt = sniff(f)
        if fmt == "llmservingsim":
            if p.is_file():
                out.append(load_llmservingsim(f, model=model, gpu=gpu))
            elif f.parent not in lss_dirs:
                lss_dirs.add(f.parent)
                out.append(load_llmservingsim(f.parent, model=model, gpu=gpu))
        elif fmt == "llmservingsim-v0":
            out.append(load_layers_csv(f, model=model, gpu=gpu))
        elif fmt == "blis-attention":
            out.append(load_blis_attention(f, gpu=gpu))
        elif fmt == "vidur-mlp":
            out.append(load_vidur_mlp(f, gpu=gpu))
        elif fmt == "vidur-attention":
            out.append(load_vidur_attention(f, gpu=gpu))
        elif fmt == "servesim-samples":
            mb = load_samples_csv(f)
            if gpu:
                _check_named_gpu(gpu, mb.gpu, f)
                mb.gpu = gpu
            out.append(mb)
        elif p.is_file():
            raise TraceFormatError(f"{f}: unrecognised microbenchmark format (header: see sim/cost/calibrate/importers)")
    if not out:
        raise TraceFormatError(f"{p}: no recognised microbenchmark files")
    return out
