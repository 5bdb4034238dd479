"""Tokenize documents into a megatron indexed dataset (PREFIX.bin / PREFIX.idx), in resumable shards.

Layout while running: ``PREFIX.shards/`` holds one ``<id>.bin/.idx`` per finished shard plus its
``<id>.stats.json``, written last (atomic rename), so a shard counts as done only once its data is
complete. A rerun of the same command skips done shards; a worker that fails leaves the others'
work on disk and the error names the shard. When all shards are done they are concatenated with
megatron's ``IndexedDatasetBuilder.add_index`` (so megatron's own reader loads the result),
``PREFIX.stats.json`` is written and the shard folder is removed. The merged files are written under
``.partial`` names and renamed at the end, and inputs with no usable document are refused
(``NoDocuments``): a failed run never leaves a PREFIX.bin/.idx that looks like a dataset.

Each document is its token ids followed by the EOD token (``<|endoftext|>``), stored as one
sequence and one document, as megatron's preprocess_data.py does with ``--append-eod``.
"""
from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from infir.data.sources import BadInput, Shard, iter_texts, plan_shards
from infir.data.tokenizer import PIECE_CHARS, TextTokenizer, TextTooLong, load_tokenizer

BATCH_DOCS = 256
MAX_EXAMPLES_PER_REASON = 20


def megatron_indexed():
    """megatron's indexed_dataset module, imported without its TE/apex fallback warnings (they
    concern training kernels, not data files)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def token_dtype(vocab_size: int) -> type:
    return megatron_indexed().DType.optimal_dtype(vocab_size)


def _atomic_write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


class ShardFailed(RuntimeError):
    pass


class NoDocuments(ValueError):
    """The inputs hold no usable document (empty, or every line skipped)."""


def no_documents(inputs: Sequence, what: str, skipped: dict, examples: list[str], hint: str) -> NoDocuments:
    """The one-line error for inputs that gave nothing to write, with why their lines were skipped."""
    names = ", ".join(map(str, inputs))
    if not skipped:
        return NoDocuments(f"no {what} in {names}: the input is empty; nothing written")
    reasons = ", ".join(f"{r}: {n}" for r, n in skipped.items())
    first = f"; first: {examples[0]}" if examples else ""
    return NoDocuments(f"no usable {what} in {names}: all {sum(skipped.values()):,} lines skipped ({reasons}{first}); "
                       f"{hint}; nothing written")


@contextlib.contextmanager
def staged(*paths: str):
    """Yield a ``.partial`` name for each of ``paths``; rename them into place when the block ends, or
    delete them if it raises, so readers never see a half-written or refused output."""
    partial = [p + ".partial" for p in paths]
    try:
        yield partial
    except BaseException:
        for p in partial:
            Path(p).unlink(missing_ok=True)
        raise
    for tmp, final in zip(partial, paths):
        os.replace(tmp, final)


def tokenize_shard(shard: Shard, out_prefix: str, tok: TextTokenizer, text_key: str) -> dict:
    """Write one shard's documents to ``out_prefix.bin/.idx``; return its stats."""
    dtype = token_dtype(tok.vocab_size)
    builder = megatron_indexed().IndexedDatasetBuilder(out_prefix + ".bin", dtype=dtype)
    stats = {"documents": 0, "tokens": 0, "skipped": Counter(), "skipped_lines": []}
    batch: list[str] = []

    def add(ids: np.ndarray) -> None:
        builder.add_document(ids, [len(ids)])
        stats["documents"] += 1
        stats["tokens"] += len(ids)

    def flush():
        for ids in tok.encode_batch(batch):
            ids.append(tok.eod)
            add(np.asarray(ids, dtype=dtype))
        batch.clear()

    def skip(line: int, reason: str) -> None:
        stats["skipped"][reason.split(" (")[0]] += 1
        stats["skipped_lines"].append({"file": shard.path, "line": line, "reason": reason})

    for rec in iter_texts(shard, text_key):
        if rec.skip is not None:
            skip(rec.line, rec.skip)
        elif len(rec.value) > PIECE_CHARS:
            flush()  # documents stay in input order
            try:
                add(_encode_long(tok, rec.value, dtype))
            except TextTooLong as err:
                skip(rec.line, str(err))
        else:
            batch.append(rec.value)
            if len(batch) >= BATCH_DOCS:
                flush()
    flush()
    builder.finalize(out_prefix + ".idx")
    stats["skipped"] = dict(stats["skipped"])
    return stats


