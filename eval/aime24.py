"""AIME 2024: 30 integer-answer problems. HF dataset `HuggingFaceH4/aime_2024` (split train; fields
id, problem, solution, answer). Reference sampling (eval/README.md): 32 samples, up to 31,000 new tokens."""
from pathlib import Path

from infir.eval.benchmarks import Benchmark, Problem, Sampling
from infir.eval.prompts import math_prompt


def to_problem(record: dict, rng) -> Problem:
    return Problem(id=str(record["id"]), prompt=math_prompt(record["problem"]), answer=str(record["answer"]))


BENCHMARK = Benchmark(
    name="aime24",
    grader="math",
    hf_id="HuggingFaceH4/aime_2024",
    split="train",
    to_problem=to_problem,
    sample_file=Path(__file__).parent / "samples" / "aime24.jsonl",
    sampling=Sampling(n=32, temperature=0.65, top_p=0.95, max_new_tokens=31_000),
)
