"""Model-like responses for the EvalScope parity check (bench/evalscope_parity.py), made from a seed.

Three kinds, one generator each: math (a gold answer in MATH-500/AIME style and a response that states
it, an equivalent form of it or a wrong one, boxed or not, in the ways reasoning models write), multiple
choice (GPQA letters in varied phrasings) and code (LiveCodeBench-style stdin and LeetCode programs,
right, wrong, crashing or slow, in varied fences). The same generator with another seed gives another
set from the same distribution: seed 1 is the tuning set, seed 2 the held-out set.
"""
from __future__ import annotations

import random
from fractions import Fraction

TUNE_SEED, HELDOUT_SEED = 1, 2

_PROSE = ["Let me set up the problem.", "We compute each term in turn.", "Checking small cases first: 1, 2, 3.",
          "By symmetry the two halves are equal.", "Substituting back gives a consistent value.",
          "So the total is 12 + 7 = 19 before the final step.", "Wait, I should double-check the second case.",
          "Using the formula $a^2 + b^2 = c^2$ with $a = 3$.", "There are 4 cases to consider."]
_UNITS = ["\\text{ cm}", "\\text{ meters}", "\\text{ dollars}", "\\,\\text{cm}^2", "\\text{ units}", " \\text{inches}",
          "\\mbox{ cm}", "\\text{ degrees}", "\\text{ ways}", "\\text{ days}"]
_NUMBER_WORDS = {0: "zero", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
                 8: "eight", 9: "nine", 10: "ten", 12: "twelve", 20: "twenty", 100: "one hundred"}


