"""avg@n and the unbiased pass@k estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", eq. 1), as EvalScope 0.17 computes them: with n samples of which c are correct,
    pass@k = E[1 - C(n-c, k) / C(n, k)],
computed as a product so that large n (AIME's 32 samples) never overflows, and averaged over problems;
avg@n is the mean verdict over every sample (EvalScope's "AveragePass@1")."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}; lower k or draw more samples")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def benchmark_metrics(correct: Sequence[Sequence[bool]], ks: Sequence[int] = (1,)) -> dict[str, float]:
    """Per-benchmark metrics from one list of sample verdicts per problem.

    avg@n is the mean verdict over all samples, every sample weighing the same (EvalScope's headline
    "AveragePass@1"; n is the largest sample count); pass@k is averaged over problems (EvalScope's
    "Pass@k", LiveCodeBench's headline at k=1), for each k that every problem has enough samples for.
    The two agree when every problem has the same number of samples.
    """
    if not correct:
        raise ValueError("benchmark_metrics: no problems were graded")
    n_min = min(len(c) for c in correct)
    if n_min == 0:
        raise ValueError("benchmark_metrics: a problem has no graded samples")
    n_max = max(len(c) for c in correct)
    out = {f"avg@{n_max}": float(np.mean([v for c in correct for v in c])) * 100}
    for k in sorted(set(ks)):
        if k <= n_min:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(len(c), sum(c), k) for c in correct])) * 100
    return out
