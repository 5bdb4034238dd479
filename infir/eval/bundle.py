"""A benchmark bundle: every benchmark's records in one folder, for hosts without network.

``infir-eval bundle DIR`` (where there is network) writes, per benchmark, ``DIR/<name>.jsonl``: the
records as the hub gives them, in its order and the dataset's own schema (LiveCodeBench only within its
date window), and ``DIR/manifest.json``: for each file its record count, sha256 and where it came
from. ``source=bundle:DIR`` (or ``sources.<name>=bundle:DIR``) then reads them offline, and refuses a
file whose checksum is not the manifest's.

Each benchmark's file is renamed into place and recorded in the manifest once complete, so an
interrupted ``infir-eval bundle`` resumes with the benchmarks it had not finished.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = "infir-eval bundle 1"
PREFIX = "bundle:"


def bundle_dir(source: str) -> Path | None:
    """The folder of a ``bundle:DIR`` source; None for any other source."""
    return Path(source[len(PREFIX):]).expanduser() if source.startswith(PREFIX) else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a benchmark bundle (no {MANIFEST}): write one with "
                                f"`infir-eval bundle {directory}` on a machine with internet")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); write the bundle again with `infir-eval bundle {directory}`") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: not an infir-eval bundle manifest (format {manifest.get('format')!r}, "
                         f"expected {FORMAT!r}); write the bundle again with `infir-eval bundle {directory}`")
    return manifest


def verified_file(directory: Path, name: str) -> Path:
    """``DIR/<name>.jsonl``, once its sha256 is the one the manifest holds."""
    directory = Path(directory)
    entries = read_manifest(directory)["benchmarks"]
    if name not in entries:
        raise FileNotFoundError(f"bundle {directory} has no {name} (it holds {', '.join(entries) or 'nothing'}): "
                                f"add it with `infir-eval bundle {directory} --benchmarks {name}` on a machine with internet")
    path = directory / entries[name]["file"]
    found = sha256(path) if path.is_file() else "no file"
    if found != entries[name]["sha256"]:
        raise ValueError(f"{path} does not match the bundle's manifest (sha256 {found[:16]}, expected "
                         f"{entries[name]['sha256'][:16]}): it changed after `infir-eval bundle` wrote it; copy the "
                         f"bundle again, or rewrite it with `infir-eval bundle {directory} --benchmarks {name} --force`")
    return path


def read_records(directory: Path, name: str) -> list[dict]:
    with open(verified_file(directory, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def done(directory: Path, name: str) -> bool:
    """Whether the bundle already holds ``name``, intact."""
    try:
        verified_file(directory, name)
        return True
    except (FileNotFoundError, ValueError):
        return False


def write_records(directory: Path, name: str, records: Iterable[dict], origin: dict) -> dict:
    """Write ``records`` as ``DIR/<name>.jsonl`` and record it in the manifest; returns its entry."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path, count = directory / f"{name}.jsonl", 0
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "w") as f:
            for record in records:
                # default=str: a hub value JSON cannot hold (a date) is kept as the text the loaders parse
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
                count += 1
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    entry = {"file": path.name, "records": count, "sha256": sha256(path), **origin}
    manifest_path = directory / MANIFEST
    manifest = read_manifest(directory) if manifest_path.is_file() else {"format": FORMAT, "benchmarks": {}}
    manifest["benchmarks"][name] = entry
    tmp = manifest_path.with_name(MANIFEST + ".partial")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, manifest_path)
    return entry