def _int_forms(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    same = [str(n), f"{n}.0", f"{n}.00", f" {n} ", f"{n}^\\circ", f"{n}^{{\\circ}}", f"{n}{rng.choice(_UNITS)}",
            f"\\${n}", f"x = {n}", f"m+n={n}", f"\\text{{{n}}}", f"{{{n}}}", f"\\textbf{{{n}}}", f"{n}.",
            f"0{n}" if n < 100 else f"{n:,}", f"{n}\\%", f"\\frac{{{2 * n}}}{{2}}", f"{n}\\text{{th}}"]
    if n in _NUMBER_WORDS:
        same += [f"\\text{{{_NUMBER_WORDS[n]}}}", _NUMBER_WORDS[n]]
    wrong = [str(n + 1), str(n - 1), str(n * 10), f"-{n}", f"{n}.5", f"{n} + 1", str(n + rng.randint(2, 50))]
    return same, wrong


def _fraction_forms(rng: random.Random, f: Fraction) -> tuple[str, list[str], list[str]]:
    a, b = f.numerator, f.denominator
    sign = "-" if a < 0 else ""
    a = abs(a)
    gold = f"{sign}\\frac{{{a}}}{{{b}}}"
    same = [gold, f"{sign}\\dfrac{{{a}}}{{{b}}}", f"{sign}\\tfrac{{{a}}}{{{b}}}", f"{sign}{a}/{b}",
            f"{sign}\\frac{{{2 * a}}}{{{2 * b}}}", f"\\left({sign}\\frac{{{a}}}{{{b}}}\\right)", f"{sign}{float(abs(f)):.4f}",
            f"{sign}{float(abs(f))}", f"\\frac{{{sign}{a}}}{{{b}}}", f"{sign}{a} / {b}"]
    if a < 10 and b < 10:
        same.append(f"{sign}\\frac{a}{b}")
    wrong = [f"{sign}\\frac{{{b}}}{{{a}}}", f"{sign}\\frac{{{a + 1}}}{{{b}}}", f"{'' if sign else '-'}\\frac{{{a}}}{{{b}}}",
             f"{sign}{float(abs(f)):.1f}", f"{sign}{a}{b}"]
    return gold, same, wrong


def _root_forms(rng: random.Random, k: int, m: int) -> tuple[str, list[str], list[str]]:
    gold = f"{k}\\sqrt{{{m}}}" if k != 1 else f"\\sqrt{{{m}}}"
    same = [gold, f"{k}\\sqrt{m}" if k != 1 else f"\\sqrt{m}", f"\\sqrt{{{k * k * m}}}", f"{k} \\sqrt{{{m}}}",
            f"\\sqrt{{{m}}} \\cdot {k}", f"{k}*sqrt({m})", f"{(k * k * m) ** 0.5:.6f}"]
    wrong = [f"{m}\\sqrt{{{k}}}" if m != k else f"{k + 1}\\sqrt{{{m}}}", f"\\sqrt{{{k * m}}}", f"{k}\\sqrt{{{m + 1}}}",
             f"{(k * k * m) ** 0.5:.1f}"]
    return gold, same, wrong


_TEMPLATED = [  # gold, equivalent forms, wrong forms: answers as MATH-500 writes them
    ("\\frac{\\pi}{2}", ["\\frac{\\pi}{2}", "\\dfrac{\\pi}{2}", "\\pi/2", "\\frac{1}{2}\\pi", "1.5708", "\\frac12\\pi"], ["\\pi", "2\\pi", "\\frac{\\pi}{3}"]),
    ("9\\pi", ["9\\pi", "9 \\pi", "\\pi \\cdot 9", "9\\pi \\text{ cm}^2", "28.2743"], ["3\\pi", "9", "18\\pi", "28.3"]),
    ("2\\pi-4", ["2\\pi - 4", "-4+2\\pi", "2(\\pi-2)"], ["2\\pi+4", "4-2\\pi", "2\\pi"]),
    ("(-3,3)", ["(-3,3)", "(-3, 3)", "\\left(-3, 3\\right)", "x \\in (-3,3)"], ["[-3,3]", "(-3,4)", "(3,-3)", "-3,3"]),
    ("[2,5)", ["[2,5)", "[2, 5)", "x\\in[2,5)"], ["(2,5)", "[2,5]", "[2,6)"]),
    ("(-\\infty, 0]", ["(-\\infty,0]", "(-\\infty, 0]", "(-inf, 0]"], ["(-\\infty, 0)", "[0, \\infty)", "(-\\infty, 1]"]),
    ("(1,2)", ["(1,2)", "(1, 2)", "\\left(1,2\\right)"], ["(2,1)", "(1,3)", "1,2"]),
    ("\\{1,2\\}", ["\\{1,2\\}", "\\{1, 2\\}", "\\{2,1\\}", "1,2", "1, 2"], ["\\{1,3\\}", "\\{1\\}", "3"]),
    ("1,2,3", ["1,2,3", "3,2,1", "1, 2, 3", "2, 1, 3"], ["1,2", "1,2,4", "123"]),
    ("-2, 5", ["-2, 5", "5, -2", "-2,5"], ["2, 5", "-2, -5", "5"]),
    ("x^2+1", ["x^2+1", "1+x^2", "x^{2}+1", "x^2 + 1"], ["x^2-1", "x^2", "x+1"]),
    ("2x+3", ["2x+3", "3+2x", "y = 2x + 3", "2x + 3"], ["2x-3", "3x+2", "2x"]),
    ("(x+1)(x-1)", ["(x+1)(x-1)", "x^2-1", "(x-1)(x+1)"], ["(x+1)^2", "x^2+1"]),
    ("\\frac{x+1}{2}", ["\\frac{x+1}{2}", "\\frac{1}{2}(x+1)", "(x+1)/2", "0.5x+0.5"], ["\\frac{x-1}{2}", "x+1"]),
    ("y=2x+3", ["y=2x+3", "y = 2x + 3", "2x+3", "y = 3 + 2x"], ["y=2x-3", "y=3x+2"]),
    ("30^\\circ", ["30^\\circ", "30", "30^{\\circ}", "30 \\text{ degrees}", "\\frac{\\pi}{6}"], ["60^\\circ", "150^\\circ", "3"]),
    ("25\\%", ["25\\%", "25", "25 \\%", "0.25", "25%"], ["75\\%", "2.5", "35\\%"]),
    ("\\$18.90", ["\\$18.90", "18.90", "18.9", "\\$ 18.90", "18.90 \\text{ dollars}"], ["\\$19", "18.09", "1890"]),
    ("1,000,000", ["1,000,000", "1000000", "1{,}000{,}000", "10^6", "1\\,000\\,000"], ["100000", "1,000,001", "10^7"]),
    ("\\text{Evelyn}", ["\\text{Evelyn}", "Evelyn", "\\textbf{Evelyn}", "\\text{evelyn}"], ["\\text{Alice}", "Bob", "\\text{Eve}"]),
    ("\\text{(C)}", ["\\text{(C)}", "(C)", "C", "\\text{C}"], ["(D)", "\\text{(A)}", "B"]),
    ("\\text{odd}", ["\\text{odd}", "odd", "\\text{Odd}"], ["\\text{even}", "even", "\\text{neither}"]),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", ["\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
                                                 "\\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}", "(1,2)"],
     ["\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}"]),
    ("\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", ["\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", "\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}"],
     ["\\begin{pmatrix} 0 & 1 \\\\ 1 & 0 \\end{pmatrix}"]),
    ("1011_2", ["1011_2", "1011_{2}", "1011"], ["1101_2", "11", "1011_3"]),
    ("3+4i", ["3+4i", "4i+3", "3 + 4i", "3+4j"], ["3-4i", "4+3i", "5"]),
    ("\\infty", ["\\infty", "infinity", "\\infty."], ["-\\infty", "0", "\\text{none}"]),
    ("\\sqrt{2}+1", ["\\sqrt{2}+1", "1+\\sqrt{2}", "1+\\sqrt2", "2.414214"], ["\\sqrt{2}-1", "\\sqrt{3}+1", "2.41"]),
    ("\\frac{1+\\sqrt{5}}{2}", ["\\frac{1+\\sqrt{5}}{2}", "\\dfrac{1 + \\sqrt{5}}{2}", "\\frac{\\sqrt{5}+1}{2}", "1.618034"],
     ["\\frac{1-\\sqrt{5}}{2}", "\\frac{1+\\sqrt{3}}{2}", "\\sqrt{5}"]),
    ("e^2", ["e^2", "e^{2}", "7.389056"], ["e", "2e", "e^3"]),
    ("\\log_2 3", ["\\log_2 3", "\\log_{2}3", "\\frac{\\ln 3}{\\ln 2}", "1.584963"], ["\\log_3 2", "\\log_2 5"]),
    ("0.25", ["0.25", ".25", "\\frac{1}{4}", "1/4", "0.250", "25\\%"], ["0.5", "2.5", "\\frac{1}{5}"]),
    ("-2", ["-2", "- 2", "x=-2", "-2.0", "\\left(-2\\right)"], ["2", "-3", "-\\frac{1}{2}"]),
    ("\\text{A, C}", ["\\text{A, C}", "A, C", "\\text{A,C}", "A and C"], ["\\text{A, B}", "C", "\\text{B, D}"]),
    ("5", ["5", "\\text{five}", "five", "5 \\text{ ways}", "x = 5"], ["6", "\\text{six}", "50"]),
]


