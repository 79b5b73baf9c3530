"""Small statistics for the tests (scipy is not a dependency): Kolmogorov-Smirnov statistics and the
gamma distribution's CDF through the regularized lower incomplete gamma function."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def ks_statistic(xs: Sequence[float], cdf: Callable[[float], float]) -> float:
    """Kolmogorov-Smirnov statistic of the sample ``xs`` against ``cdf``."""
    ys = sorted(xs)
    n = len(ys)
    d = 0.0
    for i, x in enumerate(ys):
        c = cdf(x)
        d = max(d, (i + 1) / n - c, c - i / n)
    return d


def ks_critical(n: int, alpha: float = 0.01) -> float:
    """Asymptotic one-sample KS critical value (alpha 0.01: 1.63 / sqrt(n); 0.001: 1.95 / sqrt(n))."""
    c = {0.05: 1.36, 0.01: 1.63, 0.001: 1.95}[alpha]
    return c / math.sqrt(n)


def lower_regularized_gamma(a: float, x: float) -> float:
    """P(a, x) = gamma(a, x) / Gamma(a): the series for x < a + 1, else 1 - the continued fraction
    of Q(a, x) (modified Lentz), both to double precision."""
    if a <= 0:
        raise ValueError("a must be positive")
    if x <= 0:
        return 0.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        denom = a
        for _ in range(10_000):
            denom += 1
            term *= x / denom
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return min(1.0, total * math.exp(log_prefix))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return max(0.0, 1.0 - math.exp(log_prefix) * h)


def gamma_cdf(shape: float, scale: float) -> Callable[[float], float]:
    """The CDF of Gamma(shape, scale)."""
    return lambda x: lower_regularized_gamma(shape, x / scale)


def erlang_cdf(k: int, rate: float) -> Callable[[float], float]:
    """Closed form of Gamma(k, 1/rate) for integer k: 1 - exp(-rx) * sum_{n<k} (rx)^n / n!."""

    def cdf(x: float) -> float:
        if x <= 0:
            return 0.0
        rx = rate * x
        return 1.0 - math.exp(-rx) * sum(rx**n / math.factorial(n) for n in range(k))

    return cdf


def exponential_cdf(rate: float) -> Callable[[float], float]:
    return lambda x: 1.0 - math.exp(-rate * x) if x > 0 else 0.0


def mean_cv(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and coefficient of variation (sample standard deviation / mean)."""
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(var) / mean
