"""MATH-500 (the PRM800K test subset of MATH). HF dataset `HuggingFaceH4/MATH-500` (split test;
fields problem, solution, answer, subject, level, unique_id). Answers are LaTeX, graded as EvalScope grades them
(infir.eval.math_answers)."""
from pathlib import Path

from infir.eval.benchmarks import Benchmark, Problem, Sampling
from infir.eval.prompts import math_prompt


def to_problem(record: dict, rng) -> Problem:
    return Problem(id=record["unique_id"], prompt=math_prompt(record["problem"]), answer=record["answer"])


BENCHMARK = Benchmark(
    name="math500",
    grader="math",
    hf_id="HuggingFaceH4/MATH-500",
    split="test",
    to_problem=to_problem,
    sample_file=Path(__file__).parent / "samples" / "math500.jsonl",
    sampling=Sampling(n=4, temperature=0.65, top_p=0.95, max_new_tokens=31_000),
)
