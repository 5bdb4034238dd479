"""AIME 2025 (I and II): 30 integer-answer problems. HF dataset `opencompass/AIME2025` (the one
EvalScope uses; configs AIME2025-I and AIME2025-II, split test; fields question, answer).
Reference sampling (eval/README.md): 32 samples, up to 31,000 new tokens."""
from pathlib import Path

from infir.eval.benchmarks import Benchmark, Problem, Sampling
from infir.eval.prompts import math_prompt, stable_id


def to_problem(record: dict, rng) -> Problem:
    return Problem(id=stable_id(record["question"]), prompt=math_prompt(record["question"]), answer=str(record["answer"]))


BENCHMARK = Benchmark(
    name="aime25",
    grader="math",
    hf_id="opencompass/AIME2025",
    hf_config=("AIME2025-I", "AIME2025-II"),
    split="test",
    to_problem=to_problem,
    sample_file=Path(__file__).parent / "samples" / "aime25.jsonl",
    sampling=Sampling(n=32, temperature=0.65, top_p=0.95, max_new_tokens=31_000),
)
