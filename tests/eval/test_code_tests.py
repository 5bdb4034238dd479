"""LiveCodeBench grading under LiveCodeBench's harness (as EvalScope runs it): both test styles, the
first fenced block, output comparison, the test-field codecs."""
import json
import pickle
import base64
import zlib

import pytest

from infir.eval.code_tests import CodeTask, TestCase, decode_lcb_tests, encode_lcb_tests, grade_code
from infir.eval.extract import extract_code
from infir.eval.lcb_driver import stdout_matches
from infir.eval.sandbox import Limits

LIMITS = Limits(wall_s=10.0, cpu_s=5)


def fenced(code: str, lang: str = "python") -> str:
    return f"<think>reasoning with\n```python\nprint('draft')\n```\ninside</think>\nHere:\n```{lang}\n{code}\n```\nDone."


FUNCTIONAL = CodeTask(tests=(TestCase("[1, 5, 3]", "8"), TestCase("[-1, -2]", "-3")), style="functional",
                      func_name="maxPairSum", limits=LIMITS)


def test_functional_correct_solution_passes():
    code = "class Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n        a, b = nlargest(2, nums)\n        return a + b"
    verdict, reason = grade_code(fenced(code), FUNCTIONAL)  # List and nlargest come from the prelude
    assert verdict.correct, reason
    assert "nlargest" in verdict.extracted


def test_functional_wrong_solution_fails_on_the_right_test():
    code = "class Solution:\n    def maxPairSum(self, nums):\n        return max(nums) * 2 if max(nums) > 0 else sum(nums)"
    verdict, reason = grade_code(fenced(code), FUNCTIONAL)
    assert not verdict.correct and reason == "test 0: wrong answer"
    missing = grade_code(fenced("class Solution:\n    def other(self, nums):\n        return 0"), FUNCTIONAL)
    assert not missing[0].correct and "maxPairSum" in missing[1]


def test_functional_return_types_compare_as_json():
    task = CodeTask(tests=(TestCase('[3, 1, 2]\n2', "[1, 2]"),), style="functional", func_name="smallest", limits=LIMITS)
    code = "class Solution:\n    def smallest(self, nums, k):\n        return tuple(sorted(nums)[:k])"
    assert grade_code(fenced(code), task)[0].correct


def test_stdin_solution_and_its_failures():
    task = CodeTask(tests=(TestCase("1 2\n", "3\n"), TestCase("-5 5\n", "0\n")), style="stdin", limits=LIMITS)
    assert grade_code(fenced("a, b = map(int, input().split())\nprint(a + b)"), task)[0].correct
    assert grade_code(fenced("print(3)"), task)[1] == "test 1: wrong answer"
    crashed = grade_code(fenced("a = int(input().split()[0]) // 0"), task)
    assert not crashed[0].correct and crashed[1].startswith("test 0: ZeroDivisionError")
    assert grade_code("I would loop over the input.", task)[1] == "no code block in the response"


def test_stdin_programs_run_as_the_harness_runs_them():
    """As the body of a function with star-imported helpers, stdin a StringIO and exit() a normal end:
    what passes and fails there passes and fails here."""
    task = CodeTask(tests=(TestCase("1 2\n", "3\n"), TestCase("-5 5\n", "0\n")), style="stdin", limits=LIMITS)
    passes = ["a, b = map(int, input().split())\nprint(a + b)\nexit()",
              "def main():\n    print(sum(map(int, input().split())))\n\nif __name__ == '__main__':\n    main()",
              "print(int(fsum(map(int, input().split()))))"]  # fsum: the harness's star imports
    fails = ["import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))",  # a StringIO has no buffer
             "a, b = map(int, input().split())\ns = 0\ndef add():\n    global s\n    s = a + b\nadd()\nprint(s)",
             "print(sum(map(int, input().split())))\nquit()"]  # the harness disables quit
    for code in passes:
        assert grade_code(fenced(code), task)[0].correct, code
    for code in fails:
        assert not grade_code(fenced(code), task)[0].correct, code


def test_first_fenced_block_is_graded():
    text = "```text\nnot code\n```\n```python\nprint(1)\n```\n```python\nprint(2)\n```"
    assert extract_code(text) == "not code"
    assert extract_code("```\nprint(3)\n```") == "print(3)"
    assert extract_code("Use ``` fences.\n```python\nprint(4)\n```") == ""  # a line that mentions a fence is one
    assert extract_code("no fence") is None and extract_code("```python\nprint(5)") is None


@pytest.mark.parametrize("got,expected,same", [
    ("3\n", "3", True), ("  3  \n\n", "3\n", True), ("1 2\n3 4\n", "1 2\n3 4", True),
    ("1  2", "1 2", True), ("0.3333333", "0.33333333", False), ("0.5", "0.6", False),
    ("1 2", "1 2 3", False), ("1\n2", "1 2", False), ("Yes", "yes", False), ("", "0", False),
    ("3.0", "3", True), ("2.50", "2.5", True), ("1e3", "1000", True), ("nan", "NaN", False),
])
def test_outputs_match_as_decimals(got, expected, same):
    assert stdout_matches(got, expected) is same


def test_lcb_test_codecs_round_trip():
    tests = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    assert decode_lcb_tests(encode_lcb_tests(tests)) == [TestCase("1 2\n", "3\n")]
    assert decode_lcb_tests(json.dumps(tests)) == [TestCase("1 2\n", "3\n")]


def test_private_tests_pickle_cannot_run_code():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    blob = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(pickle.UnpicklingError, match="only a string"):
        decode_lcb_tests(blob)


def test_code_task_validates():
    with pytest.raises(ValueError, match="func_name"):
        CodeTask(tests=(TestCase("", ""),), style="functional")
    with pytest.raises(ValueError, match="without tests"):
        CodeTask(tests=(), style="stdin")
