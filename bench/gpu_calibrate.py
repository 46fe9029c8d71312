"""The device run (not a test): the calibration suite on a real GPU, for one or more models' layer shapes.

    python3 bench/gpu_calibrate.py OUTDIR [--models Llama-3.1-8B,Llama-2-7B,Llama-2-70B@4] [--iters 20]

``MODEL@TP`` times one GPU's shard of a tensor-parallel model (no all-reduce: one GPU). Writes
OUTDIR/<model-slug>[-tpN]/samples.csv and meta.json per model (what ``servesim calibrate`` measures, without
the fit, which needs nothing but these files and runs anywhere: ``servesim fit OUTDIR/*/samples.csv --gpu ...``)
and prints which attention kernel PyTorch's SDPA picks for the suite's three mask forms. Imports only numpy,
pandas and torch from outside the repository, so it runs under a GPU image's own Python without servesim's
other dependencies installed; set ``SERVESIM_PURE=1`` there (the native build is for this machine's Python).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.cost.calibrate.suite import SuiteConfig, _sdpa, run_suite  # noqa: E402


def flash_check(torch) -> dict[str, str]:
    """For decode, whole-prompt prefill and chunk-after-context prefill (GQA 32/8 heads, d=128): does the
    flash kernel alone run the suite's call? ('ok' or the error's first line)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {}
    cases = {"decode": (1, 2048), "prefill_no_context": (512, 512), "prefill_after_context": (512, 2560)}
    for name, (s, t) in cases.items():
        q = torch.randn(1, 32, s, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(1, 8, t, 128, dtype=torch.bfloat16, device="cuda")
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                _sdpa(torch, q, k, k, True)
            torch.cuda.synchronize()
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001 - recorded, not raised: the timed run goes on with any kernel
            out[name] = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--models", default="Llama-3.1-8B,Llama-2-7B")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=16384)
    args = ap.parse_args()
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checks = flash_check(torch) if torch.cuda.is_available() else {}
    print("flash kernel alone:", json.dumps(checks), flush=True)
    for item in args.models.split(","):
        model, _, tp = item.partition("@")
        t0 = time.perf_counter()
        print(f"== {model} TP {tp or 1}", flush=True)
        cfg = SuiteConfig(model=model, tp=int(tp or 1), iters=args.iters, max_tokens=args.max_tokens)
        bench = run_suite(cfg, log=lambda m: print(f"  {m}", flush=True))
        bench.meta["sdpa_flash_alone"] = checks
        d = out / (re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") + (f"-tp{tp}" if tp else ""))
        bench.save(d)
        print(f"   {len(bench.samples)} samples in {time.perf_counter() - t0:.1f} s -> {d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