def math_item(rng: random.Random) -> tuple[str, str]:
    """(gold answer, the answer text the response states): equivalent or wrong, about half each."""
    kind = rng.random()
    if kind < 0.35:
        n = rng.choice([rng.randint(0, 999), rng.randint(0, 20), rng.randint(100, 999)])
        gold = str(n)
        same, wrong = _int_forms(rng, n)
    elif kind < 0.5:
        f = Fraction(rng.randint(-9, 30), rng.randint(2, 16))
        if f.denominator == 1:
            f += Fraction(1, 3)
        gold, same, wrong = _fraction_forms(rng, f)
    elif kind < 0.58:
        gold, same, wrong = _root_forms(rng, rng.randint(1, 6), rng.choice([2, 3, 5, 6, 7, 10, 11]))
    else:
        gold, same, wrong = rng.choice(_TEMPLATED)
    return gold, rng.choice(same if rng.random() < 0.55 else wrong)


def _reasoning(rng: random.Random) -> str:
    return " ".join(rng.sample(_PROSE, rng.randint(1, 4)))


def math_response(rng: random.Random, stated: str) -> str:
    """A response that states `stated` in one of the ways models do (or fails to state anything)."""
    think = f"<think>\n{_reasoning(rng)}\nMaybe it is \\boxed{{{rng.randint(1, 99)}}}? Let me verify.\n</think>\n\n"
    body = _reasoning(rng)
    decoy = str(rng.randint(1, 999))
    shapes = [
        lambda: f"{body}\n\nTherefore, the final answer is $\\boxed{{{stated}}}$.",
        lambda: f"{body}\n\n\\[\n\\boxed{{{stated}}}\n\\]",
        lambda: f"{body} So the answer is \\boxed{{{stated}}}.",
        lambda: f"{body} First guess: \\boxed{{{decoy}}}. On reflection the answer is \\boxed{{{stated}}}.",
        lambda: f"{body} I get \\boxed{{{stated}}}, but the other case gives \\boxed{{{decoy}}}.",
        lambda: f"{body} The answer is ${stated}$.",
        lambda: f"{body}\nThe final answer is {stated}",
        lambda: f"{body} Final Answer: The final answer is ${stated}$. I hope it is correct.",
        lambda: f"{body} 答案是 {stated}",
        lambda: f"{body} so we get {stated} in the end.",
        lambda: f"{body} Hence $\\boxed {stated}$",
        lambda: f"{body} \\fbox{{{stated}}}",
        lambda: f"{body} \\boxed{{ {stated} }}",
        lambda: f"{body} **Answer:** $\\boxed{{\\displaystyle {stated}}}$",
        lambda: f"{body} $$\\boxed{{{stated}}}.$$",
        lambda: f"{body} The answer is: {stated}.",
        lambda: f"{body}\n\n**Final Answer**\n\\boxed{{{stated}}}\n",
        lambda: f"{body} I could not finish the computation.",
        lambda: "",
    ]
    weights = [10, 6, 6, 3, 2, 3, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 6, 1, 0.3]
    answer = rng.choices(shapes, weights)[0]()
    wrapper = rng.random()
    if wrapper < 0.45:
        return think + answer
    if wrapper < 0.52:  # ran out of tokens while thinking
        return f"<think>\n{_reasoning(rng)} So far \\boxed{{{stated}}} looks right but"
    if wrapper < 0.56:  # the box only inside the reasoning
        return f"<think>\nIt is \\boxed{{{stated}}}.\n</think>\n\nThe result follows from the steps above, {decoy}."
    return answer


