"""GSM8K grade-school math. HF dataset `openai/gsm8k` (config main, split test; fields question,
answer, where the answer's worked solution ends with `#### <number>`)."""
from pathlib import Path

from infir.eval.benchmarks import Benchmark, Problem, Sampling
from infir.eval.prompts import math_prompt, stable_id


def to_problem(record: dict, rng) -> Problem:
    final = record["answer"].rsplit("####", 1)[-1].strip().replace(",", "")
    return Problem(id=stable_id(record["question"]), prompt=math_prompt(record["question"]), answer=final)


BENCHMARK = Benchmark(
    name="gsm8k",
    grader="math",
    hf_id="openai/gsm8k",
    hf_config="main",
    split="test",
    to_problem=to_problem,
    sample_file=Path(__file__).parent / "samples" / "gsm8k.jsonl",
    sampling=Sampling(n=1, temperature=0.65, top_p=0.95, max_new_tokens=8192),
)
