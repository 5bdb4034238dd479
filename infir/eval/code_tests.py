"""LiveCodeBench grading: the response's program runs against the problem's tests in the sandbox.

Two test styles, as LiveCodeBench has them:
- "stdin":      the program reads the test input on stdin; its stdout must match the expected output
                line by line (whitespace-insensitive, numbers compared with a small tolerance).
- "functional": LeetCode-style `class Solution` with method `func_name`; each input line is one JSON
                argument; the method's return value must equal the JSON-decoded expected output.
A sample passes when every test passes; the first failure stops the run (the rest cannot change it).
"""
from __future__ import annotations

import base64
import io
import json
import math
import pickle
import zlib
from dataclasses import dataclass, field

from infir.eval.extract import extract_code, final_text
from infir.eval.graders import Verdict
from infir.eval.sandbox import Limits, run_python


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # not a pytest class
    input: str
    output: str


@dataclass(frozen=True)
class CodeTask:
    tests: tuple[TestCase, ...]
    style: str  # "stdin" or "functional"
    func_name: str | None = None
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self):
        if self.style not in ("stdin", "functional"):
            raise ValueError(f"CodeTask.style must be 'stdin' or 'functional', got {self.style!r}")
        if self.style == "functional" and not self.func_name:
            raise ValueError("CodeTask: functional tests need func_name (LiveCodeBench metadata['func_name'])")
        if not self.tests:
            raise ValueError("CodeTask: a problem without tests cannot be graded")


# What LiveCodeBench's own harness makes available to functional solutions without an import.
_PRELUDE = """\
import bisect, collections, copy, functools, heapq, itertools, math, operator, random, re, string, sys
from bisect import *
from collections import *
from functools import *
from heapq import *
from itertools import *
from math import *
from typing import *
sys.setrecursionlimit(1 << 16)
"""

_FUNCTIONAL_DRIVER = """\
import json
source = open("solution.py").read()
namespace = {}
exec(compile(_PRELUDE + "\\n" + source, "solution.py", "exec"), namespace)
args = [json.loads(line) for line in open("input.txt").read().split("\\n") if line.strip()]
result = getattr(namespace["Solution"](), FUNC_NAME)(*args)
print(json.dumps(result))
"""


def _as_number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def outputs_match(got: str, expected: str) -> bool:
    """stdout comparison: same lines after stripping, tokens equal or numerically close (1e-6)."""
    got_lines = [line.strip() for line in got.strip().splitlines()]
    want_lines = [line.strip() for line in expected.strip().splitlines()]
    if got_lines == want_lines:
        return True
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines):
        g_tokens, w_tokens = g.split(), w.split()
        if len(g_tokens) != len(w_tokens):
            return False
        for gt, wt in zip(g_tokens, w_tokens):
            if gt == wt:
                continue
            gn, wn = _as_number(gt), _as_number(wt)
            if gn is None or wn is None or not math.isclose(gn, wn, rel_tol=1e-6, abs_tol=1e-6):
                return False
    return True


def _json_equal(got: str, expected: str) -> bool:
    try:
        return json.loads(got) == json.loads(expected)
    except json.JSONDecodeError:
        return False


def run_test(code: str, task: CodeTask, test: TestCase) -> tuple[bool, str]:
    """(passed, reason) for one test."""
    if task.style == "stdin":
        result = run_python(code, stdin=test.input, limits=task.limits)
    else:
        driver = f"_PRELUDE = {_PRELUDE!r}\nFUNC_NAME = {task.func_name!r}\n{_FUNCTIONAL_DRIVER}"
        result = run_python(driver, limits=task.limits, files={"solution.py": code, "input.txt": test.input})
    if result.timed_out:
        return False, "time limit exceeded"
    if result.returncode != 0:
        return False, f"exit {result.returncode}: {result.stderr.strip()[-300:]}"
    matches = outputs_match if task.style == "stdin" else _json_equal
    return (True, "ok") if matches(result.stdout, test.output) else (False, "wrong answer")


def grade_code(response: str, task: CodeTask) -> tuple[Verdict, str]:
    """(verdict, reason): the response's last code block against every test of `task`."""
    code = extract_code(final_text(response))
    if code is None:
        return Verdict(False, None), "no code block in the response"
    for i, test in enumerate(task.tests):
        passed, reason = run_test(code, task, test)
        if not passed:
            return Verdict(False, code), f"test {i}: {reason}"
    return Verdict(True, code), f"passed {len(task.tests)} tests"


class _NoGlobalsUnpickler(pickle.Unpickler):
    """LiveCodeBench ships private tests as a pickled *string*; refuse anything else, since a pickle
    that names a global could run code in the harness."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"private_test_cases pickle names {module}.{name}; only a string is expected")


def decode_lcb_tests(field: str | list) -> list[TestCase]:
    """LiveCodeBench's test field: a JSON list, or base64(zlib(pickle(JSON string))) for private tests."""
    if isinstance(field, list):
        items = field
    else:
        try:
            items = json.loads(field)
        except json.JSONDecodeError:
            blob = zlib.decompress(base64.b64decode(field))
            items = json.loads(_NoGlobalsUnpickler(io.BytesIO(blob)).load())
    return [TestCase(input=t["input"], output=t["output"]) for t in items]


def encode_lcb_tests(tests: list[dict]) -> str:
    """The inverse of the private-test encoding (for writing sample sets in the real format)."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
