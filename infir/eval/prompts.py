"""Prompt builders shared by the benchmark declarations in eval/: the user turn (and a benchmark's
system turn) exactly as EvalScope 0.17 writes them, the harness InfiR2's table was scored with; chat
templates are applied by the runner with the model's own tokenizer."""
from __future__ import annotations

import hashlib
import random
import re

from infir.eval.benchmarks import MATH_INSTRUCTION


def stable_id(*parts: str) -> str:
    """A short id from a record's content, for datasets that ship none (stable across runs)."""
    return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:12]


def math_prompt(problem: str) -> str:
    return f"{problem}\n{MATH_INSTRUCTION}"


def clean_option(text: str | None) -> str:
    """A GPQA option as EvalScope shows it: '[title]' marks become sentence breaks, other bracketed
    notes are dropped, double spaces single."""
    if text is None:
        return " "
    text = re.sub(r"\[.*?\]", "", text.strip().replace(" [title]", ". "))
    return text.replace("  ", " ")


def shuffled_choices(correct: str, incorrect: list[str], rng: random.Random) -> tuple[list[str], int]:
    """The cleaned options [incorrect..., correct] shuffled by `rng`, and the index of the correct one.

    One rng is shared by the records of a load, in dataset order, as EvalScope's global RNG is: with
    the same seed (EvalScope's default is 42) the options come in EvalScope's order.
    """
    options = [clean_option(text) for text in [*incorrect, correct]]
    rng.shuffle(options)
    return options, options.index(clean_option(correct))


def choice_prompt(question: str, options: list[str], preamble: str, letters: str = "ABCD") -> str:
    lines = "".join(f"({letter}) {option}\n" for letter, option in zip(letters, options))
    return f"{preamble}{question}\nChoices:\n{lines}\n{MATH_INSTRUCTION}"


CODE_SYSTEM_PROMPT = ("You are an expert Python programmer. You will be given a question (problem specification) and "
                      "will generate a correct Python program that matches the specification and passes all tests. "
                      "You will NOT return anything except for the program.")


def code_prompt(question: str, starter_code: str = "") -> str:
    """LiveCodeBench's two prompt shapes: complete the starter code, or a full stdin/stdout program."""
    if starter_code:
        fmt = ("You will use the following starter code to write the solution to the problem and enclose your "
               f"code within delimiters.\n```python\n{starter_code}\n```\n\n")
    else:
        fmt = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
               "on the sample inputs). Enclose your code within delimiters as follows.\n```python\n# YOUR CODE HERE\n```\n\n")
    return f"### Question:\n{question}\n\n### Format: {fmt} ### Answer: (use the provided format with backticks)\n\n"
