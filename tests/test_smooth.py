"""sim/cost/smooth.py: the roofline's powers are the C library's on every machine, arrays or floats."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost.smooth import pow_c, smooth

positive = st.floats(min_value=1e-12, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(positive, min_size=1, max_size=64), st.floats(min_value=1.0, max_value=8.0))
def test_array_powers_are_the_scalar_ones_to_the_bit(xs, p):
    """An array's powers are each element's float power (numpy's SIMD power differs from it where the
    CPU has AVX-512: a step time would then depend on the machine)."""
    got = pow_c(np.array(xs), p)
    assert got.dtype == np.float64 and got.shape == (len(xs),)
    assert got.tolist() == [x ** p for x in xs]
    assert pow_c(0.5, np.array(xs[:3])).tolist() == [0.5 ** x for x in xs[:3]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(positive, positive), min_size=1, max_size=32), st.floats(min_value=1.0, max_value=8.0))
def test_the_smooth_roofline_over_an_array_is_the_scalar_one_per_element(rows, p):
    f = np.array([a for a, _ in rows])
    b = np.array([c for _, c in rows])
    got = smooth(f, b, 3.0e14, 2.0e12, p, 5e-6)
    assert got.tolist() == [smooth(x, y, 3.0e14, 2.0e12, p, 5e-6) for x, y in rows]
    # and it is a roofline: at least the slower of compute and memory, at most their sum (p >= 1)
    for x, y in rows:
        t = smooth(x, y, 3.0e14, 2.0e12, p, 0.0)
        lo, hi = max(x / 3.0e14, y / 2.0e12), x / 3.0e14 + y / 2.0e12
        assert lo * (1 - 1e-12) <= t <= hi * (1 + 1e-12)


def test_two_dimensional_arrays_keep_their_shape():
    x = np.arange(1.0, 7.0).reshape(2, 3)
    assert pow_c(x, 2.5).shape == (2, 3)
    assert pow_c(x, 2.5)[1, 2] == 6.0 ** 2.5
