"""Open-loop arrival times, with the semantics of ``vllm bench serve`` so simulated and real runs line up.

What vLLM's benchmark client does (engines.md §1.7; ``vllm/benchmarks/serve.py::get_request``):

* ``request_rate == inf`` (its default): every delay is 0, all requests are sent at t = 0.
* otherwise each request ``i`` draws a gap ``Δ_i ~ Gamma(shape=b, scale=1/(rate·b))`` (mean ``1/rate``,
  CV ``1/√b``; ``b = 1`` is exponential, i.e. Poisson; ``b = inf`` is a constant gap ``1/rate``);
* the send times are the cumulative sums ``t_i = Σ_{j≤i} Δ_j`` measured from the benchmark start, so the
  *first request also waits* ``Δ_0`` (it is not sent at t = 0);
* without ramp-up the times are then rescaled so that the last one is exactly ``N / rate``; vLLM does it to
  make throughput comparable across seeds. After rescaling the mean gap (counting ``t_0 − 0``) is exactly
  ``1/rate`` and the gaps are a scaled Dirichlet, whose CV is ``sqrt((N−1)/(N·b+1)) ≈ 1/√b``.

``rescale=False`` gives the plain renewal process (same draws, no rescaling). All times are seconds from
the start of the run (t = 0). The gap draws are ``standard_gamma(b) / (rate·b)``, so with a fixed seed a
different rate scales every time by the same factor: common random numbers across a rate sweep.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from sim.core.errors import ConfigError
from sim.core.fields import int_digits
from sim.core.spec import MAX_ARRIVAL_S

ARRIVAL_KINDS = ("poisson", "gamma", "constant")


def check_rate(rate: float, name: str = "arrival rate") -> float:
    """A rate in requests/s: a number > 0, inf (all at t = 0) too; ``name`` leads the message."""
    allowed = "a number > 0 (requests/s; inf = all at t=0)"
    if isinstance(rate, bool) or not isinstance(rate, int | float | np.integer | np.floating):
        raise ConfigError(f"{name} must be {allowed}, got {rate!r}")
    try:
        rate = float(rate)
    except OverflowError:  # an int past a float's range
        raise ConfigError(f"{name}: got an integer of {int_digits(rate)} digits; allowed {allowed}") from None
    if not rate > 0:  # also rejects NaN
        raise ConfigError(f"{name} must be {allowed}, got {rate}")
    return rate


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise ConfigError(f"arrival n (number of requests) must be an integer, got {n!r}")
    if n < 0:
        raise ConfigError(f"arrival n (number of requests) must be >= 0, got {n}")
    return int(n)


MIN_BURSTINESS = 1e-6


def check_burstiness(b: float, name: str = "arrival burstiness") -> float:
    """A gamma shape: a number >= MIN_BURSTINESS, inf (constant gaps) too; ``name`` leads the message."""
    allowed = f"a number >= {MIN_BURSTINESS:g} (1 = Poisson, inf = constant gaps)"
    if isinstance(b, bool) or not isinstance(b, int | float | np.integer | np.floating):
        raise ConfigError(f"{name} must be {allowed}, got {b!r}")
    try:
        b = float(b)
    except OverflowError:  # an int past a float's range
        raise ConfigError(f"{name}: got an integer of {int_digits(b)} digits; allowed {allowed}") from None
    # vLLM asserts burstiness > 0; NaN is refused too. At 5e-324 the gamma's scale 1/(rate·b) overflows and
    # every gap is NaN; already at 1e-6 twenty draws are all 0 (every request at one instant), so nothing
    # below that describes a load.
    if not b >= MIN_BURSTINESS:
        raise ConfigError(f"{name} must be {allowed}, got {b}")
    return b


def _finish(gaps: np.ndarray, rate: float, rescale: bool) -> np.ndarray:
    times = np.cumsum(gaps)
    if rescale and len(times) and times[-1] > 0:
        # vLLM: target_total_delay_s = N / rate; multiply every time by target / t_last.
        times *= (len(times) / rate) / times[-1]
        times[-1] = len(times) / rate  # exact, not off by one ulp
    return times


def constant(rate: float, n: int) -> np.ndarray:
    """Evenly spaced: ``t_i = (i+1)/rate`` (vLLM's burstiness = inf); the last arrival is at ``n/rate``."""
    rate, n = check_rate(rate), _check_n(n)
    if math.isinf(rate):
        return np.zeros(n)
    return np.arange(1, n + 1, dtype=float) / rate


def gamma(
    rate: float, n: int, rng: np.random.Generator, burstiness: float = 1.0, *, rescale: bool = True
) -> np.ndarray:
    """Gamma-renewal arrivals as ``vllm bench serve`` draws them (see module doc); sorted, float64 seconds."""
    rate, n, b = check_rate(rate), _check_n(n), check_burstiness(burstiness)
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(b):
        return constant(rate, n)
    gaps = rng.standard_gamma(b, n) / (rate * b)
    return _finish(gaps, rate, rescale)


def poisson(rate: float, n: int, rng: np.random.Generator, *, rescale: bool = True) -> np.ndarray:
    """Exponential gaps (gamma with burstiness 1), including vLLM's rescale of the last arrival to n/rate."""
    return gamma(rate, n, rng, 1.0, rescale=rescale)


def check_span(n: int, rate: float, name: str) -> None:
    """Refuse a rate that spreads ``n`` arrivals beyond the simulated clock's range (MAX_ARRIVAL_S):
    said before anything is generated, not as a failure mid-run or as latencies that all read 0.
    ``name``: the option, for the message (``workload.rate``, ``trace option rate``)."""
    if n / rate > MAX_ARRIVAL_S:
        raise ConfigError(f"{name}: {rate:g} req/s spreads {n} arrivals over ~{n / rate:.3g} s, beyond the "
                          f"simulated clock's {MAX_ARRIVAL_S:g} s; allowed: rate >= {n / MAX_ARRIVAL_S:.3g}")


@dataclass(frozen=True, slots=True)
class ArrivalConfig:
    """An arrival process as configured; ``sample`` draws ``n`` times from a given generator."""

    kind: str = "poisson"
    rate: float = math.inf
    burstiness: float = 1.0
    rescale: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ConfigError(f"arrival kind {self.kind!r} is not one of {', '.join(ARRIVAL_KINDS)}")
        check_rate(self.rate)
        b = check_burstiness(self.burstiness)
        if self.kind != "gamma" and b != 1.0:
            raise ConfigError(
                f"arrival burstiness={self.burstiness} only applies to kind 'gamma', not {self.kind!r}"
            )
        if not isinstance(self.rescale, bool):
            raise ConfigError(f"arrival rescale must be true or false, got {self.rescale!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "constant":
            return constant(self.rate, n)
        return gamma(self.rate, n, rng, self.burstiness, rescale=self.rescale)


def make_arrivals(
    kind: str,
    rate: float,
    n: int,
    rng: np.random.Generator,
    burstiness: float = 1.0,
    *,
    rescale: bool = True,
) -> np.ndarray:
    """``n`` arrival times (seconds from t = 0) for ``kind`` in poisson | gamma | constant."""
    return ArrivalConfig(kind, rate, burstiness, rescale).sample(n, rng)


PREPASS_CHUNK = 1 << 20


class ArrivalStream:
    """The same times as ``ArrivalConfig.sample(n, rng)``, element for element, handed out in chunks so a
    million-request workload never holds its arrival array. Gap draws are sequential in numpy, and the
    cumulative sum is carried across chunks in the same order of additions, so chunking changes no bit.
    vLLM's rescale needs the last time before the first: a pre-pass over a copy of the generator sums the
    gaps (O(n) draws, 8 MB of memory)."""

    def __init__(self, arrivals: ArrivalConfig, n: int, rng: np.random.Generator) -> None:
        self.cfg, self.n, self.rng = arrivals, _check_n(n), rng
        self.done = 0
        self.carry = 0.0
        self.factor: float | None = None  # the rescale: (n / rate) / t_last
        a = arrivals
        self.renewal = a.kind != "constant" and math.isfinite(a.rate) and math.isfinite(a.burstiness)
        if self.renewal and a.rescale and n:
            probe = copy.deepcopy(rng)
            buf = np.empty(min(n, PREPASS_CHUNK))
            last, left = 0.0, n
            while left:
                k = min(left, PREPASS_CHUNK)
                last = float(self._cumsum(probe, buf[:k], last)[-1])
                left -= k
            if last > 0:
                self.factor = (n / a.rate) / last

    def _cumsum(self, rng: np.random.Generator, out: np.ndarray, carry: float) -> np.ndarray:
        """The next ``len(out)`` cumulative times (before any rescale), after ``carry``, into ``out``."""
        b = self.cfg.burstiness
        if b == 1.0:
            rng.standard_exponential(out=out)  # what standard_gamma(1.0) draws, without its overhead
        else:
            rng.standard_gamma(b, out=out)
        np.divide(out, self.cfg.rate * b, out=out)
        out[0] += carry  # carry + g0, then the sums in the order one cumsum over every gap makes them
        return np.cumsum(out, out=out)

    def take(self, k: int) -> np.ndarray:
        """The next ``min(k, left)`` arrival times."""
        k = min(k, self.n - self.done)
        a, i0 = self.cfg, self.done
        self.done += k
        if k <= 0:
            return np.zeros(0)
        if math.isinf(a.rate):
            return np.zeros(k)
        if not self.renewal:  # constant gaps (kind constant, or gamma with burstiness inf)
            return np.arange(i0 + 1, i0 + k + 1, dtype=float) / a.rate
        times = self._cumsum(self.rng, np.empty(k), self.carry)
        self.carry = float(times[-1])
        if self.factor is not None:
            times *= self.factor
            if self.done == self.n:
                times[-1] = self.n / a.rate  # exact, not off by one ulp (as _finish)
        return times
