"""Graders: a model response + the gold answer -> Verdict, as EvalScope 0.17 grades them (InfiR2's
harness). One function per kind of benchmark.

- "math":   the answer the text after `</think>` states (`extract.stated_answer`: the last \\boxed{},
            else "the answer is ...", else the last number), normalized twice as EvalScope does, against
            the normalized gold answer: equal as strings, as numbers within 1e-4, or by sympy
            (`math_answers`).
- "choice": the last standalone letter A-D of that text (`extract.extract_choice`) equals the gold letter.
- "code":   lives in `code_tests.py`: it needs test cases, not an answer string.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from infir.eval.extract import extract_choice, final_text, stated_answer
from infir.eval.math_answers import answers_equal, normalize_answer

MATH_TIME_LIMIT_S = 10


@dataclass(frozen=True)
class Verdict:
    correct: bool
    extracted: str | None  # what was graded, for the per-sample jsonl; None when nothing was found


class _SympyTimeout(Exception):
    pass


@contextmanager
def _time_limit(seconds: int):
    """sympy can run for minutes on a pathological answer (EvalScope would wait); past the limit the
    sample is graded wrong. SIGALRM is only for the main thread, so other threads run unlimited."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _SympyTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def grade_math(response: str, answer: str) -> Verdict:
    gold = normalize_answer(answer)
    if not gold:
        raise ValueError(f"math grader: gold answer {answer!r} is empty once normalized; fix the benchmark's answer field")
    pred = normalize_answer(normalize_answer(stated_answer(final_text(response))))
    try:
        with _time_limit(MATH_TIME_LIMIT_S):
            correct = answers_equal(pred, gold)
    except _SympyTimeout:
        correct = False
    return Verdict(correct, pred or None)


def grade_choice(response: str, answer: str, letters: str = "ABCD") -> Verdict:
    gold = answer.strip().upper()
    if gold not in letters or len(gold) != 1:
        raise ValueError(f"choice grader: gold answer {answer!r} is not one of the letters {letters}")
    chosen = extract_choice(final_text(response))
    return Verdict(bool(chosen) and chosen.strip() == gold, chosen or None)


def grade_answer(bench, response: str, answer: str) -> Verdict:
    """The verdict of `bench`'s grader (a Benchmark whose grader is "math" or "choice")."""
    if bench.grader == "math":
        return grade_math(response, answer)
    if bench.grader == "choice":
        return grade_choice(response, answer, bench.letters)
    raise ValueError(f"{bench.name} is graded by running code against tests, not against an answer string; "
                     "use infir.eval.code_tests.grade_code(response, problem.code_task)")
