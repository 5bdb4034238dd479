"""Pull the gradable part out of a model response: text after the reasoning, the last \\boxed{},
a multiple-choice letter, a code block. Pure string functions, no math library."""
from __future__ import annotations

import re

THINK_END = "</think>"


def final_text(response: str) -> str:
    """The text after the last `</think>` (the answer part of a reasoning model's output).

    A response without `</think>` is graded whole: non-reasoning models never emit it. A response
    that opened `<think>` but never closed it ran out of tokens while thinking and has no answer.
    """
    if THINK_END in response:
        return response.rsplit(THINK_END, 1)[1]
    if "<think>" in response:
        return ""
    return response


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _top_level_boxes(text: str) -> list[str]:
    """Contents of every top-level box, in order (an unclosed box at the end is ignored)."""
    boxes, pos = [], 0
    while (match := _BOX_OPEN.search(text, pos)) is not None:
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            break
        boxes.append(text[match.end(): i - 1].strip())
        pos = i  # boxes nested inside this one are part of its content, not top-level
    return boxes


def last_boxed(text: str) -> str | None:
    """Content of the last top-level `\\boxed{...}` (or `\\fbox{...}`), braces balanced, or None.

    A box holding only another box (`\\boxed{\\boxed{5}}`) is unwrapped to its content.
    """
    boxes = _top_level_boxes(text)
    if not boxes:
        return None
    content = boxes[-1]
    while (match := _BOX_OPEN.match(content)) is not None and _top_level_boxes(content) == [content[match.end():-1].strip()]:
        content = content[match.end():-1].strip()
    return content


_LETTER = r"\(?\*{0,2}([A-J])\*{0,2}\)?"
_CHOICE_PATTERNS = [
    # strongest first: an explicit statement of the answer. Keywords are case-insensitive, the letter is
    # not: "the answer is a prime" must not read as choice A. A bare "Option A" is a mention, not a
    # statement ("Option A is wrong"), so it is not a keyword here.
    re.compile(r"(?i:final\s+answer|answer|correct\s+(?:option|choice))"
               r"(?:\s+is)?[\s:*\-]*(?:\$?\\(?:boxed|text(?:bf)?)\{)?" + _LETTER + r"(?![A-Za-z])"),
    re.compile(r"^\s*" + _LETTER + r"\s*[\.\):]?\s*$", re.M),
    re.compile(r"\(([A-J])\)"),
]


def extract_choice(text: str, letters: str = "ABCD") -> str | None:
    """The chosen letter: from the last \\boxed{} if any, else the last explicit "answer is X" /
    "Answer: (X)", else a line holding only the letter, else the last "(X)"."""
    boxed = last_boxed(text)
    if boxed is not None:
        m = re.fullmatch(r"\s*(?:\\text\{)?\(?([A-Za-z])\)?\}?\s*[\.:]?.*", boxed, re.S)
        if m and m.group(1).upper() in letters:
            return m.group(1).upper()
        return None
    for pattern in _CHOICE_PATTERNS:
        found = [m.group(1) for m in pattern.finditer(text) if m.group(1) in letters]
        if found:
            return found[-1]
    return None


def extract_code(text: str) -> str | None:
    """The last fenced code block (```python ... ``` preferred, any fence otherwise), or None."""
    blocks = re.findall(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", text, re.S)
    if not blocks:
        return None
    python = [body for lang, body in blocks if lang.lower() in ("python", "python3", "py")]
    return (python or [body for _, body in blocks])[-1]
