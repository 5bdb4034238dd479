"""Graders: a model response + the gold answer -> Verdict. One function per kind of benchmark.

- "math":   the last \\boxed{} of the text after `</think>` (or that text whole, through math-verify's
            own answer anchors, when nothing is boxed) checked against the gold answer by math-verify
            (LaTeX and plain numbers, fractions, roots, pi, units, thousands separators, sets, ...).
- "choice": the option letter (see `extract.extract_choice`) compared with the gold letter.
- "code":   lives in `code_tests.py`: it needs test cases, not an answer string.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from infir.eval.extract import extract_choice, final_text, last_boxed


@dataclass(frozen=True)
class Verdict:
    correct: bool
    extracted: str | None  # what was graded, for the per-sample jsonl; None when nothing was found


def _math_verify():
    try:
        import math_verify
    except ImportError as e:  # pragma: no cover - it is a dependency of the package
        raise ImportError("math grading needs math-verify: `pip install 'math-verify>=0.5'`") from e
    return math_verify


def _timeout_seconds() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    return 5 if threading.current_thread() is threading.main_thread() else None


def _normalize(latex: str) -> str:
    """What math-verify does not undo itself: "12\\%" (read as a string, not the number 12), a thin
    space as thousands separator ("1\\,000"), and a sentence's full stop inside the box ("36.")."""
    latex = re.sub(r"\\?%", "", latex)
    latex = re.sub(r"(?<=\d)\\,(?=\d{3}(?!\d))", "", latex)
    return re.sub(r"(?<=\d)\.\s*$", "", latex.strip())


def grade_math(response: str, answer: str) -> Verdict:
    mv = _math_verify()
    text = final_text(response)
    boxed = last_boxed(text)
    candidate = f"\\boxed{{{_normalize(boxed)}}}" if boxed is not None else text
    if not candidate.strip():
        return Verdict(False, None)
    timeout = _timeout_seconds()
    gold_config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    pred_config = [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()]
    gold = mv.parse(f"${_normalize(answer)}$", gold_config, parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math grader: gold answer {answer!r} does not parse; fix the benchmark's answer field")
    pred = mv.parse(candidate, pred_config, parsing_timeout=timeout)
    if not pred:
        return Verdict(False, boxed)
    extracted = str(pred[-1])  # math-verify returns [sympy object, matched string]
    return Verdict(bool(mv.verify(gold, pred, timeout_seconds=timeout)), extracted)


def grade_choice(response: str, answer: str, letters: str = "ABCD") -> Verdict:
    gold = extract_choice(answer.strip(), letters) or answer.strip().upper()
    if gold not in letters:
        raise ValueError(f"choice grader: gold answer {answer!r} is not one of the letters {letters}")
    chosen = extract_choice(final_text(response), letters)
    return Verdict(chosen == gold, chosen)


def grade_answer(bench, response: str, answer: str) -> Verdict:
    """The verdict of `bench`'s grader (a Benchmark whose grader is "math" or "choice")."""
    if bench.grader == "math":
        return grade_math(response, answer)
    if bench.grader == "choice":
        return grade_choice(response, answer, bench.letters)
    raise ValueError(f"{bench.name} is graded by running code against tests, not against an answer string; "
                     "use infir.eval.code_tests.grade_code(response, problem.code_task)")