def _encode_long(tok: TextTokenizer, text: str, dtype) -> np.ndarray:
    """A long document's ids and EOD, encoded piece by piece and kept as ``dtype`` (2 or 4 bytes a token)."""
    pieces = [np.asarray(ids, dtype=dtype) for ids in tok.encode_long(text)]
    return np.concatenate([*pieces, np.asarray([tok.eod], dtype=dtype)])


# Worker state. The parent loads the tokenizer once and the forked workers inherit it: loading
# Qwen's 151k-token vocabulary (and checking its tiktoken twin) is slow enough that doing it per
# worker would eat the fast path's gain on all but huge inputs.
_WORKER: dict = {}


def _init_worker() -> None:
    # One worker = one core: HF tokenizers would otherwise spread each batch over every core
    # (workers=1 would then not mean one core, and N workers would oversubscribe N cores).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _run_shard(job: tuple[str, Shard, str]) -> tuple[str, dict | None, str | BadInput | None]:
    """``(shard id, stats, None)``, or the failure: the BadInput itself, else the traceback."""
    shard_id, shard, out_prefix = job
    try:
        stats = tokenize_shard(shard, out_prefix, _WORKER["tok"], _WORKER["text_key"])
        stats["shard"] = asdict(shard)
        _atomic_write_json(Path(out_prefix + ".stats.json"), stats)
        return shard_id, stats, None
    except BadInput as err:  # the file itself is broken: the parent reports it as bad input
        return shard_id, None, err
    except Exception:  # reported by the parent with the shard's name; other shards keep going
        return shard_id, None, traceback.format_exc()


def _fingerprint(inputs: Sequence[Path], tok: TextTokenizer, text_key: str) -> dict:
    files = []
    for p in inputs:
        st = p.stat()
        files.append({"path": str(p.resolve()), "size": st.st_size, "mtime": int(st.st_mtime)})
    return {"inputs": files, "tokenizer": tok.fingerprint, "text_key": text_key}


def tokenize_to_indexed(
    inputs: Sequence[Path | str],
    output_prefix: Path | str,
    tokenizer_dir: Path | str,
    text_key: str = "text",
    workers: int = 1,
    shard_bytes: int | None = None,
    progress: bool = True,
) -> dict:
    """Tokenize ``inputs`` into ``output_prefix.bin/.idx``; returns (and writes) the stats."""
    inputs = _existing_inputs(inputs)
    tok = load_tokenizer(tokenizer_dir)  # fail here, before any work, on a bad tokenizer
    _WORKER.update(tok=tok, text_key=text_key)
    megatron_indexed()  # imported once here, so forked workers inherit it instead of re-importing
    output_prefix = str(output_prefix)
    Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
    fingerprint = _fingerprint(inputs, tok, text_key)
    done = _finished_stats(output_prefix, fingerprint)
    if done is not None:
        return done

    shard_dir = Path(output_prefix + ".shards")
    workers = max(1, int(workers))
    jobs = _plan_jobs(inputs, shard_dir, workers, shard_bytes)  # reads the inputs' headers: fails before writing
    shard_dir.mkdir(exist_ok=True)
    _check_shard_dir(shard_dir, fingerprint)
    results, todo = _split_done(jobs)
    start = time.time()
    failures = _run_shards(jobs, todo, results, workers, Path(output_prefix).name, progress)
    _raise_on_failures(failures, jobs, results, shard_dir, inputs)

    stats = _merge(jobs, results, output_prefix, tok)
    stats.update(fingerprint=fingerprint, seconds=round(time.time() - start, 2), workers=workers,
                 backend=tok.backend)
    _atomic_write_json(Path(output_prefix + ".stats.json"), stats)
    shutil.rmtree(shard_dir)
    return stats


