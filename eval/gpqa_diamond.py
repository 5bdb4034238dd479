"""GPQA-Diamond: 198 graduate-level four-option questions. HF dataset `Idavidrein/gpqa` (gated:
accept its terms and `huggingface-cli login` once; config gpqa_diamond, split train; fields
Question, Correct Answer, Incorrect Answer 1..3, Record ID).

The prompt is EvalScope's default for GPQA (InfiR2's harness): five worked expert examples
(gpqa_chain_of_thought.txt, the chain-of-thought examples of the GPQA authors as EvalScope ships them),
the question, the options as "(A) ...", and the instruction to box the answer. The options are shuffled
by one RNG seeded with the run's seed and used in dataset order, as EvalScope does (seed=42 is its
default). Reference sampling (eval/README.md): 8 samples, up to 26,000 new tokens."""
from pathlib import Path

from infir.eval.benchmarks import Benchmark, Problem, Sampling
from infir.eval.prompts import choice_prompt, shuffled_choices

LETTERS = "ABCD"
PREAMBLE = ("Here are some example questions from experts. Answer the final question yourself, following the "
            "format of the previous questions exactly.\n"
            + (Path(__file__).parent / "gpqa_chain_of_thought.txt").read_text() + "\nQuestion: ")


def to_problem(record: dict, rng) -> Problem:
    incorrect = [record[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
    options, correct = shuffled_choices(record["Correct Answer"], incorrect, rng)
    return Problem(id=record["Record ID"], prompt=choice_prompt(record["Question"], options, PREAMBLE, LETTERS),
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
