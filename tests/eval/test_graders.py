"""Gold cases for the public grading API: (benchmark, response, gold answer, expected verdict).

Equivalent and non-equivalent answers: integers, thousands separators, fractions, decimals, roots,
pi, units and degrees, percentages, intervals and tuples, expressions, nested and repeated \\boxed,
text after the answer, the `</think>` split, and GPQA letter formats.

The expected verdicts are EvalScope 0.17.1's (InfiR2's harness), read off by running it on each case,
its quirks included: "1,000" is the list {0, 1} (sorted) and not 1000, numbers within 1e-4 relative are
equal (12,345,679 = 12345678), brackets and parentheses are dropped before comparing ([-3,3] = (-3,3),
2x+1 = 2(x+1)), an unclosed \\boxed{ reads to the end, a response cut off while thinking is graded
whole, and a GPQA answer is the last standalone letter (the article "a" is A).
"""
import pytest

from infir.eval import grade

T = "<think>\nLet me work it out. Maybe 7? Or \\boxed{999}.\n</think>\n\n"  # a reasoning prefix

MATH_CASES = [
    # integers (AIME style)
    ("aime24", "\\boxed{204}", "204", True),
    ("aime24", "\\boxed{205}", "204", False),
    ("aime24", "The answer is $\\boxed{33}$.", "33", True),
    ("aime24", "\\boxed{033}", "33", True),
    ("aime24", "\\boxed{ 33 }", "33", True),
    ("aime24", "\\boxed{33.0}", "33", True),
    ("aime24", "\\boxed{-33}", "33", False),
    ("aime24", "\\boxed{3 3}", "33", True),
    ("aime24", "\\boxed{0}", "0", True),
    ("aime24", "\\boxed{1}", "0", False),
    ("aime25", "so $m+n = \\boxed{70}$", "70", True),
    ("aime25", "\\boxed{m+n=70}", "70", False),
    ("aime25", "\\boxed{x = 70}", "70", True),
    ("aime25", "\\boxed{70^\\circ}", "70", True),
    ("aime25", "\\boxed{71}", "70", False),
    ("aime25", "\\boxed{7}", "70", False),
    ("aime25", "\\boxed{700}", "70", False),
    ("aime25", "\\boxed{\\text{70}}", "70", True),
    ("aime25", "\\boxed{\\textbf{70}}", "70", True),
    ("aime25", "**Final answer:** \\boxed{588}", "588", True),
    # thousands separators
    ("gsm8k", "\\boxed{1,000}", "1000", False),
    ("gsm8k", "\\boxed{1000}", "1,000", False),
    ("gsm8k", "\\boxed{1{,}000}", "1000", True),
    ("gsm8k", "\\boxed{1\\,000}", "1000", False),
    ("gsm8k", "\\boxed{12,345,678}", "12345678", True),
    ("gsm8k", "\\boxed{12,345,679}", "12345678", True),
    ("gsm8k", "\\boxed{1,001}", "1000", False),
    ("gsm8k", "The total is 5,000 toys. \\boxed{5000}", "5000", True),
    ("gsm8k", "\\boxed{100}", "1000", False),
    # money and units
    ("gsm8k", "\\boxed{\\$18.90}", "18.9", True),
    ("gsm8k", "\\boxed{18.90}", "18.9", True),
    ("gsm8k", "\\boxed{\\$19}", "18.9", False),
    ("gsm8k", "\\boxed{10 \\text{ cm}}", "10", True),
    ("gsm8k", "\\boxed{10\\,\\text{cm}}", "10", True),
    ("gsm8k", "\\boxed{10 \\mbox{ dollars}}", "10", True),
    ("gsm8k", "\\boxed{12 \\text{ meters}}", "10", False),
    ("gsm8k", "\\boxed{26 \\text{ pencils}}", "26", True),
    ("gsm8k", "\\boxed{6\\text{ days}}", "6", True),
    ("gsm8k", "\\boxed{7\\text{ days}}", "6", False),
    # percentages
    ("gsm8k", "\\boxed{12\\%}", "12", True),
    ("gsm8k", "\\boxed{12\\%}", "12\\%", True),
    ("gsm8k", "\\boxed{13\\%}", "12", False),
    # fractions and decimals
    ("math500", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("math500", "\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True),
    ("math500", "\\boxed{\\tfrac12}", "\\frac{1}{2}", True),
    ("math500", "\\boxed{1/2}", "\\frac{1}{2}", True),
    ("math500", "\\boxed{0.5}", "\\frac{1}{2}", True),
    ("math500", "\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),
    ("math500", "\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    ("math500", "\\boxed{0.33}", "\\frac{1}{3}", False),
    ("math500", "\\boxed{\\frac{3}{4}}", "0.75", True),
    ("math500", "\\boxed{\\frac{4}{3}}", "0.75", False),
    ("math500", "\\boxed{-\\frac{1}{2}}", "\\frac{1}{2}", False),
    ("math500", "\\boxed{-\\frac{1}{2}}", "-\\frac12", True),
    ("math500", "\\boxed{\\frac{-1}{2}}", "-\\frac{1}{2}", True),
    ("math500", "\\boxed{1\\frac{1}{2}}", "\\frac{3}{2}", True),
    ("math500", "\\boxed{\\frac{9}{2}}", "4.5", True),
    ("math500", "\\boxed{4.50}", "\\frac{9}{2}", True),
    ("math500", "\\boxed{4.6}", "\\frac{9}{2}", False),
    # roots
    ("math500", "\\boxed{2\\sqrt{3}}", "2\\sqrt{3}", True),
    ("math500", "\\boxed{\\sqrt{12}}", "2\\sqrt{3}", True),
    ("math500", "\\boxed{2\\sqrt3}", "2\\sqrt{3}", True),
    ("math500", "\\boxed{\\sqrt{3}\\cdot 2}", "2\\sqrt{3}", True),
    ("math500", "\\boxed{3\\sqrt{2}}", "2\\sqrt{3}", False),
    ("math500", "\\boxed{\\sqrt{6}}", "2\\sqrt{3}", False),
    ("math500", "\\boxed{5\\sqrt{2}}", "5\\sqrt{2}", True),
    ("math500", "\\boxed{\\sqrt{50}}", "5\\sqrt{2}", True),
    ("math500", "\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", True),
    ("math500", "\\boxed{\\frac{1}{2}\\sqrt{3}}", "\\frac{\\sqrt{3}}{2}", True),
    ("math500", "\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{3}}{2}", False),
    ("math500", "\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", True),
    ("math500", "\\boxed{\\sqrt[3]{8}}", "2", True),
    ("math500", "\\boxed{4^{1/2}}", "2", True),
    # pi
    ("math500", "\\boxed{9\\pi}", "9\\pi", True),
    ("math500", "\\boxed{9 \\pi}", "9\\pi", True),
    ("math500", "\\boxed{\\pi \\cdot 9}", "9\\pi", True),
    ("math500", "\\boxed{3\\pi}", "9\\pi", False),
    ("math500", "\\boxed{9}", "9\\pi", False),
    ("math500", "\\boxed{28.27}", "9\\pi", False),
    ("math500", "\\boxed{\\frac{\\pi}{2}}", "\\frac{\\pi}{2}", True),
    ("math500", "\\boxed{\\frac{1}{2}\\pi}", "\\frac{\\pi}{2}", True),
    ("math500", "\\boxed{\\pi}", "\\frac{\\pi}{2}", False),
    ("math500", "\\boxed{2\\pi - 4}", "2\\pi-4", True),
    # degrees
    ("math500", "\\boxed{30^\\circ}", "30", True),
    ("math500", "\\boxed{30}", "30^\\circ", True),
    ("math500", "\\boxed{60^{\\circ}}", "30^\\circ", False),
    # intervals, tuples, sets
    ("math500", "\\boxed{(-3,3)}", "(-3,3)", True),
    ("math500", "\\boxed{(-3, 3)}", "(-3,3)", True),
    ("math500", "\\boxed{[-3,3]}", "(-3,3)", True),
    ("math500", "\\boxed{(-3,4)}", "(-3,3)", False),
    ("math500", "\\boxed{(1,2)}", "(1,2)", True),
    ("math500", "\\boxed{(2,1)}", "(1,2)", False),
    ("math500", "\\boxed{\\{1,2\\}}", "\\{1,2\\}", True),
    ("math500", "\\boxed{2, 1}", "1,2", True),
    ("math500", "\\boxed{1, 3}", "1,2", False),
    # expressions
    ("math500", "\\boxed{x^2+1}", "x^2+1", True),
    ("math500", "\\boxed{1+x^2}", "x^2+1", True),
    ("math500", "\\boxed{x^2-1}", "x^2+1", False),
    ("math500", "\\boxed{(x+1)(x-1)}", "x^2-1", True),
    ("math500", "\\boxed{2x+2}", "2(x+1)", True),
    ("math500", "\\boxed{2x+1}", "2(x+1)", True),
    ("math500", "\\boxed{y = 2x + 3}", "2x+3", True),
    ("math500", "\\boxed{3^{10}}", "59049", True),
    ("math500", "\\boxed{2^{10}}", "1000", False),
    ("math500", "\\boxed{10!}", "3628800", True),
    ("math500", "\\boxed{\\binom{10}{3}}", "120", True),
    ("math500", "\\boxed{e^2}", "e^2", True),
    ("math500", "\\boxed{\\log_2 8}", "3", False),
    # nested and repeated boxes, trailing text, the </think> split
    ("math500", "\\boxed{\\boxed{5}}", "5", True),
    ("math500", "\\boxed{\\boxed{6}}", "5", False),
    ("math500", "First \\boxed{6}, wait, that is wrong: \\boxed{5}", "5", True),
    ("math500", "First \\boxed{5}, wait, that is wrong: \\boxed{6}", "5", False),
    ("math500", "\\boxed{5} is the answer, not 6 or 7.", "5", True),
    ("math500", "\\boxed{5}. Check: 2+3=5, and 6 is not it.", "5", True),
    ("math500", "\\boxed{\\frac{1}{2}} since the other root 3 is rejected", "\\frac{1}{2}", True),
    ("math500", "\\fbox{5}", "5", True),
    ("math500", "\\boxed{5", "5", True),
    ("math500", T + "\\boxed{7}", "7", True),
    ("math500", T + "The answer is \\boxed{8}.", "7", False),
    ("math500", T + "No boxed answer here.", "999", False),
    ("math500", "<think>I will say \\boxed{7} but I run out of tokens", "7", True),
    ("math500", "<think>a</think>x<think>b</think> \\boxed{7}", "7", True),
    ("math500", "<think>\\boxed{7}</think> \\boxed{8}", "7", False),
    # no box: "the answer is ...", else the last number
    ("gsm8k", "The final answer is 26.", "26", True),
    ("gsm8k", "The final answer is $26$.", "26", True),
    ("gsm8k", "The final answer is 27.", "26", False),
    ("gsm8k", "", "26", False),
    ("gsm8k", "I do not know.", "26", False),
    # the demo's own solution format
    ("demo_arith", "Emma has 13 + 23 = 36 marbles. The answer is \\boxed{36}.", "36", True),
    ("demo_arith", "Emma has 13 + 23 = 35 marbles. The answer is \\boxed{35}.", "36", False),
    ("demo_arith", "The answer is \\boxed{36.}", "36", True),
]

CHOICE_CASES = [
    ("gpqa_diamond", "\\boxed{C}", "C", True),
    ("gpqa_diamond", "\\boxed{B}", "C", False),
    ("gpqa_diamond", "\\boxed{(C)}", "C", True),
    ("gpqa_diamond", "\\boxed{\\text{C}}", "C", True),
    ("gpqa_diamond", "\\boxed{\\text{(C)}}", "C", True),
    ("gpqa_diamond", "\\boxed{C) sp}", "C", True),
    ("gpqa_diamond", "\\boxed{c}", "C", True),
    ("gpqa_diamond", "\\boxed{E}", "C", False),
    ("gpqa_diamond", "\\boxed{sp2}", "C", False),
    ("gpqa_diamond", "The answer is C.", "C", True),
    ("gpqa_diamond", "The answer is (C).", "C", True),
    ("gpqa_diamond", "The answer is (B).", "C", False),
    ("gpqa_diamond", "Answer: C", "C", True),
    ("gpqa_diamond", "Answer: D", "C", False),
    ("gpqa_diamond", "ANSWER: C", "C", True),
    ("gpqa_diamond", "**Answer:** C", "C", True),
    ("gpqa_diamond", "**Answer: (C)**", "C", True),
    ("gpqa_diamond", "Final Answer: \\textbf{C}", "C", True),
    ("gpqa_diamond", "Final answer: $\\boxed{C}$", "C", True),
    ("gpqa_diamond", "The correct option is C, because ...", "C", True),
    ("gpqa_diamond", "The correct choice is (A)", "C", False),
    ("gpqa_diamond", "Options (A) and (B) fail, so the answer is (C).", "C", True),
    ("gpqa_diamond", "It is not (C); the answer is (A).", "C", False),
    ("gpqa_diamond", "Option A is wrong. Option B is wrong.\n\nC", "C", True),
    ("gpqa_diamond", "A\n", "C", False),
    ("gpqa_diamond", "the answer is a prime number, so (C)", "C", True),
    ("gpqa_diamond", "the answer is a prime number", "A", True),
    ("gpqa_diamond", "I cannot tell.", "C", False),
    ("gpqa_diamond", "", "C", False),
    ("gpqa_diamond", T + "\\boxed{C}", "C", True),
    ("gpqa_diamond", "<think>The answer is (C).</think> The answer is (D).", "C", False),
    ("gpqa_diamond", "<think>The answer is (C).</think> The answer is (C).", "C", True),
    ("gpqa_diamond", "<think>The answer is (C) but still thinking", "C", True),
    ("gpqa_diamond", "\\boxed{A} then on reflection \\boxed{C}", "C", True),
    ("gpqa_diamond", "\\boxed{C} then on reflection \\boxed{A}", "C", False),
    ("gpqa_diamond", "\\boxed{C}", " C ", True),
    ("gpqa_diamond", "Answer: A", "A", True),
    ("gpqa_diamond", "Answer: B", "B", True),
    ("gpqa_diamond", "Answer: D", "D", True),
]


@pytest.mark.parametrize("bench_name,response,answer,expected", MATH_CASES + CHOICE_CASES)
def test_gold_case(bench_name, response, answer, expected):
    assert grade(bench_name, response, answer) is expected


def test_case_count():
    assert len(MATH_CASES) + len(CHOICE_CASES) >= 150
    for cases in (MATH_CASES, CHOICE_CASES):  # both verdicts are exercised for each kind
        assert {c[3] for c in cases} == {True, False}


def test_code_benchmark_refuses_answer_grading():
    with pytest.raises(ValueError, match="grade_code"):
        grade("livecodebench_v5", "```python\nprint(1)\n```", "1")


def test_unknown_benchmark_names_the_known_ones():
    with pytest.raises(KeyError, match="aime24"):
        grade("aime2024", "\\boxed{1}", "1")


def test_unparseable_gold_answer_is_an_error():
    with pytest.raises(ValueError, match="gold answer"):
        grade("math500", "\\boxed{1}", "")
    with pytest.raises(ValueError, match="gold answer"):
        grade("gpqa_diamond", "\\boxed{C}", "(C)")