def _raise_on_failures(failures, jobs, results: dict[str, dict], shard_dir: Path, inputs: list[Path]) -> None:
    """A broken input file or inputs with no document end the run with nothing kept (a rerun would
    fail the same way); other shard failures keep the finished shards for a rerun to resume from."""
    bad = [err for _, err in failures if isinstance(err, BadInput)]
    if bad:
        shutil.rmtree(shard_dir)
        raise bad[0]
    if failures:
        raise _shards_failed(failures, jobs, len(results), shard_dir)
    if not sum(r["documents"] for r in results.values()):
        shutil.rmtree(shard_dir)
        skipped: Counter = Counter()
        for r in results.values():
            skipped.update(r["skipped"])
        examples = [f"{e['file']}:{e['line']}: {e['reason']}" for r in results.values() for e in r["skipped_lines"][:1]]
        raise no_documents(inputs, "document", dict(skipped), examples,
                           "each line needs a non-empty string under --text-key")


def _existing_inputs(inputs: Sequence[Path | str]) -> list[Path]:
    inputs = [Path(p) for p in inputs]
    if not inputs:
        raise ValueError("no input files given")
    for p in inputs:
        if not p.exists():
            raise FileNotFoundError(f"input {p} does not exist")
    return inputs


def _finished_stats(output_prefix: str, fingerprint: dict) -> dict | None:
    """The stats of a complete earlier run on the same inputs, tokenizer and text key; None if there is none."""
    stats_path = Path(output_prefix + ".stats.json")
    if stats_path.is_file() and Path(output_prefix + ".idx").is_file() and Path(output_prefix + ".bin").is_file():
        done = json.loads(stats_path.read_text())
        if done.get("fingerprint") == fingerprint:
            return done
    return None


