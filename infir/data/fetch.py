"""``infir-prep fetch``: stream each source of a fetch spec (infir.data.fetch_spec) from the HF hub, or a
local copy of it, into parquet shards that ``infir-prep pretrain`` and ``infir-prep sft`` read, up to a
token budget per source; a killed fetch resumes where its last shard ended.

Under ROOT::

    raw/<source>/part-00000.parquet ...  the documents: a ``text`` column (or ``messages`` for chat rows);
                                         a shard is written as ``.partial`` and renamed when full
    raw/<source>/progress.json           rows read, documents and tokens kept, shards written, and the
                                         stream's position (datasets' state_dict, plus rows read since)
    <spec>.fetch.json                    every fetched source: hub id, configs, license, counts
    <spec>.fetched.yaml                  the spec's phases, each source's share taken of its counted tokens

progress.json is replaced atomically, and only after the shard it counts is in place; a rerun first
deletes every shard it does not count (a ``.partial``, or one renamed just before a kill) and resumes
the stream at the saved position, so each row is read once and each document written once.

Tokens are counted as training will see them: a document's ids plus its EOD, as ``infir-prep pretrain``
stores it, and for chat rows the ids of the rendered conversation, as ``infir-prep sft`` stores them. A
source stops at the document that leaves it closest to its budget.
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from infir.data.chat import BadSample, ChatFormatter
from infir.data.fetch_spec import FetchSource, FetchSpec, load_fetch_spec
from infir.data.hub import (FetchError, check_hub, is_network_error, local_copy, open_rows, refused,
                            software_heritage_text)
from infir.data.sources import text_problem
from infir.data.tokenize_corpus import _atomic_write_json
from infir.data.tokenizer import PIECE_CHARS, TextTokenizer, TextTooLong, load_tokenizer

BATCH_ROWS = 64
ROW_GROUP_ROWS = 1024
DEFAULT_SHARD_TOKENS = 50_000_000
SWH_THREADS = 32  # S3 answers in tens of milliseconds: enough requests in flight to keep a core busy


class FetchInterrupted(RuntimeError):
    """The stream broke off mid-way; what was written stays and a rerun resumes."""


def count_tokens(tok: TextTokenizer, texts: list[str]) -> list[int | None]:
    """Each text's number of ids (long ones encoded piece by piece); None for one too long to encode."""
    counts: list[int | None] = [None] * len(texts)
    short = [i for i, t in enumerate(texts) if len(t) <= PIECE_CHARS]
    for i, ids in zip(short, tok.encode_batch([texts[i] for i in short])):
        counts[i] = len(ids)
    for i in sorted(set(range(len(texts))) - set(short)):
        try:
            counts[i] = sum(len(ids) for ids in tok.encode_long(texts[i]))
        except TextTooLong:
            pass
    return counts


class Documents:
    """One source's rows -> ``(record to write, tokens, skip reason)``."""

    def __init__(self, source: FetchSource, write: str, tok: TextTokenizer, chat: ChatFormatter | None):
        self.source, self.write, self.tok, self.chat = source, write, tok, chat

    def convert(self, rows: list[dict]) -> list[tuple[dict | None, int, str | None]]:
        missing = self._fill_from_software_heritage(rows) if self.source.software_heritage else {}
        records, texts, reasons = zip(*((None, "", missing[i]) if i in missing else self._one(row)
                                        for i, row in enumerate(rows)))
        counts = count_tokens(self.tok, [t if r is None else "" for t, r in zip(texts, reasons)])
        eod = 1 if self.write == "text" else 0
        out = []
        for record, n, reason in zip(records, counts, reasons):
            if reason is None and n is None:
                reason = "too long to encode (a stretch with no line break or space between words)"
            out.append((record, (n or 0) + eod, reason) if reason is None else (None, 0, reason))
        return out

    def _one(self, row: dict) -> tuple[dict | None, str, str | None]:
        """The record, the text whose tokens count, or why the row is skipped."""
        if self.source.chat is None:
            reason = text_problem(row, self.source.text)
            return ({"text": row[self.source.text]}, row[self.source.text], None) if reason is None else (None, "", reason)
        try:
            messages = self.source.chat.messages(row)
        except BadSample as err:
            return None, "", str(err)
        text = self.chat.render(messages)
        if self.write == "messages":
            return {"messages": messages}, text, None
        reason = text_problem({"text": text}, "text")
        return ({"text": text}, text, None) if reason is None else (None, "", reason)

    def _fill_from_software_heritage(self, rows: list[dict]) -> dict[int, str]:
        """Fetch the text of rows that carry only a blob id; the rows whose file is not found, with why."""
        key, swh = self.source.text, self.source.software_heritage
        todo = [i for i, r in enumerate(rows) if not r.get(key) and r.get(swh.blob)]
        if not todo:  # a local copy whose rows hold the text
            return {}
        with ThreadPoolExecutor(SWH_THREADS) as pool:
            texts = pool.map(lambda i: software_heritage_text(rows[i][swh.blob], rows[i].get(swh.encoding)), todo)
            missing = {}
            for i, text in zip(todo, texts):
                if text is None:
                    missing[i] = "blob not in Software Heritage"
                else:
                    rows[i][key] = text
        return missing


