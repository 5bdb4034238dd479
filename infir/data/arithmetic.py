"""Arithmetic word problems with step-by-step solutions: the project's own reasoning data.

Each problem is a dict ``{"question", "solution", "answer"}``; the solution states every step as an
equation and ends with ``The answer is \\boxed{N}.`` so the math grader reads it like a
real benchmark answer.

Train / eval split (held-out by construction, not by luck): every problem falls in one of
``_BUCKETS`` buckets by a hash of its question text, and bucket 0 is the held-out set. Seeds below
``EVAL_SEED`` draw only from the training buckets; seeds ``>= EVAL_SEED`` draw only from bucket 0.
So no question of an eval set ever appears in any training set, whichever seeds either side uses.
Arithmetic facts (``7 + 5 = 12``) are shared across the split, as they are between GSM8K's train
and test sets; the model must still read the story to find which numbers to combine.
"""
from __future__ import annotations

import hashlib
import random
from typing import Callable

EVAL_SEED = 1_000_000
"""First held-out seed: ``arithmetic_problems(n, EVAL_SEED)`` is the canonical eval set."""

_BUCKETS = 5

_NAMES = (
    "Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Henry", "Iris", "Jack", "Kate",
    "Leo", "Mia", "Noah", "Olivia", "Paul", "Rosa", "Sam", "Tara", "Victor", "Wendy", "Yusuf",
)
_OBJECTS = (
    "apples", "books", "coins", "pencils", "marbles", "stamps", "cookies", "shells", "cards",
    "flowers", "eggs", "candles", "buttons", "stones", "ribbons", "plums",
)
_CONTAINERS = ("bags", "boxes", "baskets", "jars", "crates", "packs")


def _add(rng: random.Random, name: str, other: str, obj: str) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    question = f"{name} has {a} {obj}. {other} gives {name} {b} more {obj}. How many {obj} does {name} have now?"
    steps = [f"{name} starts with {a} {obj} and gets {b} more, so {a} + {b} = {a + b}."]
    return question, steps, a + b


def _sub(rng: random.Random, name: str, other: str, obj: str) -> tuple[str, list[str], int]:
    a = rng.randint(5, 40)
    b = rng.randint(1, a - 1)
    question = f"{name} has {a} {obj} and gives {b} of them to {other}. How many {obj} does {name} have left?"
    steps = [f"{name} starts with {a} {obj} and gives away {b}, so {a} - {b} = {a - b}."]
    return question, steps, a - b


def _mul(rng: random.Random, name: str, other: str, obj: str) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    box = rng.choice(_CONTAINERS)
    question = f"{name} buys {a} {box} of {obj}. Each of the {box} holds {b} {obj}. How many {obj} does {name} buy?"
    steps = [f"There are {a} {box} with {b} {obj} each, so {a} * {b} = {a * b}."]
    return question, steps, a * b


def _div(rng: random.Random, name: str, other: str, obj: str) -> tuple[str, list[str], int]:
    each, people = rng.randint(2, 9), rng.randint(2, 9)
    total = each * people
    question = f"{name} shares {total} {obj} equally among {people} friends. How many {obj} does each friend get?"
    steps = [f"{total} {obj} are split into {people} equal parts, so {total} / {people} = {each}."]
    return question, steps, each


def _add_sub(rng: random.Random, name: str, other: str, obj: str) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    c = rng.randint(1, a + b - 1)
    question = (f"{name} has {a} {obj}. {name} finds {b} more and then gives {c} to {other}. "
                f"How many {obj} does {name} have now?")
    steps = [f"After finding more, {name} has {a} + {b} = {a + b} {obj}.",
             f"After giving {c} away, {name} has {a + b} - {c} = {a + b - c} {obj}."]
    return question, steps, a + b - c


def _mul_add(rng: random.Random, name: str, other: str, obj: str) -> tuple[str, list[str], int]:
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
    box = rng.choice(_CONTAINERS)
    question = (f"{name} has {a} {box} with {b} {obj} in each, and {c} loose {obj}. "
                f"How many {obj} does {name} have in total?")
    steps = [f"The {box} hold {a} * {b} = {a * b} {obj}.",
             f"With the loose ones, {name} has {a * b} + {c} = {a * b + c} {obj}."]
    return question, steps, a * b + c


_Template = Callable[[random.Random, str, str, str], tuple[str, list[str], int]]
_TEMPLATES: dict[int, tuple[_Template, ...]] = {1: (_add, _sub, _mul, _div), 2: (_add_sub, _mul_add)}


def is_eval_seed(seed: int) -> bool:
    return seed >= EVAL_SEED


def _bucket(question: str) -> int:
    return int.from_bytes(hashlib.sha1(question.encode("utf-8")).digest()[:4], "little") % _BUCKETS


def make_problem(rng: random.Random, steps: tuple[int, ...] = (1, 2)) -> dict:
    """One problem drawn from ``rng`` (no split applied: ``arithmetic_problems`` does that)."""
    template = rng.choice([t for k in steps for t in _TEMPLATES[k]])
    name, other = rng.sample(_NAMES, 2)
    question, steps, answer = template(rng, name, other, rng.choice(_OBJECTS))
    solution = " ".join(steps) + f" The answer is \\boxed{{{answer}}}."
    return {"question": question, "solution": solution, "answer": str(answer)}


def arithmetic_problems(n: int, seed: int, steps: tuple[int, ...] = (1, 2)) -> list[dict]:
    """``n`` distinct problems; seeds ``>= EVAL_SEED`` give held-out problems (see module doc).

    ``steps`` picks the templates by how many operations the solution takes (1 and/or 2).
    """
    if not steps or any(k not in _TEMPLATES for k in steps):
        raise ValueError(f"arithmetic_problems: steps must be a non-empty subset of {tuple(_TEMPLATES)}, got {steps}")
    if n < 0:
        raise ValueError(f"arithmetic_problems: n must be >= 0, got {n}")
    if seed < 0:
        raise ValueError(f"arithmetic_problems: seed must be >= 0, got {seed}")
    want_eval = is_eval_seed(seed)
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[dict] = []
    # The problem space holds millions of questions, so rejection sampling ends quickly; the cap
    # turns an impossible request into an error instead of a hang.
    for _ in range(50 * n + 1000):
        if len(problems) == n:
            break
        problem = make_problem(rng, steps)
        q = problem["question"]
        if q in seen or (_bucket(q) == 0) != want_eval:
            continue
        seen.add(q)
        problems.append(problem)
    if len(problems) < n:
        raise RuntimeError(f"arithmetic_problems: found only {len(problems)} distinct problems of {n} asked")
    return problems


def as_text(problem: dict) -> str:
    """A problem as one pretraining document (question, then the worked solution)."""
    return f"Question: {problem['question']}\nAnswer: {problem['solution']}"


def as_chat(problem: dict) -> list[dict]:
    """A problem as the SFT conversation; the demo eval prompts with ``as_chat(p)[:1]``."""
    return [{"role": "user", "content": problem["question"]},
            {"role": "assistant", "content": problem["solution"]}]
