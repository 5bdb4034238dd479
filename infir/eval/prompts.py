"""Prompt builders shared by the benchmark declarations in eval/ (the user turn; chat templates are
applied by the runner with the model's own tokenizer)."""
from __future__ import annotations

import hashlib
import random

from infir.eval.benchmarks import MATH_INSTRUCTION


def stable_id(*parts: str) -> str:
    """A short id from a record's content, for datasets that ship none (stable across runs)."""
    return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:12]


def math_prompt(problem: str) -> str:
    return f"{problem.strip()}\n{MATH_INSTRUCTION}"


def shuffled_choices(correct: str, incorrect: list[str], seed: int, key: str) -> tuple[list[str], int]:
    """The options in an order fixed by (seed, key), and the index of the correct one.

    Seeded per problem, not globally, so one problem's order does not depend on which others load.
    """
    options = [correct, *incorrect]
    order = list(range(len(options)))
    random.Random(f"{seed}:{key}").shuffle(order)
    return [options[i].strip() for i in order], order.index(0)


def choice_prompt(question: str, options: list[str], letters: str = "ABCD") -> str:
    lines = "\n".join(f"{letters[i]}) {option}" for i, option in enumerate(options))
    return (f"{question.strip()}\n\n{lines}\n\nPlease reason step by step, and put the letter of the correct "
            "option within \\boxed{}, e.g. \\boxed{A}.")


def code_prompt(question: str, starter_code: str = "") -> str:
    """LiveCodeBench's two prompt shapes: complete the starter code, or a full stdin/stdout program."""
    head = ("You will be given a programming problem. Write a correct Python 3 program that meets the "
            "specification and passes all tests.\n\n" f"Question: {question.strip()}\n\n")
    if starter_code.strip():
        return head + ("Complete the following starter code and put your whole solution in one fenced "
                       f"code block:\n```python\n{starter_code.rstrip()}\n```\n")
    return head + ("Read the input from standard input and write the answer to standard output (do not "
                   "hard-code the sample inputs). Put your whole program in one fenced code block:\n"
                   "```python\n# YOUR CODE HERE\n```\n")
