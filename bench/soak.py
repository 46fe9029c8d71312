"""Randomised soak (not a test): random configs run with the decode fast-forward on and off, which must agree.

    .venv/bin/python bench/soak.py [--seed 1] [--configs 200] [--requests 50,600] [--show-skips]

Each config is drawn from its own seed (``--seed`` x 100000 + its index, so a failure is reproduced by its
index alone): a catalogue model on a card, one of the presets with its limits (tight pools, chunking,
prefix caching, async scheduling, queue timeouts), an open loop (Poisson or gamma, shared prefixes), a
closed loop or multi-turn sessions, client timeouts, a horizon, and a third of the time a cluster of 2-5
replicas behind one of the routers (and a gateway cap), or prefill and decode replicas (P/D). The run with the fast-forward must give the
same requests, steps and ITL values as stepping one by one (tests/invariants.py
``check_fast_forward_exact``; clusters: tests/test_cluster.py ``_same_run``), and a single engine's every
request accounted for once with its timestamps in order (``check_requests_conserved``). A config the setup refuses
(ConfigError, MemoryPlanError) is skipped and counted. A failure prints its index and its config as JSON
(``sim.app.config.config_from_dict`` / ``simulate_cluster`` take it as it is). Exit status 1 on any failure.

The unit tests draw their configs derandomised and small (tests/test_invariants.py); this draws new ones
at a few hundred to thousands of requests. It found a step store that dropped a kv_usage value stored
first at the last step (9690e87) and a clock an ulp short of a run's end (adebd56, 0e0b388).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sim.app.cluster import simulate_cluster  # noqa: E402
from sim.app.config import config_from_dict  # noqa: E402
from sim.app.simulate import simulate  # noqa: E402
from sim.core.errors import ConfigError, MemoryPlanError  # noqa: E402
from tests.invariants import check_fast_forward_exact, check_requests_conserved, workload_ids  # noqa: E402
from tests.test_cluster import _same_run  # noqa: E402

MODELS = [("Meta-Llama-3-8B", "A100-80GB-SXM"), ("Llama-3.1-8B", "H100 SXM"), ("Mistral-7B", "RTX 4090"),
          ("Qwen2.5-7B", "RTX 4090"), ("Phi-3-mini", "RTX 4090"), ("Qwen3-30B-A3B", "H100 SXM")]  # fmt: skip
PRESETS = ["vllm", "vllm", "vllm", "vllm-v0", "sarathi", "tgi", "trtllm", "orca", "static", "hf-static",
           "llamacpp", "ollama"]  # fmt: skip
ROUTERS = ["least-outstanding", "round-robin", "random", "least-kv", "prefix-aware", "session-affinity"]


def draw(r: random.Random, requests: tuple[int, int]) -> dict[str, Any]:
    """One random config (a cluster config when it has a ``cluster`` table)."""
    model, gpu = r.choice(MODELS)
    preset = r.choice(PRESETS)
    mml = r.choice([2048, 4096]) if model == "Phi-3-mini" else r.choice([2048, 4096, 8192])
    eng: dict[str, Any] = {"policy": preset, "max_model_len": mml}
    if preset in ("vllm", "vllm-v0", "tgi", "trtllm", "sarathi", "orca", "static"):
        eng["max_num_seqs"] = r.choice([4, 16, 64, 128, 256])
        if r.random() < 0.3:
            eng["num_gpu_blocks_override"] = r.choice([600, 2000])
    if preset in ("vllm", "vllm-v0"):
        eng["enable_prefix_caching"] = r.random() < 0.6
        if r.random() < 0.4:
            eng["enable_chunked_prefill"] = True
            eng["max_num_batched_tokens"] = r.choice([512, 2048, 8192])
    if preset == "vllm":
        eng["async_scheduling"] = r.random() < 0.7
    if preset == "llamacpp":
        k = r.choice([1, 2, 4])
        eng = {"policy": preset, "n_parallel": k, "n_ctx": 4096 * k}
    elif preset == "ollama":
        eng = {"policy": preset, "num_parallel": r.choice([1, 2, 4]), "num_ctx": 4096}
    if r.random() < 0.15:
        eng["queue_timeout_s"] = r.choice([0.5, 2.0, 10.0])
    n = r.randint(*requests)
    rate = r.choice([1.0, 4.0, 10.0, 30.0, 100.0])
    lengths = {"prompt": {"dist": "lognormal", "mean": r.choice([100, 800, 2500]), "std": 400, "min": 4, "max": 3500},
               "output": {"dist": "lognormal", "mean": r.choice([20, 150, 400]), "std": 100, "min": 1, "max": 1500}}
    cluster = r.random() < 0.35
    kind = r.choice(["open", "open", "closed", "sessions"])
    if kind == "open":
        wl: dict[str, Any] = {"num_requests": n, "rate": rate, **lengths}
        if r.random() < 0.3:
            wl |= {"arrival": "gamma", "burstiness": r.choice([0.25, 0.5, 2.0])}
        if r.random() < 0.3:
            wl["shared_prefix"] = {"num_groups": r.randint(1, 6), "prefix_len": r.choice([64, 512])}
    elif kind == "closed":
        wl = {"kind": "closed", "num_clients": r.choice([2, 8, 32]), "num_requests": n,
              "think_time": r.choice([0.0, 0.5, 2.0]), **lengths}  # fmt: skip
    else:
        wl = {"kind": "sessions", "num_sessions": max(n // 8, 1), "rate": rate / 8,
              "turns": {"dist": "uniform", "low": 1, "high": 12},
              "message": {"dist": "uniform", "low": 10, "high": 300}, "output": {"dist": "uniform", "low": 5, "high": 300},
              "think_time": r.choice([0.5, 3.0])}  # fmt: skip
    if r.random() < 0.15 and not cluster:  # client timeouts: a single engine's
        wl["client_timeout_s"] = r.choice([1.0, 5.0, 30.0])
    raw: dict[str, Any] = {"model": {"name": model}, "hardware": {"gpu": gpu}, "engine": eng, "workload": wl,
                           "simulation": {"seed": r.randint(0, 10**6)}}  # fmt: skip
    if r.random() < 0.2:
        raw["simulation"]["horizon"] = r.choice([5.0, 30.0, 120.0])
    if cluster and preset == "vllm" and r.random() < 0.5:  # prefill / decode disaggregation
        eng["enable_prefix_caching"] = True  # the decode replicas take the KV through their prefix cache
        raw["cluster"] = {"router": r.choice(["least-outstanding", "round-robin", "random"]),
                          "disagg": {"link_bandwidth_gb_s": r.choice([1.0, 25.0]), "link_latency_ms": 0.5}}
        raw["replica"] = [{"name": "p", "count": r.randint(1, 2), "role": "prefill"},
                          {"name": "d", "count": r.randint(1, 3), "role": "decode"}]  # fmt: skip
    elif cluster:
        raw["cluster"] = {"replicas": r.randint(2, 5), "router": r.choice(ROUTERS)}
        if r.random() < 0.3:
            raw["cluster"]["gateway"] = {"max_outstanding": r.choice([2, 8, 32])}
    return raw


def check(raw: dict[str, Any]) -> None:
    """Fast-forward on and off agree (raises AssertionError where not; ConfigError where refused)."""
    if "cluster" in raw:
        on = simulate_cluster(copy.deepcopy(raw))
        _same_run(on, simulate_cluster(copy.deepcopy(raw), fast_forward=False))
    else:
        cfg = config_from_dict(copy.deepcopy(raw))
        on = simulate(cfg)
        check_fast_forward_exact(on, simulate(config_from_dict(copy.deepcopy(raw)), fast_forward=False))
        # and every request accounted for once, its timestamps in order (tests/invariants.py)
        check_requests_conserved(on, workload_ids(cfg, on.meta["limits"]["max_model_len"]), cfg.simulation.horizon)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--only", type=int, nargs="*", help="these config indices only (a failure's reproduction)")
    ap.add_argument("--requests", default="50,600", help="LO,HI requests per config (default 50,600)")
    ap.add_argument("--show-skips", action="store_true", help="list why configs were skipped")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.requests.split(","))
    skips: collections.Counter[str] = collections.Counter()
    ok = failed = 0
    t0 = time.perf_counter()
    for i in args.only if args.only is not None else range(args.configs):
        raw = draw(random.Random(args.seed * 100000 + i), (lo, hi))
        try:
            check(raw)
            ok += 1
        except (ConfigError, MemoryPlanError) as e:
            skips[str(e)[:80]] += 1
        except Exception as e:  # noqa: BLE001 - a soak reports every failure and goes on
            failed += 1
            print(f"FAIL config {i} (--seed {args.seed} --only {i}): {e!r}\n{json.dumps(raw)}", flush=True)
            traceback.print_exc(limit=4)
    print(f"{ok} agreed, {failed} failed, {sum(skips.values())} skipped (refused by the setup) "
          f"in {time.perf_counter() - t0:.0f} s")  # fmt: skip
    if args.show_skips:
        for why, k in skips.most_common():
            print(f"  {k:4d}  {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
