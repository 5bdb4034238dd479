"""Result files: a bench report's figures as JSON, which bench/report.py turns into BENCHMARKS.md.

A report (what bench/_common.emit prints) is a `## title`, a header (device, versions, command, date),
text lines and markdown tables. `parse_report` reads one back into {title, env, notes, tables};
`write_result` writes that as REPORT.json beside REPORT.md, with the commit the run measured. The same
parser reads the reports printed before the scripts wrote JSON (verbatim outputs kept under
bench/results/), so every run, old or new, reaches the page through one format and no figure is typed.

    python3 bench/result_file.py bench/results/DATE-COMMIT/*.md   # JSON for reports printed without it
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION_PATTERNS = {  # as header() prints them, and as older reports (bench/optim.py's own header) did
    "torch": r"\btorch (\S+?)[,;]?(?:\s|$)",
    "cuda": r"\bCUDA (\S+?)[,;]?(?:\s|$)",
    "triton": r"\btriton (\S+?)[,;]?(?:\s|$)",
    "python": r"\bpython (\d\S*?)[,;]?(?:\s|$)",
}


def cell(text: str):
    """A table cell as a number where it is one ('1.53e+03' -> 1530.0), None where empty, else the text."""
    text = text.strip()
    if not text:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_env(header: list[str]) -> dict:
    env = {}
    for line in header:
        if m := re.match(r"- device: ([^;]+)", line):
            env["device"] = m.group(1).strip()
        if m := re.match(r"- command: `(.*)`$", line):
            env["command"] = m.group(1)
        if m := re.match(r"- date: (.*?)(?: UTC)?$", line):
            env["date"] = m.group(1)
        if m := re.match(r"- environment: (.*)$", line):
            env["environment"] = m.group(1)
            continue
        for key, pattern in VERSION_PATTERNS.items():
            if (m := re.search(pattern, line)) and not line.startswith(("- command", "- date")):
                env.setdefault(key, m.group(1))
    return env


def split_row(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_report(text: str) -> dict:
    """{title, env, notes, tables}: each table is {caption, columns, rows, printed}: its caption the text line
    just above it where that is a heading or ends in ':', its rows as records of numbers (where a cell is one)
    and as the cells' printed text; the other text lines are the report's notes."""
    lines = text.splitlines()
    title = next((ln[3:].strip() for ln in lines if ln.startswith("## ")), "")
    header = [ln for ln in lines if re.match(r"- (device|torch|versions|command|date|environment|PCIe)\b", ln)]
    notes, tables, last_text = [], [], None
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                block.append(lines[i])
                i += 1
            columns, printed = split_row(block[0]), [split_row(b) for b in block[2:]]
            caption = last_text if last_text and (last_text.startswith("#") or last_text.endswith(":")) else None
            if caption:
                notes.pop()
            tables.append({"caption": (caption or "").lstrip("#").strip().rstrip(":"), "columns": columns,
                           "rows": [dict(zip(columns, map(cell, cells))) for cells in printed],
                           "printed": printed})
            last_text = None
            continue
        if line and not line.startswith("## ") and lines[i] not in header:
            notes.append(line)
            last_text = line
        elif lines[i] in header or line.startswith("## "):
            last_text = None
        i += 1
    return {"title": title, "env": parse_env(header), "notes": notes, "tables": tables}


def current_commit() -> str:
    """HEAD's short hash, '-dirty' when tracked files differ from it; 'unknown' outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def write_result(report_path: str | Path, text: str, commit: str | None = None) -> Path:
    """Write the report's figures as JSON beside it (REPORT.md -> REPORT.json) and return that path."""
    result = parse_report(text)
    result["env"]["commit"] = commit or current_commit()
    path = Path(report_path).with_suffix(".json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", help="report files (markdown) as a bench script printed them")
    p.add_argument("--commit", help="the commit they measured (default: from their folder's name, DATE-COMMIT)")
    args = p.parse_args()
    for report in map(Path, args.reports):
        commit = args.commit or report.parent.name.rsplit("-", 1)[-1]
        print(write_result(report, report.read_text(), commit))


if __name__ == "__main__":
    main()