class ShardWriter:
    """Records into ``part-NNNNN.parquet`` under ``folder``, written as ``.partial`` until closed."""

    def __init__(self, folder: Path, index: int, write: str):
        import pyarrow as pa

        text = pa.large_string()
        column = text if write == "text" else pa.list_(pa.struct([("role", text), ("content", text)]))
        self.schema = pa.schema([(write, column)])
        self.folder, self.index = folder, index
        self.rows = self.tokens = 0
        self._buffer: list[dict] = []
        self._writer = None

    def path(self, index: int) -> Path:
        return self.folder / f"part-{index:05d}.parquet"

    def add(self, record: dict, tokens: int) -> None:
        self._buffer.append(record)
        self.rows, self.tokens = self.rows + 1, self.tokens + tokens
        if len(self._buffer) >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._buffer:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(str(self.path(self.index)) + ".partial", self.schema, compression="zstd")
        self._writer.write_table(pa.Table.from_pylist(self._buffer, schema=self.schema))
        self._buffer.clear()

    def close(self) -> bool:
        """Finish the shard being filled and rename it into place; False when it holds nothing."""
        self._flush()
        if self._writer is None:
            return False
        self._writer.close()
        os.replace(str(self.path(self.index)) + ".partial", self.path(self.index))
        self._writer, self.index, self.rows, self.tokens = None, self.index + 1, 0, 0
        return True


def _start(folder: Path, settings: dict) -> dict:
    """The saved progress of ``folder`` (a new one if none), with every shard it does not count deleted."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "progress.json"
    if path.is_file():
        state = json.loads(path.read_text())
        if state["settings"] != settings:
            changed = sorted(k for k in set(settings) | set(state["settings"])
                             if settings.get(k) != state["settings"].get(k))
            raise FetchError(f"{folder} holds rows fetched with other settings ({', '.join(changed)}); delete that "
                             "folder (or pick another --root) to fetch anew")
    else:
        state = {"settings": settings, "rows": 0, "documents": 0, "tokens": 0, "shards": 0, "skipped": {},
                 "position": None, "finished": None, "budget": None}
    for p in folder.glob("part-*.parquet*"):
        if p.name.endswith(".partial") or int(p.name[5:10]) >= state["shards"]:
            p.unlink()
    return state


def _done(state: dict, budget: int | None) -> bool:
    """Read to its end, or to a budget at least as large as this one."""
    if state["finished"] == "exhausted":
        return True
    return state["finished"] == "budget" and budget is not None and budget <= state["budget"]


def _take(batch: list[dict], docs: Documents, writer: ShardWriter, state: dict, bar) -> int:
    """Write the batch's documents until the budget is met; returns how many rows were used (the rest
    stay unread for a later, larger budget)."""
    budget, skipped = state["budget"], Counter(state["skipped"])
    used = len(batch)
    for i, (record, tokens, reason) in enumerate(docs.convert(batch)):
        if reason is not None:
            skipped[reason.split(" (")[0]] += 1
            state["rows"] += 1
            continue
        if budget is not None and tokens - (budget - state["tokens"]) > budget - state["tokens"]:
            state["finished"], used = "budget", i  # stopping short is closer to the budget than taking it
            break
        writer.add(record, tokens)
        state["rows"], state["documents"], state["tokens"] = state["rows"] + 1, state["documents"] + 1, state["tokens"] + tokens
        bar.update(tokens)
        if budget is not None and state["tokens"] >= budget:
            state["finished"], used = "budget", i + 1
            break
    state["skipped"] = dict(skipped)
    bar.set_postfix(documents=state["documents"], rows=state["rows"], refresh=False)
    return used


def _commit(folder: Path, writer: ShardWriter, state: dict, position: dict) -> None:
    if writer.close():
        state["shards"] = writer.index
    state["position"] = copy.deepcopy(position)
    _atomic_write_json(folder / "progress.json", state)


def _resume(source: FetchSource, state: dict, from_dir: Path | None):
    """The source's stream and an iterator over it, at the saved position."""
    rows = open_rows(source, from_dir)
    position = state["position"] or {"stream": None, "skip": 0}
    if position["stream"] is not None:
        rows.load_state_dict(position["stream"])
    it = iter(rows)
    for _ in itertools.islice(it, position["skip"]):
        pass
    return rows, it, {"stream": position["stream"] or rows.state_dict(), "skip": position["skip"]}


