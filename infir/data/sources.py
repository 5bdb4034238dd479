"""Read documents from jsonl / jsonl.gz / parquet / a local HF ``datasets`` directory, in shards.

A shard is a slice of one input that one worker tokenizes on its own: a byte range of a plain
jsonl file (cut at line starts), whole row groups of a parquet file, a row range of an HF
dataset, or a whole gzip file
(gzip cannot be entered mid-stream). Every record comes back with its 1-based line (or row) number
so a bad line is reported as ``file:line: reason`` and never stops the run; a file that cannot be read
at all (a truncated gzip, a corrupt parquet file) is a ``BadInput`` that names it.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


class BadInput(ValueError):
    """An input file that cannot be read (truncated, corrupt, or not what its name says): rerunning
    will not help, the file must be fixed."""


@contextlib.contextmanager
def _reading(path, what: str):
    """Turn the errors of a damaged ``what`` file into a BadInput naming ``path``."""
    import pyarrow

    try:
        yield
    except (EOFError, zlib.error, OSError, pyarrow.ArrowException) as err:
        raise BadInput(f"{path}: not a readable {what} file ({err}); it is truncated or corrupt: "
                       "fix or replace it") from None


@dataclass(frozen=True)
class Shard:
    path: str
    kind: str          # "jsonl" | "jsonl.gz" | "parquet" | "hf"
    start: int         # byte offset (jsonl), row group (parquet) or row (hf); 0 for jsonl.gz
    end: int           # exclusive; -1 = to the end
    first_line: int    # 1-based number of the shard's first line / row
    size: int          # bytes (jsonl, jsonl.gz) or rows (parquet, hf): the progress unit


@dataclass
class Record:
    line: int
    value: Any = None         # the extracted field on success
    skip: str | None = None   # the reason when the line is skipped


def input_kind(path: Path) -> str:
    name = path.name.lower()
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "hf"
        raise ValueError(f"{path} is a directory but not a saved HF dataset (no dataset_info.json / state.json); "
                         "pass jsonl, jsonl.gz or parquet files, or a `datasets.save_to_disk` directory")
    if name.endswith(".gz") and name[:-3].endswith(JSONL_SUFFIXES):
        return "jsonl.gz"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise ValueError(f"{path}: unsupported input format; use .jsonl, .jsonl.gz, .parquet or a saved HF dataset directory")


def _hf_dataset(path: str):
    import datasets

    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"{path}: a DatasetDict without a 'train' split ({list(ds)}); save the split you want")
        ds = ds["train"]
    return ds


def plan_shards(path: Path, target_bytes: int, target_rows: int = 200_000) -> list[Shard]:
    """Cut one input into shards of about ``target_bytes`` (jsonl) or ``target_rows`` rows."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input {path} does not exist")
    kind = input_kind(path)
    if kind == "jsonl.gz":
        return [Shard(str(path), kind, 0, -1, 1, path.stat().st_size)]
    if kind == "jsonl":
        return _plan_jsonl(path, max(1, target_bytes))
    if kind == "parquet":
        return _plan_parquet(path, target_rows)
    rows = len(_hf_dataset(str(path)))
    return [Shard(str(path), kind, s, min(s + target_rows, rows), s + 1, min(target_rows, rows - s))
            for s in range(0, rows, target_rows)] or [Shard(str(path), kind, 0, 0, 1, 0)]


def _plan_parquet(path: Path, target_rows: int) -> list[Shard]:
    """Whole row groups per shard (start/end index row groups), so a worker reads only its own."""
    import pyarrow.parquet as pq

    with _reading(path, "parquet"):
        meta = pq.ParquetFile(path).metadata
    shards, first_group, first_row, rows = [], 0, 0, 0
    for g in range(meta.num_row_groups):
        rows += meta.row_group(g).num_rows
        if rows >= target_rows or g == meta.num_row_groups - 1:
            shards.append(Shard(str(path), "parquet", first_group, g + 1, first_row + 1, rows))
            first_group, first_row, rows = g + 1, first_row + rows, 0
    return shards or [Shard(str(path), "parquet", 0, 0, 1, 0)]


def _plan_jsonl(path: Path, target_bytes: int) -> list[Shard]:
    size = path.stat().st_size
    shards, start, line = [], 0, 1
    with open(path, "rb") as f:
        while start < size:
            f.seek(min(start + target_bytes, size))
            f.readline()  # move the cut to the next line start
            end = min(f.tell(), size) if start + target_bytes < size else size
            f.seek(start)
            newlines = _count_newlines(f, end - start)
            shards.append(Shard(str(path), "jsonl", start, end, line, end - start))
            start, line = end, line + newlines
    return shards or [Shard(str(path), "jsonl", 0, 0, 1, 0)]


def _count_newlines(f, nbytes: int) -> int:
    count = 0
    while nbytes > 0:
        chunk = f.read(min(nbytes, 1 << 24))
        if not chunk:
            break
        count += chunk.count(b"\n")
        nbytes -= len(chunk)
    return count


def _decode_json_line(raw: bytes) -> tuple[Any, str | None]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"invalid UTF-8 (byte {err.start})"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"malformed json ({err.msg} at column {err.colno})"


def _jsonl_lines(shard: Shard) -> Iterator[tuple[int, bytes]]:
    if shard.kind == "jsonl.gz":
        with _reading(shard.path, "gzip"), gzip.open(shard.path, "rb") as f:
            yield from enumerate(f, start=1)
        return
    with open(shard.path, "rb") as f:
        f.seek(shard.start)
        line, pos = shard.first_line, shard.start
        for raw in f:
            if pos >= shard.end:
                break
            yield line, raw
            line, pos = line + 1, pos + len(raw)


def iter_rows(shard: Shard) -> Iterator[tuple[int, Any, str | None]]:
    """Yield ``(line, row, skip_reason)``; a row is a dict on success."""
    if shard.kind in ("jsonl", "jsonl.gz"):
        for line, raw in _jsonl_lines(shard):
            if not raw.strip():
                continue  # blank lines are layout, not documents
            row, reason = _decode_json_line(raw)
            if reason is None and not isinstance(row, dict):
                row, reason = None, f"json value is a {type(row).__name__}, not an object"
            yield line, row, reason
    elif shard.kind == "parquet":
        import pyarrow.parquet as pq

        with _reading(shard.path, "parquet"):
            table = pq.ParquetFile(shard.path).read_row_groups(list(range(shard.start, shard.end)))
        for i, row in enumerate(table.to_pylist()):
            yield shard.first_line + i, row, None
    else:
        ds = _hf_dataset(shard.path).select(range(shard.start, shard.end))
        for i, row in enumerate(ds):
            yield shard.first_line + i, row, None


def text_problem(row: dict, text_key: str) -> str | None:
    """Why ``row[text_key]`` is not a trainable document, or None when it is."""
    if text_key not in row:
        return f"missing field '{text_key}'"
    if not isinstance(row[text_key], str):
        return f"field '{text_key}' is {type(row[text_key]).__name__}, not a string"
    if not row[text_key].strip():
        return "empty document"
    if not _encodable(row[text_key]):
        return "text holds a lone UTF-16 surrogate (an escaped \\ud8xx in the json)"
    return None


def iter_texts(shard: Shard, text_key: str) -> Iterator[Record]:
    """The ``text_key`` field of each row, or why the row is skipped."""
    for line, row, reason in iter_rows(shard):
        reason = reason if reason is not None else text_problem(row, text_key)
        yield Record(line, skip=reason) if reason is not None else Record(line, value=row[text_key])


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
