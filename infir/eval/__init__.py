"""infir.eval: reasoning evaluation (AIME, GPQA-Diamond, LiveCodeBench, MATH-500, GSM8K).

Public API:
  grade(benchmark, response, answer) -> bool   math and multiple-choice benchmarks, graded as EvalScope 0.17
  pass_at_k(n, c, k)                            Chen et al. 2021 unbiased estimator
  infir-eval run / compare / list               (infir.eval.cli)

Modules: extract (answer text), math_answers (normalization, equivalence), graders (math, choices),
sandbox + code_tests + lcb_driver (LiveCodeBench), metrics (avg@n, pass@k),
benchmarks (registry of eval/<name>.py), backends (vLLM, HF), cache, runner, report, config, cli.
"""
from __future__ import annotations

from infir.eval.metrics import pass_at_k

__all__ = ["grade", "pass_at_k"]


def grade(benchmark: str, response: str, answer: str) -> bool:
    """True when `response` answers a problem of `benchmark` (e.g. "aime24", "gpqa_diamond") whose
    gold answer is `answer`; only the text after the last `</think>` counts (all of it without one)."""
    from infir.eval.benchmarks import get_benchmark
    from infir.eval.graders import grade_answer

    return grade_answer(get_benchmark(benchmark), response, answer).correct