def fetch_source(source: FetchSource, folder: Path, docs: Documents, settings: dict, *, from_dir: Path | None = None,
                 shard_tokens: int = DEFAULT_SHARD_TOKENS, progress: bool = True) -> dict:
    """Fetch one source into ``folder`` up to ``source.budget`` tokens; returns its progress."""
    state = _start(folder, settings)
    if _done(state, source.budget):
        return state
    state.update(budget=source.budget, finished=None)
    rows, it, position = _resume(source, state, from_dir)
    writer = ShardWriter(folder, state["shards"], settings["write"])
    bar = tqdm(total=source.budget, initial=state["tokens"], unit="tok", unit_scale=True, desc=f"fetch {source.name}",
               disable=not progress, file=sys.stderr)
    try:
        while state["finished"] is None:
            batch = list(itertools.islice(it, BATCH_ROWS))
            if not batch:
                state["finished"] = "exhausted"
                break
            used = _take(batch, docs, writer, state, bar)
            if used < len(batch):
                position["skip"] += used
                break
            position = {"stream": rows.state_dict(), "skip": 0}
            if writer.tokens >= shard_tokens:
                _commit(folder, writer, state, position)
    except Exception as err:
        if is_network_error(err):
            raise FetchInterrupted(f"{source.name}: the stream from {source.hub} broke off after {state['rows']:,} rows "
                                   f"({err}); {state['shards']} shards are kept and rerunning the command resumes "
                                   "after the last of them") from None
        raise refused(source, err) or err
    finally:
        bar.close()
        getattr(it, "close", lambda: None)()
    _commit(folder, writer, state, position)
    return state


def fetch(spec_path: Path | str, root: Path | str, tokenizer_dir: Path | str, *, from_dir: Path | None = None,
          only: list[str] | None = None, tokens_per_source: int | None = None,
          shard_tokens: int = DEFAULT_SHARD_TOKENS, progress: bool = True) -> dict:
    """Fetch the spec's sources (``only`` these, if given) under ``root``; returns the report ``summary`` prints."""
    spec = load_fetch_spec(spec_path)
    names = only or list(spec.sources)
    unknown = [n for n in names if n not in spec.sources]
    if unknown:
        raise ValueError(f"{spec.path} declares no source {', '.join(unknown)}; its sources: {', '.join(spec.sources)}")
    root = Path(root)
    sources = [spec.sources[n] if tokens_per_source is None else replace(spec.sources[n], budget=tokens_per_source)
               for n in names]
    todo = [s for s in sources if not _done(_peek(root / "raw" / s.name), s.budget)]
    for source in todo:  # before the tokenizer loads: no network, or no local copy, fails in a second
        check_hub(source) if from_dir is None else local_copy(from_dir, source)
    tok = load_tokenizer(tokenizer_dir)
    chat = ChatFormatter(tokenizer_dir) if any(s.chat for s in todo) else None
    for source in sources:
        settings = json.loads(json.dumps({**source.settings(), "write": spec.write, "tokenizer": tok.fingerprint,
                                          "origin": "hub" if from_dir is None else "local copy"}))  # as saved
        fetch_source(source, root / "raw" / source.name, Documents(source, spec.write, tok, chat), settings,
                     from_dir=from_dir, shard_tokens=shard_tokens, progress=progress)
    states = {n: _peek(root / "raw" / n) for n in spec.sources if (root / "raw" / n / "progress.json").is_file()}
    return {"spec": spec, "root": root, "tokenizer": str(tokenizer_dir), "fetched": names, "states": states,
            "manifest": _write_manifest(spec, root, states), "mixture": _write_mixture(spec, root, states)}


def _peek(folder: Path) -> dict:
    path = folder / "progress.json"
    return json.loads(path.read_text()) if path.is_file() else {"finished": None, "budget": None}


def _write_manifest(spec: FetchSpec, root: Path, states: dict[str, dict]) -> Path:
    """What was fetched from where, under which license: one file beside the data."""
    sources = {}
    for name, state in states.items():
        s = spec.sources[name]
        sources[name] = {"hub": s.hub, "configs": list(s.configs), "split": s.split, "revision": s.revision,
                         "license": s.license, "origin": state["settings"]["origin"],
                         "files": sorted(str(p.relative_to(root)) for p in (root / "raw" / name).glob("part-*.parquet")),
                         **{k: state[k] for k in ("budget", "rows", "documents", "tokens", "skipped", "finished")}}
    path = root / f"{spec.name}.fetch.json"
    _atomic_write_json(path, {"spec": str(spec.path), "write": spec.write, "sources": sources})
    return path


def _write_mixture(spec: FetchSpec, root: Path, states: dict[str, dict]) -> Path | None:
    """The spec's phases with each source's token budget taken from what was counted: a phase reads its
    planned share of the source's tokens, so no phase reads a document twice and all phases together read
    each fetched document once. At full budgets these are the spec's own numbers."""
    if not spec.phases:
        return None
    import yaml

    phases = []
    for i, phase in enumerate(spec.phases):
        name = str(phase.get("name", f"phase{i + 1}"))  # the names infir.data.mixture gives them
        sources = []
        for s in phase["sources"]:
            source = str(s.get("name", Path(str(s["prefix"])).name))
            if states.get(source, {}).get("tokens"):
                tokens = round(states[source]["tokens"] * spec.shares[name][source])
                sources.append({"name": source, "prefix": s["prefix"], "tokens": tokens})
        if sources:
            phases.append({"name": name, "sources": sources})
    if not phases:
        return None
    path = root / f"{spec.name}.fetched.yaml"
    path.write_text(f"# written by infir-prep fetch from {spec.path}: each phase's share of the tokens counted per source\n"
                    + yaml.safe_dump({"name": spec.name, "phases": phases}, sort_keys=False))
    return path
