"""GPQA-Diamond: 198 graduate-level four-option questions. HF dataset `Idavidrein/gpqa` (gated:
accept its terms and `huggingface-cli login` once; config gpqa_diamond, split train; fields
Question, Correct Answer, Incorrect Answer 1..3, Record ID). The options are shuffled per problem
with the run's seed. Reference sampling (eval/README.md): 8 samples, up to 26,000 new tokens."""
from pathlib import Path

from infir.eval.benchmarks import Benchmark, Problem, Sampling
from infir.eval.prompts import choice_prompt, shuffled_choices

LETTERS = "ABCD"


def to_problem(record: dict, seed: int) -> Problem:
    incorrect = [record[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
    options, correct = shuffled_choices(record["Correct Answer"], incorrect, seed, key=record["Record ID"])
    return Problem(id=record["Record ID"], prompt=choice_prompt(record["Question"], options, LETTERS),
                   answer=LETTERS[correct])


BENCHMARK = Benchmark(
    name="gpqa_diamond",
    grader="choice",
    hf_id="Idavidrein/gpqa",
    hf_config="gpqa_diamond",
    split="train",
    to_problem=to_problem,
    sample_file=Path(__file__).parent / "samples" / "gpqa_diamond.jsonl",
    sampling=Sampling(n=8, temperature=0.65, top_p=0.95, max_new_tokens=26_000),
    letters=LETTERS,
)
