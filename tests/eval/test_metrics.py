"""pass@k against its definition (an exact enumeration over all k-subsets) and avg@k."""
import itertools
import math
import random

import pytest

from infir.eval import pass_at_k
from infir.eval.metrics import benchmark_metrics


def pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_matches_enumeration_on_random_cases():
    rng = random.Random(1234)
    for _ in range(60):
        n = rng.randint(1, 10)
        c, k = rng.randint(0, n), rng.randint(1, n)
        assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_by_enumeration(n, c, k), abs=1e-12)


def test_matches_binomial_form_for_large_n():
    for n, c, k in [(32, 5, 8), (32, 1, 1), (64, 10, 16), (200, 3, 100)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)


def test_edges():
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)


def test_benchmark_metrics():
    verdicts = [[True, False, False, False], [True, True, True, True], [False] * 4]
    m = benchmark_metrics(verdicts, ks=[1, 2, 4, 8])
    assert m["avg@4"] == pytest.approx(100 * (0.25 + 1 + 0) / 3)
    assert m["pass@1"] == pytest.approx(m["avg@4"])  # pass@1 is the mean of the verdicts
    assert m["pass@2"] == pytest.approx(100 * (0.5 + 1 + 0) / 3)
    assert m["pass@4"] == pytest.approx(100 * 2 / 3)
    assert "pass@8" not in m  # not estimable from 4 samples
    with pytest.raises(ValueError, match="no problems"):
        benchmark_metrics([])