def math_cases(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        gold, stated = math_item(rng)
        cases.append({"id": f"math-{seed}-{i}", "gold": gold, "response": math_response(rng, stated)})
    return cases


def choice_response(rng: random.Random, letter: str, other: str) -> str:
    body = rng.choice(["Option A ignores the spin term.", "The reaction proceeds by SN2.", "We compare energies.",
                       "B and D contradict the data.", "this is a classic result.", "Consider each option in turn."])
    shapes = [
        f"{body}\n\nThe answer is \\boxed{{{letter}}}.",
        f"{body} Therefore the correct answer is ({letter}).",
        f"{body}\n\nAnswer: {letter}",
        f"{body}\n\n**Answer: ({letter})**",
        f"{body} So the answer is {letter.lower()}.",
        f"{body} \\boxed{{\\text{{{letter}}}}}",
        f"{body} \\boxed{{({letter})}}",
        f"{body} I pick {letter}, not {other}.",
        f"{body} I pick {other}. Final: \\boxed{{{letter}}}",
        f"{body} \\boxed{{{letter}}} is a good choice because of a lower barrier.",
        f"{body} The answer is \\boxed{{{letter}}}. Note that {other} would need a catalyst.",
        f"{body}\n{letter}",
        f"{body} ({letter}) {rng.choice(['10 kJ', 'sp3', 'the cis isomer'])}",
        f"{body} Final answer: {letter}) {rng.choice(['2.5 eV', 'increase', 'none of these'])}",
        f"{body} The correct option is **{letter}**.",
        f"{body} The answer is $\\boxed{{{letter}}}$",
        f"{body} It must be option {letter}; options {other} and the rest fail.",
        f"{body} I am not sure.",
        f"{body} \\boxed{{{letter}{other}}}",
        f"{body} The answer: {letter}.\nA quick check confirms it.",
        "",
    ]
    answer = rng.choice(shapes)
    wrapper = rng.random()
    if wrapper < 0.5:
        return f"<think>\nMaybe ({other}). {body}\n</think>\n\n{answer}"
    if wrapper < 0.56:
        return f"<think>\nI think it is ({letter}) but"
    return answer


def choice_cases(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        gold = rng.choice("ABCD")
        said = gold if rng.random() < 0.5 else rng.choice("ABCD")
        other = rng.choice([c for c in "ABCD" if c != said])
        cases.append({"id": f"choice-{seed}-{i}", "gold": gold, "response": choice_response(rng, said, other)})
    return cases


# Code: small problems in LiveCodeBench's two shapes, each with programs written the ways models write
# them. Tests are tiny so that a run costs milliseconds; the slow programs spin until the time limit.
def _stdin(inputs: list[str], outputs: list[str]) -> dict:
    return {"inputs": inputs, "outputs": outputs, "fn_name": None}


def _functional(fn: str, inputs: list[str], outputs: list[str]) -> dict:
    return {"inputs": inputs, "outputs": outputs, "fn_name": fn}


_SUM_IO = _stdin(["1 2\n", "-5 5\n", "100 23\n"], ["3\n", "0\n", "123\n"])
_MEAN_IO = _stdin(["4\n1 2 3 4\n", "2\n3 3\n"], ["2.5\n", "3\n"])
_LINES_IO = _stdin(["3\n", "1\n"], ["1\n2\n3\n", "1\n"])
_WORDS_IO = _stdin(["hello big world\n", "a b\n"], ["world big hello\n", "b a\n"])
_YESNO_IO = _stdin(["4\n", "7\n"], ["Yes\n", "No\n"])
_PAIR_IO = _functional("maxPairSum", ["[1, 5, 3]", "[-1, -2]"], ["8", "-3"])
_SMALLEST_IO = _functional("smallest", ["[3, 1, 2]\n2", "[5, 4]\n1"], ["[1, 2]", "[4]"])
_COUNT_IO = _functional("countMost", ["\"abca\"", "\"zz\""], ["2", "2"])
_HALF_IO = _functional("half", ["5", "4"], ["2.5", "2"])

_PROGRAMS = {  # problem -> (tests, [(program, note)])
    "sum": (_SUM_IO, [
        ("a, b = map(int, input().split())\nprint(a + b)", "input()"),
        ("import sys\na, b = map(int, sys.stdin.readline().split())\nprint(a + b)", "readline"),
        ("import sys\ndata = sys.stdin.read().split()\nprint(int(data[0]) + int(data[1]))", "read().split()"),
        ("import sys\ndata = sys.stdin.buffer.read().split()\nprint(int(data[0]) + int(data[1]))", "stdin.buffer"),
        ("def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\nif __name__ == \"__main__\":\n    main()", "__main__ guard"),
        ("def main():\n    a, b = map(int, input().split())\n    print(a + b)\nmain()", "main()"),
        ("a, b = map(int, open(0).read().split())\nprint(a + b)", "open(0)"),
        ("import sys\nfor line in sys.stdin:\n    a, b = map(int, line.split())\n    print(a + b)", "for line in stdin"),
        ("a, b = map(int, input().split())\nprint(a - b)", "wrong"),
        ("a, b = map(int, input().split())\nprint(a + b + 0 * int('x'))", "crash"),
        ("a, b = map(int, input().split())\ns = 0\ndef add():\n    global s\n    s = a + b\nadd()\nprint(s)", "global"),
        ("a, b = map(int, input().split())\nprint(a + b)\nexit()", "exit()"),
        ("import sys\na, b = map(int, input().split())\nsys.stdout.write(str(a + b) + '\\n')", "stdout.write"),
        ("a, b = map(int, input().split())\nprint(a + b, end='')", "no newline"),
        ("a, b = map(int, input().split()\nprint(a + b)", "syntax error"),
    ]),
    "mean": (_MEAN_IO, [
        ("n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) / n)", "float /"),
        ("n = int(input())\nxs = list(map(int, input().split()))\nprint(f'{sum(xs) / n:.2f}')", "2 decimals"),
        ("n = int(input())\nxs = list(map(int, input().split()))\nm = sum(xs) / n\nprint(int(m) if m == int(m) else m)", "int when whole"),
        ("n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) // n)", "floor"),
        ("n = int(input())\nxs = list(map(int, input().split()))\nprint(fsum(xs) / n)", "prelude fsum"),
        ("n = int(input())\nxs = list(map(int, input().split()))\nprint(mean(xs))", "prelude mean"),
        ("n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) / n + 1e-9)", "off by 1e-9"),
    ]),
    "lines": (_LINES_IO, [
        ("n = int(input())\nfor i in range(1, n + 1):\n    print(i)", "loop"),
        ("n = int(input())\nprint('\\n'.join(map(str, range(1, n + 1))))", "join"),
        ("n = int(input())\nprint(*range(1, n + 1))", "one line"),
        ("n = int(input())\nfor i in range(1, n + 1):\n    print(i, end=' \\n')", "trailing space"),
        ("n = int(input())\nfor i in range(1, n + 1):\n    print(i)\nprint()", "extra blank line"),
        ("n = int(input())\nwhile n:\n    pass\nprint(1)", "slow"),
        ("import sys\nsys.setrecursionlimit(10**6)\ndef f(k):\n    return [] if k == 0 else f(k - 1) + [k]\nprint('\\n'.join(map(str, f(int(input())))))", "recursion"),
    ]),
    "words": (_WORDS_IO, [
        ("print(' '.join(input().split()[::-1]))", "slice"),
        ("print(*reversed(input().split()))", "reversed"),
        ("w = input().split()\nw.reverse()\nprint(' '.join(w))", "reverse()"),
        ("print(' '.join(sorted(input().split())))", "wrong"),
        ("print(input()[::-1])", "chars reversed"),
        ("import sys\nw = sys.stdin.readline().split()\nprint(' '.join(w[::-1]))\nquit()", "quit()"),
    ]),
    "yesno": (_YESNO_IO, [
        ("n = int(input())\nprint('Yes' if n % 2 == 0 else 'No')", "right"),
        ("n = int(input())\nprint('YES' if n % 2 == 0 else 'NO')", "upper case"),
        ("n = int(input())\nprint('Yes' if gcd(n, 2) == 2 else 'No')", "prelude gcd"),
        ("import math\nn = int(input())\nprint('Yes' if math.gcd(n, 2) == 2 else 'No')", "math.gcd"),
        ("n = int(input())\nif n % 2 == 0:\n    print('Yes')\nelse:\n    print('No')\nraise SystemExit(0)", "SystemExit(0)"),
    ]),
    "pair": (_PAIR_IO, [
        ("class Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n        a, b = nlargest(2, nums)\n        return a + b", "prelude nlargest"),
        ("class Solution:\n    def maxPairSum(self, nums):\n        s = sorted(nums)\n        return s[-1] + s[-2]", "sorted"),
        ("class Solution:\n    def maxPairSum(self, nums):\n        return max(nums) * 2", "wrong"),
        ("class Solution:\n    def maxPairSum(self, nums):\n        while True:\n            pass", "slow"),
        ("class Solution:\n    def maxPair(self, nums):\n        return 0", "wrong name"),
        ("def maxPairSum(nums):\n    s = sorted(nums)\n    return s[-1] + s[-2]", "no class"),
        ("from typing import List\n\nclass Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n        nums.sort()\n        return nums[-1] + nums[-2]", "import typing"),
    ]),
    "smallest": (_SMALLEST_IO, [
        ("class Solution:\n    def smallest(self, nums, k):\n        return sorted(nums)[:k]", "list"),
        ("class Solution:\n    def smallest(self, nums, k):\n        return tuple(sorted(nums)[:k])", "tuple"),
        ("class Solution:\n    def smallest(self, nums, k):\n        return set(sorted(nums)[:k])", "set"),
        ("class Solution:\n    def smallest(self, nums, k):\n        return sorted(nums)[-k:]", "wrong"),
    ]),
    "count": (_COUNT_IO, [
        ("class Solution:\n    def countMost(self, s: str) -> int:\n        return max(Counter(s).values())", "prelude Counter"),
        ("from collections import Counter\nclass Solution:\n    def countMost(self, s):\n        return Counter(s).most_common(1)[0][1]", "import Counter"),
        ("class Solution:\n    def countMost(self, s):\n        return len(set(s))", "wrong"),
        ("class Solution:\n    def countMost(self, s):\n        return max(s.count(c) for c in s) + undefined_name", "crash"),
    ]),
    "half": (_HALF_IO, [
        ("class Solution:\n    def half(self, n: int) -> float:\n        return n / 2", "true division"),
        ("class Solution:\n    def half(self, n):\n        return n // 2", "floor"),
        ("class Solution:\n    def half(self, n):\n        return str(n / 2)", "string"),
    ]),
}


def code_problems() -> dict[str, dict]:
    """Each problem's tests in EvalScope's `evaluation_sample` shape (inputs, outputs, fn_name)."""
    return {name: tests for name, (tests, _) in _PROGRAMS.items()}


def code_response(rng: random.Random, program: str, draft: str, shape: int | None = None) -> str:
    lang = rng.choice(["python", "python", "python", "py", "Python", "python3", ""])
    block = f"```{lang}\n{program}\n```"
    text = rng.choice(["Here is the solution.", "The idea is a single pass.", "We read the input and compute."])
    shapes = [
        lambda: f"{text}\n\n{block}",
        lambda: f"<think>\nDraft:\n```python\n{draft}\n```\nHmm, fix it.\n</think>\n\n{text}\n{block}",
        lambda: f"<think>\nFirst try:\n```python\n{draft}\n```\nstill thinking",
        lambda: f"{text}\n```python\n{draft}\n```\nActually, a better version:\n{block}",
        lambda: f"Sample input:\n```\n1 2\n```\n{text}\n{block}",
        lambda: f"{text} Wrap it in ``` fences as asked.\n{block}",
        lambda: f"{text}\n  {block.replace(chr(10), chr(10) + '  ')}",
        lambda: f"{text}\n```python  # final solution\n{program}\n```",
        lambda: f"{text}\n~~~python\n{program}\n~~~",
        lambda: f"{text}\n```python\n{program}\n",
        lambda: f"{text}\n{program}",
        lambda: f"{block}\nExplanation: ```{lang}``` blocks hold code.",
        lambda: f"{text}\n```python\n{program}```",
        lambda: f"<think>\nok\n</think>\n```python\n{program}\n```\n\nComplexity: O(n).\n```\nO(n)\n```",
    ]
    weights = [20, 8, 2, 4, 2, 1, 1, 1, 1, 1, 1, 1, 1, 4]
    index = shape if shape is not None else rng.choices(range(len(shapes)), weights)[0]
    return shapes[index]()


def code_cases(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    names = sorted(_PROGRAMS)
    cases = []
    for i in range(count):
        problem = rng.choice(names)
        programs = _PROGRAMS[problem][1]
        program, note = rng.choice(programs)
        if note == "slow" and rng.random() < 0.7:  # each slow program costs the time limit: keep them rare
            program, note = programs[0]
        draft, _ = rng.choice(programs)
        cases.append({"id": f"code-{seed}-{i}", "problem": problem, "note": note,
                      "response": code_response(rng, program, draft)})
    return cases


# Fuzz: random strings of the pieces the extraction and normalization rules react to, for those string
# rules alone (no equivalence check): every branch of them, in orders no model would write.
_PIECES = ["\\boxed{", "\\boxed ", "{", "}", "\\frac", "\\dfrac", "\\tfrac", "1", "2", "07", "10", ".", ",", "-", "+",
           "x", "y=", "k =", "=", "\\text{", "\\textbf{", "cm", "inches", "}^2", "and", "\\$", "$", "%", "\\%",
           "\\left(", "\\right)", "(", ")", "[", "]", "\\{", "\\}", "^\\circ", "^{\\circ}", "\\sqrt", "\\sqrt3", " ",
           "\n", "The answer is ", "the answer is: ", "final answer is ", "final answer is $", "$. I hope",
           "答案是", "</think>", "<think>", "```", "```python\n", "A", "B", "c", "D", "E", "inf", "infinity",
           "\\infty", "j", "i", "five", "Twelve", "point", "\\mbox{", "\\!", "\\begin{array}{cc}", "\\end{array}",
           "\\begin{pmatrix}", "\\end{pmatrix}", "bmatrix", "\\\\", "&", "/", "sqrt", "th", "grade", "x\\in",
           "\\to", "\\emptyset", "(-\\infty,\\infty)", "\\neq", "\\leq", "\\geq", "\\mathbf", ":", "3.000", ".5",
           " .5", "{.5", "12th grade", "\u043a\u0438", "\n\n", "1,2", "-3, 4", "0.50"]


def fuzz_cases(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"fuzz-{seed}-{i}", "text": "".join(rng.choices(_PIECES, k=rng.randint(1, 14)))} for i in range(count)]
