"""The project's reasoning data: correct worked solutions, and a held-out split that holds."""
import re

import pytest

from infir.data.arithmetic import EVAL_SEED, arithmetic_problems, as_chat, as_text

_EQ = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


def test_every_step_is_true_and_the_box_holds_the_last_result():
    for p in arithmetic_problems(2000, 7):
        steps = _EQ.findall(p["solution"])
        assert steps, p
        for a, op, b, c in steps:
            assert _OPS[op](int(a), int(b)) == int(c), p
        assert p["solution"].endswith(f"The answer is \\boxed{{{p['answer']}}}.")
        assert steps[-1][3] == p["answer"]
        # The question's numbers are the ones the first step combines.
        numbers = re.findall(r"\d+", p["question"])
        assert steps[0][0] in numbers and steps[0][2] in numbers


def test_eval_questions_never_appear_in_training_sets():
    held_out = {p["question"] for p in arithmetic_problems(2000, EVAL_SEED)}
    assert len(held_out) == 2000
    for seed in (0, 1, 2, 10, 11, 12, 999_999):
        train = {p["question"] for p in arithmetic_problems(3000, seed)}
        assert not train & held_out, seed
    # Two eval seeds draw from the same held-out bucket: they overlap, which is fine, but are not equal.
    assert [p["question"] for p in arithmetic_problems(50, EVAL_SEED + 1)] != \
        [p["question"] for p in arithmetic_problems(50, EVAL_SEED)]


def test_deterministic_and_step_filter():
    assert arithmetic_problems(100, 3) == arithmetic_problems(100, 3)
    two = arithmetic_problems(200, 3, steps=(2,))
    assert all(len(_EQ.findall(p["solution"])) == 2 for p in two)
    one = arithmetic_problems(200, 3, steps=(1,))
    assert all(len(_EQ.findall(p["solution"])) == 1 for p in one)
    with pytest.raises(ValueError, match="steps"):
        arithmetic_problems(1, 3, steps=(3,))


def test_text_and_chat_views():
    p = arithmetic_problems(1, 0)[0]
    assert as_text(p) == f"Question: {p['question']}\nAnswer: {p['solution']}"
    assert as_chat(p) == [{"role": "user", "content": p["question"]}, {"role": "assistant", "content": p["solution"]}]
