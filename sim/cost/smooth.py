"""The smooth roofline's arithmetic, the same on every machine.

``smooth`` is costmodel.md §0 item 2 for one kernel: ((F/P)^p + (B/BW)^p)^(1/p) + t0, over numpy arrays or
floats. Its powers go through ``pow_c``, the C library's ``pow``: numpy's ``np.power`` is not the same
function on every machine (where the CPU has AVX-512 it uses SIMD code accurate to a few ulp, SVML,
elsewhere the C library's), so with it a step time, and every timestamp after it, depended on the CPU
(seen: 517 of 10,000 powers differ on an AMD EPYC with AVX-512, and the pinned digests of
tests/test_outputs_unchanged.py and tests/test_prefix_hashes.py failed there).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pow_c(base: Any, exp: Any) -> Any:
    """``base ** exp`` by the C library's ``pow`` (Python's float power), elementwise over arrays. The
    tables the roofline prices from are built once (~1,000 values each), so the loop costs nothing."""
    if isinstance(base, np.ndarray) or isinstance(exp, np.ndarray):
        b, e = np.broadcast_arrays(np.asarray(base, dtype=np.float64), np.asarray(exp, dtype=np.float64))
        out = [x ** y for x, y in zip(b.ravel().tolist(), e.ravel().tolist(), strict=True)]
        return np.array(out, dtype=np.float64).reshape(b.shape)
    return float(base) ** float(exp)


def smooth(flops: Any, nbytes: Any, peak: float, bw: float, p: float, t0: float) -> Any:
    """Smooth roofline ((F/P)^p + (B/BW)^p)^(1/p) + t0 (costmodel.md §0 item 2), arrays or floats."""
    return pow_c(pow_c(flops / peak, p) + pow_c(nbytes / bw, p), 1.0 / p) + t0
