"""Timing on the device and what it is, for the calibration suite (sim/cost/calibrate/suite.py): CUDA-event
timing of CUDA-graph replays, operands that rotate through copies larger than the L2, and the environment
recorded in a profile's metadata."""

from __future__ import annotations

import math
import os
import platform
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------- timing


class Timer:
    """Median seconds of ``fn()``: CUDA events around a CUDA graph of ``reps`` launches on a GPU, wall clock
    around plain calls on the CPU."""

    def __init__(self, torch: Any, device: str, iters: int, warmup: int) -> None:
        self.torch, self.device, self.iters, self.warmup = torch, device, iters, warmup
        self.graphs = device == "cuda"

    def __call__(self, fn: Callable[[], Any], reps: int = 1, graph: bool = True, host: bool = False) -> float:
        """``host``: wall clock including the device sync (for CPU-side loops), on any device."""
        torch = self.torch
        if self.device != "cuda" or host:
            for _ in range(self.warmup):
                fn()
            ts = []
            sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
            for _ in range(self.iters):
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                ts.append(time.perf_counter() - t0)
            return float(np.median(ts))
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        run, per = fn, 1
        if graph and self.graphs:
            try:
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn()
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(g):
                    for _ in range(reps):
                        fn()
                run, per = g.replay, reps
            except Exception:  # noqa: BLE001 - some kernels cannot be captured: time them eagerly
                self.graphs = False
        ts = []
        for _ in range(self.iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e-3 / per)
        return float(np.median(ts))


# ---------------------------------------------------------------------------------------------- environment


def environment(torch: Any, device: str) -> dict[str, Any]:
    """Device, driver, torch and CUDA versions (recorded in the profile's metadata)."""
    env: dict[str, Any] = {
        "device": device,
        "torch_version": torch.__version__,
        "cuda_version": getattr(torch.version, "cuda", None),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            device_name=torch.cuda.get_device_name(0),
            device_count=torch.cuda.device_count(),
            sm_count=props.multi_processor_count,
            total_memory_bytes=props.total_memory,
            l2_cache_bytes=getattr(props, "L2_cache_size", None),
            capability=f"{props.major}.{props.minor}",
            cudnn_version=torch.backends.cudnn.version(),
        )
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False,
            )
            env["driver_version"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            env["driver_version"] = None
    else:
        env.update(device_name=f"CPU ({platform.processor() or platform.machine()})", device_count=1,
                   cpu_count=os.cpu_count(), driver_version=None)
    return env


def copies(nbytes: int, smoke: bool, device: str, torch: Any) -> int:
    """How many copies of an operand the timed calls cycle through so that, together, they are well over the
    L2 cache (4x it, at most 256 copies): a model's layers each read their own weights and KV cache, so a
    kernel timed on one buffer it just read would read it from L2 at several times HBM's bandwidth
    (one H200's 60 MB L2 holds a whole Llama-3-8B QKV projection)."""
    if device != "cuda" or smoke:
        return 1
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (64 << 20)
    return max(1, min(256, math.ceil(4 * l2 / max(1, nbytes))))


def rotate(bufs: list[Any], call: Callable[[Any], Any]) -> Callable[[], Any]:
    """A no-argument call that uses the next buffer each time it is called (captured calls in a CUDA graph
    each keep the buffer they were captured with)."""
    state = [0]

    def fn():
        i = state[0]
        state[0] = (i + 1) % len(bufs)
        return call(bufs[i])

    return fn
