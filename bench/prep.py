"""Pretraining tokenization throughput: tokens/s and tokens/s per core of `infir-prep pretrain`.

    python bench/prep.py [--mb 8] [--workers 1 2] [--repeats 2] [--out PATH]

End to end, as a user runs it: read jsonl, tokenize, append EOD, write megatron .bin/.idx, merge
shards, write stats (imports and tokenizer loading excluded, each run into a fresh output). The
corpus is the demo's own text (Shakespeare scenes + worked arithmetic) repeated to --mb
megabytes. Rows: the demo tokenizer (8192 tokens, HF), and Qwen2.5's vocabulary (built offline
from qwen.tiktoken) through HF tokenizers and through the tiktoken fast path (identical ids,
tests/data/test_tokenizer.py). Best of --repeats per row; the ratio column compares each Qwen row
with the HF Qwen row at the same worker count, measured in the same run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from result_file import write_result  # bench/ is the script's own folder, first on sys.path


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _corpus(path: Path, megabytes: float) -> int:
    from infir.data.arithmetic import arithmetic_problems, as_text
    from infir.data.shakespeare import shakespeare_documents

    docs = [d["text"] for d in shakespeare_documents()] + [as_text(p) for p in arithmetic_problems(5000, 0)]
    lines = [json.dumps({"text": t}) + "\n" for t in docs]
    target, written = megabytes * 1e6, 0
    with open(path, "w") as f:
        while written < target:
            for line in lines:
                f.write(line)
                written += len(line)
                if written >= target:
                    break
    return written


def _encode_only(corpus: Path, qwen_dir: Path, demo_dir: Path) -> list[str]:
    """Tokenizer speed alone, one core: what the fast path changes before I/O and json dilute it."""
    from infir.data.tokenizer import load_tokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    texts = [json.loads(line)["text"] for line in open(corpus)][:20000]
    batches = [texts[i:i + 256] for i in range(0, len(texts), 256)]
    rows, reference = [], None
    for name, tok in (("demo BPE 8k", load_tokenizer(demo_dir)),
                      ("Qwen2.5 vocab", load_tokenizer(qwen_dir, allow_tiktoken=False)),
                      ("Qwen2.5 vocab", load_tokenizer(qwen_dir))):
        tok.encode_batch(batches[0])  # warm up
        start = time.perf_counter()
        n = sum(len(ids) for b in batches for ids in tok.encode_batch(b))
        seconds = time.perf_counter() - start
        if name.startswith("Qwen") and tok.backend == "hf":
            reference = n / seconds
        ratio = f"{n / seconds / reference:.2f}x" if name.startswith("Qwen") else "-"
        rows.append(f"| {name} | {tok.backend} | {n:,} | {seconds:.2f} | {n / seconds:,.0f} | {ratio} |")
        print(rows[-1], file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=8.0, help="corpus size in MB of jsonl")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here, and its figures as JSON beside it (PATH.json)")
    args = parser.parse_args()

    import megatron.core
    import tiktoken
    import tokenizers
    import torch

    from infir.data import DEMO_TOKENIZER
    from infir.data.qwen_vocab import build_qwen_tokenizer_dir
    from infir.data.tokenize_corpus import megatron_indexed, tokenize_to_indexed

    megatron_indexed()
    work = Path(tempfile.mkdtemp(prefix="infir_bench_prep_"))
    try:
        corpus = work / "corpus.jsonl"
        size = _corpus(corpus, args.mb)
        qwen_dir = build_qwen_tokenizer_dir(work / "qwen_tokenizer")
        cases = [("demo BPE 8k", DEMO_TOKENIZER, "hf"), ("Qwen2.5 vocab", qwen_dir, "hf"),
                 ("Qwen2.5 vocab", qwen_dir, "tiktoken")]
        rows, reference = [], {}
        for name, tok_dir, backend in cases:
            for workers in args.workers:
                os.environ["INFIR_DISABLE_TIKTOKEN"] = "1" if backend == "hf" else "0"
                best = None
                for r in range(args.repeats):
                    out = work / f"out_{len(rows)}_{r}"
                    start = time.perf_counter()
                    stats = tokenize_to_indexed([corpus], out / "x", tok_dir, workers=workers, progress=False)
                    seconds = time.perf_counter() - start
                    assert stats["backend"] == backend, (stats["backend"], backend)
                    best = min(best or seconds, seconds)
                    shutil.rmtree(out)
                tps = stats["tokens"] / best
                if name.startswith("Qwen") and backend == "hf":
                    reference[workers] = tps
                ratio = f"{tps / reference[workers]:.2f}x" if name.startswith("Qwen") else "-"
                rows.append(f"| {name} | {backend} | {workers} | {stats['tokens']:,} | {best:.2f} | "
                            f"{tps:,.0f} | {tps / workers:,.0f} | {size / best / 1e6 / workers:.2f} | {ratio} |")
                print(rows[-1], file=sys.stderr)
        os.environ.pop("INFIR_DISABLE_TIKTOKEN", None)
        encode_rows = _encode_only(corpus, qwen_dir, DEMO_TOKENIZER)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    header = [
        "## bench/prep.py: pretrain tokenization (jsonl -> megatron .bin/.idx)",
        "",
        f"- device: {_cpu_name()}, {os.cpu_count()} cores visible (shared machine: other jobs ran beside it)",
        f"- versions: python {platform.python_version()}, torch {torch.__version__}, tokenizers {tokenizers.__version__}, "
        f"tiktoken {tiktoken.__version__}, megatron-core {megatron.core.__version__}",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- corpus: {size / 1e6:.1f} MB jsonl (Shakespeare scenes + worked arithmetic, repeated); best of {args.repeats}",
        "",
        "| tokenizer | backend | workers | tokens | seconds | tokens/s | tokens/s per core | MB/s per core | vs HF (same vocab, workers) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    encode_header = [
        "",
        "Encode only (one core, no I/O: `encode_batch` on the same documents, 256 per batch):",
        "",
        "| tokenizer | backend | tokens | seconds | tokens/s per core | vs HF (same vocab) |",
        "|---|---|---|---|---|---|",
    ]
    table = "\n".join(header + rows + encode_header + encode_rows) + "\n"
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
        write_result(args.out, table)


if __name__ == "__main__":
    main()
