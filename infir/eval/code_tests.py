"""LiveCodeBench grading: the response's program runs against the problem's tests in the sandbox,
under LiveCodeBench's own harness as EvalScope 0.17 runs it (`lcb_driver`, InfiR2's scores).

Two test styles, as LiveCodeBench has them:
- "stdin":      the program reads the test input on stdin; its stdout must match the expected output
                line by line (stripped lines equal, or equal as Decimal numbers).
- "functional": LeetCode-style `class Solution` with method `func_name`; each input line is one JSON
                argument; the method's return value must equal the JSON-decoded expected output.
A sample passes when every test passes; all tests run in one sandboxed process and the first failure
stops it (the rest cannot change the verdict). `CodeTask.limits.wall_s` is the limit per test.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import pickle
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from infir.eval import lcb_driver
from infir.eval.extract import extract_code, final_text
from infir.eval.graders import Verdict
from infir.eval.sandbox import Limits, run_python

_DRIVER_SOURCE = Path(lcb_driver.__file__).read_text()


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


def _driver_limits(task: CodeTask) -> tuple[int, Limits]:
    """The per-test alarm (whole seconds, as the harness sets it) and the sandbox's limits for the whole
    sample: (alarm + 1) s of wall clock per test, the harness's own global limit, and the per-test CPU
    limit once per test plus a second for the harness to start."""
    per_test = max(1, math.ceil(task.limits.wall_s))
    count = len(task.tests)
    return per_test, dataclasses.replace(task.limits, wall_s=float((per_test + 1) * count),
                                         cpu_s=task.limits.cpu_s * count + 1)


def run_tests(code: str, task: CodeTask) -> tuple[bool, str]:
    """(passed, reason): `code` against every test of `task` in one sandboxed run of the harness."""
    per_test, limits = _driver_limits(task)
    spec = {"inputs": [t.input for t in task.tests], "outputs": [t.output for t in task.tests],
            "fn_name": task.func_name if task.style == "functional" else None, "timeout": per_test}
    result = run_python(_DRIVER_SOURCE, limits=limits, files={"solution.py": code, "tests.json": json.dumps(spec)})
    if result.timed_out:
        return False, "time limit exceeded"
    tagged = [line for line in result.stdout.splitlines() if line.startswith(lcb_driver.RESULT_TAG)]
    if not tagged:
        return False, f"exit {result.returncode}: {result.stderr.strip()[-300:]}"
    outcome = json.loads(tagged[-1][len(lcb_driver.RESULT_TAG):])
    return outcome["passed"], outcome["reason"]


def grade_code(response: str, task: CodeTask) -> tuple[Verdict, str]:
    """(verdict, reason): the first code block of the text after `</think>` against every test of `task`."""
    code = extract_code(final_text(response))
    if code is None:
        return Verdict(False, None), "no code block in the response"
    passed, reason = run_tests(code, task)
    return Verdict(passed, code), reason


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
