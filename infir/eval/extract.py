"""Pull the gradable part out of a model response the way EvalScope 0.17 does (the harness InfiR2's
table was scored with): the text after the reasoning, the stated math answer, the option letter, the
program. Pure string functions; they keep EvalScope's rules where those are crude (a GPQA response is
read as its last standalone letter A-D, a program is the first fenced block), since infir's scores are
compared with numbers produced by exactly these rules."""
from __future__ import annotations

import re

THINK_END = "</think>"


def final_text(response: str) -> str:
    """The text after the last `</think>`, or the whole response when it has none (EvalScope's
    `remove_until` filter, as InfiR2 configures it: a response cut off while thinking is graded whole)."""
    return response.rsplit(THINK_END, 1)[1] if THINK_END in response else response


def _braced(text: str) -> str:
    """The content of the brace group `text` opens with, nesting respected (to the end if unclosed)."""
    depth = 1
    for i, char in enumerate(text[1:], start=1):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return text[1:i]
    return text[1:]


def _last_number(text: str) -> str:
    numbers = re.findall(r"-?\d*\.?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else ""


def stated_answer(text: str) -> str:
    """The answer a math response states, not yet normalized: Minerva's "final answer is $X$. I hope",
    else what follows the last `boxed` (a brace group, or up to the next `$`), else what follows the
    last "the answer is" / "final answer is", else what follows "答案是", else the last number."""
    text = text.replace("\u043a\u0438", "")  # a step marker of the Math-Shepherd data
    if "final answer is $" in text and "$. I hope" in text:
        answer = text.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in text:
        after = text.split("boxed")[-1]
        if not after:
            return ""
        answer = _braced(after) if after[0] == "{" else after.split("$")[0].strip()
    elif "he answer is" in text:
        answer = text.split("he answer is")[-1].strip()
    elif "final answer is" in text:
        answer = text.split("final answer is")[-1].strip()
    elif "答案是" in text:
        answer = text.split("答案是")[1].strip().split("\n\n")[0].strip()
    else:
        answer = _last_number(text)
    answer = re.sub(r"\n\s*", "", answer)
    answer = answer[1:] if answer.startswith(":") else answer
    answer = answer[:-1] if answer.endswith(".") else answer
    return answer[:-1] if answer.endswith("/") else answer


def extract_choice(text: str) -> str:
    """The last standalone letter A-D of the text, upper-cased first (so the article "a" reads as A);
    the text itself, trimmed, when it has none."""
    letters = re.findall(r"\b(A|B|C|D)\b", text.upper())
    picked = letters[-1] if letters else text.strip().strip(".")
    return picked.rstrip(".").rstrip("/")


def extract_code(text: str) -> str | None:
    """The lines between the first two lines that hold a ``` fence (LiveCodeBench's rule: the first
    block, whatever its language), or None when fewer than two lines hold one."""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return None
    return "\n".join(lines[fences[0] + 1:fences[1]])
