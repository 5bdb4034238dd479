"""LiveCodeBench grading: both test styles, output comparison, the test-field codecs."""
import json
import pickle
import base64
import zlib

import pytest

from infir.eval.code_tests import CodeTask, TestCase, decode_lcb_tests, encode_lcb_tests, grade_code, outputs_match
from infir.eval.extract import extract_code
from infir.eval.sandbox import Limits

LIMITS = Limits(wall_s=10.0, cpu_s=5)


def fenced(code: str, lang: str = "python") -> str:
    return f"<think>reasoning with ```python\nprint('draft')\n``` inside</think>\nHere:\n```{lang}\n{code}\n```\nDone."


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


def test_functional_return_types_compare_as_json():
    task = CodeTask(tests=(TestCase('[3, 1, 2]\n2', "[1, 2]"),), style="functional", func_name="smallest", limits=LIMITS)
    code = "class Solution:\n    def smallest(self, nums, k):\n        return tuple(sorted(nums)[:k])"
    assert grade_code(fenced(code), task)[0].correct


def test_stdin_solution_and_its_failures():
    task = CodeTask(tests=(TestCase("1 2\n", "3\n"), TestCase("-5 5\n", "0\n")), style="stdin", limits=LIMITS)
    assert grade_code(fenced("a, b = map(int, input().split())\nprint(a + b)"), task)[0].correct
    assert grade_code(fenced("print(3)"), task)[1] == "test 1: wrong answer"
    crashed = grade_code(fenced("raise SystemExit(3)"), task)
    assert not crashed[0].correct and crashed[1].startswith("test 0: exit 3")
    assert grade_code("I would loop over the input.", task)[1] == "no code block in the response"


def test_last_python_block_after_think_is_graded():
    text = "```text\nnot code\n```\n```python\nprint(1)\n```\n```python\nprint(2)\n```"
    assert extract_code(text).strip() == "print(2)"
    assert extract_code("```\nprint(3)\n```").strip() == "print(3)"
    assert extract_code("no fence") is None


@pytest.mark.parametrize("got,expected,same", [
    ("3\n", "3", True), ("  3  \n\n", "3\n", True), ("1 2\n3 4\n", "1 2\n3 4", True),
    ("1  2", "1 2", True), ("0.3333333", "0.33333333", True), ("0.5", "0.6", False),
    ("1 2", "1 2 3", False), ("1\n2", "1 2", False), ("Yes", "yes", False), ("", "0", False),
    ("3.0", "3", True), ("nan", "1", False),
])
def test_outputs_match(got, expected, same):
    assert outputs_match(got, expected) is same


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
