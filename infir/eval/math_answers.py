"""Math answers as EvalScope 0.17 grades them (AIME 2024/2025, MATH-500): normalize the extracted answer
and the gold one, then decide equivalence numerically or with sympy.

InfiR2's table was scored by EvalScope 0.17, whose math grader is the one of Qwen2.5-Math's evaluation
(string rewrites, then a numeric check within 1e-4, then sympy). It is written again here, rule for
rule, because EvalScope cannot be installed beside infir (it pins `datasets==3.2`); the parity test
(tests/eval/test_evalscope_parity.py) holds this module to EvalScope's recorded verdicts. The rules are
EvalScope's, odd ones included (`and` and `x=` are deleted wherever they occur, a lone `j` is read as the
imaginary unit): a rule "fixed" here would move infir's scores away from the table they are compared to.
"""
from __future__ import annotations

import math
import re

from word2number import w2n


def number_from_words(text: str) -> str:
    """'five' -> '5', 'one hundred' -> '100'; anything word2number cannot read is returned unchanged."""
    try:
        return str(w2n.word_to_num(text))
    except Exception:  # word2number raises ValueError, and IndexError on some word orders
        return text


# Plain substitutions, in order: LaTeX spellings of the same thing, then decorations that carry no value.
_SPELLINGS = [("\\!", ""), ("bmatrix", "pmatrix"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\neq", "\\ne"),
              ("\\leq", "\\le"), ("\\geq", "\\ge"), ("\\left", ""), ("\\right", ""), ("\\{", "{"), ("\\}", "}")]
_DECORATIONS = [("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("$", ""), ("\\(", ""), ("\\)", "")]
_VARIABLE_PREFIXES = ["x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to"]
_SETS = [("\\emptyset", "{}"), ("(-\\infty,\\infty)", "\\mathbb{R}"), ("\\%", ""), ("%", ""), (" .", " 0."), ("{.", "{0.")]
_INTEGER_LIST = re.compile(r"(\s*-?\d+\s*,)*\s*-?\d+\s*")


def _replace_all(text: str, pairs) -> str:
    for old, new in pairs:
        text = text.replace(old, new)
    return text


def _text_words_to_numbers(text: str) -> str:
    def word(match: re.Match) -> str:
        converted = number_from_words(match.group(1).lower())
        return match.group(0) if converted == match.group(1).lower() else converted

    return re.sub(r"\\text\{([a-zA-Z]+)\}", word, text)


def _drop_trailing_unit(text: str) -> str:
    text = re.sub(r"(cm|inches)\}\^2", r"\1}", text)  # a squared unit goes with its unit
    without = re.sub(r"\\text\{.*?\}$", "", text).strip()
    return without if without and without != text else text


def _infinity(text: str) -> str:
    text = text.replace("infinity", "\\infty")
    if "\\infty" not in text:
        text = text.replace("inf", "\\infty")
    return text.replace("+\\inity", "\\infty")


def _brace_fractions(text: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{72} -> \\frac{1}{72}; a \\frac with fewer than two characters
    after it leaves the whole text as it was."""
    head, *tails = text.split("\\frac")
    out = [head]
    for tail in tails:
        if tail.startswith("{"):
            out.append("\\frac" + tail)
        elif len(tail) < 2:
            return text
        elif tail[1] == "{":
            out.append(f"\\frac{{{tail[0]}}}{tail[1:]}")
        else:
            out.append(f"\\frac{{{tail[0]}}}{{{tail[1]}}}{tail[2:]}")
    return "".join(out)


def _slash_to_frac(text: str) -> str:
    """'3/4' -> '\\frac{3}{4}' when both sides are integers written plainly (or hold a sqrt)."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        num, den = (part if "sqrt" in part else int(part) for part in parts)
    except ValueError:
        return text
    return f"\\frac{{{num}}}{{{den}}}" if text == f"{num}/{den}" else text


def _strip_zero_decimals(text: str) -> str:
    text = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", text)
    return re.sub(r"(\d+)\.0*$", r"\1", text)


def normalize_answer(answer: str) -> str:
    """An answer string as EvalScope compares it: spellings unified, units, degrees, dollars, percent
    signs and `x=` dropped, number words as digits, integer lists sorted."""
    text = str(answer).strip().replace("\n", "").rstrip(".")
    text = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", text)
    text = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", text)
    text = _replace_all(text, _SPELLINGS)
    text = _drop_trailing_unit(_text_words_to_numbers(text))
    text = number_from_words(_replace_all(text, _DECORATIONS))
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    text = _replace_all(_replace_all(text, [(p, "") for p in _VARIABLE_PREFIXES]), _SETS)
    text = _infinity(text).replace("and", "").replace("\\mathbf", "")
    text = re.sub(r"\\mbox\{.*?\}", "", text)
    if "j" in text and "i" not in text:
        text = text.replace("j", "i")
    text = _strip_zero_decimals(text)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 5": a short name on the left
        text = sides[1]
    text = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", text).replace(" ", "")
    text = _slash_to_frac(_brace_fractions(text))
    text = re.sub(r"\\(?=-?\d+(\\|\)|,|\]|$))", "", text)
    text = re.sub(r"thgrade$", "", text)
    if _INTEGER_LIST.fullmatch(text):
        text = ",".join(str(n) for n in sorted(int(part) for part in text.split(",")))
    return text


def _as_number(text: str) -> float | None:
    """A float from '1,000', '12.5' or '12.5%' (-> 0.125), else None."""
    text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        pass
    if text.endswith("%"):
        text = text[:-1].removesuffix("\\")
        try:
            return float(text) / 100
        except ValueError:
            pass
    return None


def close(a: float, b: float) -> bool:
    return math.isclose(b, a, rel_tol=1e-4)


def choice_letter_of(text: str) -> str:
    """The last standalone A-E in `text` (case-insensitive), else `text` itself, trimmed."""
    text = text.strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":")
    letters = re.findall(r"\b(A|B|C|D|E)\b", text.upper())
    picked = letters[-1] if letters else text.strip().strip(".")
    return picked.rstrip(".").rstrip("/")


def _numbers_equal(pred: str, gold: str) -> bool | None:
    """Both numbers: equal within 1e-4 to the gold, or to it read as a percentage either way. None when
    either is not a number."""
    p, g = _as_number(pred), _as_number(gold)
    if p is None or g is None:
        return None
    return any(close(p, target) for target in (g / 100, g, g * 100))


def _as_pmatrix(text: str) -> str:
    """'{1,2}' -> a one-column pmatrix, for a gold vector compared with a matrix prediction."""
    rows = [m.strip("{}") for m in re.findall(r"\{.*,.*\}", text.strip())]
    return ", ".join(r"\begin{pmatrix}" + row.replace(",", "\\") + r"\end{pmatrix}" for row in rows)


def _without_brackets_equal(pred: str, gold: str) -> bool:
    p, g = pred, gold
    if (pred.startswith("[") and pred.endswith("]") and not gold.startswith("(")) or \
            (pred.startswith("(") and pred.endswith(")") and not gold.startswith("[")):
        p, g = p.strip("[]()"), g.strip("[]()")
    p, g = (re.sub(r"[{}()]", "", s) for s in (p, g))
    return p.lower() == g.lower()


def _elementwise_equal(pred: str, gold: str) -> bool:
    """Tuples and intervals element by element; matrices row by row, cell by cell."""
    bracketed = re.compile(r"(\(|\[).+(\)|\])")
    if bracketed.match(pred) and bracketed.match(gold):
        p, g = pred[1:-1].split(","), gold[1:-1].split(",")
        if len(p) == len(g) and all(answers_equal(a, b) for a, b in zip(p, g)):
            return True
    begins, ends = ("\\begin{pmatrix}", "\\begin{bmatrix}"), ("\\end{pmatrix}", "\\end{bmatrix}")
    if not all(s.startswith(begins) and s.endswith(ends) for s in (pred, gold)):
        return False
    rows = [[line.strip() for line in s[len(begins[0]):-len(ends[0])].split("\\\\") if line.strip()]
            for s in (pred, gold)]
    if len(rows[0]) != len(rows[1]):
        return False
    for p_row, g_row in zip(*rows):
        p_cells, g_cells = p_row.split("&"), g_row.split("&")
        if len(p_cells) != len(g_cells) or not all(answers_equal(a, b) for a, b in zip(p_cells, g_cells)):
            return False
    return True


def _equations_equal(pred: str, gold: str) -> bool:
    """Two equations as lhs - rhs, up to sign; or an equation with a short name ('k = 5') against a value."""
    if pred.count("=") == 1 and gold.count("=") == 1:
        p, g = (f"{lhs.strip()} - ({rhs.strip()})" for lhs, rhs in (s.split("=") for s in (pred, gold)))
        return symbolic_equal(p, g) or symbolic_equal(f"-({p})", g)
    if pred.count("=") == 1 and len(pred.split("=")[0].strip()) <= 2 and "=" not in gold:
        return answers_equal(pred.split("=")[1], gold)
    if gold.count("=") == 1 and len(gold.split("=")[0].strip()) <= 2 and "=" not in pred:
        return answers_equal(pred, gold.split("=")[1])
    return False


def answers_equal(pred: str, gold: str) -> bool:
    """EvalScope's equivalence of two normalized answers (see `normalize_answer`)."""
    if pred.strip().lower() == gold.strip().lower():
        return True
    if gold in ("A", "B", "C", "D", "E") and choice_letter_of(pred) == gold:
        return True
    numeric = _numbers_equal(pred, gold)
    if numeric is not None:
        return numeric
    if not pred:
        return False
    gold, pred = gold.strip(), pred.strip()
    if "pmatrix" in pred and "pmatrix" not in gold:
        gold = _as_pmatrix(gold)
    return (_without_brackets_equal(pred, gold) or _elementwise_equal(pred, gold)
            or _equations_equal(pred, gold) or symbolic_equal(pred, gold))


def _parse(text: str):
    """The first of sympy's LaTeX parser, sympy's expression parser and latex2sympy that reads `text`
    (with doubled backslashes halved, then as it is); the text itself when none does. sympy's LaTeX
    parser needs antlr4 4.11 and fails without it, as it does under EvalScope in the same environment."""
    from latex2sympy2_extended import latex2sympy
    from sympy.parsing.latex import parse_latex
    from sympy.parsing.sympy_parser import parse_expr

    for parser in (parse_latex, parse_expr, latex2sympy):
        for candidate in (text.replace("\\\\", "\\"), text):
            try:
                return parser(candidate)
            except Exception:  # each parser fails in its own way on what it cannot read
                pass
    return text


def _try(check) -> bool:
    try:
        return bool(check())
    except Exception:  # sympy raises many kinds on objects it cannot compare; that is "not equal"
        return False


def symbolic_equal(a: str, b: str) -> bool:
    from sympy import N, simplify

    x, y = _parse(a), _parse(b)
    return (_try(lambda: str(x) == str(y) or x == y)
            or _try(lambda: x.equals(y) or simplify(x - y) == 0)
            or _try(lambda: abs(x.lhs - x.rhs).equals(abs(y.lhs - y.rhs)))
            or _try(lambda: close(float(N(x)), float(N(y))))
            or _try(lambda: x.shape == y.shape and x.applyfunc(lambda v: round(v, 3)).equals(y.applyfunc(lambda v: round(v, 3)))))