def _plan_jobs(inputs: list[Path], shard_dir: Path, workers: int,
               shard_bytes: int | None) -> list[tuple[str, Shard, str]]:
    """``(shard id, shard, output prefix)`` for every shard of every input, in input order.

    Without ``shard_bytes``, about four shards per worker, each between 1 MiB and 256 MiB.
    """
    if shard_bytes is None:
        total = sum(p.stat().st_size for p in inputs if p.is_file())
        shard_bytes = min(256 << 20, max(1 << 20, total // (4 * workers) + 1))
    jobs = []
    for i, p in enumerate(inputs):
        for k, shard in enumerate(plan_shards(p, shard_bytes)):
            sid = f"{i:04d}-{k:05d}"
            jobs.append((sid, shard, str(shard_dir / sid)))
    return jobs


def _split_done(jobs: list[tuple[str, Shard, str]]) -> tuple[dict[str, dict], list[tuple[str, Shard, str]]]:
    """The stats of the shards an earlier run finished, by shard id, and the jobs still to run."""
    results: dict[str, dict] = {}
    todo = []
    for sid, shard, prefix in jobs:
        done_stats = Path(prefix + ".stats.json")
        if done_stats.is_file():
            results[sid] = json.loads(done_stats.read_text())
        else:
            todo.append((sid, shard, prefix))
    return results, todo


def _run_shards(jobs, todo, results: dict[str, dict], workers: int, name: str,
                progress: bool) -> list[tuple[str, str]]:
    """Tokenize the shards of ``todo``, adding their stats to ``results``; returns ``(shard id,
    traceback)`` for each shard that failed. The progress bar counts all ``jobs``, done ones included."""
    failures = []
    shard_of = {sid: shard for sid, shard, _ in jobs}
    bar = tqdm(total=sum(s.size for s in shard_of.values()),
               initial=sum(shard_of[sid].size for sid in results),
               unit="B" if all(s.kind.startswith("jsonl") for s in shard_of.values()) else "row", unit_scale=True,
               desc=f"tokenize -> {name}", disable=not progress, file=sys.stderr)

    def collect(sid, stats, err):
        bar.update(shard_of[sid].size)
        if err is not None:
            failures.append((sid, err))
        else:
            results[sid] = stats
            bar.set_postfix(tokens=f"{sum(r['tokens'] for r in results.values()):.3g}")

    if todo:
        if workers == 1 or len(todo) == 1:
            _run_in_process(todo, collect)
        else:
            ctx = mp.get_context("fork")
            with ctx.Pool(min(workers, len(todo)), initializer=_init_worker) as pool:
                for out in pool.imap_unordered(_run_shard, todo):
                    collect(*out)
    bar.close()
    return failures


def _run_in_process(todo, collect) -> None:
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    try:
        _init_worker()
        for job in todo:
            collect(*_run_shard(job))
    finally:  # in-process: give the caller its setting back
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _shards_failed(failures: list[tuple[str, str]], jobs, finished: int, shard_dir: Path) -> ShardFailed:
    """One line naming each failed shard and its error; the tracebacks go to ``shard_dir/errors.log``."""
    path_of = {sid: shard.path for sid, shard, _ in jobs}
    log = shard_dir / "errors.log"
    log.write_text("".join(f"--- shard {sid} ({path_of[sid]}):\n{err}\n" for sid, err in failures))
    causes = "; ".join(f"shard {sid} of {path_of[sid]}: {err.strip().splitlines()[-1]}" for sid, err in failures)
    return ShardFailed(
        f"{len(failures)} of {len(jobs)} shards failed ({causes}); the {finished} finished ones are kept in "
        f"{shard_dir} and a rerun of the same command resumes from them (tracebacks: {log})")


def _check_shard_dir(shard_dir: Path, fingerprint: dict) -> None:
    marker = shard_dir / "fingerprint.json"
    if marker.is_file():
        if json.loads(marker.read_text()) != fingerprint:
            raise RuntimeError(
                f"{shard_dir} holds shards from a run with other inputs or another tokenizer; "
                "delete that folder (or pick another --output) to start over")
    else:
        _atomic_write_json(marker, fingerprint)


def _merge(jobs, results: dict[str, dict], output_prefix: str, tok: TextTokenizer) -> dict:
    skipped: Counter = Counter()
    skipped_lines = []
    with staged(output_prefix + ".bin", output_prefix + ".idx") as (bin_path, idx_path):
        builder = megatron_indexed().IndexedDatasetBuilder(bin_path, dtype=token_dtype(tok.vocab_size))
        # add_index runs gc.collect() per shard, a full heap walk (slow once torch is imported); freezing
        # the objects that exist now leaves it only the merge's own garbage to look at.
        gc.freeze()
        try:
            for sid, _, prefix in jobs:
                builder.add_index(prefix)
                skipped.update(results[sid]["skipped"])
                skipped_lines.extend(results[sid]["skipped_lines"])
        finally:
            gc.unfreeze()
        builder.finalize(idx_path)
    with open(output_prefix + ".skipped.jsonl", "w") as f:
        for entry in skipped_lines:
            f.write(json.dumps(entry) + "\n")
    examples: dict[str, list[str]] = {}
    for entry in skipped_lines:
        reason = entry["reason"].split(" (")[0]
        bucket = examples.setdefault(reason, [])
        if len(bucket) < MAX_EXAMPLES_PER_REASON:
            bucket.append(f"{entry['file']}:{entry['line']}: {entry['reason']}")
    return {
        "output": output_prefix,
        "documents": sum(r["documents"] for r in results.values()),
        "tokens": sum(r["tokens"] for r in results.values()),
        "skipped": dict(skipped),
        "skipped_examples": examples,
        "skipped_log": output_prefix + ".skipped.jsonl",
        "shards": len(jobs),
        "dtype": np.dtype(token_dtype(tok.vocab_size)).name,
    }
