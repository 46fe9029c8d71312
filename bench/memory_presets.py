"""Each preset's start-up memory plan on the three cases of docs/memory_reservations.md, as a markdown table.

    PYTHONPATH=. python bench/memory_presets.py            # this tree
    PYTHONPATH=/path/to/other/tree python bench/memory_presets.py   # another tree (e.g. before a change)

Uses only resolve() and the MemoryPlan fields every version has, so two trees can be compared.
"""

from __future__ import annotations

import argparse

from policies.base import policy_names
from sim.app.config import config_from_dict
from sim.app.simulate import resolve
from sim.core.errors import ServesimError

GIB = 1 << 30
CASES = (
    ("Llama-3.1-8B", "RTX 4090", 1),
    ("Llama-3.1-8B", "A100 80GB", 1),
    ("Mixtral-8x7B", "H100", 2),
    ("Llama-3.1-70B", "H100", 4),
)


def row(preset: str, model: str, gpu: str, tp: int, max_model_len: int | None) -> str:
    engine: dict = {"policy": preset}
    if max_model_len:
        engine["max_model_len"] = max_model_len
    cfg = {"model": {"name": model}, "hardware": {"gpu": gpu, "tensor_parallel_size": tp}, "engine": engine}
    case = f"{model} / {gpu}" + (f" TP{tp}" if tp > 1 else "")
    try:
        setup = resolve(config_from_dict(cfg))
    except ServesimError as exc:
        return f"| {preset} | {case} | does not start: {str(exc)[:90]} |||||||"
    p = setup.memory
    ctx = getattr(p, "context_bytes", 0)
    lim = setup.limits
    return (f"| {preset} | {case} | {p.gpu_memory_utilization:.2f} | {p.weight_bytes / GIB:.2f} | "
            f"{p.activation_bytes / GIB:.2f} | {p.non_torch_bytes / GIB:.2f} | {ctx / GIB:.2f} | "
            f"{p.kv_budget_bytes / GIB:.2f} | {lim.num_gpu_blocks * lim.block_size:,} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-model-len", type=int, default=8192, help="0: leave it unset (the preset's default)")
    ap.add_argument("--presets", nargs="*", default=None)
    args = ap.parse_args()
    print("| preset | case | util | weights | activation | non-torch | CUDA ctx | KV budget GiB | KV tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for preset in args.presets or policy_names():
        for model, gpu, tp in CASES:
            print(row(preset, model, gpu, tp, args.max_model_len or None))


if __name__ == "__main__":
    main()
